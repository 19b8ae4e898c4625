// Host-side plans: buffer sizes and workspace offsets computed from STATIC shapes only
// (sizes, counts, maxima; never sequence boundaries). A plan is made once (e.g. before
// CUDA-graph capture), the caller allocates the workspace it asks for, and every call of the
// operator (ops.hpp) derives all sequence-dependent metadata - candidate offsets, THD scale
// prefixes - from the inputs of THAT call, into the workspace. Nothing computed from one
// call's boundaries is ever read by another call: a plan made for one packing serves any
// packing with the same static shapes. (spec 03 §6.5: scale prefixes kept from warmup were
// stale on replay with new boundaries; here there is nothing to keep.)
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "csattn/config.hpp"
#include "csattn/tensor.hpp"

namespace csattn {

// BSHD: B sequences of equal length, tensors [B, S, ...]. THD: packed rows [T, ...] split by
// cu_seqlens (B+1, int32).
enum class QkvFormat { bshd, thd };
const char* qkv_format_name(QkvFormat f);

// A byte range [offset, offset + bytes) of a caller-owned workspace; offsets are multiples of
// kWorkspaceAlignment.
struct WorkspaceRegion {
  std::size_t offset = 0;
  std::size_t bytes = 0;
};
constexpr std::size_t kWorkspaceAlignment = 256;

// MXFP8 scale storage of one operand in the 128x4 layout (spec 03 §5.5).
// Logical scales are [rows, groups] bytes, rows = token * rows_per_token + sub-row (Q:
// token * H + head; K: token), groups = cols / 32. Packed scales are [slices, rows_padded,
// groups_padded] bytes: BSHD one slice per batch entry with rows padded to 128; THD one slice
// whose rows are the worst-case padded total (capacity_tokens * rows_per_token).
struct Mxfp8ScalePlan {
  QkvFormat format = QkvFormat::thd;
  std::int64_t batch = 0;       // BSHD: B. THD: number of sequences N
  std::int64_t tokens = 0;      // BSHD: tokens per batch entry S. THD: total tokens T
  int rows_per_token = 1;       // H for Q, 1 for K
  int cols = 0;                 // elements per logical row (a head vector), multiple of 32
  int groups = 0;               // cols / 32
  int groups_padded = 0;        // groups rounded up to 4
  int token_alignment = 0;      // THD: 128 / gcd(128, rows_per_token); BSHD: 0
  std::int64_t capacity_tokens = 0;  // THD: floor((T + min(T,N)(a-1)) / a) a; BSHD: S
  std::int64_t slices = 0;           // BSHD: B; THD: 1
  std::int64_t rows_padded = 0;      // rows of one slice, a multiple of 128

  std::int64_t logical_rows() const;  // BSHD: B*S*rows_per_token; THD: T*rows_per_token
  std::int64_t logical_bytes() const { return logical_rows() * groups; }
  std::int64_t packed_bytes() const { return slices * rows_padded * groups_padded; }
  Shape packed_shape() const { return {slices, rows_padded, groups_padded}; }

  // Throw csattn::Error naming the bad argument.
  static Mxfp8ScalePlan bshd(std::int64_t batch, std::int64_t seqlen, int rows_per_token,
                             int cols);
  static Mxfp8ScalePlan thd(std::int64_t tokens, std::int64_t sequences, int rows_per_token,
                            int cols);
};

// The static geometry of compact_indexer_topk calls (spec 03 §2, §6).
struct CompactIndexerGeometry {
  QkvFormat format = QkvFormat::thd;
  int batch = 0;               // B: batch entries (BSHD) or packed segments (THD)
  std::int64_t q_rows = 0;     // THD: T_q (rows of q). BSHD: ignored (B * S_q)
  std::int64_t k_rows = 0;     // THD: T_k (rows of k). BSHD: ignored (B * S_k)
  int max_seqlen_q = 0;        // BSHD: S_q. THD: bound on every segment's query length
  int max_seqlen_k = 0;        // BSHD: S_k. THD: bound on every segment's key length
  int heads = 0;               // H: indexer query heads (any count)
  int head_dim = 0;            // D (mxfp8: a multiple of 32)
  int topk = 0;                // K: output width
  int ratio = 4;               // r: compressed entry j covers raw tokens [j r, (j+1) r)
  bool causal_offsets = false;  // q_causal_offsets will be passed (context parallelism)
  IndexerPrecision precision = IndexerPrecision::bf16;
  // 0: score every row in one pass (buffer of all candidates). > 0: score and select this
  // many consecutive rows at a time, reusing one buffer of rows_per_pass * max candidates
  // per row (bounded memory for very long sequences; results are identical).
  int rows_per_pass = 0;
};

// Sizes and workspace layout of compact_indexer_topk for one geometry.
struct CompactIndexerPlan {
  CompactIndexerGeometry geometry;
  std::int64_t q_rows = 0, k_rows = 0;  // total rows of q and k (BSHD: B*S)
  std::int64_t pass_rows = 0;           // rows per pass in effect (q_rows for one pass)
  // Capacity of the candidate buffer in floats. One pass: BSHD B Gfun(S_q) exactly (S_k
  // clamp included); THD without offsets the worst split of q_rows into segments of at most
  // max_seqlen_q rows (about T_q max_seqlen_q / (2r)); with offsets T_q max_seqlen_k.
  // Chunked: rows_per_pass * min(max_seqlen_k, max_seqlen_q div r) (offsets:
  // rows_per_pass * max_seqlen_k), capped by the one-pass value.
  std::int64_t cand_capacity = 0;
  Mxfp8ScalePlan q_scale, k_scale;  // mxfp8 only

  // Workspace regions (bytes == 0: not used by this geometry).
  WorkspaceRegion cand_batch_offsets;  // int64 [B+1]
  WorkspaceRegion cand_buffer;         // f32 [cand_capacity]
  WorkspaceRegion q_data, k_data;      // e4m3, like q and k
  WorkspaceRegion q_scale_logical, k_scale_logical;  // e8m0 [rows, D/32]
  WorkspaceRegion q_scale_packed, k_scale_packed;    // e8m0, Mxfp8ScalePlan::packed_shape()
  WorkspaceRegion q_scale_cu_seqlens, k_scale_cu_seqlens;  // THD: int32 [B+1] padded prefixes
  std::size_t workspace_bytes = 0;

  // Validates the geometry (csattn::Error naming the field) and lays out the workspace.
  static CompactIndexerPlan make(const CompactIndexerGeometry& geometry);
};

inline std::size_t workspace_bytes(const CompactIndexerPlan& plan) { return plan.workspace_bytes; }

// Host memory for a workspace (64-byte aligned, uninitialised contents are fine: operators
// never read a workspace byte they did not write in the same call). For CPU callers.
class HostWorkspace {
 public:
  explicit HostWorkspace(std::size_t bytes = 0);
  std::size_t bytes() const { return bytes_; }
  TensorView view();  // dtype e8m0 (bytes), shape [bytes]
  unsigned char* data() { return reinterpret_cast<unsigned char*>(chunks_.data()); }

 private:
  struct alignas(64) Chunk {
    unsigned char b[64];
  };
  std::vector<Chunk> chunks_;
  std::size_t bytes_ = 0;
};

}  // namespace csattn
