"""csattn.DeviceLayer on torch CUDA tensors (DLPack, caller workspaces, torch's stream)
against csattn.Layer(device="cuda") on host arrays: the same kernels, so the forward is
bitwise equal and the gradients (fp32 atomics in both) agree to 1e-6 in cosine, the weight
gradients read from the backward workspace at their offsets. Needs torch with CUDA and a
GPU; skips otherwise (passed on the H200 2026-12-04)."""
import numpy as np
import pytest

import csattn

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and csattn.cuda_available()[0]),
                                reason="needs a GPU and torch with CUDA")

LAYOUTS = {"SWA": ([37, 5, 70, 1], [40, 8, 72, 1]), "CSA": ([37, 5, 70, 1], [40, 8, 72, 1]),
           "HCA": ([131, 260, 3], [132, 262, 3])}


def cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("kind", ["SWA", "CSA", "HCA"])
def test_device_layer_matches_the_host_array_gpu_layer(kind):
    cfg = {c.kind: c for c in csattn.preset_layers("small")}[kind]
    cfg.loss_coeff = 0.5
    lengths, padded = LAYOUTS[kind]
    cu, cu_p = [0] + list(np.cumsum(lengths)), [0] + list(np.cumsum(padded))
    T, B, L, R = cu_p[-1], len(lengths), max(padded), cu[-1]
    w = csattn.LayerWeights.random(cfg, 61)
    g = torch.Generator().manual_seed(62)
    x = torch.randn(T, cfg.d_model, generator=g).to(torch.bfloat16)
    gy = torch.randn(T, cfg.d_model, generator=g).to(torch.bfloat16)

    host = csattn.Layer(cfg, w, device="cuda")
    ref = host.forward(x.float().numpy(), cu, cu_p)
    ref_g = host.backward(ref, gy.float().numpy())

    dev = torch.device("cuda")
    dl = csattn.DeviceLayer(cfg, w)
    cud = torch.tensor(cu, dtype=torch.int32, device=dev)
    cupd = torch.tensor(cu_p, dtype=torch.int32, device=dev)
    planned = csattn.plan_device_memory(cfg, T, B, L)  # the host plan is what the layer asks for
    assert dl.forward_workspace_bytes(T, B, L) == planned["forward_workspace"]
    assert dl.backward_workspace_bytes(T, B, L) == planned["backward_workspace"]
    ws = torch.full((dl.forward_workspace_bytes(T, B, L),), 255, dtype=torch.uint8, device=dev)
    y = torch.empty(T, cfg.d_model, dtype=torch.bfloat16, device=dev)
    topk = torch.empty(T, cfg.index_topk, dtype=torch.int32, device=dev) if kind == "CSA" else None
    loss = torch.empty(1, dtype=torch.float32, device=dev)
    stream = torch.cuda.current_stream().cuda_stream
    dl.forward(x.to(dev), cud, cupd, L, R, ws, y, topk=topk, loss=loss, stream=stream)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(y.float().cpu().numpy(), ref.output)
    assert loss.item() == pytest.approx(ref.indexer_loss, rel=0, abs=0)
    if kind == "CSA":
        np.testing.assert_array_equal(topk.cpu().numpy(), ref.topk)

    bws = torch.empty(dl.backward_workspace_bytes(T, B, L), dtype=torch.uint8, device=dev)
    dx = torch.empty(T, cfg.d_model, dtype=torch.float32, device=dev)
    dl.backward(gy.to(dev), cud, cupd, L, R, ws, bws, dx, 1.0, stream=stream)
    torch.cuda.synchronize()
    assert cosine(dx.cpu().numpy(), ref_g["input"]) > 1 - 1e-6
    raw = bws.cpu()
    for name, offset in dl.weight_gradient_offsets(T, B, L).items():
        want = ref_g[name]
        got = raw[offset:offset + want.size * 4].view(torch.float32).reshape(want.shape).numpy()
        if not want.any():
            assert not got.any(), name
        else:
            assert cosine(got, want) > 1 - 1e-6, name

    with pytest.raises(csattn.Error, match="bfloat16"):
        dl.forward(x.float().to(dev), cud, cupd, L, R, ws, y, stream=stream)
    with pytest.raises(csattn.Error, match="bytes"):
        dl.forward(x.to(dev), cud, cupd, L, R, ws[:1024], y, stream=stream)
