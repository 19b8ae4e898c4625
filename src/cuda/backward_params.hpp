// Buffers of the GPU backward: weight gradients (fp32, one per parameter) and activation
// gradients (bf16 between operators, fp32 where several contributions are summed).
#pragma once
#include "cuda/params.hpp"

namespace csattn::cuda {

struct DeviceGradients {
  float *wq_a = nullptr, *q_norm = nullptr, *wq_b = nullptr, *wkv = nullptr,
        *kv_norm = nullptr, *wo_a = nullptr, *wo_b = nullptr, *sink = nullptr;
  float *c_wkv = nullptr, *c_wgate = nullptr, *c_norm = nullptr, *c_ape = nullptr;
  float *i_wq_b = nullptr, *i_wproj = nullptr, *ic_wkv = nullptr, *ic_wgate = nullptr,
        *ic_norm = nullptr, *ic_ape = nullptr;
};

struct BackwardBuffers {
  bf16* dy = nullptr;          // [T, d_model] upstream gradient
  bf16* du = nullptr;          // [T, G*r_o]
  bf16* dattn = nullptr;       // [T, H*D]
  bf16* dq = nullptr;          // [T, H*D]
  float* dkv_acc = nullptr;    // [T, D]
  float* dcomp_acc = nullptr;  // [Nc, D]
  float* dsink_part = nullptr; // [T, H]
  bf16* dkv = nullptr;         // [T, D]
  bf16* dnormed = nullptr;     // [T, max(D, r_q)] scratch: gradient after a norm's backward
  bf16* dqb = nullptr;         // [T, H*D], in dattn's bytes (plan_backward)
  bf16* dcq = nullptr;         // [T, r_q]
  float* rstd = nullptr;       // scratch of the norm backward (rmsnorm_backward_scratch_floats)
  float* dx = nullptr;         // [T, d_model], in dq's bytes where it fits (plan_backward)
  bf16* dcomp = nullptr;       // [Nc, max(D, D_I)]
  bf16* dpooled = nullptr;     // [Nc, max(D, D_I)]
  bf16 *da = nullptr, *dg = nullptr;  // [T, max(coff*D, 2*D_I)]
  bf16* dqi = nullptr;         // [T, H_I*D_I]
  float* dweff = nullptr;      // [T, H_I]
  bf16* dwraw = nullptr;       // [T, H_I]
  float* dkeys_acc = nullptr;  // [Nc, D_I]
  float* loss_grad_scale = nullptr;  // [1]: upstream loss gradient x loss scale (on the device)
  // Deterministic mode: per-(row, copy, slot) key-gradient contributions of one row chunk
  // (grad_chunk.hpp); null and 0 in fast mode.
  float* det_scratch = nullptr;
  std::size_t det_scratch_bytes = 0;
};

}  // namespace csattn::cuda
