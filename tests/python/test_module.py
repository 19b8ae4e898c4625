"""The Python package against the fp64 oracle and against itself: forward (fp32 tight, bf16
under the similarity gate), backward by central differences of the oracle, packed batches
equal to their segments alone, padding rows that change nothing, weights I/O, and a clear
csattn.Error for every bad input. Layers are the tiny preset's (SWA, CSA, HCA) on ragged,
padded batches drawn fresh from a seed per test."""
import numpy as np
import pytest

import csattn

def tiny(kind):
    """A fresh config (tests may change fields) of the tiny preset's SWA, CSA or HCA layer."""
    return {c.kind: c for c in csattn.preset_layers("tiny")}[kind]


LENGTHS, PADDED = [37, 5, 70, 1], [40, 8, 72, 1]  # ragged, with padding rows, a 1-row tail
# HCA compresses blocks of 128: sequences long enough for one and for two entries.
HCA_LENGTHS, HCA_PADDED = [131, 260, 3], [132, 262, 3]


def layout_for(kind):
    return (HCA_LENGTHS, HCA_PADDED) if kind == "HCA" else (LENGTHS, PADDED)


def cu(lengths):
    return [0] + list(np.cumsum(lengths))


def batch(cfg, seed, lengths=LENGTHS, padded=PADDED):
    rng = np.random.default_rng(seed)
    T = sum(padded)
    return rng.standard_normal((T, cfg.d_model)).astype(np.float32), cu(lengths), cu(padded)


def real_rows(lengths=LENGTHS, padded=PADDED):
    start = np.cumsum([0] + padded[:-1])
    return np.concatenate([np.arange(s, s + n) for s, n in zip(start, lengths)])


def cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_version_and_build_info():
    """__version__ is CMakeLists.txt's project version (pyproject.toml reads it from there);
    build_info() has the keys of `csattn info --json` and agrees with cuda_available()."""
    import pathlib
    import re
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = pathlib.Path(__file__).parents[2]
    # pyproject.toml's own version rule (scikit-build-core's regex provider) on CMakeLists.txt
    rule = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["scikit-build"]["metadata"]["version"]
    assert rule["input"] == "CMakeLists.txt"
    found = re.search(rule["regex"], (root / rule["input"]).read_text())
    assert found and csattn.__version__ == found.group("value")
    info = csattn.build_info()
    assert info["version"] == csattn.__version__
    assert set(info) == {"version", "cuda_backend", "cuda_target", "cuda_runtime_version",
                         "cuda_driver_version", "nccl", "mpi", "cblas", "cpu_threads", "gpus",
                         "gpu_note"}
    assert info["mpi"] == csattn.mpi_available() and info["nccl"] == csattn.nccl_available()
    assert bool(info["gpus"]) == csattn.cuda_available()[0]
    assert bool(info["gpus"]) != bool(info["gpu_note"])


def test_plan_device_memory():
    """The GPU layer's memory planned without a GPU: the totals are the sums of the parts and
    grow with the rows; without the CUDA backend it says so."""
    cfg = csattn.preset_layers("flash")[2]  # CSA
    if not csattn.build_info()["cuda_backend"]:
        with pytest.raises(csattn.Error, match="CUDA backend"):
            csattn.plan_device_memory(cfg, 4096, 1, 4096)
        return
    small = csattn.plan_device_memory(cfg, 4096, 1, 4096)
    big = csattn.plan_device_memory(cfg, 8192, 2, 4096, deterministic=True)
    for p in (small, big):
        assert p["training_step"] == p["weights"] + p["forward_workspace"] + p["backward_workspace"]
        assert p["forward_only"] == p["weights"] + p["forward_workspace"]
        assert 0 < p["weight_gradients"] < p["backward_workspace"]
    assert big["weights"] == small["weights"]
    assert big["forward_workspace"] > small["forward_workspace"]
    with pytest.raises(csattn.Error, match="rows"):
        csattn.plan_device_memory(cfg, 100, 2, 10)
    # Context parallel over 4 GPUs: each rank about a quarter of the one-GPU workspaces.
    one = csattn.plan_device_memory(cfg, 32768, 1, 32768)
    part = csattn.CpPartition.build([0, 32768], None, "two_chunk", 4)
    ranks = csattn.plan_cp_device_memory(cfg, part)
    assert len(ranks) == 4
    for r in ranks:
        assert r["context_parallel"] > 0 and r["weights"] == one["weights"]
        assert r["training_step"] == (r["weights"] + r["forward_workspace"] + r["context_parallel"]
                                      + r["backward_workspace"])
        assert one["forward_workspace"] / 5 < r["forward_workspace"] < one["forward_workspace"] / 3


