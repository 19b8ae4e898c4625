// The compact indexer on the CPU (spec 03 §2-§3): scores only the causally visible
// (query, compressed key) pairs into the compact candidate buffer, one slab per row at its
// closed-form offset, then selects each row's top-k with the shared rule (topk_select.hpp)
// and the softmax over the selection. Rows are processed in passes of a fixed number of rows
// reusing one buffer (one pass = all rows). No dense score matrix exists at any point: the
// scratch per thread is one row block x H x one key tile.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace csattn::cpu {

// Where the 128x4-packed E8M0 scale of (segment, local token, sub-row, group) lives.
struct PackedScaleAddress {
  bool thd = true;
  int rows_per_token = 1;
  int groups_padded = 4;
  std::int64_t slice_bytes = 0;             // BSHD: bytes per batch entry
  const std::int32_t* prefixes = nullptr;   // THD: padded token prefixes of this call
  std::int64_t offset(int segment, std::int64_t local_token, int sub, int group) const;
};

// Rows of an operand read as fp32: [tokens, rows_per_token, cols] f32, bf16 or E4M3 + packed
// scales.
struct OperandRows {
  enum class Kind { f32, bf16, mxfp8 };
  Kind kind = Kind::f32;
  const void* data = nullptr;
  int rows_per_token = 1;
  int cols = 0;
  const std::uint8_t* packed_scales = nullptr;  // mxfp8
  PackedScaleAddress scales;                     // mxfp8

  // fp32 values of `count` tokens starting at global token `token` (local position `local`
  // in `segment`): a pointer into `data` for f32, else dequantized / converted into scratch.
  const float* load(int segment, std::int64_t token, std::int64_t local, std::int64_t count,
                    std::vector<float>& scratch) const;
};

struct CompactIndexerCall {
  int heads = 0, dim = 0, topk = 0, ratio = 0;
  float sm_scale = 1.0f;
  // THD form of the batch (BSHD: equal lengths): B+1 prefixes, B causal offsets or empty.
  std::span<const std::int32_t> cu_q, cu_k, offsets;
  OperandRows q;  // rows_per_token = heads, cols = dim
  OperandRows k;  // rows_per_token = 1, cols = dim
  OperandRows w;  // rows_per_token = 1, cols = heads (f32 / bf16)
  std::span<std::int64_t> cand_batch_offsets;  // [B+1], written by the call
  float* cand = nullptr;                       // the candidate buffer
  std::int64_t cand_capacity = 0;              // floats
  std::int64_t pass_rows = 0;                  // rows per pass (>= 1)
  std::int32_t* indices = nullptr;             // [T_q, topk]
  float* logits = nullptr;                     // [T_q, topk]
  float* softmax = nullptr;                    // [T_q, topk] or null
};

// Throws csattn::Error(Internal) if a pass would not fit the buffer (the caller validated
// the layout against the plan, so this is a broken invariant).
void compact_indexer_topk(const CompactIndexerCall& call);

}  // namespace csattn::cpu
