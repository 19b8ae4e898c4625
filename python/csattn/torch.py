"""PyTorch integration: ``HybridAttention``, an ``nn.Module`` holding one layer's parameters
(state-dict keys = the release names without the leading ``attn.``), whose forward runs the
csattn layer under autograd.

    import torch, csattn
    from csattn.torch import HybridAttention
    cfg = csattn.preset_layers("small")[1]
    attn = HybridAttention(cfg, precision="fp32")            # random weights (seed 0)
    out = attn(x, cu_seqlens=[0, 100, 300])                 # x: [T, d_model] tensor
    (out.output.square().sum() + out.indexer_loss).backward()   # grads on x and parameters

The compute runs in csattn, not in torch. With device="cuda" (or "auto" on a GPU machine),
precision "bf16" and x a CUDA tensor, the module runs csattn.DeviceLayer on torch's tensors
and current stream: x, the output, the top-k, the loss and every gradient stay on the GPU
(x is taken as bf16; the output and dx come back in x's dtype), the workspaces are torch
allocations, and nothing synchronises with the host. Otherwise tensors are copied to host
float32 arrays for csattn.Layer and the results back to x's device and dtype (the reference
path). Either way the layer's weights are (re)built from the parameters when one of them
changed (an optimizer step), which copies them through the host once per step. The
indexer's parameters receive gradients from the indexer loss only, as in the layer.
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


def _lengths(cu, cu_padded):
    """(rows, segments, longest padded segment, real rows) of a packed batch."""
    padded = cu_padded if cu_padded is not None else cu
    longest = max((b - a for a, b in zip(padded, padded[1:])), default=0)
    return padded[-1], len(cu) - 1, longest, cu[-1]


class _DeviceLayerFunction(torch.autograd.Function):
    """The layer on CUDA tensors through csattn.DeviceLayer: the forward workspace (it keeps
    the activations) lives in ctx until the backward."""

    @staticmethod
    def forward(ctx, module, cu, cu_padded, x, *params):
        layer = module._device_layer()
        cfg = module.config
        rows, segments, longest, real = _lengths(cu, cu_padded)
        dev = x.device
        stream = torch.cuda.current_stream(dev).cuda_stream
        cu_d = torch.tensor(cu, dtype=torch.int32).to(dev, non_blocking=True)
        cup_d = torch.tensor(cu_padded if cu_padded is not None else cu, dtype=torch.int32).to(
            dev, non_blocking=True)
        xb = x.detach().to(torch.bfloat16).contiguous()
        ws = torch.empty(layer.forward_workspace_bytes(rows, segments, longest), dtype=torch.uint8,
                         device=dev)
        y = torch.empty(rows, cfg.d_model, dtype=torch.bfloat16, device=dev)
        csa = cfg.kind == "CSA"
        topk = torch.empty(rows, cfg.index_topk, dtype=torch.int32, device=dev) if csa else \
            torch.empty(0, dtype=torch.int32, device=dev)
        loss = torch.zeros(1, dtype=torch.float32, device=dev)
        layer.forward(xb, cu_d, cup_d, longest, real, ws, y, topk=topk if csa else None,
                      loss=loss, stream=stream)
        ctx.state = (layer, cu_d, cup_d, ws, (rows, segments, longest, real), x.dtype)
        ctx.set_materialize_grads(False)  # an unused output's gradient is None: no work for it
        ctx.layer_names = module._names
        ctx.param_meta = [(p.device, p.dtype, tuple(p.shape)) for p in params]
        ctx.mark_non_differentiable(topk)
        return y.to(x.dtype), loss[0], topk

    @staticmethod
    def backward(ctx, grad_out, grad_loss, _grad_topk):
        layer, cu_d, cup_d, ws, (rows, segments, longest, real), x_dtype = ctx.state
        dev = ws.device
        stream = torch.cuda.current_stream(dev).cuda_stream
        cfg_d = layer.config.d_model
        gy = torch.zeros(rows, cfg_d, dtype=torch.bfloat16, device=dev) if grad_out is None else \
            grad_out.detach().to(torch.bfloat16).contiguous()
        # The loss gradient is read on the device (None when the loss is unused: no loss
        # gradient at all); nothing is read back to the host.
        gl_dev = None if grad_loss is None else \
            grad_loss.detach().to(dev, torch.float32).reshape(1).contiguous()
        # Both may be autograd's own tensors, freed when this returns: keep their memory from
        # reuse until this stream has read them.
        cur = torch.cuda.current_stream(dev)
        for t in (gy, gl_dev):
            if t is not None:
                t.record_stream(cur)
        bws = torch.empty(layer.backward_workspace_bytes(rows, segments, longest),
                          dtype=torch.uint8, device=dev)
        dx = torch.empty(rows, cfg_d, dtype=torch.float32, device=dev)
        layer.backward(gy, cu_d, cup_d, longest, real, ws, bws, dx, 0.0 if gl_dev is None else 1.0,
                       stream=stream, grad_indexer_loss_device=gl_dev)
        offsets = layer.weight_gradient_offsets(rows, segments, longest)
        grads = []
        for name, (device, dtype, shape) in zip(ctx.layer_names, ctx.param_meta):
            n = 4 * int(np.prod(shape))
            at = offsets[name]
            # Parameters on the GPU (the usual case) take a view of the workspace; others a copy.
            grads.append(bws[at:at + n].view(torch.float32).view(shape).to(device, dtype))
        ctx.state = None  # the forward workspace can go
        return (None, None, None, dx.to(x_dtype), *grads)


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
        self._cached_device = None  # (parameter versions, csattn.DeviceLayer)

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

    def _version_key(self):
        # Changes when a parameter changed (an optimizer step bumps its version).
        return tuple((p._version, p.data_ptr()) for _, p in self.parameters_by_name())

    def _layer(self):
        key = self._version_key()
        if self._cached is None or self._cached[0] != key:
            self._cached = (key, csattn.Layer(self.config, self.to_weights(), **self._options))
        return self._cached[1]

    def _device_layer(self):
        key = self._version_key()
        if self._cached_device is None or self._cached_device[0] != key:
            layer = csattn.DeviceLayer(self.config, self.to_weights(),
                                       deterministic=self._options["deterministic"])
            self._cached_device = (key, layer)
        return self._cached_device[1]

    def _on_device(self, x):
        """Whether this call takes csattn.DeviceLayer (CUDA tensors, a GPU backend, bf16)."""
        opts = self._options
        if not x.is_cuda or opts["device"] not in ("cuda", "auto") or opts["precision"] != "bf16":
            return False
        return csattn.cuda_available()[0]

    def forward(self, x, cu_seqlens, cu_seqlens_padded=None):
        """x: [T, d_model]; cu_seqlens / cu_seqlens_padded as for csattn.Layer.forward.
        Returns Output(output like x, indexer_loss: a 0-dim float32 tensor, topk: int32
        [T, index_topk] for CSA, else empty)."""
        cu = csattn._arrays.int_list(cu_seqlens, "cu_seqlens")
        cu_padded = csattn._arrays.int_list(cu_seqlens_padded, "cu_seqlens_padded")
        params = [p for _, p in self.parameters_by_name()]
        fn = _DeviceLayerFunction if self._on_device(x) else _LayerFunction
        out, loss, topk = fn.apply(self, cu, cu_padded, x, *params)
        return Output(out, loss, topk)
