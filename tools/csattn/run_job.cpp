#include "run_job.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <utility>

#include <fmt/core.h>

#include "cli_util.hpp"
#include "csattn/checkpoint.hpp"
#include "csattn/error.hpp"
#include "csattn/layer.hpp"
#include "csattn/safetensors.hpp"
#include "oracle.hpp"

namespace csattn::cli {

std::vector<int> sample_rows(const SeqLayout& layout, int n) {
  if (n <= 0) return {};
  std::vector<int> real_rows;  // physical indices of every real row, ascending
  for (int b = 0; b < layout.num_segments(); ++b)
    for (int t = 0; t < layout.real_len(b); ++t) real_rows.push_back(layout.seg_start(b) + t);
  const auto total = static_cast<int>(real_rows.size());
  if (total <= n) return real_rows;

  std::set<int> picked;
  // Segment boundaries first: every segment's first row, then every segment's last row, so
  // that a small n still touches every segment.
  std::vector<int> boundaries;
  for (int b = 0; b < layout.num_segments(); ++b)
    if (layout.real_len(b) > 0) boundaries.push_back(layout.seg_start(b));
  for (int b = 0; b < layout.num_segments(); ++b)
    if (layout.real_len(b) > 0) boundaries.push_back(layout.seg_start(b) + layout.real_len(b) - 1);
  for (int r : boundaries) {
    if (static_cast<int>(picked.size()) >= n) break;
    picked.insert(r);
  }
  // Then rows spread evenly over the real rows (midpoints of m equal slices), growing m
  // until n distinct rows are chosen.
  for (int m = n - static_cast<int>(picked.size()); static_cast<int>(picked.size()) < n; ++m) {
    for (int j = 0; j < m && static_cast<int>(picked.size()) < n; ++j) {
      const auto ordinal =
          static_cast<int>((static_cast<std::int64_t>(2 * j + 1) * total) / (2 * std::int64_t{m}));
      picked.insert(real_rows[static_cast<std::size_t>(std::min(ordinal, total - 1))]);
    }
  }
  return {picked.begin(), picked.end()};
}

namespace {

std::vector<std::int32_t> topk_vector(const Tensor& topk, std::int64_t rows, int k) {
  require(topk.dtype() == DType::i32 && topk.shape() == Shape{rows, k}, ErrorKind::Internal,
          "backend topk_indices has dtype " + std::string(dtype_name(topk.dtype())) +
              " and shape " + shape_str(topk.shape()) + ", expected i32 " +
              shape_str(Shape{rows, k}));
  const std::int32_t* p = topk.ptr<std::int32_t>();
  return {p, p + topk.numel()};
}

}  // namespace

OracleCheck check_with_oracle(const AttentionConfig& cfg, const RunPlan& plan,
                              const LayerWeights& weights, const std::vector<double>& x64,
                              const LayerOutputs& fwd) {
  OracleCheck c;
  const std::vector<int> rows = sample_rows(plan.layout, plan.check_rows);
  if (rows.empty()) return c;
  Stopwatch sw;
  const oracle::Weights64 w64 = oracle::weights64(weights);
  const std::int64_t T = plan.layout.total_rows();
  const int d = cfg.d_model;

  std::vector<std::int32_t> backend_topk;
  oracle::Options forced;
  forced.query_rows = &rows;
  if (cfg.has_indexer()) {
    backend_topk = topk_vector(fwd.topk_indices, T, cfg.index_topk);
    forced.forced_topk = &backend_topk;
  }
  const oracle::Result ref = oracle::forward(cfg, plan.layout, w64, x64, forced);
  require(ref.output.size() == static_cast<std::size_t>(T) * static_cast<std::size_t>(d),
          ErrorKind::Internal, "oracle output has the wrong size");

  const float* out = fwd.output.ptr<float>();
  for (int r : rows) {
    for (int j = 0; j < d; ++j) {
      const std::size_t i = static_cast<std::size_t>(r) * static_cast<std::size_t>(d) +
                            static_cast<std::size_t>(j);
      const double diff = std::fabs(static_cast<double>(out[i]) - ref.output[i]);
      // NaN anywhere must show up, not vanish in std::max.
      c.max_abs_diff = std::isnan(diff) ? diff : std::max(c.max_abs_diff, diff);
      c.max_abs_ref = std::max(c.max_abs_ref, std::fabs(ref.output[i]));
      if (std::isnan(c.max_abs_diff)) break;
    }
  }
  c.rows = static_cast<int>(rows.size());

  if (cfg.has_indexer()) {
    oracle::Options own;
    own.query_rows = &rows;
    const oracle::Result sel = oracle::forward(cfg, plan.layout, w64, x64, own);
    const auto K = static_cast<std::size_t>(cfg.index_topk);
    require(sel.topk.size() == static_cast<std::size_t>(T) * K, ErrorKind::Internal,
            "oracle topk has the wrong size");
    int equal = 0;
    for (int r : rows) {
      const std::size_t off = static_cast<std::size_t>(r) * K;
      if (std::equal(sel.topk.begin() + static_cast<std::ptrdiff_t>(off),
                     sel.topk.begin() + static_cast<std::ptrdiff_t>(off + K),
                     backend_topk.begin() + static_cast<std::ptrdiff_t>(off)))
        ++equal;
    }
    c.topk_match = static_cast<double>(equal) / static_cast<double>(rows.size());
  }
  c.ms = sw.ms();
  return c;
}

std::map<std::string, std::string> save_metadata(const RunPlan& plan) {
  std::vector<int> indices, ratios;
  for (const LayerSpec& s : plan.layers) {
    indices.push_back(s.index);
    ratios.push_back(s.cfg.compress_ratio);
  }
  return {{"csattn.config", plan.model.to_hf_json()},
          {"csattn.precision", precision_name(plan.run_options.precision)},
          {"csattn.indexer_precision", indexer_precision_name(plan.model.base.indexer_precision)},
          {"csattn.seqlens", join_ints(plan.seqlens)},
          {"csattn.padded_seqlens", join_ints(plan.padded_seqlens)},
          {"csattn.layers", join_ints(indices)},
          {"csattn.compress_ratios", join_ints(ratios)},
          {"csattn.seed", std::to_string(plan.seed)}};
}

void record_layer(const RunPlan& plan, const LayerSpec& spec, const LayerOutputs& out,
                  const Tensor* grad_input, const std::map<std::string, Tensor>* grads,
                  LayerResult& res, TensorMap& saved) {
  res.indexer_loss = out.indexer_loss;
  res.output_norm = l2_norm(out.output);
  if (grad_input) res.grad_input_norm = l2_norm(*grad_input);
  if (grads) {
    double ss = 0.0;
    for (const auto& [name, g] : *grads) ss += sum_squares(g);
    res.grad_weights_norm = std::sqrt(ss);
  }
  if (plan.save_file.empty()) return;
  const std::string pre = plan.layers.size() > 1 ? spec.layer.prefix() + "." : "";
  saved[pre + "output"] = out.output;
  saved[pre + "indexer_loss"] = Tensor::scalar_f32(out.indexer_loss);
  if (spec.cfg.has_indexer() && out.topk_indices.nbytes() > 0)
    saved[pre + "topk_indices"] = out.topk_indices;
  if (grad_input) saved[pre + "grad.hidden_states"] = *grad_input;
  if (grads)
    for (const auto& [name, g] : *grads) saved[pre + "grad." + name] = g;
}

RunReport run_job(RunPlan& plan) {
  RunReport report;
  Stopwatch total;
  std::vector<double> x64;
  if (plan.check_rows > 0) x64 = plan.x.to_f64();
  TensorMap saved;
  const int n_layers = static_cast<int>(plan.layers.size());

  for (int li = 0; li < n_layers; ++li) {
    const LayerSpec& spec = plan.layers[static_cast<std::size_t>(li)];
    const AttentionConfig& cfg = spec.cfg;
    LayerResult res;
    res.index = spec.index;
    res.layer = spec.layer;
    res.compress_ratio = cfg.compress_ratio;
    res.kind = cfg.kind();
    res.tokens = plan.layout.total_rows();
    if (plan.progress)
      fmt::print(stderr, "csattn: [{}/{}] layer {} ({}): running\n", li + 1, n_layers,
                 spec.layer.label(), layer_kind_name(res.kind));

    LayerWeights weights = plan.file_weights
                               ? *plan.file_weights
                               : LayerWeights::random(cfg, plan.seed + static_cast<std::uint64_t>(spec.index));
    const HybridAttentionLayer layer(cfg, std::move(weights), plan.run_options);

    Stopwatch fwd_sw;
    LayerOutputs fwd = layer.forward(plan.x, plan.layout);
    res.forward_ms = fwd_sw.ms();

    LayerGradients grads;
    if (plan.backward) {
      Stopwatch bwd_sw;
      grads = layer.backward(fwd, plan.grad_output, 1.0f);
      res.backward_ms = bwd_sw.ms();
    }
    record_layer(plan, spec, fwd, plan.backward ? &grads.grad_input : nullptr,
                 plan.backward ? &grads.grad : nullptr, res, saved);
    if (plan.check_rows > 0) res.check = check_with_oracle(cfg, plan, layer.weights(), x64, fwd);

    if (plan.progress) {
      std::string line = fmt::format("csattn: [{}/{}] layer {} ({}): forward {:.1f} ms", li + 1,
                                     n_layers, spec.layer.label(), layer_kind_name(res.kind),
                                     res.forward_ms);
      if (res.backward_ms >= 0) line += fmt::format(", backward {:.1f} ms", res.backward_ms);
      if (res.check.rows > 0) line += fmt::format(", oracle check {:.1f} ms", res.check.ms);
      fmt::print(stderr, "{}\n", line);
      std::fflush(stderr);
    }
    report.layers.push_back(res);
  }

  if (!plan.save_file.empty()) save_safetensors(plan.save_file, saved, save_metadata(plan));
  report.total_ms = total.ms();
  return report;
}

}  // namespace csattn::cli
