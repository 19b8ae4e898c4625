"""PyTorch integration: ``HybridAttention``, an ``nn.Module`` holding one layer's parameters
(state-dict keys = the release names without the leading ``attn.``), whose forward runs the
csattn layer under autograd.

    import torch, csattn
    from csattn.torch import HybridAttention
    cfg = csattn.preset_layers("small")[1]
    attn = HybridAttention(cfg, precision="fp32")            # random weights (seed 0)
    out = attn(x, cu_seqlens=[0, 100, 300])                 # x: [T, d_model] tensor
    (out.output.square().sum() + out.indexer_loss).backward()   # grads on x and parameters

The compute runs in csattn (CPU, or the GPU with device="cuda"), not in torch: tensors are
copied to host float32 arrays and the results back to x's device and dtype, so this is a
reference and testing path, not a zero-copy one. The indexer's parameters receive gradients
from the indexer loss only, as in the layer.
"""
from collections import namedtuple

import numpy as np
import torch

import csattn

Output = namedtuple("Output", ["output", "indexer_loss", "topk"])

_PREFIX = "attn."


def _host(t):
    return t.detach().to("cpu", torch.float32).contiguous().numpy()


class _LayerFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, module, cu, cu_padded, x, *params):
        layer = module._layer()
        fwd = layer.forward(_host(x), cu, cu_padded)
        ctx.layer, ctx.fwd, ctx.x_meta = layer, fwd, (x.device, x.dtype)
        ctx.layer_names = module._names  # the order of params, and of backward's gradients
        ctx.param_meta = [(p.device, p.dtype) for p in params]
        out = torch.from_numpy(fwd.output).to(x.device, x.dtype)
        loss = torch.tensor(fwd.indexer_loss, dtype=torch.float32, device=x.device)
        topk = torch.from_numpy(fwd.topk).to(x.device) if fwd.topk is not None else \
            torch.empty(0, dtype=torch.int32, device=x.device)
        ctx.mark_non_differentiable(topk)
        return out, loss, topk

    @staticmethod
    def backward(ctx, grad_out, grad_loss, _grad_topk):
        gy = np.zeros(ctx.fwd.output.shape, np.float32) if grad_out is None else _host(grad_out)
        gl = 0.0 if grad_loss is None else float(grad_loss)
        grads = ctx.layer.backward(ctx.fwd, gy, gl)
        device, dtype = ctx.x_meta
        gx = torch.from_numpy(grads["input"]).to(device, dtype)
        gp = [torch.from_numpy(grads[name]).to(d, t)
              for name, (d, t) in zip(ctx.layer_names, ctx.param_meta)]
        return (None, None, None, gx, *gp)


class HybridAttention(torch.nn.Module):
    """One DeepSeek-V4 attention layer as a module. config: csattn.AttentionConfig; weights:
    csattn.LayerWeights (None: random from `seed`); precision "bf16" / "fp32"; device: where
    csattn computes ("cpu", "cuda", "auto"), independent of the tensors' device."""

    def __init__(self, config, weights=None, *, seed=0, precision="bf16", device="cpu", threads=0,
                 deterministic=False):
        super().__init__()
        if weights is None:
            weights = csattn.LayerWeights.random(config, seed)
        self.config = config
        self._options = dict(precision=precision, device=device, threads=threads,
                             deterministic=deterministic)
        self._names = weights.names()
        for name in self._names:
            self._register(name, torch.nn.Parameter(torch.from_numpy(weights[name])))
        self._cached = None  # (parameter versions, csattn.Layer)

    def _register(self, name, param):
        """attn.compressor.wkv.weight -> submodule compressor, submodule wkv, parameter weight."""
        parts = name[len(_PREFIX):].split(".") if name.startswith(_PREFIX) else name.split(".")
        owner = self
        for p in parts[:-1]:
            if not hasattr(owner, p):
                owner.add_module(p, torch.nn.Module())
            owner = getattr(owner, p)
        owner.register_parameter(parts[-1], param)

    def _param(self, name):
        owner = self
        for p in (name[len(_PREFIX):] if name.startswith(_PREFIX) else name).split("."):
            owner = getattr(owner, p)
        return owner

    def parameters_by_name(self):
        """(release name, parameter) in the layer's parameter order."""
        return [(n, self._param(n)) for n in self._names]

    def to_weights(self):
        """The current parameter values as csattn.LayerWeights (e.g. to save)."""
        w = csattn.LayerWeights.zeros(self.config)
        for name, p in self.parameters_by_name():
            w[name] = _host(p)
        return w

    def _layer(self):
        # Rebuilt only when a parameter changed (an optimizer step bumps its version).
        key = tuple((p._version, p.data_ptr()) for _, p in self.parameters_by_name())
        if self._cached is None or self._cached[0] != key:
            self._cached = (key, csattn.Layer(self.config, self.to_weights(), **self._options))
        return self._cached[1]

    def forward(self, x, cu_seqlens, cu_seqlens_padded=None):
        """x: [T, d_model]; cu_seqlens / cu_seqlens_padded as for csattn.Layer.forward.
        Returns Output(output like x, indexer_loss: a 0-dim float32 tensor, topk: int32
        [T, index_topk] for CSA, else empty)."""
        cu = csattn._arrays.int_list(cu_seqlens, "cu_seqlens")
        cu_padded = csattn._arrays.int_list(cu_seqlens_padded, "cu_seqlens_padded")
        params = [p for _, p in self.parameters_by_name()]
        out, loss, topk = _LayerFunction.apply(self, cu, cu_padded, x, *params)
        return Output(out, loss, topk)
