// Warp-level tensor-core and async-copy primitives (sm_80+ PTX, used on sm_90a): 16-byte
// cp.async, ldmatrix and the m16n8k16 bf16 MMA with fp32 accumulation. Fragment layouts
// follow the PTX ISA ("Matrix fragments for mma.m16n8k16"): with g = lane / 4 and
// q = lane % 4, A holds rows {g, g+8} x cols {2q, 2q+1} (+8), B holds k rows {2q, 2q+1} (+8)
// x col g, C holds rows {g, g+8} x cols {2q, 2q+1}.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace csattn::cuda {

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// Bytes from `smem_raw` (the dynamic shared memory) to its first 1024-byte boundary: wgmma's
// 128-byte swizzle is anchored there (descriptor base offset 0), and so are the TMA tiles that
// feed it; the launches ask for 1 KB more than their layout for it. An offset, added in the
// kernel (`smem_raw + align_1024_pad(smem_raw)`): a pointer returned from a helper made the
// compiler lose the shared address space of every access through it (generic loads and
// stores: +16-192 instructions a kernel, seventeenth session).
__device__ __forceinline__ std::uint32_t align_1024_pad(const void* smem_raw) {
  const std::uint32_t raw = smem_addr(smem_raw);
  return ((raw + 1023u) & ~1023u) - raw;
}

__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
// Both carry a "memory" clobber, so the compiler never moves shared-memory accesses across
// them (every use is also followed by a barrier that has one; this does not rely on it).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t addr, std::uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t addr, std::uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b for one m16n8k16 tile.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                                         std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}
// The inverse: a bf16 pair (low half first) as two floats.
__device__ __forceinline__ float2 unpack_bf16(std::uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
}

// 2^x as the one MUFU.EX2 instruction, results below 2^-126 flushed to zero. exp2f adds a
// compare and two predicated multiplies around it to produce those denormals - three of four
// instructions spent on values that round to nothing next to a softmax row's largest term (1).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace csattn::cuda
