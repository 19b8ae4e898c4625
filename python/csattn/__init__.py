"""csattn: the DeepSeek-V4 hybrid attention layer (SWA, CSA with the lightning indexer and
top-k, HCA) from hidden states to output, forward and backward with the indexer KL loss, on
packed variable-length batches (THD: ``cu_seqlens``, optionally ``cu_seqlens_padded``).

    import numpy as np, csattn
    cfg = csattn.preset_layers("small")[1]          # the CSA layer of the small preset
    layer = csattn.Layer(cfg, seed=0, precision="fp32")
    x = np.random.default_rng(0).standard_normal((300, cfg.d_model), dtype=np.float32)
    fwd = layer.forward(x, cu_seqlens=[0, 100, 300])
    grads = layer.backward(fwd, np.ones_like(fwd.output))   # {"input": ..., "attn.*": ...}

Arrays may be NumPy arrays or anything NumPy can read (``__array__`` or ``__dlpack__``, e.g.
CPU torch tensors); they are copied to float32 on the host. The layer runs on the CPU, or
on a Hopper GPU with ``device="cuda"`` / ``"auto"`` (bf16), still taking and returning host
arrays. Errors are ``csattn.Error`` (a ``ValueError``) with the library's message. The
operators of ops.hpp (MXFP8 quantization, the 128x4 scale layout, the compact indexer) are
in ``csattn.ops`` and re-exported here. Context parallelism over MPI: under ``mpirun -np P``,
``comm = csattn.mpi_world()``, ``part = csattn.CpPartition.build(cu, cu_padded, "two_chunk",
P)`` (``pad_for_context_parallel`` pads a layout to what a mode accepts), and
``csattn.ContextParallelLayer(cfg, weights).forward(comm, part, x[part.rows(comm.rank)])``.
On GPUs, one per rank: ``nccl = csattn.nccl_communicator(comm, csattn.launcher_local_rank())``
and ``csattn.ContextParallelLayer(cfg, weights, device="cuda").forward(nccl, part, ...)``.
"""
import json as _json

import numpy as np

from ._csattn import (AttentionConfig, Communicator, ContextParallelLayer, CpForward,
                      CpPartition, DeviceLayer, Error, Forward, LayerWeights, cuda_available,
                      hf_config_layer_names, hf_config_layers, launcher_local_rank, mpi_available, mpi_world,
                      nccl_available, nccl_communicator, pad_for_context_parallel,
                      plan_cp_device_memory, plan_device_memory, preset_layers, preset_names,
                      retain_freed_host_memory)
from . import _csattn
from ._arrays import host_array as _host, int_list as _offsets
from .ops import compact_indexer_topk, dequantize_mxfp8, pack_mxfp8_scales, quantize_mxfp8

__all__ = ["AttentionConfig", "Communicator", "ContextParallelLayer", "CpForward", "CpPartition",
           "DeviceLayer", "Error", "Forward", "Layer", "LayerWeights", "bshd_cu_seqlens", "compact_indexer_topk",
           "cuda_available", "dequantize_mxfp8", "hf_config_layer_names", "hf_config_layers", "launcher_local_rank",
           "mpi_available", "mpi_world", "nccl_available", "nccl_communicator",
           "oracle_forward", "pack_mxfp8_scales", "pad_for_context_parallel", "plan_cp_device_memory",
           "plan_device_memory",
           "preset_layers",
           "preset_names", "quantize_mxfp8", "retain_freed_host_memory", "build_info"]


def build_info():
    """The version, this build's backends and communicators and the GPUs it sees, as a dict
    (the keys of ``csattn info --json``): what a bug report should carry."""
    return _json.loads(_csattn.build_info_json())


__version__ = _csattn.__version__


def bshd_cu_seqlens(batch, seqlen):
    """cu_seqlens of `batch` sequences of `seqlen` rows each (BSHD as a THD batch)."""
    if batch < 0 or seqlen < 0:
        raise Error(f"batch and seqlen must be >= 0, got {batch} and {seqlen}")
    return [b * seqlen for b in range(batch + 1)]


class Layer:
    """One attention layer: `config` (an AttentionConfig) and `weights` (LayerWeights; None
    draws random ones from `seed`). precision: "bf16" (the GPU path's rounding points) or
    "fp32"; device: "cpu", "cuda" or "auto"; threads: 0 = OpenMP's default; deterministic:
    fixed-order GPU reductions (the CPU is always deterministic)."""

    def __init__(self, config, weights=None, *, seed=0, precision="bf16", device="cpu",
                 threads=0, deterministic=False):
        if weights is None:
            weights = LayerWeights.random(config, seed)
        self._layer = _csattn.Layer(config, weights, precision, device, threads, deterministic)
        self.weights = weights

    @property
    def config(self):
        return self._layer.config

    @property
    def precision(self):
        return self._layer.precision

    @property
    def device(self):
        return self._layer.device

    def forward(self, x, cu_seqlens, cu_seqlens_padded=None, topk=None):
        """x: [T, d_model]; cu_seqlens: B+1 real cumulative lengths; cu_seqlens_padded: B+1
        physical ones (rows past a sequence's real length are padding). topk: a forced CSA
        selection [T, index_topk] (segment-local ids, -1 unused) instead of the indexer's.
        Returns a Forward (.output, .topk, .indexer_loss) to pass to backward."""
        return self._layer.forward(
            _host(x, np.float32, "x"), _offsets(cu_seqlens, "cu_seqlens"),
            _offsets(cu_seqlens_padded, "cu_seqlens_padded"),
            None if topk is None else _host(topk, np.int32, "topk"))

    def backward(self, forward, grad_output, grad_indexer_loss=1.0):
        """Gradients of <output, grad_output> + grad_indexer_loss * indexer_loss: a dict with
        "input" [T, d_model] and one float32 array per parameter name. The indexer's
        parameters are trained by the indexer loss alone (zero when loss_coeff is 0)."""
        if not isinstance(forward, Forward):
            raise Error("forward must be the Forward returned by this layer's forward()")
        return self._layer.backward(forward, _host(grad_output, np.float32, "grad_output"),
                                    float(grad_indexer_loss))


def oracle_forward(config, weights, x, cu_seqlens, cu_seqlens_padded=None, topk=None, rows=None):
    """The layer forward in fp64, written straight from the equations: the reference every
    backend is tested against. Returns {"output": float64 [T, d_model], "topk": int32 or
    None, "indexer_loss": float}. topk forces the CSA selection; rows computes only those
    query rows (the others are NaN and the loss NaN)."""
    return _csattn.oracle_forward(
        config, weights, _host(x, np.float64, "x"), _offsets(cu_seqlens, "cu_seqlens"),
        _offsets(cu_seqlens_padded, "cu_seqlens_padded"),
        None if topk is None else [int(i) for i in _host(topk, np.int32, "topk").ravel()],
        _offsets(rows, "rows"))
