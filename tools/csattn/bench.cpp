// `csattn bench`: tokens per second of forward and forward + backward of single-sequence
// batches, per preset, length and layer type (median of --repeat timed runs).
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#ifdef CSATTN_HAVE_CUDA
#include "cuda_bench.hpp"
#endif
#include "csattn/config.hpp"
#include "csattn/layer.hpp"
#include "csattn/layout.hpp"
#include "csattn/weights.hpp"
#include "report.hpp"

namespace csattn::cli {

namespace {

struct BenchArgs {
  std::vector<std::string> presets;
  std::vector<std::string> seqlens;
  std::vector<std::string> ratios;
  int repeat = 3;
  int warmup = 1;
  bool json = false;
  int threads = 0;
  std::uint64_t seed = 42;
  std::string dtype = "bf16";
  bool quiet = false;
  std::string device = "cpu";
  std::string out, svg;  // GPU benchmarks
  std::vector<std::string> sections;  // GPU benchmarks: empty = all
};

// Default lengths per preset: the large presets get shorter sequences.
std::vector<int> default_seqlens(const std::string& preset) {
  if (preset == "flash" || preset == "pro") return {1024, 2048};
  return {1024, 4096};
}

struct BenchCase {
  std::string preset;
  AttentionConfig cfg;
  int layer_index = 0;
  int seqlen = 0;
};

struct BenchResult {
  BenchCase c;
  std::vector<double> forward_ms;
  std::vector<double> forward_backward_ms;
  double fwd_median() const { return median(forward_ms); }
  double fwd_bwd_median() const { return median(forward_backward_ms); }
};

double tokens_per_s(std::int64_t tokens, double ms) {
  return ms > 0 ? static_cast<double>(tokens) * 1000.0 / ms : 0.0;
}

int run_gpu_bench(const BenchArgs& a) {
#ifdef CSATTN_HAVE_CUDA
  const std::vector<std::string>& known = bench::cuda_bench_sections();
  for (const std::string& s : a.sections)
    if (std::find(known.begin(), known.end(), s) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      std::fprintf(stderr, "csattn: error: --sections: unknown benchmark section '%s' (expected %s)\n", s.c_str(),
                   list.c_str());
      return 2;
    }
  std::string why;
  if (!cuda_available(&why)) {
    std::fprintf(stderr, "csattn: error: --device: cuda: %s\n", why.c_str());
    return 2;
  }
  return bench::run_cuda_bench(a.out, a.svg, a.sections);
#else
  (void)a;
  std::fprintf(stderr, "csattn: error: --device: cuda: this build has no CUDA backend\n");
  return 2;
#endif
}

int run_bench(const BenchArgs& a) {
  // Validate every option before any work.
  std::vector<std::string> presets;
  for (const std::string& p : a.presets.empty() ? std::vector<std::string>{"small", "flash"}
                                                : a.presets)
    presets.push_back(check_preset(p, "--preset"));
  const std::vector<int> given_lens =
      a.seqlens.empty() ? std::vector<int>{} : parse_int_list(a.seqlens, "--seqlens");
  for (int L : given_lens)
    if (L < 1) bad_option("--seqlens", std::to_string(L) + " must be >= 1");
  const std::vector<int> ratios =
      a.ratios.empty() ? std::vector<int>{0, 4, 128} : parse_ratio_list(a.ratios, "--ratio");
  if (a.repeat < 1) bad_option("--repeat", std::to_string(a.repeat) + " must be >= 1");
  if (a.warmup < 0) bad_option("--warmup", std::to_string(a.warmup) + " must be >= 0");
  const Precision precision = parse_precision(a.dtype, "--dtype");
  const int threads = apply_threads(a.threads, "--threads");

  std::vector<BenchCase> cases;
  for (const std::string& p : presets) {
    const ModelConfig model = ModelConfig::preset(p);
    for (int L : given_lens.empty() ? default_seqlens(p) : given_lens) {
      for (std::size_t i = 0; i < ratios.size(); ++i) {
        BenchCase c{p, model.base, static_cast<int>(i), L};
        c.cfg.compress_ratio = ratios[i];
        c.cfg.validate();
        cases.push_back(c);
      }
    }
  }

  RunOptions ro;
  ro.precision = precision;
  ro.threads = a.threads;
  const bool bf16 = precision == Precision::bf16;
  std::vector<BenchResult> results;
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    const BenchCase& c = cases[ci];
    if (!a.quiet) {
      fmt::print(stderr, "csattn bench: [{}/{}] {} {} {} tokens\n", ci + 1, cases.size(),
                 c.preset, layer_kind_name(c.cfg.kind()), c.seqlen);
      std::fflush(stderr);
    }
    const SeqLayout layout = SeqLayout::bshd(1, c.seqlen);
    const Shape shape = {c.seqlen, c.cfg.d_model};
    const auto n = static_cast<std::size_t>(c.seqlen) * static_cast<std::size_t>(c.cfg.d_model);
    const Tensor x = Tensor::from_f32(random_normal(n, a.seed, 1, bf16), shape);
    const Tensor gy = Tensor::from_f32(random_normal(n, a.seed, 2, bf16), shape);
    const HybridAttentionLayer layer(
        c.cfg, LayerWeights::random(c.cfg, a.seed + static_cast<std::uint64_t>(c.layer_index)),
        ro);

    for (int w = 0; w < a.warmup; ++w) {
      const LayerOutputs f = layer.forward(x, layout);
      (void)layer.backward(f, gy, 1.0f);
    }
    BenchResult r{c, {}, {}};
    for (int k = 0; k < a.repeat; ++k) {
      Stopwatch sw;
      const LayerOutputs f = layer.forward(x, layout);
      r.forward_ms.push_back(sw.ms());
    }
    for (int k = 0; k < a.repeat; ++k) {
      Stopwatch sw;
      const LayerOutputs f = layer.forward(x, layout);
      (void)layer.backward(f, gy, 1.0f);
      r.forward_backward_ms.push_back(sw.ms());
    }
    results.push_back(std::move(r));
  }

