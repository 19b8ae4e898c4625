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
