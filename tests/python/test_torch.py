"""csattn.torch.HybridAttention against the csattn layer it wraps: the same outputs, autograd
gradients of the input and of every parameter equal to Layer.backward's (output term and
indexer loss), the module's parameters as the release names, the layer rebuilt after an
optimizer step, and x's dtype and device kept. Skips where torch is not installed."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import csattn  # noqa: E402
from csattn.torch import HybridAttention  # noqa: E402


def tiny(kind):
    return {c.kind: c for c in csattn.preset_layers("tiny")}[kind]


LENGTHS, PADDED = [37, 5, 70], [40, 8, 72]
CU, CU_PADDED = [0, 37, 42, 112], [0, 40, 48, 120]


@pytest.mark.parametrize("kind", ["SWA", "CSA", "HCA"])
def test_module_matches_the_layer(kind):
    cfg = tiny(kind)
    weights = csattn.LayerWeights.random(cfg, 31)
    attn = HybridAttention(cfg, weights, precision="fp32")
    layer = csattn.Layer(cfg, weights, precision="fp32")
    rng = np.random.default_rng(32)
    x_np = rng.standard_normal((CU_PADDED[-1], cfg.d_model)).astype(np.float32)
    gy_np = rng.standard_normal(x_np.shape).astype(np.float32)

    x = torch.from_numpy(x_np.copy()).requires_grad_()
    out = attn(x, CU, CU_PADDED)
    ref = layer.forward(x_np, CU, CU_PADDED)
    np.testing.assert_array_equal(out.output.detach().numpy(), ref.output)
    assert out.indexer_loss.item() == pytest.approx(ref.indexer_loss, rel=1e-6)
    if kind == "CSA":
        np.testing.assert_array_equal(out.topk.numpy(), ref.topk)
    else:
        assert out.topk.numel() == 0

    (out.output * torch.from_numpy(gy_np)).sum().add(out.indexer_loss * 2.0).backward()
    grads = layer.backward(ref, gy_np, grad_indexer_loss=2.0)
    np.testing.assert_allclose(x.grad.numpy(), grads["input"], rtol=1e-6, atol=1e-7)
    for name, p in attn.parameters_by_name():
        assert p.grad is not None, name
        np.testing.assert_allclose(p.grad.numpy(), grads[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_parameters_state_dict_and_optimizer_step():
    cfg = tiny("CSA")
    weights = csattn.LayerWeights.random(cfg, 33)
    attn = HybridAttention(cfg, weights, precision="fp32")
    keys = set(attn.state_dict())
    assert keys == {n[len("attn."):] for n in weights.names()}
    assert "compressor.wkv.weight" in keys and "indexer.compressor.ape" in keys
    back = attn.to_weights()
    for name in weights.names():
        np.testing.assert_array_equal(back[name], weights[name])

    x = torch.randn(CU[-1], cfg.d_model, generator=torch.Generator().manual_seed(34))
    before = attn(x, CU).output.detach().clone()
    opt = torch.optim.SGD(attn.parameters(), lr=0.1)
    attn(x, CU).output.square().sum().backward()
    opt.step()
    after = attn(x, CU).output.detach()
    assert not torch.equal(before, after)  # the step reached the layer
    fresh = csattn.Layer(cfg, attn.to_weights(), precision="fp32").forward(x.numpy(), CU).output
    np.testing.assert_array_equal(after.numpy(), fresh)


def test_dtype_is_kept_and_only_x_may_be_used():
    cfg = tiny("HCA")
    attn = HybridAttention(cfg, seed=35)
    x = torch.randn(300, cfg.d_model, dtype=torch.bfloat16, requires_grad=True)
    out = attn(x, [0, 300])
    assert out.output.dtype == torch.bfloat16 and out.output.shape == x.shape
    out.output.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad.float()).all()
    with pytest.raises(csattn.Error, match="cu_seqlens"):
        attn(x, [0, 299])


def _cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.skipif(not (torch.cuda.is_available() and csattn.cuda_available()[0]),
                    reason="needs a GPU and torch with CUDA")
@pytest.mark.parametrize("kind", ["SWA", "CSA", "HCA"])
def test_cuda_tensors_take_the_device_layer(kind):
    """CUDA tensors with device="cuda": csattn.DeviceLayer on torch's tensors and stream. Same
    kernels as csattn.Layer(device="cuda") on host arrays: the output bitwise, the gradients
    (fp32 atomics in both) to 1e-6 in cosine; after an optimizer step the layer is rebuilt."""
    cfg = {c.kind: c for c in csattn.preset_layers("small")}[kind]
    cfg.loss_coeff = 0.5
    weights = csattn.LayerWeights.random(cfg, 41)
    attn = HybridAttention(cfg, weights, device="cuda").cuda()
    host = csattn.Layer(cfg, weights, device="cuda")
    g = torch.Generator().manual_seed(42)
    x_cpu = torch.randn(CU_PADDED[-1], cfg.d_model, generator=g).to(torch.bfloat16)
    gy_cpu = torch.randn(x_cpu.shape, generator=g).to(torch.bfloat16)
    x = x_cpu.cuda().requires_grad_()

    out = attn(x, CU, CU_PADDED)
    assert attn._cached_device is not None and attn._cached is None  # no host-array layer
    assert out.output.is_cuda and out.output.dtype == torch.bfloat16
    ref = host.forward(x_cpu.float().numpy(), CU, CU_PADDED)
    np.testing.assert_array_equal(out.output.detach().float().cpu().numpy(), ref.output)
    assert out.indexer_loss.item() == pytest.approx(ref.indexer_loss, rel=0, abs=0)
    if kind == "CSA":
        np.testing.assert_array_equal(out.topk.cpu().numpy(), ref.topk)

    (out.output.float() * gy_cpu.float().cuda()).sum().add(out.indexer_loss * 2.0).backward()
    grads = host.backward(ref, gy_cpu.float().numpy(), grad_indexer_loss=2.0)
    assert x.grad.is_cuda and x.grad.dtype == torch.bfloat16
    assert _cosine(x.grad.float().cpu().numpy(), grads["input"]) > 1 - 1e-4  # dx rounded to bf16
    for name, p in attn.parameters_by_name():
        want = grads[name]
        assert p.grad.is_cuda, name
        got = p.grad.cpu().numpy()
        if not want.any():
            assert not got.any(), name
        else:
            assert _cosine(got, want) > 1 - 1e-6, name
            # the size too: the loss's factor 2.0 reaches the indexer's parameters on the device
            assert np.linalg.norm(got) == pytest.approx(np.linalg.norm(want), rel=1e-4), name

    first = attn._cached_device[1]
    with torch.no_grad():
        attn.parameters_by_name()[0][1].mul_(0.5)
    attn(x, CU, CU_PADDED)
    assert attn._cached_device[1] is not first  # rebuilt from the changed parameter