  if (a.json) {
    using ojson = nlohmann::ordered_json;
    ojson j;
    j["command"] = "bench";
    j["precision"] = precision_name(precision);
    j["threads"] = threads;
    j["repeat"] = a.repeat;
    j["warmup"] = a.warmup;
    j["seed"] = a.seed;
    ojson rows = ojson::array();
    for (const BenchResult& r : results) {
      const double f = r.fwd_median(), fb = r.fwd_bwd_median();
      rows.push_back({{"preset", r.c.preset},
                      {"compress_ratio", r.c.cfg.compress_ratio},
                      {"type", layer_kind_name(r.c.cfg.kind())},
                      {"tokens", r.c.seqlen},
                      {"forward_ms", json_number(f)},
                      {"forward_backward_ms", json_number(fb)},
                      {"forward_tokens_per_s", json_number(tokens_per_s(r.c.seqlen, f))},
                      {"forward_backward_tokens_per_s", json_number(tokens_per_s(r.c.seqlen, fb))},
                      {"forward_ms_runs", r.forward_ms},
                      {"forward_backward_ms_runs", r.forward_backward_ms}});
    }
    j["results"] = std::move(rows);
    fmt::print("{}\n", j.dump(2));
    return 0;
  }

  fmt::print("csattn bench: precision {}, threads {}, median of {} runs after {} warmup\n\n",
             precision_name(precision), threads, a.repeat, a.warmup);
  fmt::print("{:<6}  {:<4}  {:>7}  {:>10}  {:>12}  {:>12}  {:>14}\n", "preset", "type", "tokens",
             "fwd ms", "fwd+bwd ms", "fwd tok/s", "fwd+bwd tok/s");
  for (const BenchResult& r : results) {
    const double f = r.fwd_median(), fb = r.fwd_bwd_median();
    fmt::print("{:<6}  {:<4}  {:>7}  {:>10.2f}  {:>12.2f}  {:>12.0f}  {:>14.0f}\n", r.c.preset,
               layer_kind_name(r.c.cfg.kind()), r.c.seqlen, f, fb, tokens_per_s(r.c.seqlen, f),
               tokens_per_s(r.c.seqlen, fb));
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Tokens per second of forward and forward + backward (median of --repeat runs)");
  cmd->add_option("--preset", a->presets, "Presets, comma list [default: small,flash]")
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_option("--seqlens", a->seqlens,
                  "Single-sequence lengths, comma list [default: small 1024,4096; flash "
                  "1024,2048]")
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_option("--ratio", a->ratios, "Compress ratios, comma list [default: 0,4,128]")
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_option("--repeat", a->repeat, "Timed runs per case (the median is reported)")
      ->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "Untimed forward + backward runs first")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON instead of the table");
  cmd->add_option("--threads", a->threads, "OpenMP threads (0 = default)");
  cmd->add_option("--seed", a->seed, "Seed of the random weights and inputs")
      ->capture_default_str();
  cmd->add_option("--dtype", a->dtype, "Precision: bf16 or fp32")->capture_default_str();
  cmd->add_flag("-q,--quiet", a->quiet, "No progress lines on stderr");
  cmd->add_option("--device", a->device,
                  "cpu: the layer's tokens/s (the options above); cuda: the GPU benchmarks "
                  "(ceilings, sparse attention at FlashMLA's shapes, layer forward + "
                  "backward, indexer at 32K-128K tokens), with --out and --svg")
      ->capture_default_str();
  cmd->add_option("--out", a->out, "GPU benchmarks: write the JSON report here")->type_name("FILE");
  cmd->add_option("--svg", a->svg, "GPU benchmarks: write the attention chart here")->type_name("FILE");
  cmd->add_option("--sections", a->sections,
                  "GPU benchmarks: run only these sections (attention, attention_backward, reductions, "
                  "layer, deterministic, indexer, elementwise, indexer_loss, cp) [default: all]")
      ->delimiter(',')
      ->type_name("LIST");
  return [a]() {
    if (a->device == "cuda") return run_gpu_bench(*a);
    if (a->device != "cpu") {
      std::fprintf(stderr, "csattn: error: --device: '%s' is not one of cpu, cuda\n", a->device.c_str());
      return 2;
    }
    return run_bench(*a);
  };
}

}  // namespace csattn::cli
