"""csattn.ops against independent NumPy references written from spec 03: the E4M3 / E8M0
quantizer (nearest of the 126 finite E4M3 values, ties to the even code), the 128x4 byte
formula of §5.5 with its worked examples, and the compact indexer as a dense masked score
matrix with a stable sort (ties to the smallest id), in BSHD and THD, with causal offsets,
in passes, and in MXFP8."""
import numpy as np
import pytest

import csattn
from csattn import ops

# ---- MXFP8 -------------------------------------------------------------------------------


def e4m3_values():
    """The value of every non-negative finite E4M3 code 0x00..0x7E (bias 7, 3 mantissa bits)."""
    v = []
    for code in range(0x7F):
        e, m = code >> 3, code & 7
        v.append(m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(v)


E4M3 = e4m3_values()


def ref_e4m3(v):
    """Codes of float32 values: nearest finite value, ties to the even code, saturating to 448."""
    a = np.minimum(np.abs(v.astype(np.float64)), 448.0)
    hi = np.clip(np.searchsorted(E4M3, a), 1, len(E4M3) - 1)
    lo = hi - 1
    dlo, dhi = a - E4M3[lo], E4M3[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a == 0, 0, code)
    return (code | np.where(np.signbit(v), 0x80, 0)).astype(np.uint8)


def ref_quantize(x):
    blocks = x.reshape(*x.shape[:-1], -1, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=-1)
    p = amax * np.float32(1 / 448)
    m, ex = np.frexp(p)
    e = np.where(p == 0, 0, np.where(m == 0.5, ex - 1, ex) + 127).astype(np.int64)
    e = np.clip(e, 0, 254)
    mult = np.ldexp(np.float32(1), (127 - e)).astype(np.float32)[..., None]
    return ref_e4m3(blocks * mult).reshape(x.shape), e.astype(np.uint8)


def test_mxfp8_matches_the_reference_quantizer():
    rng = np.random.default_rng(1)
    # Blocks of very different magnitudes, exact powers of two, values on E4M3 ties.
    x = rng.standard_normal((6, 5, 128)).astype(np.float32) * np.float32(2.0) ** rng.integers(-20, 20, (6, 5, 1))
    x[0, 0, :32] = 448.0 * 2.0 ** -3
    x[0, 1, :32] = np.float32(1.0625) * 2.0 ** np.arange(32) % 7  # ties between codes
    x[0, 2, :32] = 0.0
    values, scales = ops.quantize_mxfp8(x)
    rv, rs = ref_quantize(x)
    assert values.dtype == np.uint8 and values.shape == x.shape and scales.shape == (6, 5, 4)
    np.testing.assert_array_equal(scales, rs)
    np.testing.assert_array_equal(values, rv)
    d = ops.dequantize_mxfp8(values, scales)
    blockmax = np.abs(x.reshape(6, 5, 4, 32)).max(-1, keepdims=True)
    assert (np.abs(d.reshape(6, 5, 4, 32) - x.reshape(6, 5, 4, 32)) <= blockmax / 16).all()
    assert (scales[0, 2, 0] == 0) and not values[0, 2, :32].any()


def test_mxfp8_special_values():
    x = np.zeros((2, 32), dtype=np.float32)
    x[0, 3] = np.nan
    x[1, :] = 1.0
    x[1, 5] = np.inf
    values, scales = ops.quantize_mxfp8(x)
    assert scales[0, 0] == 0xFF and values[0, 3] == 0x7F
    assert scales[1, 0] == 0xFE
    assert np.isnan(ops.dequantize_mxfp8(values, scales)[0]).all()
    with pytest.raises(csattn.Error, match="32"):
        ops.quantize_mxfp8(np.zeros((2, 40), dtype=np.float32))
    with pytest.raises(csattn.Error, match="uint8"):
        ops.dequantize_mxfp8(values.astype(np.int32), scales)


# ---- the 128x4 scale layout ----------------------------------------------------------------


def ref_offset(m, g, g_pad):
    return 512 * ((m // 128) * (g_pad // 4) + g // 4) + 16 * (m % 32) + 4 * ((m % 128) // 32) + g % 4


def ref_pack(logical, rows_padded, g_pad):
    out = np.zeros(rows_padded * g_pad, dtype=np.uint8)
    for m in range(logical.shape[0]):
        for g in range(logical.shape[1]):
            out[ref_offset(m, g, g_pad)] = logical[m, g]
    return out


def test_128x4_layout_spec_example_and_bshd():
    assert ref_offset(130, 2, 4) == 546  # spec 03 §5.5
    rng = np.random.default_rng(2)
    B, S, H, G = 2, 5, 64, 4  # Q: rows = token * H + head
    logical = rng.integers(1, 255, (B * S * H, G), dtype=np.uint8)
    packed = ops.pack_mxfp8_scales(logical, H, batch=B, seqlen=S)
    rows_padded = -(-S * H // 128) * 128
    assert packed.shape == (B, rows_padded, 4)
    for b in range(B):
        ref = ref_pack(logical[b * S * H:(b + 1) * S * H], rows_padded, 4)
        np.testing.assert_array_equal(packed[b].ravel(), ref)


def test_128x4_layout_thd_prefixes():
    rng = np.random.default_rng(3)
    # Spec examples: Q lens [1,2,3,4,5] (64 heads, a = 2) -> prefixes [0,2,4,8,12,18]; K lens
    # [16, 24] (a = 128) -> [0, 128, 256].
    lens = [1, 2, 3, 4, 5]
    cu = list(np.cumsum([0] + lens))
    logical = rng.integers(1, 255, (cu[-1] * 64, 4), dtype=np.uint8)
    packed, prefixes = ops.pack_mxfp8_scales(logical, 64, cu_seqlens=cu)
    assert list(prefixes) == [0, 2, 4, 8, 12, 18]
    flat = packed.reshape(-1)
    ref = np.zeros_like(flat)
    for b, n in enumerate(lens):
        for t in range(n):
            for h in range(64):
                m_log, m_pack = (cu[b] + t) * 64 + h, (prefixes[b] + t) * 64 + h
                for g in range(4):
                    ref[ref_offset(m_pack, g, 4)] = logical[m_log, g]
    np.testing.assert_array_equal(flat, ref)
    _, kp = ops.pack_mxfp8_scales(rng.integers(1, 255, (40, 4), dtype=np.uint8), 1, cu_seqlens=[0, 16, 40])
    assert list(kp) == [0, 128, 256]
    with pytest.raises(csattn.Error):
        ops.pack_mxfp8_scales(logical, 64)  # neither layout


# ---- the compact indexer -------------------------------------------------------------------


def ref_indexer_row(q, k, w, n, topk, sm_scale):
    """One query row: scores of its n visible keys, the top-k ids ascending, logits, softmax."""
    s = sm_scale * (w[:, None] * np.maximum(q @ k[:n].T, 0)).sum(axis=0) if n else np.zeros(0)
    order = np.argsort(-s, kind="stable")[:min(topk, n)]  # stable: ties to the smallest id
    ids = np.sort(order)
    ids_out = np.full(topk, -1, dtype=np.int32)
    logits = np.full(topk, -np.inf, dtype=np.float32)
    soft = np.zeros(topk, dtype=np.float32)
    ids_out[:len(ids)] = ids
    logits[:len(ids)] = s[ids]
    if len(ids):
        e = np.exp(s[ids] - s[ids].max())
        soft[:len(ids)] = e / e.sum()
    return ids_out, logits, soft


def exact_inputs(rng, shape_q, shape_k, shape_w):
    """Small integers and weights in {-1, -1/2, 1/2, 1, 2}: every score is exact in fp32 (and
    in MXFP8: integers up to 7 are E4M3 values at any block scale), with many ties."""
    q = rng.integers(-3, 4, shape_q).astype(np.float32)
    k = rng.integers(-3, 4, shape_k).astype(np.float32)
    w = rng.choice(np.array([-1, -0.5, 0.5, 1, 2], dtype=np.float32), shape_w)
    return q, k, w


@pytest.mark.parametrize("precision", ["bf16", "mxfp8"])
def test_compact_indexer_bshd(precision):
    rng = np.random.default_rng(4)
    B, S, H, D, K, r = 2, 70, 4, 32, 6, 4
    q, k, w = exact_inputs(rng, (B, S, H, D), (B, S // r, D), (B, S, H))
    ids, logits, soft = ops.compact_indexer_topk(q, k, w, K, ratio=r, precision=precision, sm_scale=0.5)
    assert ids.shape == (B, S, K) and ids.dtype == np.int32
    for b in range(B):
        for t in range(S):
            n = min((t + 1) // r, S // r)
            ri, rl, rs = ref_indexer_row(q[b, t], k[b], w[b, t], n, K, 0.5)
            np.testing.assert_array_equal(ids[b, t], ri, err_msg=f"row {b},{t}")
            np.testing.assert_array_equal(logits[b, t], rl)
            np.testing.assert_allclose(soft[b, t], rs, rtol=1e-6, atol=1e-7)


def test_compact_indexer_thd_offsets_and_passes():
    rng = np.random.default_rng(5)
    H, D, K, r = 3, 32, 5, 4
    lens_q, lens_k, offs = [33, 1, 50], [20, 4, 12], [40, 0, 3]
    cu_q, cu_k = list(np.cumsum([0] + lens_q)), list(np.cumsum([0] + lens_k))
    q, k, w = exact_inputs(rng, (cu_q[-1], H, D), (cu_k[-1] + 7, D), (cu_q[-1], H))  # 7 unused rows
    one = ops.compact_indexer_topk(q, k, w, K, ratio=r, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                   q_causal_offsets=offs)
    chunked = ops.compact_indexer_topk(q, k, w, K, ratio=r, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                       q_causal_offsets=offs, rows_per_pass=7)
    for a, b in zip(one, chunked):
        np.testing.assert_array_equal(a, b)
    ids = one[0]
    for b in range(3):
        for t in range(lens_q[b]):
            n = int(np.clip((offs[b] + t + 1) // r, 0, lens_k[b]))
            row = cu_q[b] + t
            ri, _, _ = ref_indexer_row(q[row], k[cu_k[b]:cu_k[b + 1]], w[row], n, K, 1.0)
            np.testing.assert_array_equal(ids[row], ri, err_msg=f"segment {b} row {t}")
    with pytest.raises(csattn.Error):
        ops.compact_indexer_topk(q, k, w, K, cu_seqlens_q=cu_q)  # cu_seqlens_k missing
    with pytest.raises(csattn.Error, match="precision"):
        ops.compact_indexer_topk(q, k, w, K, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, precision="fp4")
