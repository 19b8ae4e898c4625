"""The individual operators of <csattn/ops.hpp> on host arrays: MXFP8 quantization (E4M3
values, one E8M0 scale per 32 elements), the Blackwell 128x4 scale layout, and the compact
lightning indexer (scores only for causally visible (query, compressed key) pairs, the
fused top-k with ties to the smallest id, and the softmax over the selection)."""
import numpy as np

from . import _csattn
from ._arrays import byte_array as _u8, host_array, int_list as _ints
from ._csattn import Error


def _f32(a, what):
    return host_array(a, np.float32, what)


def quantize_mxfp8(x):
    """x [..., D] (D a multiple of 32) -> (values, scales): E4M3 bytes shaped like x and E8M0
    bytes [..., D/32], both uint8 (spec 03 §5.2: scale = amax / 448 rounded up to a power of
    two, values rounded to nearest even and saturated to +-448)."""
    return _csattn.quantize_mxfp8(_f32(x, "x"))


def dequantize_mxfp8(values, scales):
    """float32 values * 2^(scale - 127) of quantize_mxfp8's output."""
    return _csattn.dequantize_mxfp8(_u8(values, "values"), _u8(scales, "scales"))


def pack_mxfp8_scales(scales, rows_per_token, *, cu_seqlens=None, batch=None, seqlen=None):
    """Logical E8M0 scales [rows, groups] (row = token * rows_per_token + sub-row) in the
    128x4 layout: THD (cu_seqlens in tokens) returns (packed [1, rows_padded, groups_padded],
    the padded prefixes of this cu_seqlens); BSHD (batch, seqlen) returns packed
    [batch, rows_padded, groups_padded]. Padding bytes are 0."""
    s = _u8(scales, "scales")
    if cu_seqlens is not None:
        if batch is not None or seqlen is not None:
            raise Error("give cu_seqlens (THD) or batch and seqlen (BSHD), not both")
        return _csattn.pack_mxfp8_scales_thd(s, _ints(cu_seqlens, "cu_seqlens"), int(rows_per_token))
    if batch is None or seqlen is None:
        raise Error("BSHD packing needs batch and seqlen (or give cu_seqlens for THD)")
    return _csattn.pack_mxfp8_scales_bshd(s, int(batch), int(seqlen), int(rows_per_token))


def compact_indexer_topk(q, k, weights, topk, *, ratio=4, precision="bf16", sm_scale=1.0,
                         cu_seqlens_q=None, cu_seqlens_k=None, q_causal_offsets=None,
                         rows_per_pass=0):
    """The compact indexer: S(t, j) = sm_scale * sum_h w[t, h] ReLU(q[t, h] . k[j]) for the
    n(t) = clamp((offset + t + 1) div ratio, 0, len_k) visible keys only, the min(topk, n)
    largest (ties to the smallest id) and their softmax. BSHD: q [B, S_q, H, D], k [B, S_k,
    D], weights [B, S_q, H]; THD: q [T_q, H, D], k [T_k, D], weights [T_q, H] with
    cu_seqlens_q / cu_seqlens_k. precision "mxfp8" quantizes q and k first. Returns
    (indices int32 ascending then -1, logits float32 with -inf padding, softmax float32)."""
    return _csattn.compact_indexer_topk(
        _f32(q, "q"), _f32(k, "k"), _f32(weights, "weights"), int(topk), int(ratio), str(precision),
        float(sm_scale), _ints(cu_seqlens_q, "cu_seqlens_q"), _ints(cu_seqlens_k, "cu_seqlens_k"),
        _ints(q_causal_offsets, "q_causal_offsets"), int(rows_per_pass))