def test_presets_and_config():
    assert csattn.preset_names() == ["tiny", "small", "flash", "pro"]
    assert [c.kind for c in csattn.preset_layers("tiny")] == ["SWA", "CSA", "HCA"]
    flash = csattn.preset_layers("flash")
    assert len(flash) == 44 and flash[2].kind == "CSA" and flash[2].index_topk == 512
    cfg = csattn.AttentionConfig()
    cfg.compress_ratio = 4
    assert cfg.kind == "CSA"
    cfg.indexer_precision = "mxfp8"
    assert cfg.indexer_precision == "mxfp8"
    cfg.validate()
    cfg.rope_dim = cfg.head_dim + 2
    with pytest.raises(csattn.Error, match="rope_dim"):
        cfg.validate()
    with pytest.raises(csattn.Error, match="indexer_precision"):
        cfg.indexer_precision = "fp4"
    with pytest.raises(csattn.Error, match="unknown preset"):
        csattn.preset_layers("huge")


@pytest.mark.parametrize("kind", ["SWA", "CSA", "HCA"])
def test_fp32_forward_matches_the_oracle(kind):
    cfg = tiny(kind)
    layer = csattn.Layer(cfg, seed=3, precision="fp32")
    x, c, cp = batch(cfg, 4, *layout_for(kind))
    fwd = layer.forward(x, c, cp)
    out = fwd.output
    assert out.shape == x.shape and out.dtype == np.float32 and np.isfinite(out).all()
    ref = csattn.oracle_forward(cfg, layer.weights, x, c, cp, topk=fwd.topk)
    scale = np.abs(ref["output"]).max()
    assert np.abs(out - ref["output"]).max() <= 2e-5 * scale
    if kind == "CSA":
        own = csattn.oracle_forward(cfg, layer.weights, x, c, cp)  # the oracle's own selection
        same = (own["topk"] == fwd.topk).all(axis=1)
        assert same.mean() >= 0.95, f"{(~same).sum()} rows select differently"
        assert fwd.indexer_loss > 0
        assert fwd.indexer_loss == pytest.approx(ref["indexer_loss"], rel=1e-4)
        k = fwd.topk
        assert k.shape == (x.shape[0], cfg.index_topk) and k.dtype == np.int32
        for row in k:  # ascending valid ids, then -1
            valid = row[row >= 0]
            assert (np.diff(valid) > 0).all() and (row[len(valid):] == -1).all()
    else:
        assert fwd.topk is None and fwd.indexer_loss == 0.0


@pytest.mark.parametrize("kind", ["SWA", "CSA", "HCA"])
def test_bf16_forward_is_close_to_the_oracle(kind):
    cfg = tiny(kind)
    layer = csattn.Layer(cfg, seed=5)  # bf16 by default
    assert layer.precision == "bf16" and layer.device == "cpu"
    x, c, cp = batch(cfg, 6, *layout_for(kind))
    fwd = layer.forward(x, c, cp)
    ref = csattn.oracle_forward(cfg, layer.weights, x, c, cp, topk=fwd.topk)
    rows = real_rows(*layout_for(kind))
    assert cosine(fwd.output[rows], ref["output"][rows]) > 1 - 1.5e-3


