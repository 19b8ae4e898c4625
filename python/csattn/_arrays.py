"""Conversions of user inputs to what the compiled module takes: C-contiguous host arrays
of one dtype, and lists of Python ints. Their failures are csattn.Error like the library's."""
import numpy as np

from ._csattn import Error


def host_array(a, dtype, what):
    """A C-contiguous host array of `dtype` holding `a`'s values (NumPy arrays, objects with
    __array__ or __dlpack__, nested sequences)."""
    if a is None:
        raise Error(f"{what} is required")
    if not isinstance(a, np.ndarray) and not hasattr(a, "__array__") and hasattr(a, "__dlpack__"):
        a = np.from_dlpack(a)
    try:
        return np.ascontiguousarray(np.asarray(a), dtype=dtype)
    except (TypeError, ValueError) as e:
        raise Error(f"{what}: cannot be read as a {np.dtype(dtype).name} array ({e})") from None


def byte_array(a, what):
    """Raw bytes (E4M3 values, E8M0 scales): uint8 only, never converted from numbers."""
    a = np.asarray(a)
    if a.dtype != np.uint8:
        raise Error(f"{what} must hold raw bytes (uint8), got dtype {a.dtype}")
    return np.ascontiguousarray(a)


def int_list(v, what):
    """A 1-D integer sequence (cu_seqlens, offsets, rows) as a list of int; None stays None."""
    if v is None:
        return None
    a = np.asarray(v)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise Error(f"{what} must be a 1-D sequence of integers, got shape {a.shape} dtype {a.dtype}")
    return [int(i) for i in a]
