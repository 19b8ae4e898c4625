// The host-side plans of plan.hpp: static sizes and workspace offsets.
#include "csattn/plan.hpp"

#include <algorithm>
#include <string>

#include "core/compact_layout.hpp"
#include "core/mxfp8_layout.hpp"
#include "csattn/error.hpp"

namespace csattn {

const char* qkv_format_name(QkvFormat f) { return f == QkvFormat::bshd ? "bshd" : "thd"; }

namespace {

void require_at_least(std::int64_t value, std::int64_t min, const std::string& name) {
  require(value >= min, ErrorKind::InvalidArgument,
          name + " = " + std::to_string(value) + " must be >= " + std::to_string(min));
}

void require_mxfp8_cols(int cols, const std::string& name) {
  require(cols > 0 && cols % mxfp8::kBlock == 0, ErrorKind::InvalidArgument,
          name + " = " + std::to_string(cols) +
              " must be a positive multiple of 32 (one E8M0 scale per 32 elements)");
}

// Appends a region of `bytes` to the workspace being laid out.
WorkspaceRegion take(std::size_t& cursor, std::int64_t bytes) {
  WorkspaceRegion r{cursor, static_cast<std::size_t>(bytes)};
  cursor += (r.bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
  return r;
}

}  // namespace

std::int64_t Mxfp8ScalePlan::logical_rows() const {
  return (format == QkvFormat::bshd ? batch * tokens : tokens) * rows_per_token;
}

Mxfp8ScalePlan Mxfp8ScalePlan::bshd(std::int64_t batch, std::int64_t seqlen, int rows_per_token,
                                    int cols) {
  require_at_least(batch, 1, "mxfp8 scale plan: batch");
  require_at_least(seqlen, 0, "mxfp8 scale plan: seqlen");
  require_at_least(rows_per_token, 1, "mxfp8 scale plan: rows_per_token");
  require_mxfp8_cols(cols, "mxfp8 scale plan: cols");
  Mxfp8ScalePlan p;
  p.format = QkvFormat::bshd;
  p.batch = batch;
  p.tokens = seqlen;
  p.rows_per_token = rows_per_token;
  p.cols = cols;
  p.groups = mxfp8::scale_groups(cols);
  p.groups_padded = mxfp8::padded_groups(p.groups);
  p.capacity_tokens = seqlen;
  p.slices = batch;
  p.rows_padded = mxfp8::round_up(seqlen * rows_per_token, mxfp8::kAtomRows);
  return p;
}

Mxfp8ScalePlan Mxfp8ScalePlan::thd(std::int64_t tokens, std::int64_t sequences,
                                   int rows_per_token, int cols) {
  require_at_least(tokens, 0, "mxfp8 scale plan: tokens");
  require_at_least(sequences, 1, "mxfp8 scale plan: sequences");
  require_at_least(rows_per_token, 1, "mxfp8 scale plan: rows_per_token");
  require_mxfp8_cols(cols, "mxfp8 scale plan: cols");
  Mxfp8ScalePlan p;
  p.format = QkvFormat::thd;
  p.batch = sequences;
  p.tokens = tokens;
  p.rows_per_token = rows_per_token;
  p.cols = cols;
  p.groups = mxfp8::scale_groups(cols);
  p.groups_padded = mxfp8::padded_groups(p.groups);
  p.token_alignment = mxfp8::thd_token_alignment(rows_per_token);
  p.capacity_tokens = mxfp8::thd_scale_capacity_tokens(tokens, sequences, rows_per_token);
  p.slices = 1;
  p.rows_padded = p.capacity_tokens * rows_per_token;  // a multiple of 128 by construction
  return p;
}

CompactIndexerPlan CompactIndexerPlan::make(const CompactIndexerGeometry& g) {
  const std::string w = "compact indexer geometry: ";
  require_at_least(g.batch, 1, w + "batch");
  require_at_least(g.heads, 1, w + "heads");
  require_at_least(g.head_dim, 1, w + "head_dim");
  require_at_least(g.topk, 1, w + "topk");
  require_at_least(g.ratio, 1, w + "ratio");
  require_at_least(g.max_seqlen_q, 0, w + "max_seqlen_q");
  require_at_least(g.max_seqlen_k, 0, w + "max_seqlen_k");
  require_at_least(g.rows_per_pass, 0, w + "rows_per_pass");
  const bool mx = g.precision == IndexerPrecision::mxfp8;
  if (mx) require_mxfp8_cols(g.head_dim, w + "head_dim (precision mxfp8)");

  CompactIndexerPlan p;
  p.geometry = g;
  if (g.format == QkvFormat::bshd) {
    p.q_rows = std::int64_t{g.batch} * g.max_seqlen_q;
    p.k_rows = std::int64_t{g.batch} * g.max_seqlen_k;
  } else {
    require_at_least(g.q_rows, 0, w + "q_rows");
    require_at_least(g.k_rows, 0, w + "k_rows");
    require(g.q_rows <= std::int64_t{g.batch} * g.max_seqlen_q, ErrorKind::InvalidArgument,
            w + "q_rows = " + std::to_string(g.q_rows) + " cannot be split into batch = " +
                std::to_string(g.batch) + " segments of at most max_seqlen_q = " +
                std::to_string(g.max_seqlen_q) + " rows");
    p.q_rows = g.q_rows;
    p.k_rows = g.k_rows;
  }
  const std::int64_t one_pass =
      g.format == QkvFormat::bshd && !g.causal_offsets
          ? std::int64_t{g.batch} *
                compact::rows_candidates_before(0, g.max_seqlen_q, g.ratio, g.max_seqlen_k)
          : compact::cand_capacity(p.q_rows, g.batch, g.max_seqlen_q, g.max_seqlen_k, g.ratio,
                                   g.causal_offsets);
  if (g.rows_per_pass > 0 && g.rows_per_pass < p.q_rows) {
    p.pass_rows = g.rows_per_pass;
    p.cand_capacity = std::min(one_pass, compact::cand_capacity_per_pass(
                                             g.rows_per_pass, g.max_seqlen_q, g.max_seqlen_k,
                                             g.ratio, g.causal_offsets));
  } else {
    p.pass_rows = std::max<std::int64_t>(p.q_rows, 1);
    p.cand_capacity = one_pass;
  }

  std::size_t cursor = 0;
  p.cand_batch_offsets = take(cursor, (std::int64_t{g.batch} + 1) * 8);
  p.cand_buffer = take(cursor, p.cand_capacity * 4);
  if (mx) {
    if (g.format == QkvFormat::bshd) {
      p.q_scale = Mxfp8ScalePlan::bshd(g.batch, g.max_seqlen_q, g.heads, g.head_dim);
      p.k_scale = Mxfp8ScalePlan::bshd(g.batch, g.max_seqlen_k, 1, g.head_dim);
    } else {
      p.q_scale = Mxfp8ScalePlan::thd(p.q_rows, g.batch, g.heads, g.head_dim);
      p.k_scale = Mxfp8ScalePlan::thd(p.k_rows, g.batch, 1, g.head_dim);
    }
    p.q_data = take(cursor, p.q_rows * g.heads * g.head_dim);
    p.k_data = take(cursor, p.k_rows * g.head_dim);
    p.q_scale_logical = take(cursor, p.q_scale.logical_bytes());
    p.k_scale_logical = take(cursor, p.k_scale.logical_bytes());
    p.q_scale_packed = take(cursor, p.q_scale.packed_bytes());
    p.k_scale_packed = take(cursor, p.k_scale.packed_bytes());
    if (g.format == QkvFormat::thd) {
      p.q_scale_cu_seqlens = take(cursor, (std::int64_t{g.batch} + 1) * 4);
      p.k_scale_cu_seqlens = take(cursor, (std::int64_t{g.batch} + 1) * 4);
    }
  }
  p.workspace_bytes = cursor;
  return p;
}

HostWorkspace::HostWorkspace(std::size_t bytes)
    : chunks_((bytes + sizeof(Chunk) - 1) / sizeof(Chunk)), bytes_(bytes) {}

TensorView HostWorkspace::view() {
  return {bytes_ ? data() : nullptr, DType::e8m0, {static_cast<std::int64_t>(bytes_)}, Device::cpu};
}

}  // namespace csattn