def oracle_objective(cfg, weights, x, c, cp, topk, gy, loss_weight):
    r = csattn.oracle_forward(cfg, weights, x, c, cp, topk=topk)
    return float((r["output"] * gy).sum()) + loss_weight * r["indexer_loss"]


def assert_directional(grad, step, fd, what):
    """<grad, step> against a central difference fd along step: 1e-4 relative, plus 2e-6 of
    sum |grad * step| for the rounding of a float32 gradient (agreement seen: ~1e-5; a 1%
    error in the gradient fails)."""
    terms = grad.astype(np.float64) * step
    an = float(terms.sum())
    tol = 1e-4 * abs(fd) + 2e-6 * float(np.abs(terms).sum()) + 1e-15
    assert abs(an - fd) <= tol, f"{what}: analytic {an:.9e}, central difference {fd:.9e}"


def weights_with(cfg, weights, name, value):
    w = csattn.LayerWeights.random(cfg, 0)
    for n in weights.names():
        w[n] = weights[n]
    w[name] = value.astype(np.float32)
    return w


# One main-path parameter per group and, for CSA, indexer parameters (trained by the indexer
# loss alone, so their objective is the loss and the others' is the output term).
GRAD_PARAMS = {
    "SWA": ["attn.wq_b.weight", "attn.attn_sink", "attn.wo_a.weight"],
    "CSA": ["attn.wkv.weight", "attn.compressor.ape", "attn.indexer.wq_b.weight",
            "attn.indexer.compressor.wkv.weight"],
    "HCA": ["attn.q_norm.weight", "attn.compressor.wgate.weight"],
}


@pytest.mark.parametrize("kind", ["SWA", "CSA", "HCA"])
def test_backward_matches_central_differences_of_the_oracle(kind):
    cfg = tiny(kind)
    layer = csattn.Layer(cfg, seed=7, precision="fp32")
    x, c, cp = batch(cfg, 8, *layout_for(kind))
    rng = np.random.default_rng(9)
    gy = rng.standard_normal(x.shape)
    fwd = layer.forward(x, c, cp)
    eps = 1e-4

    # Input, through the output term (the indexer sees a detached x).
    grads = layer.backward(fwd, gy.astype(np.float32), grad_indexer_loss=0.0)
    assert set(grads) == {"input", *layer.weights.names()}
    v = rng.standard_normal(x.shape)
    x64 = x.astype(np.float64)
    fd = (oracle_objective(cfg, layer.weights, x64 + eps * v, c, cp, fwd.topk, gy, 0.0) -
          oracle_objective(cfg, layer.weights, x64 - eps * v, c, cp, fwd.topk, gy, 0.0))
    assert_directional(grads["input"], 2 * eps * v, fd, "input")

    loss_grads = layer.backward(fwd, np.zeros_like(x), grad_indexer_loss=1.0)
    for name in GRAD_PARAMS[kind]:
        indexer = name.startswith("attn.indexer.")
        g = (loss_grads if indexer else grads)[name]
        assert g.any(), f"{name} has an all-zero gradient"
        w0 = layer.weights[name].astype(np.float64)
        d = rng.standard_normal(w0.shape) * max(1.0, np.abs(w0).max())
        zero = np.zeros_like(gy)
        obj = lambda w: oracle_objective(cfg, weights_with(cfg, layer.weights, name, w), x, c, cp,
                                         fwd.topk, zero if indexer else gy, 1.0 if indexer else 0.0)
        # The perturbed weights are rounded to float32: the step is what they represent.
        wp, wm = (w0 + eps * d).astype(np.float32), (w0 - eps * d).astype(np.float32)
        assert_directional(g, wp.astype(np.float64) - wm.astype(np.float64), obj(wp) - obj(wm), name)
        if indexer:  # the main loss never reaches the indexer, the indexer loss never x
            assert not grads[name].any()
    if kind == "CSA":
        assert not loss_grads["input"].any() and not loss_grads["attn.wq_b.weight"].any()


