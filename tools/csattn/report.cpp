#include "report.hpp"

#include <cmath>
#include <cstdio>

#include <fmt/core.h>

#include "cli_util.hpp"

namespace csattn::cli {

namespace {

std::string config_summary(const AttentionConfig& c) {
  return fmt::format(
      "d_model {}, heads {} x {} (rope {}), q_lora {}, o_groups {} x {}, window {}, "
      "indexer {} x {} top-{}",
      c.d_model, c.n_heads, c.head_dim, c.rope_dim, c.q_lora_rank, c.o_groups, c.o_lora_rank,
      c.window, c.index_n_heads, c.index_head_dim, c.index_topk);
}

// "-" for "not applicable" (negative sentinels).
std::string num_or_dash(double v, const char* spec) {
  if (v < 0) return "-";
  return fmt::format(fmt::runtime(spec), v);
}

}  // namespace

nlohmann::ordered_json json_number(double v) {
  if (!std::isfinite(v)) return nullptr;
  return v;
}

void print_run_table(const RunPlan& plan, const RunReport& report) {
  const AttentionConfig& c = plan.model.base;
  std::string source = "preset " + plan.preset;
  if (!plan.config_file.empty())
    source = "config " + plan.config_file + " (defaults: preset " + plan.preset + ")";
  fmt::print("csattn run: {}\n", source);
  fmt::print("  {}\n", config_summary(c));
  fmt::print("  device {}, precision {}, indexer {}, threads {}, seed {}, backward {}, "
             "indexer loss coeff {} ({}, {})\n",
             plan.run_options.device == Device::cuda ? "cuda" : "cpu",
             precision_name(plan.run_options.precision), indexer_precision_name(c.indexer_precision),
             plan.threads, plan.seed,
             plan.backward ? "on" : "off", c.loss_coeff, c.sparse_loss ? "sparse" : "dense",
             c.per_token_loss ? "sum over rows" : "mean over rows");
  std::string batch = fmt::format("  batch: {} segment{}, seqlens {}", plan.seqlens.size(),
                                  plan.seqlens.size() == 1 ? "" : "s", join_ints(plan.seqlens));
  if (plan.padded_seqlens != plan.seqlens)
    batch += fmt::format(" (padded {})", join_ints(plan.padded_seqlens));
  batch += fmt::format(", {} rows", plan.layout.total_rows());
  fmt::print("{}\n", batch);
  if (!plan.inputs_file.empty())
    fmt::print("  inputs {}{}\n", plan.inputs_file,
               plan.grad_output_from_file ? "" : " (grad_output: seeded random)");
  if (!plan.weights_file.empty()) fmt::print("  weights {}\n", plan.weights_file);
  if (plan.check_rows > 0)
    fmt::print("  oracle check: up to {} sampled rows per layer (fp64 reference)\n",
               plan.check_rows);
  fmt::print("\n");

  fmt::print("{:>5}  {:<4}  {:>7}  {:>9}  {:>9}  {:>10}  {:>10}  {:>10}  {:>10}  {:>4}  {:>9}  "
             "{:>9}  {:>9}  {:>7}\n",
             "layer", "type", "tokens", "fwd ms", "bwd ms", "idx loss", "|out|", "|grad in|",
             "|grad w|", "rows", "max|diff|", "max|ref|", "rel diff", "topk eq");
  for (const LayerResult& r : report.layers) {
    const bool checked = r.check.rows > 0;
    fmt::print(
        "{:>5}  {:<4}  {:>7}  {:>9.2f}  {:>9}  {:>10}  {:>10.4e}  {:>10}  {:>10}  {:>4}  {:>9}  "
        "{:>9}  {:>9}  {:>7}\n",
        r.layer.label(), layer_kind_name(r.kind), r.tokens, r.forward_ms,
        num_or_dash(r.backward_ms, "{:.2f}"),
        r.kind == LayerKind::csa && std::isfinite(r.indexer_loss)
            ? fmt::format("{:.4e}", r.indexer_loss)
            : std::string(r.kind == LayerKind::csa ? "n/a" : "-"),
        r.output_norm, num_or_dash(r.grad_input_norm, "{:.4e}"),
        num_or_dash(r.grad_weights_norm, "{:.4e}"), checked ? std::to_string(r.check.rows) : "-",
        checked ? fmt::format("{:.3e}", r.check.max_abs_diff) : "-",
        checked ? fmt::format("{:.3e}", r.check.max_abs_ref) : "-",
        checked ? fmt::format("{:.2e}", r.check.rel_diff()) : "-",
        checked && r.check.topk_match >= 0 ? fmt::format("{:.3f}", r.check.topk_match) : "-");
  }
  fmt::print("\n");
  if (plan.check_rows > 0)
    fmt::print(
        "max|diff|: largest |output - oracle| on the sampled rows (CSA: attention on the "
        "backend's top-k); rel diff = max|diff| / max|ref|;\n"
        "topk eq: fraction of sampled rows whose own oracle top-k equals the backend's (in bf16,\n"
        "rounded scores can swap near-ties at the k-th boundary; --dtype fp32 compares exactly).\n");
  fmt::print("total {:.1f} ms\n", report.total_ms);
  std::fflush(stdout);
}

nlohmann::ordered_json run_report_json(const RunPlan& plan, const RunReport& report) {
  using ojson = nlohmann::ordered_json;
  const AttentionConfig& c = plan.model.base;
  ojson j;
  j["command"] = "run";
  j["preset"] = plan.preset;
  j["config_file"] = plan.config_file.empty() ? ojson(nullptr) : ojson(plan.config_file);
  j["config"] = ojson::parse(plan.model.to_hf_json());
  j["indexer_loss"] = {{"coeff", c.loss_coeff},
                       {"sparse", c.sparse_loss},
                       {"per_token", c.per_token_loss}};
  j["precision"] = precision_name(plan.run_options.precision);
  j["device"] = plan.run_options.device == Device::cuda ? "cuda" : "cpu";
  j["indexer_precision"] = indexer_precision_name(c.indexer_precision);
  j["threads"] = plan.threads;
  j["seed"] = plan.seed;
  j["backward"] = plan.backward;
  j["seqlens"] = plan.seqlens;
  j["padded_seqlens"] = plan.padded_seqlens;
  j["total_rows"] = plan.layout.total_rows();
  j["inputs_file"] = plan.inputs_file.empty() ? ojson(nullptr) : ojson(plan.inputs_file);
  j["weights_file"] = plan.weights_file.empty() ? ojson(nullptr) : ojson(plan.weights_file);
  j["save_file"] = plan.save_file.empty() ? ojson(nullptr) : ojson(plan.save_file);
  j["check_rows"] = plan.check_rows;
  ojson layers = ojson::array();
  for (const LayerResult& r : report.layers) {
    ojson l;
    l["index"] = r.index;
    l["name"] = r.layer.prefix();  // layers.N, or mtp.K for a config's MTP module entry
    l["compress_ratio"] = r.compress_ratio;
    l["type"] = layer_kind_name(r.kind);
    l["tokens"] = r.tokens;
    l["forward_ms"] = json_number(r.forward_ms);
    l["backward_ms"] = r.backward_ms < 0 ? ojson(nullptr) : json_number(r.backward_ms);
    l["indexer_loss"] = json_number(r.indexer_loss);
    l["output_norm"] = json_number(r.output_norm);
    l["grad_input_norm"] = r.grad_input_norm < 0 ? ojson(nullptr) : json_number(r.grad_input_norm);
    l["grad_weights_norm"] =
        r.grad_weights_norm < 0 ? ojson(nullptr) : json_number(r.grad_weights_norm);
    if (r.check.rows > 0) {
      l["check"] = {{"rows", r.check.rows},
                    {"max_abs_diff", json_number(r.check.max_abs_diff)},
                    {"max_abs_ref", json_number(r.check.max_abs_ref)},
                    {"rel_diff", json_number(r.check.rel_diff())},
                    {"topk_match_fraction",
                     r.check.topk_match < 0 ? ojson(nullptr) : json_number(r.check.topk_match)},
                    {"ms", json_number(r.check.ms)}};
    } else {
      l["check"] = nullptr;
    }
    layers.push_back(std::move(l));
  }
  j["layers"] = std::move(layers);
  j["total_ms"] = json_number(report.total_ms);
  return j;
}

}  // namespace csattn::cli
