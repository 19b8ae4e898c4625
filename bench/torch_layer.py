#!/usr/bin/env python3
"""PyTorch eager reference of one DeepSeek-V4 hybrid attention layer (SWA / CSA / HCA).

The same semantics as csattn (../shared/spec/01-attention-math.md §2-§6, docs/numerics.md):
Q low-rank path, shared K=V head, interleaved-pair RoPE on the last rope_dim dims (plain for
SWA, YaRN with the compress base for ratio > 1), the gated-pooling compressors, the lightning
indexer with top-k (ties to the smallest index), sparse attention with a per-head sink,
inverse RoPE, grouped O projection, the indexer KL loss; packed THD batches (cu_seqlens and
padded cu_seqlens, everything restarts per segment). Written as a user's reference would be:
plain vectorised torch ops (gather the keys by index, masked softmax), bf16 activations and
weights with fp32 scores and softmaxes, autograd for the backward. No custom kernels.

Modes:
  time     CUDA timing of forward and forward+backward with random weights (table + JSON)
  export   write weights (attn.* release names) and inputs for `csattn run --weights --inputs`
  compare  run this forward (+ backward) on exported files and compare with `csattn run --save`

Examples:
  python3 bench/torch_layer.py time --preset flash --ratios 0,4,128 --tokens 4096,16384
  python3 bench/torch_layer.py export --preset small --ratio 4 --seqlens 100,37 \\
      --padded-seqlens 104,40 --weights-out w.st --inputs-out x.st
  build/csattn run --preset small --ratio 4 --weights w.st --inputs x.st --save y.st --dtype fp32
  python3 bench/torch_layer.py compare --weights w.st --inputs x.st --csattn y.st
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

# ---------------------------------------------------------------------------------------------
# Configuration (mirrors csattn::AttentionConfig / ModelConfig::preset, src/core/config.cpp)
# ---------------------------------------------------------------------------------------------


@dataclass
class Config:
    d_model: int = 256
    n_heads: int = 8
    head_dim: int = 64
    rope_dim: int = 16
    q_lora_rank: int = 128
    o_groups: int = 2
    o_lora_rank: int = 128
    window: int = 64
    index_n_heads: int = 8
    index_head_dim: int = 64
    index_topk: int = 32
    rope_theta: float = 10000.0
    compress_rope_theta: float = 40000.0
    yarn_factor: float = 4.0
    yarn_original_max_pos: int = 65536
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    norm_eps: float = 1e-6
    loss_coeff: float = 0.01
    sparse_loss: bool = True
    per_token_loss: bool = False
    compress_ratios: list = field(default_factory=lambda: [0, 4, 128])


def _flash_ratios():
    return [0, 0, 4] + [128, 4] * 20 + [0]


def _pro_ratios():
    return [128, 128, 4] + [128, 4] * 29 + [0]


PRESETS = {
    "tiny": dict(d_model=64, n_heads=4, head_dim=32, rope_dim=16, q_lora_rank=32, o_groups=2,
                 o_lora_rank=32, window=16, index_n_heads=4, index_head_dim=32, index_topk=8,
                 compress_ratios=[0, 4, 128]),
    "small": dict(d_model=256, n_heads=8, head_dim=64, rope_dim=16, q_lora_rank=128, o_groups=2,
                  o_lora_rank=128, window=64, index_n_heads=8, index_head_dim=64, index_topk=32,
                  compress_ratios=[0, 4, 128]),
    "flash": dict(d_model=4096, n_heads=64, head_dim=512, rope_dim=64, q_lora_rank=1024,
                  o_groups=8, o_lora_rank=1024, window=128, index_n_heads=64,
                  index_head_dim=128, index_topk=512, compress_ratios=_flash_ratios()),
    "pro": dict(d_model=7168, n_heads=128, head_dim=512, rope_dim=64, q_lora_rank=1536,
                o_groups=16, o_lora_rank=1024, window=128, index_n_heads=64,
                index_head_dim=128, index_topk=1024, compress_ratios=_pro_ratios()),
}


def preset_config(name: str) -> Config:
    if name not in PRESETS:
        raise SystemExit(f"unknown preset '{name}': expected one of {', '.join(PRESETS)}")
    return Config(**PRESETS[name])


def config_from_hf(obj: dict, base: Config) -> Config:
    """The keys of `csattn config` / a DeepSeek-V4 Hugging Face config.json."""
    c = dataclasses.replace(base)
    keys = {"hidden_size": "d_model", "num_attention_heads": "n_heads", "head_dim": "head_dim",
            "qk_rope_head_dim": "rope_dim", "q_lora_rank": "q_lora_rank",
            "o_groups": "o_groups", "o_lora_rank": "o_lora_rank", "sliding_window": "window",
            "index_n_heads": "index_n_heads", "index_head_dim": "index_head_dim",
            "index_topk": "index_topk", "rope_theta": "rope_theta",
            "compress_rope_theta": "compress_rope_theta", "rms_norm_eps": "norm_eps"}
    for k, attr in keys.items():
        if obj.get(k) is not None:
            setattr(c, attr, type(getattr(c, attr))(obj[k]))
    rs = obj.get("rope_scaling") or {}
    for k, attr in {"factor": "yarn_factor",
                    "original_max_position_embeddings": "yarn_original_max_pos",
                    "beta_fast": "yarn_beta_fast", "beta_slow": "yarn_beta_slow"}.items():
        if rs.get(k) is not None:
            setattr(c, attr, type(getattr(c, attr))(rs[k]))
    if obj.get("compress_ratios") is not None:
        c.compress_ratios = [0 if int(r) == 1 else int(r) for r in obj["compress_ratios"]]
    return c


def build_config(args) -> Config:
    cfg = preset_config(args.preset)
    if getattr(args, "config", None):
        with open(args.config) as f:
            cfg = config_from_hf(json.load(f), cfg)
    apply_overrides(cfg, args)
    return cfg


def apply_overrides(cfg: Config, args) -> None:
    if getattr(args, "topk", None) is not None:
        cfg.index_topk = args.topk
    if getattr(args, "window", None) is not None:
        cfg.window = args.window
    if getattr(args, "loss_coeff", None) is not None:
        cfg.loss_coeff = args.loss_coeff
    if getattr(args, "dense_loss", False):
        cfg.sparse_loss = False
    if getattr(args, "per_token_loss", False):
        cfg.per_token_loss = True


# ---------------------------------------------------------------------------------------------
# Parameters under the DeepSeek-V4 release names (src/core/weights.cpp, layer_params)
# ---------------------------------------------------------------------------------------------


def layer_params(cfg: Config, ratio: int):
    """[(name, shape, dtype)] of one layer; bf16 except attn.attn_sink and *.ape (fp32)."""
    bf, f32 = torch.bfloat16, torch.float32
    d, hd, qr = cfg.d_model, cfg.head_dim, cfg.q_lora_rank
    hD, g, ro = cfg.n_heads * hd, cfg.o_groups, cfg.o_lora_rank
    p = [("attn.wq_a.weight", (qr, d), bf), ("attn.q_norm.weight", (qr,), bf),
         ("attn.wq_b.weight", (hD, qr), bf), ("attn.wkv.weight", (hd, d), bf),
         ("attn.kv_norm.weight", (hd,), bf), ("attn.wo_a.weight", (g * ro, hD // g), bf),
         ("attn.wo_b.weight", (d, g * ro), bf), ("attn.attn_sink", (cfg.n_heads,), f32)]
    if ratio > 1:
        cw = (2 if ratio == 4 else 1) * hd
        p += [("attn.compressor.wkv.weight", (cw, d), bf),
              ("attn.compressor.wgate.weight", (cw, d), bf),
              ("attn.compressor.norm.weight", (hd,), bf),
              ("attn.compressor.ape", (ratio, cw), f32)]
    if ratio == 4:
        ih, idim = cfg.index_n_heads, cfg.index_head_dim
        p += [("attn.indexer.wq_b.weight", (ih * idim, qr), bf),
              ("attn.indexer.weights_proj.weight", (ih, d), bf),
              ("attn.indexer.compressor.wkv.weight", (2 * idim, d), bf),
              ("attn.indexer.compressor.wgate.weight", (2 * idim, d), bf),
              ("attn.indexer.compressor.norm.weight", (idim,), bf),
              ("attn.indexer.compressor.ape", (4, 2 * idim), f32)]
    return p


def init_moments(name: str, shape) -> tuple[float, float]:
    """csattn's LayerWeights::random scales: projections N(0, 1/fan_in), norm gains near 1,
    a clearly non-zero sink and ape."""
    if name == "attn.attn_sink" or name.endswith(".ape"):
        return 0.0, 0.5
    if name.endswith("norm.weight"):
        return 1.0, 0.1
    return 0.0, 1.0 / math.sqrt(shape[1])


def random_params(cfg: Config, ratio: int, seed: int, device) -> dict:
    """Random weights in their file dtypes (not csattn's values: its generator differs)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    out = {}
    for name, shape, dtype in layer_params(cfg, ratio):
        mean, std = init_moments(name, shape)
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std + mean
        out[name] = t.to(dtype)
    return out


# ---------------------------------------------------------------------------------------------
# Packed THD geometry
# ---------------------------------------------------------------------------------------------


class Geometry:
    """Per-row and per-compressed-entry metadata of a packed batch. Physical geometry comes
    from the padded cu_seqlens; the real ones only mark padding rows."""

    def __init__(self, cu, cu_padded, ratio: int, device):
        cu = [int(v) for v in cu]
        cup = [int(v) for v in cu_padded] if cu_padded is not None else list(cu)
        if len(cu) < 2 or len(cup) != len(cu):
            raise SystemExit("cu_seqlens needs B+1 >= 2 entries (and as many in the padded one)")
        B = len(cu) - 1
        seg_len = [cup[b + 1] - cup[b] for b in range(B)]
        real_len = [cu[b + 1] - cu[b] for b in range(B)]
        for b in range(B):
            if not 0 <= real_len[b] <= seg_len[b]:
                raise SystemExit(f"segment {b}: real length {real_len[b]} > padded {seg_len[b]}")
        self.ratio = ratio
        self.rows = cup[-1]
        self.real_rows = sum(real_len)
        n_comp = [(L // ratio) if ratio > 1 else 0 for L in seg_len]
        comp_start = [0]
        for n in n_comp:
            comp_start.append(comp_start[-1] + n)
        self.n_comp = n_comp
        self.max_comp = max(n_comp) if n_comp else 0
        self.comp_rows = comp_start[-1]
        kw = dict(device=device, dtype=torch.long)
        seg_start_t = torch.tensor(cup[:-1], **kw)
        seg = torch.repeat_interleave(torch.arange(B, **kw), torch.tensor(seg_len, **kw))
        self.row_seg = seg
        self.row_start = seg_start_t[seg]  # physical start of the row's segment
        self.row_pos = torch.arange(self.rows, **kw) - self.row_start
        self.row_pad = self.row_pos >= torch.tensor(real_len, **kw)[seg]
        self.row_comp_start = torch.tensor(comp_start[:-1], **kw)[seg]
        if ratio > 1:
            self.visible = torch.minimum((self.row_pos + 1) // ratio,
                                         torch.tensor(n_comp, **kw)[seg])
        else:
            self.visible = torch.zeros(self.rows, **kw)
        cseg = torch.repeat_interleave(torch.arange(B, **kw), torch.tensor(n_comp, **kw))
        self.comp_j = torch.arange(self.comp_rows, **kw) - torch.tensor(comp_start[:-1], **kw)[cseg]
        m = max(ratio, 1)
        # Block j of a segment owns its tokens j*m .. j*m+m-1 (physical row ids).
        self.comp_tok = (seg_start_t[cseg] + self.comp_j * m)[:, None] + torch.arange(m, **kw)
        self.comp_pos = self.comp_j * m  # RoPE position of entry j


# ---------------------------------------------------------------------------------------------
# Operators
# ---------------------------------------------------------------------------------------------


def rope_frequencies(cfg: Config, ratio: int) -> torch.Tensor:
    """omega_i (fp32): plain RoPE for SWA, YaRN with the compress base for ratio > 1."""
    dim, half = cfg.rope_dim, cfg.rope_dim // 2
    yarn = ratio > 1
    base = cfg.compress_rope_theta if yarn else cfg.rope_theta
    omega = [base ** (-2.0 * i / dim) for i in range(half)]
    if yarn:
        def corr(r):
            return dim * math.log(cfg.yarn_original_max_pos / (2 * math.pi * r)) / (2 * math.log(base))
        low = max(math.floor(corr(cfg.yarn_beta_fast)), 0.0)
        high = min(math.ceil(corr(cfg.yarn_beta_slow)), float(dim - 1))
        if low == high:
            high += 0.001
        out = []
        for i, extra in enumerate(omega):
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)
            out.append(extra / cfg.yarn_factor * ramp + extra * (1.0 - ramp))
        omega = out
    return torch.tensor(omega, dtype=torch.float64).to(torch.float32)


def rope_table(positions: torch.Tensor, omega: torch.Tensor, dtype):
    """cos/sin [N, rope_dim/2]: fp32 angles, cast to the activation dtype."""
    ang = positions.to(torch.float32)[:, None] * omega.to(positions.device)[None, :]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def rope(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dim: int, inverse=False):
    """Interleaved-pair rotation of the last rope_dim dims; cos/sin broadcast against
    v[..., rope_dim/2]. Products in fp32, one rounding to v's dtype."""
    nope, r = v[..., :-rope_dim], v[..., -rope_dim:]
    r = r.unflatten(-1, (-1, 2)).float()
    a, b = r[..., 0], r[..., 1]
    c, s = cos.float(), sin.float()
    if inverse:
        s = -s
    rot = torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2).to(v.dtype)
    return torch.cat((nope, rot), dim=-1)


def rmsnorm(v: torch.Tensor, weight, eps: float):
    """RMSNorm computed in fp32, rounded once; weight None = weightless."""
    vf = v.float()
    y = vf * torch.rsqrt(vf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(v.dtype)


_HADAMARD = {}


def hadamard(v: torch.Tensor):
    """Orthonormal Sylvester-Walsh-Hadamard transform of the last dim (fp32, one rounding)."""
    n = v.shape[-1]
    key = (n, v.device)
    if key not in _HADAMARD:
        h = torch.ones(1, 1, dtype=torch.float64)
        while h.shape[0] < n:
            h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
        if h.shape[0] != n:
            raise SystemExit(f"Hadamard size {n} is not a power of two")
        _HADAMARD[key] = (h / math.sqrt(n)).to(torch.float32).to(v.device)
    return (v.float() @ _HADAMARD[key]).to(v.dtype)


def compressor(x, P, prefix, geo: Geometry, d, cos_c, sin_c, cfg: Config, rotate: bool):
    """Gated pooling (per channel softmax over the slots), RMSNorm, RoPE at j*m, optional
    Hadamard. m = 4: entry j pools block j-1's A half and block j's B half (8 candidates)."""
    m = geo.ratio
    a = x @ P[prefix + "wkv.weight"].t()  # [T, coff*d] content
    g = x @ P[prefix + "wgate.weight"].t()  # [T, coff*d] gate logits
    ape = P[prefix + "ape"].float()  # [m, coff*d]
    tok = geo.comp_tok  # [Nc, m]
    if m == 4:
        prev = (tok - m).clamp(min=0)
        has_prev = (geo.comp_j > 0)[:, None, None]
        s_prev = (g[prev][..., :d].float() + ape[:, :d]).masked_fill(~has_prev, float("-inf"))
        s_cur = g[tok][..., d:].float() + ape[:, d:]
        scores = torch.cat((s_prev, s_cur), dim=1)  # [Nc, 8, d]
        vals = torch.cat((a[prev][..., :d], a[tok][..., d:]), dim=1)
    else:
        scores = g[tok].float() + ape  # [Nc, m, d]
        vals = a[tok]
    w = torch.softmax(scores, dim=1)
    pooled = (w * vals.float()).sum(dim=1).to(x.dtype)
    c = rmsnorm(pooled, P[prefix + "norm.weight"], cfg.norm_eps)
    c = rope(c, cos_c, sin_c, cfg.rope_dim)
    if rotate:
        c = hadamard(c)
    return c


def topk_select(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k of each row of fp32 scores (-inf = not visible): score descending, ties to the
    smallest index (stable sort); invisible picks become -1; each row is written in ascending
    index order followed by -1 padding (csattn's convention). Returns int32 [rows, k]."""
    rows, n = scores.shape
    out = torch.full((rows, k), -1, dtype=torch.int32, device=scores.device)
    ke = min(k, n)
    if ke == 0 or rows == 0:
        return out
    vals, idx = torch.sort(scores, dim=1, descending=True, stable=True)
    vals, idx = vals[:, :ke], idx[:, :ke]
    idx = torch.where(torch.isneginf(vals), torch.full_like(idx, n), idx)
    idx = torch.sort(idx, dim=1).values  # ascending, the -1 markers (n) last
    out[:, :ke] = torch.where(idx == n, torch.full_like(idx, -1), idx).to(torch.int32)
    return out


def index_scores(qi, w, keys):
    """I[t, j] = sum_h w[t,h] ReLU(qI[t,h] . K[j]) in fp32 from the stored operands.
    qi [r, HI, DI], w [r, HI], keys [n, DI] -> [r, n]."""
    dots = torch.einsum("thd,jd->thj", qi.float(), keys.float())
    return torch.einsum("th,thj->tj", w.float(), torch.relu(dots))


@dataclass
class LayerOut:
    output: torch.Tensor
    topk: torch.Tensor | None
    indexer_loss: torch.Tensor


def layer_forward(cfg: Config, ratio: int, P: dict, x: torch.Tensor, geo: Geometry,
                  forced_topk: torch.Tensor | None = None, chunk_elems: int = 1 << 28) -> LayerOut:
    """One layer's forward on a packed batch. x [T, d_model] in the compute dtype; P holds the
    parameters (bf16 ones in the compute dtype, ape and sink fp32). Autograd gives the
    backward: the indexer sees detached x and c and is trained only by its loss."""
    T, dt = x.shape[0], x.dtype
    H, D, rd = cfg.n_heads, cfg.head_dim, cfg.rope_dim
    dev = x.device
    omega = rope_frequencies(cfg, ratio)
    cos_t, sin_t = rope_table(geo.row_pos, omega, dt)  # [T, rd/2]

    # Query path: down-projection, RMSNorm, up-projection, weightless per-head RMS, RoPE.
    cq = rmsnorm(x @ P["attn.wq_a.weight"].t(), P["attn.q_norm.weight"], cfg.norm_eps)
    q = (cq @ P["attn.wq_b.weight"].t()).view(T, H, D)
    q = rope(rmsnorm(q, None, cfg.norm_eps), cos_t[:, None], sin_t[:, None], rd)
    # The shared K=V head.
    kv = rmsnorm(x @ P["attn.wkv.weight"].t(), P["attn.kv_norm.weight"], cfg.norm_eps)
    kv = rope(kv, cos_t, sin_t, rd)

    if ratio > 1:
        cos_c, sin_c = rope_table(geo.comp_pos, omega, dt)
        comp = compressor(x, P, "attn.compressor.", geo, D, cos_c, sin_c, cfg, rotate=False)
    else:
        comp = kv.new_zeros((0, D))

    # Key ids per row into kv_full = [kv (T rows); comp (all segments' entries)]; -1 = none.
    W = cfg.window
    s = geo.row_pos[:, None] - W + 1 + torch.arange(W, device=dev)
    win_ids = torch.where(s >= 0, geo.row_start[:, None] + s, torch.full_like(s, -1))
    topk = None
    if ratio == 4:
        HI, DI, K = cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk
        xd, cqd = x.detach(), cq.detach()
        qi = (cqd @ P["attn.indexer.wq_b.weight"].t()).view(T, HI, DI)
        qi = hadamard(rope(qi, cos_t[:, None], sin_t[:, None], rd))
        wI = xd @ P["attn.indexer.weights_proj.weight"].t()
        wI = (wI * (1.0 / math.sqrt(HI))) * (1.0 / math.sqrt(DI))  # two roundings in bf16
        keysI = compressor(xd, P, "attn.indexer.compressor.", geo, DI, cos_c, sin_c, cfg,
                           rotate=True)
        if forced_topk is not None:
            topk = forced_topk.to(device=dev, dtype=torch.int32)
        else:
            topk = torch.full((T, K), -1, dtype=torch.int32, device=dev)
            with torch.no_grad():
                for b, nc in enumerate(geo.n_comp):
                    if nc == 0:
                        continue
                    rows = (geo.row_seg == b).nonzero().flatten()
                    c0 = int(geo.row_comp_start[rows[0]])
                    kb = keysI[c0:c0 + nc]
                    step = max(1, chunk_elems // max(1, HI * nc))
                    for r0 in range(0, rows.numel(), step):
                        rr = rows[r0:r0 + step]
                        sc = index_scores(qi[rr], wI[rr], kb)
                        vis = torch.where(geo.row_pad[rr], 0, geo.visible[rr])
                        j = torch.arange(nc, device=dev)
                        sc = sc.masked_fill(j[None, :] >= vis[:, None], float("-inf"))
                        topk[rr] = topk_select(sc, K)
        sel = topk.long()
        comp_ids = torch.where(sel >= 0, T + geo.row_comp_start[:, None] + sel,
                               torch.full_like(sel, -1))
    elif ratio == 128:
        j = torch.arange(geo.max_comp, device=dev)
        comp_ids = torch.where(j[None, :] < geo.visible[:, None],
                               T + geo.row_comp_start[:, None] + j[None, :],
                               torch.full((T, geo.max_comp), -1, dtype=torch.long, device=dev))
    else:
        comp_ids = win_ids.new_zeros((T, 0))
    ids = torch.cat((win_ids, comp_ids), dim=1)  # [T, W + n_comp_keys]
    valid = ids >= 0

    # Sparse attention with the sink: gather keys, fp32 logits, masked softmax with a
    # zero-value sink logit per head.
    scale = 1.0 / math.sqrt(D)
    kv_full = torch.cat((kv, comp), dim=0).float()
    keys = kv_full[ids.clamp(min=0)]  # [T, nk, D] (K = V)
    logits = torch.bmm(q.float(), keys.transpose(1, 2)) * scale  # [T, H, nk]
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    sink = P["attn.attn_sink"].float().view(1, H, 1).expand(T, H, 1)
    probs = torch.softmax(torch.cat((logits, sink), dim=-1), dim=-1)[..., :-1]
    o = torch.bmm(probs, keys).to(dt)  # [T, H, D]

    loss = torch.zeros((), dtype=torch.float32, device=dev)
    if ratio == 4 and cfg.loss_coeff > 0:
        loss = indexer_loss(cfg, geo, q, kv_full, comp, sink, logits, topk, qi, wI, keysI,
                            chunk_elems)

    # Inverse RoPE, grouped low-rank O projection, output projection.
    o = rope(o, cos_t[:, None], sin_t[:, None], rd, inverse=True)
    G, ro = cfg.o_groups, cfg.o_lora_rank
    woa = P["attn.wo_a.weight"].view(G, ro, H * D // G)
    u = torch.einsum("tgi,gri->tgr", o.reshape(T, G, H * D // G), woa).reshape(T, G * ro)
    y = u @ P["attn.wo_b.weight"].t()
    return LayerOut(y, topk, loss)


def indexer_loss(cfg, geo, q, kv_full, comp, sink, logits, topk, qi, wI, keysI, chunk_elems):
    """KL(teacher || predictor) over the candidates S_t (top-k or all visible). Teacher: the
    main attention's per-head probabilities with the full CSA denominator (sink + window +
    S_t), detached, head-summed, L1-normalised; predictor: softmax of the index scores."""
    T, H, D = q.shape
    dev = q.device
    W = cfg.window
    tiny = torch.finfo(torch.float32).tiny
    with torch.no_grad():
        if cfg.sparse_loss:
            # S_t = the selection, i.e. the attention's own compressed columns.
            cand = topk.long()
            lse = torch.logsumexp(torch.cat((logits, sink), dim=-1), dim=-1)  # [T, H]
            teach = torch.exp(logits[..., W:] - lse[..., None]).sum(dim=1)  # [T, K]
        else:
            # S_t = all visible entries: denominator = sink + window + every visible entry.
            j = torch.arange(geo.max_comp, device=dev)
            vis = torch.where(geo.row_pad, 0, geo.visible)
            cand = torch.where(j[None, :] < vis[:, None], j[None, :],
                               torch.full((T, geo.max_comp), -1, dtype=torch.long, device=dev))
            lse_ws = torch.logsumexp(torch.cat((logits[..., :W], sink), dim=-1), dim=-1)
            teach = torch.zeros((T, geo.max_comp), dtype=torch.float32, device=dev)
            step = max(1, chunk_elems // max(1, H * max(geo.max_comp, 1) * 2))
            compf = comp.float()
            for r0 in range(0, T, step):
                sl = slice(r0, r0 + step)
                c = cand[sl]
                kc = compf[(geo.row_comp_start[sl, None] + c.clamp(min=0))]  # [r, S, D]
                z = torch.bmm(q[sl].float(), kc.transpose(1, 2)) / math.sqrt(D)
                z = z.masked_fill((c < 0)[:, None, :], float("-inf"))
                lse = torch.logaddexp(lse_ws[sl], torch.logsumexp(z, dim=-1))
                teach[sl] = torch.exp(z - lse[..., None]).sum(dim=1)
        valid = cand >= 0
        teach = torch.where(valid, teach, torch.zeros_like(teach))
        teach = teach / teach.sum(dim=-1, keepdim=True).clamp(min=tiny)

    # Predictor (trains the indexer only: qi, wI, keysI come from detached inputs).
    kI = keysI[geo.row_comp_start[:, None] + cand.clamp(min=0)]  # [T, S, DI]
    dots = torch.einsum("thd,tsd->ths", qi.float(), kI.float())
    scores = torch.einsum("th,ths->ts", wI.float(), torch.relu(dots))
    scores = scores.masked_fill(~valid, -1e30)  # finite: rows without candidates stay NaN-free
    logp = torch.log_softmax(scores, dim=-1)
    kl = torch.where(valid, teach * (torch.log(teach.clamp(min=1e-10)) - logp),
                     torch.zeros_like(logp)).sum()
    if cfg.per_token_loss:
        return cfg.loss_coeff * kl
    return kl * (cfg.loss_coeff / geo.real_rows) if geo.real_rows > 0 else kl * 0.0


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def pick_device(name: str | None) -> torch.device:
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def compute_params(P: dict, dtype, device, requires_grad=False) -> dict:
    """File-dtype parameters -> compute parameters: bf16 ones in `dtype`, fp32 ones fp32."""
    out = {}
    for name, t in P.items():
        t = t.to(device)
        t = t.float() if t.dtype == torch.float32 else t.to(dtype)
        out[name] = t.detach().requires_grad_(requires_grad)
    return out


def int_list(s: str) -> list:
    return [int(v) for v in s.split(",") if v.strip() != ""]


def sims(a: torch.Tensor, b: torch.Tensor) -> dict:
    """cosine, tensor similarity 2<a,b>/(|a|^2+|b|^2), max abs diff, max diff / max |b|."""
    a, b = a.double().flatten(), b.double().flatten()
    aa, bb, ab = float(a @ a), float(b @ b), float(a @ b)
    den = math.sqrt(aa * bb)
    diff = float((a - b).abs().max()) if a.numel() else 0.0
    ref = float(b.abs().max()) if b.numel() else 0.0
    return {"cosine": ab / den if den > 0 else (1.0 if aa == bb else 0.0),
            "tensor_sim": 2 * ab / (aa + bb) if aa + bb > 0 else 1.0,
            "max_abs_diff": diff, "max_rel_diff": diff / ref if ref > 0 else diff}


# ---------------------------------------------------------------------------------------------
# Mode: time
# ---------------------------------------------------------------------------------------------


class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def median_ms(self, fn, warmup: int, iters: int) -> float:
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(iters):
            if self.cuda:
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def is_oom(e: BaseException) -> bool:
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(e, (RuntimeError, MemoryError)) and (
        isinstance(e, MemoryError) or "out of memory" in str(e).lower()
        or "CUBLAS_STATUS_ALLOC_FAILED" in str(e))


def time_case(cfg, ratio, tokens, dtype, device, args) -> dict:
    res = {"ratio": ratio, "kind": {0: "SWA", 4: "CSA", 128: "HCA"}[ratio], "tokens": tokens}
    cuda = device.type == "cuda"
    timer = Timer(device)
    P = compute_params(random_params(cfg, ratio, args.seed, device), dtype, device,
                       requires_grad=True)
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed + 1)
    x = torch.randn((tokens, cfg.d_model), generator=gen, device=device).to(dtype)
    gy = torch.randn((tokens, cfg.d_model), generator=gen, device=device).to(dtype)
    x.requires_grad_(True)
    geo = Geometry([0, tokens], None, ratio, device)
    if cuda:
        torch.cuda.synchronize()
        res["base_mem_gib"] = torch.cuda.memory_allocated() / 2**30

    def fwd():
        with torch.no_grad():
            return layer_forward(cfg, ratio, P, x, geo, chunk_elems=args.chunk_elems)

    def fwd_bwd():
        for t in list(P.values()) + [x]:
            t.grad = None
        out = layer_forward(cfg, ratio, P, x, geo, chunk_elems=args.chunk_elems)
        tensors, grads = [out.output], [gy]
        if out.indexer_loss.requires_grad:
            tensors.append(out.indexer_loss)
            grads.append(torch.ones_like(out.indexer_loss))
        torch.autograd.backward(tensors, grads)

    for key, fn in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
        failed = None
        try:
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            res[key + "_ms"] = timer.median_ms(fn, args.warmup, args.iters)
            if cuda:
                res[key + "_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        except Exception as e:  # noqa: BLE001 - OOM is reported, everything else re-raised
            if not is_oom(e):
                raise
            failed = "OOM"
        if failed:  # out of the except block so its frames (and tensors) are released
            res[key + "_ms"] = None
            res[key + "_error"] = failed
            for t in list(P.values()) + [x]:
                t.grad = None
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    if res.get("fwd_ms"):
        res["fwd_tokens_per_s"] = tokens / (res["fwd_ms"] / 1e3)
    del P, x, gy
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return res


def cmd_time(args) -> int:
    cfg = build_config(args)
    device = pick_device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    cases = []
    t_all = time.perf_counter()
    for ratio in int_list(args.ratios):
        for tokens in int_list(args.tokens):
            t0 = time.perf_counter()
            r = time_case(cfg, ratio, tokens, dtype, device, args)
            r["wall_s"] = time.perf_counter() - t0
            cases.append(r)
            print(f"torch_layer: {r['kind']} {tokens} tokens done in {r['wall_s']:.1f} s",
                  file=sys.stderr, flush=True)
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "preset": args.preset, "dtype": args.dtype,
              "warmup": args.warmup, "iters": args.iters,
              "config": dataclasses.asdict(cfg) | {"compress_ratios": None},
              "cases": cases, "total_s": time.perf_counter() - t_all}

    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    print(f"PyTorch eager layer, {report['device']}, torch {torch.__version__}, preset "
          f"{args.preset}, {args.dtype}, median of {args.iters} after {args.warmup} warm-ups")
    print(f"{'layer':<5} {'tokens':>7} {'fwd ms':>10} {'fwd+bwd ms':>11} {'fwd peak GiB':>13} "
          f"{'f+b peak GiB':>13} {'fwd tok/s':>12}")
    for r in cases:
        fwd = "OOM" if r.get("fwd_error") else fmt(r.get("fwd_ms"), ".2f")
        fb = "OOM" if r.get("fwd_bwd_error") else fmt(r.get("fwd_bwd_ms"), ".2f")
        print(f"{r['kind']:<5} {r['tokens']:>7} {fwd:>10} {fb:>11} "
              f"{fmt(r.get('fwd_peak_gib'), '.2f'):>13} {fmt(r.get('fwd_bwd_peak_gib'), '.2f'):>13} "
              f"{fmt(r.get('fwd_tokens_per_s'), ',.0f'):>12}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
    return 0


# ---------------------------------------------------------------------------------------------
# Mode: export
# ---------------------------------------------------------------------------------------------


def cmd_export(args) -> int:
    from safetensors.torch import save_file

    cfg = build_config(args)
    ratio = args.ratio
    lens = int_list(args.seqlens)
    padded = int_list(args.padded_seqlens) if args.padded_seqlens else None
    if padded is not None and (len(padded) != len(lens) or any(p < l for p, l in zip(padded, lens))):
        raise SystemExit("--padded-seqlens needs one entry per sequence, each >= its real length")
    cu, cup = [0], [0]
    for i, L in enumerate(lens):
        cu.append(cu[-1] + L)
        cup.append(cup[-1] + (padded[i] if padded else L))
    T = cup[-1]
    cpu = torch.device("cpu")
    P = random_params(cfg, ratio, args.seed, cpu)
    meta = {"torch_layer.preset": args.preset, "torch_layer.ratio": str(ratio),
            "torch_layer.seed": str(args.seed)}
    save_file({k: v.contiguous() for k, v in P.items()}, args.weights_out, metadata=meta)
    gen = torch.Generator().manual_seed(args.seed + 1)
    act = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.input_dtype]
    inputs = {"hidden_states": torch.randn((T, cfg.d_model), generator=gen).to(act),
              "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
              "grad_output": torch.randn((T, cfg.d_model), generator=gen).to(act)}
    if padded is not None:
        inputs["cu_seqlens_padded"] = torch.tensor(cup, dtype=torch.int32)
    save_file(inputs, args.inputs_out, metadata=meta)
    print(f"wrote {args.weights_out} ({len(P)} tensors, ratio {ratio}) and {args.inputs_out} "
          f"({T} rows, {len(lens)} sequences)")
    return 0


# ---------------------------------------------------------------------------------------------
# Mode: compare
# ---------------------------------------------------------------------------------------------


def load_st(path):
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, (f.metadata() or {})


def cmd_compare(args) -> int:
    W, wmeta = load_st(args.weights)
    X, _ = load_st(args.inputs)
    R, rmeta = load_st(args.csattn)

    # Config: --config / --preset if given, else the csattn.config the --save file carries.
    if args.config or args.preset:
        args.preset = args.preset or "small"
        cfg = build_config(args)
    else:
        base = preset_config(wmeta.get("torch_layer.preset", "small"))
        if "csattn.config" in rmeta:
            base = config_from_hf(json.loads(rmeta["csattn.config"]), base)
        cfg = base
        apply_overrides(cfg, args)
    if args.ratio is not None:
        ratio = args.ratio
    elif "csattn.compress_ratios" in rmeta and "," not in rmeta["csattn.compress_ratios"]:
        ratio = int(rmeta["csattn.compress_ratios"])
    elif "torch_layer.ratio" in wmeta:
        ratio = int(wmeta["torch_layer.ratio"])
    else:
        raise SystemExit("cannot tell the layer's ratio: pass --ratio")
    dtype_name = args.dtype or rmeta.get("csattn.precision", "bf16")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    device = pick_device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False

    want = {n for n, _, _ in layer_params(cfg, ratio)}
    if set(W) != want:
        raise SystemExit(f"--weights: tensors {sorted(set(W) ^ want)} do not match ratio {ratio}")
    if "output" not in R:
        multi = sorted({".".join(k.split(".")[:2]) for k in R if k.startswith(("layers.", "mtp."))})
        raise SystemExit(f"--csattn: no 'output' tensor (layers in the file: {multi}); run csattn "
                         "with one layer (--ratio R --weights W)")
    P = compute_params(W, dtype, device, requires_grad=True)
    cup = X.get("cu_seqlens_padded")
    geo = Geometry(X["cu_seqlens"].tolist(), cup.tolist() if cup is not None else None, ratio,
                   device)
    x = X["hidden_states"].to(device=device, dtype=dtype).requires_grad_(True)
    forced = None
    if args.use_csattn_topk and ratio == 4:
        forced = R["topk_indices"]
    t0 = time.perf_counter()
    out = layer_forward(cfg, ratio, P, x, geo, forced_topk=forced)
    fwd_s = time.perf_counter() - t0
    report = {"ratio": ratio, "dtype": dtype_name, "rows": geo.rows, "real_rows": geo.real_rows,
              "forward_s": fwd_s}
    report["output"] = sims(out.output.detach().cpu(), R["output"])
    real = ~geo.row_pad.cpu()
    report["output_real_rows"] = sims(out.output.detach().cpu()[real], R["output"][real])
    if ratio == 4:
        mine, theirs = out.topk.cpu().long(), R["topk_indices"].long()
        same = (mine.sort(dim=1).values == theirs.sort(dim=1).values).all(dim=1)
        report["topk_rows_equal"] = float(same.float().mean())
        report["topk_rows_differing"] = int((~same).sum())
        report["topk_forced_from_csattn"] = forced is not None
    lt, lc = float(out.indexer_loss.detach()), float(R["indexer_loss"]) if "indexer_loss" in R else 0.0
    report["indexer_loss"] = {"torch": lt, "csattn": lc,
                              "rel_diff": abs(lt - lc) / abs(lc) if lc else abs(lt - lc)}

    grads_ok = True
    if "grad.hidden_states" in R and not args.no_backward:
        gy = X.get("grad_output")
        if gy is None:
            raise SystemExit("--inputs has no grad_output: csattn drew a random one; cannot "
                             "compare gradients (pass --no-backward)")
        t0 = time.perf_counter()
        tensors, grads = [out.output], [gy.to(device=device, dtype=out.output.dtype)]
        if out.indexer_loss.requires_grad:
            tensors.append(out.indexer_loss)
            grads.append(torch.ones_like(out.indexer_loss))
        torch.autograd.backward(tensors, grads)
        report["backward_s"] = time.perf_counter() - t0
        g = {"hidden_states": sims(x.grad.cpu(), R["grad.hidden_states"])}
        for name in sorted(P):
            mine = P[name].grad
            mine = torch.zeros_like(P[name]) if mine is None else mine
            g[name] = sims(mine.detach().cpu(), R["grad." + name])
        report["grads"] = g
        worst = min(v["cosine"] for v in g.values())
        report["worst_grad_cosine"] = worst
        grads_ok = worst >= 1 - args.grad_tol

    o = report["output"]
    print(f"compare ratio {ratio} ({dtype_name}), {geo.rows} rows ({geo.real_rows} real), "
          f"forward {fwd_s:.2f} s")
    print(f"  output         cosine 1-{1 - o['cosine']:.3e}  tensor_sim 1-{1 - o['tensor_sim']:.3e}"
          f"  max_abs_diff {o['max_abs_diff']:.3e}  max_rel_diff {o['max_rel_diff']:.3e}")
    if ratio == 4:
        print(f"  top-k          rows with identical sets {report['topk_rows_equal']:.6f} "
              f"({report['topk_rows_differing']} differ)"
              + (" [csattn's top-k forced]" if forced is not None else ""))
    il = report["indexer_loss"]
    print(f"  indexer_loss   torch {il['torch']:.9g}  csattn {il['csattn']:.9g}  "
          f"rel_diff {il['rel_diff']:.3e}")
    if "grads" in report:
        print(f"  gradients      worst cosine 1-{1 - report['worst_grad_cosine']:.3e}")
        for name, v in report["grads"].items():
            if args.verbose or v["cosine"] < 1 - args.grad_tol:
                print(f"    {name:<42} cosine 1-{1 - v['cosine']:.3e}  "
                      f"max_rel_diff {v['max_rel_diff']:.3e}")
    ok = o["cosine"] >= 1 - args.tol
    report["pass"] = ok and (grads_ok or not args.check_grads)
    print("  PASS" if report["pass"] else "  FAIL", f"(output cosine >= 1-{args.tol:g}"
          + (f", grad cosine >= 1-{args.grad_tol:g}" if args.check_grads else "") + ")")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if report["pass"] else 1


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def add_config_args(p, preset_default="small"):
    p.add_argument("--preset", default=preset_default, choices=list(PRESETS),
                   help=f"model dimensions (default {preset_default})")
    p.add_argument("--config", help="DeepSeek-V4 HF config.json (e.g. `csattn config` output)")
    p.add_argument("--topk", type=int, help="indexer top-k K")
    p.add_argument("--window", type=int, help="sliding window W")
    p.add_argument("--loss-coeff", type=float, help="indexer KL loss coefficient (default 0.01)")
    p.add_argument("--dense-loss", action="store_true", help="KL over all visible entries")
    p.add_argument("--per-token-loss", action="store_true", help="sum the KL instead of the mean")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)

    t = sub.add_parser("time", help="time forward and forward+backward (CUDA events)")
    add_config_args(t, "flash")
    t.add_argument("--ratios", default="0,4,128", help="comma list (default 0,4,128)")
    t.add_argument("--tokens", default="4096,16384", help="comma list (default 4096,16384)")
    t.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    t.add_argument("--warmup", type=int, default=3)
    t.add_argument("--iters", type=int, default=10)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--json-out", help="write the results as JSON")

    e = sub.add_parser("export", help="write weights and inputs for csattn run")
    add_config_args(e, "small")
    e.add_argument("--ratio", type=int, required=True, choices=[0, 4, 128])
    e.add_argument("--seqlens", required=True, help="real lengths, comma list")
    e.add_argument("--padded-seqlens", help="physical lengths, comma list")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--input-dtype", default="bf16", choices=["bf16", "fp32"],
                   help="dtype of hidden_states and grad_output (default bf16)")
    e.add_argument("--weights-out", required=True)
    e.add_argument("--inputs-out", required=True)

    c = sub.add_parser("compare", help="compare with a csattn run --save file")
    add_config_args(c, None)
    c.add_argument("--ratio", type=int, choices=[0, 4, 128],
                   help="default: from the --csattn file's metadata")
    c.add_argument("--weights", required=True)
    c.add_argument("--inputs", required=True)
    c.add_argument("--csattn", required=True, help="the file `csattn run --save` wrote")
    c.add_argument("--dtype", choices=["bf16", "fp32"], help="default: csattn's precision")
    c.add_argument("--use-csattn-topk", action="store_true",
                   help="attend csattn's selection (isolates the rest from top-k flips)")
    c.add_argument("--no-backward", action="store_true", help="skip the gradient comparison")
    c.add_argument("--tol", type=float, default=2e-3, help="fail if output cosine < 1 - tol")
    c.add_argument("--grad-tol", type=float, default=3e-3)
    c.add_argument("--check-grads", action="store_true",
                   help="also fail if a gradient's cosine < 1 - grad-tol")
    c.add_argument("--verbose", "-v", action="store_true", help="print every gradient")
    c.add_argument("--json-out")

    for p in (t, e, c):
        p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
        p.add_argument("--threads", type=int, default=0, help="CPU threads (0 = torch default)")
        p.add_argument("--chunk-elems", type=int, default=1 << 28,
                       help="row chunking of the top-k scoring (elements per chunk)")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    return {"time": cmd_time, "export": cmd_export, "compare": cmd_compare}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