def test_packed_batch_equals_its_segments_and_padding_changes_nothing():
    cfg = tiny("CSA")
    cfg.per_token_loss = True  # sums, so the segments' losses add up
    layer = csattn.Layer(cfg, seed=11, precision="fp32")
    lengths = [9, 1, 30, 17]
    x, c, _ = batch(cfg, 12, lengths, lengths)
    fwd = layer.forward(x, c)
    loss = 0.0
    for b, n in enumerate(lengths):
        rows = slice(c[b], c[b] + n)
        one = layer.forward(x[rows], [0, n])
        np.testing.assert_allclose(one.output, fwd.output[rows], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(one.topk, fwd.topk[rows])
        loss += one.indexer_loss
    assert loss == pytest.approx(fwd.indexer_loss, rel=1e-5)

    # Garbage in padding rows changes no real row, and no gradient.
    x, c, cp = batch(cfg, 13)
    gy = np.random.default_rng(14).standard_normal(x.shape).astype(np.float32)
    pad = np.setdiff1d(np.arange(x.shape[0]), real_rows())
    assert len(pad) > 0
    a = layer.forward(x, c, cp)
    x2 = x.copy()
    x2[pad] = 1e3
    b2 = layer.forward(x2, c, cp)
    rows = real_rows()
    np.testing.assert_array_equal(a.output[rows], b2.output[rows])
    gy[pad] = 0.0
    ga, gb = layer.backward(a, gy), layer.backward(b2, gy)
    for name in layer.weights.names():
        np.testing.assert_allclose(ga[name], gb[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_bshd_and_repeatability():
    cfg = tiny("HCA")
    layer = csattn.Layer(cfg, seed=15)
    assert csattn.bshd_cu_seqlens(3, 140) == [0, 140, 280, 420]
    x = np.random.default_rng(16).standard_normal((420, cfg.d_model)).astype(np.float32)
    a = layer.forward(x, csattn.bshd_cu_seqlens(3, 140))
    b = layer.forward(x, np.array([0, 140, 280, 420], dtype=np.int64))
    np.testing.assert_array_equal(a.output, b.output)
    ga = layer.backward(a, np.ones_like(a.output))
    gb = layer.backward(b, np.ones_like(b.output))
    for name, g in ga.items():
        np.testing.assert_array_equal(g, gb[name], err_msg=name)


def test_inputs_other_than_float32_numpy():
    cfg = tiny("SWA")
    layer = csattn.Layer(cfg, seed=17, precision="fp32")
    x, c, _ = batch(cfg, 18, [20], [20])

    class ArrayLike:  # anything NumPy can read
        def __init__(self, a):
            self.a = a

        def __array__(self, dtype=None, copy=None):
            return self.a

    ref = layer.forward(x, c).output
    np.testing.assert_array_equal(layer.forward(x.astype(np.float64), c).output, ref)
    np.testing.assert_array_equal(layer.forward(ArrayLike(x), c).output, ref)
    np.testing.assert_array_equal(layer.forward(np.asfortranarray(x), c).output, ref)
    np.testing.assert_array_equal(layer.forward(x.tolist(), c).output, ref)


def test_weights_io(tmp_path):
    cfg = tiny("CSA")
    w = csattn.LayerWeights.random(cfg, 19)
    path = str(tmp_path / "layer.safetensors")
    w.save(path)
    back = csattn.LayerWeights.load(path, cfg)
    for name in w.names():
        np.testing.assert_array_equal(w[name], back[name], err_msg=name)
    a = w["attn.attn_sink"]
    a[:] = 123.0  # a copy: the weights do not change
    assert not (w["attn.attn_sink"] == 123.0).any()
    w["attn.attn_sink"] = a
    assert (w["attn.attn_sink"] == 123.0).all()
    x, c, cp = batch(cfg, 20)
    assert not np.array_equal(csattn.Layer(cfg, w).forward(x, c, cp).output,
                              csattn.Layer(cfg, back).forward(x, c, cp).output)
    with pytest.raises(csattn.Error, match="attn.attn_sink"):
        w["attn.attn_sink"] = np.zeros(3, dtype=np.float32)
    with pytest.raises(csattn.Error):
        csattn.LayerWeights.load(str(tmp_path / "missing.safetensors"), cfg)
    with pytest.raises(csattn.Error):
        csattn.LayerWeights.load(path, tiny("SWA"))  # extra compressor / indexer tensors
    # A checkpoint directory in the Hugging Face sharded layout: only its index and the
    # shard it names are read (C++ tests cover FP8 shards and every index error). The shard
    # sits in a subfolder beside a decoy file: only the index finds it.
    ckpt = tmp_path / "ckpt"
    (ckpt / "shards").mkdir(parents=True)
    (tmp_path / "layer.safetensors").rename(ckpt / "shards" / "model-00001-of-00001.safetensors")
    csattn.LayerWeights.random(cfg, 20).save(str(ckpt / "decoy.safetensors"))
    import json
    names = w.names()
    (ckpt / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {n: "shards/model-00001-of-00001.safetensors" for n in names}}))
    from_dir = csattn.LayerWeights.load(str(ckpt), cfg)
    for name in names:
        np.testing.assert_array_equal(back[name], from_dir[name], err_msg=name)


def with_prefix(src, dst, prefix):
    """Copies a safetensors file with every tensor renamed to prefix + name (the header
    rewritten by the format's definition: u64 header length, JSON header, data)."""
    import json
    import struct
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    renamed = {(k if k == "__metadata__" else prefix + k): v for k, v in header.items()}
    text = json.dumps(renamed).encode()
    text += b" " * (-len(text) % 8)
    open(dst, "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def test_weights_load_picks_a_layer_or_the_mtp_module(tmp_path):
    # The release's checkpoint holds layers.N.attn.* and the MTP module's mtp.K.attn.*:
    # `layer` takes N, "layers.N" or "mtp.K".
    cfg, mtp_cfg = tiny("CSA"), tiny("SWA")
    main, mtp = csattn.LayerWeights.random(cfg, 31), csattn.LayerWeights.random(mtp_cfg, 32)
    main.save(str(tmp_path / "main.safetensors"))
    mtp.save(str(tmp_path / "mtp.safetensors"))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with_prefix(tmp_path / "main.safetensors", ckpt / "model-00001-of-00002.safetensors", "layers.3.")
    with_prefix(tmp_path / "mtp.safetensors", ckpt / "model-00002-of-00002.safetensors", "mtp.0.")
    import json
    index = {"layers.3." + n: "model-00001-of-00002.safetensors" for n in main.names()}
    index.update({"mtp.0." + n: "model-00002-of-00002.safetensors" for n in mtp.names()})
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    for layer, c, want in ((3, cfg, main), ("layers.3", cfg, main), ("mtp.0", mtp_cfg, mtp)):
        got = csattn.LayerWeights.load(str(ckpt), c, layer)
        for name in want.names():
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{layer}: {name}")
    with pytest.raises(csattn.Error, match="mtp.1.attn"):
        csattn.LayerWeights.load(str(ckpt), mtp_cfg, "mtp.1")
    with pytest.raises(csattn.Error, match="not a layer"):
        csattn.LayerWeights.load(str(ckpt), mtp_cfg, "last")
    with pytest.raises(csattn.Error, match="3, mtp.0"):
        csattn.LayerWeights.load(str(ckpt), cfg)
    # The config names each layer as the checkpoint does: its last entry is the MTP module's.
    (tmp_path / "config.json").write_text(json.dumps(
        {"hidden_size": 64, "num_hidden_layers": 4, "compress_ratios": [0, 0, 0, 4, 0]}))
    names = csattn.hf_config_layer_names(str(tmp_path / "config.json"))
    assert names == ["layers.0", "layers.1", "layers.2", "layers.3", "mtp.0"]
    assert [c.compress_ratio for c in csattn.hf_config_layers(str(tmp_path / "config.json"))] == [0, 0, 0, 4, 0]
    (tmp_path / "config.json").write_text(json.dumps({"compress_ratios": [0, 4]}))
    assert csattn.hf_config_layer_names(str(tmp_path / "config.json")) == ["layers.0", "layers.1"]
    for layer in (np.int64(3), np.int32(3)):  # numpy integers are integers
        got = csattn.LayerWeights.load(str(ckpt), cfg, layer)
        np.testing.assert_array_equal(got["attn.wkv.weight"], main["attn.wkv.weight"])
    with pytest.raises(csattn.Error, match="expected None"):
        csattn.LayerWeights.load(str(ckpt), cfg, 3.0)
    with pytest.raises(csattn.Error, match="expected None"):
        csattn.LayerWeights.load(str(ckpt), cfg, True)  # not layers.1
    for bad in (-1, 1 << 40):
        with pytest.raises(csattn.Error, match="expected 0 <= N"):
            csattn.LayerWeights.load(str(ckpt), cfg, bad)


def test_every_bad_input_is_a_csattn_error():
    cfg = tiny("CSA")
    layer = csattn.Layer(cfg, seed=21)
    x, c, cp = batch(cfg, 22)
    fwd = layer.forward(x, c, cp)
    cases = [
        (lambda: layer.forward(x[:, :5], c, cp), "hidden_states"),
        (lambda: layer.forward(x, [0, 50], None), "cu_seqlens"),
        (lambda: layer.forward(x, [0, 60, 40, x.shape[0]], None), "cu_seqlens"),
        (lambda: layer.forward(x, [0.0, 1.5], None), "integers"),
        (lambda: layer.forward(x, c, cp, topk=np.zeros((3, 3), dtype=np.int32)), "topk"),
        (lambda: layer.backward(fwd, np.zeros((3, cfg.d_model), dtype=np.float32)), "grad"),
        (lambda: layer.backward("not a forward", np.zeros_like(x)), "Forward"),
        (lambda: csattn.Layer(cfg, precision="fp16"), "precision"),
        (lambda: csattn.Layer(cfg, device="tpu"), "device"),
        (lambda: layer.forward(None, c, cp), "x"),
        (lambda: csattn.oracle_forward(cfg, layer.weights, x[:, :5], c, cp), "x must be"),
    ]
    for call, words in cases:
        with pytest.raises(csattn.Error, match=words):
            call()
    assert issubclass(csattn.Error, ValueError)


def test_cuda_availability_is_reported():
    ok, why = csattn.cuda_available()
    assert isinstance(ok, bool) and (ok or why)
    if not ok:
        with pytest.raises(csattn.Error):
            csattn.Layer(tiny("SWA"), device="cuda")


def test_retain_freed_host_memory_then_layers_still_agree():
    """The allocator setting is taken under glibc (Linux) and changes no result."""
    import platform
    cfg = tiny("CSA")
    layer = csattn.Layer(cfg, csattn.LayerWeights.random(cfg, 31), precision="fp32")
    x, c, cp = batch(cfg, 32)
    before = layer.forward(x, cu_seqlens=c, cu_seqlens_padded=cp).output
    took = csattn.retain_freed_host_memory()
    assert isinstance(took, bool)
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert took
    after = layer.forward(x, cu_seqlens=c, cu_seqlens_padded=cp).output
    np.testing.assert_array_equal(before, after)


def test_context_parallel_device_options():
    """ContextParallelLayer takes device like Layer: a bad name, 'cuda' without a GPU, and fp32
    on the GPU are csattn.Error; the NCCL factory and the launcher's local rank are there."""
    cfg = tiny("CSA")
    w = csattn.LayerWeights.random(cfg, 29)
    with pytest.raises(csattn.Error, match="expected 'cpu', 'cuda' or 'auto'"):
        csattn.ContextParallelLayer(cfg, w, device="gpu")
    if not csattn.cuda_available()[0]:
        with pytest.raises(csattn.Error, match="device cuda"):
            csattn.ContextParallelLayer(cfg, w, device="cuda")
    else:
        with pytest.raises(csattn.Error, match="bf16 only"):
            csattn.ContextParallelLayer(cfg, w, precision="fp32", device="cuda")
    assert isinstance(csattn.nccl_available(), bool)
    assert isinstance(csattn.launcher_local_rank(), int)
    assert callable(csattn.nccl_communicator)


@pytest.mark.skipif(not csattn.cuda_available()[0], reason="no usable GPU in this build")
@pytest.mark.parametrize("kind", ["SWA", "CSA", "HCA"])
def test_cuda_layer_matches_the_cpu_layer(kind):
    """device='cuda' through the same Python calls: the CPU's bf16 emulation on the GPU's own
    selection (forward cosine > 1 - 2e-4, every gradient > 1 - 3e-3, as the C++ GPU tests)."""
    cfg = {c.kind: c for c in csattn.preset_layers("small")}[kind]  # the C++ GPU tests' shapes
    w = csattn.LayerWeights.random(cfg, 23)
    gpu = csattn.Layer(cfg, w, device="cuda")
    cpu = csattn.Layer(cfg, w, device="cpu")
    assert gpu.device == "cuda"
    x, c, cp = batch(cfg, 24, *layout_for(kind))
    gy = np.random.default_rng(25).standard_normal(x.shape).astype(np.float32)
    fg = gpu.forward(x, c, cp)
    fc = cpu.forward(x, c, cp, topk=fg.topk)
    rows = real_rows(*layout_for(kind))
    assert cosine(fg.output[rows], fc.output[rows]) > 1 - 2e-4
    gg, gc = gpu.backward(fg, gy), cpu.backward(fc, gy)
    for name, g in gc.items():
        if np.abs(g).max() > 0:
            assert cosine(gg[name], g) > 1 - 3e-3, name


def test_empty_segments_and_concurrent_calls():
    cfg = tiny("CSA")
    layer = csattn.Layer(cfg, seed=26)
    for c in ([0, 0], [0, 0, 5], [0, 3, 3, 7]):  # empty batch, empty segments
        x = np.random.default_rng(27).standard_normal((c[-1], cfg.d_model)).astype(np.float32)
        fwd = layer.forward(x, c)
        assert fwd.output.shape == x.shape and fwd.topk.shape == (c[-1], cfg.index_topk)
        assert layer.backward(fwd, np.ones_like(x))["input"].shape == x.shape
    # Calls on one Layer from several threads (the GIL is released) give the serial results.
    import threading
    xs = [batch(cfg, 40 + i)[0] for i in range(4)]
    c, cp = batch(cfg, 40)[1:]
    serial = [layer.forward(x, c, cp).output for x in xs]
    got = [None] * len(xs)

    def run(i):
        got[i] = layer.forward(xs[i], c, cp).output

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(got, serial):
        np.testing.assert_array_equal(a, b)


def test_hf_config_json(tmp_path):
    import json
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 512, "num_attention_heads": 16, "head_dim": 64,
                                "qk_rope_head_dim": 16, "sliding_window": 32, "index_topk": 64,
                                "compress_ratios": [0, 4, 128, 4], "rope_scaling": {"factor": 8}}))
    layers = csattn.hf_config_layers(str(path))
    assert [c.kind for c in layers] == ["SWA", "CSA", "HCA", "CSA"]
    c = layers[1]
    assert (c.d_model, c.n_heads, c.head_dim, c.window, c.index_topk, c.yarn_factor) == (512, 16, 64, 32, 64, 8.0)
    assert c.index_n_heads == csattn.preset_layers("flash")[0].index_n_heads  # missing: flash's
    path.write_text(json.dumps({"compress_ratios": [0, 5]}))
    with pytest.raises(csattn.Error, match="5"):
        csattn.hf_config_layers(str(path))
