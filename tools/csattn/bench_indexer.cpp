// `csattn bench-indexer`: the compact indexer forward + top-k + softmax alone
// (ops::compact_indexer_topk) on one BSHD sequence per length: scored (query, key) pairs per
// second and the memory of the candidate buffer / workspace, one pass and chunked, against
// the dense [S_q, S_k] fp32 score matrix the compact path never allocates.
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "commands.hpp"
#include "csattn/config.hpp"
#include "csattn/ops.hpp"
#include "csattn/plan.hpp"
#include "report.hpp"

namespace csattn::cli {

namespace {

struct BenchIndexerArgs {
  std::vector<std::string> seqlens;
  std::vector<std::string> precisions;
  int heads = 64, head_dim = 128, topk = 512, ratio = 4;
  int rows_per_pass = 0;
  int repeat = 3, warmup = 1, threads = 0;
  std::uint64_t seed = 42;
  bool json = false;
  bool quiet = false;
};

struct Row {
  int seqlen = 0;
  IndexerPrecision precision = IndexerPrecision::bf16;
  std::int64_t pairs = 0;
  std::size_t workspace = 0, cand_bytes = 0;
  double dense_bytes = 0.0;
  std::vector<double> ms;
};

std::vector<std::uint16_t> random_bf16(std::size_t n, std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16_bits(dist(rng));
  return v;
}

int run_bench_indexer(const BenchIndexerArgs& a) {
  const std::vector<int> lens = a.seqlens.empty() ? std::vector<int>{1024, 4096, 16384}
                                                  : parse_int_list(a.seqlens, "--seqlens");
  for (int L : lens)
    if (L < 1) bad_option("--seqlens", std::to_string(L) + " must be >= 1");
  std::vector<IndexerPrecision> precs;
  for (const std::string& s :
       a.precisions.empty() ? std::vector<std::string>{"bf16", "mxfp8"} : a.precisions)
    precs.push_back(parse_indexer_precision(s, "--indexer-precision"));
  if (a.repeat < 1) bad_option("--repeat", std::to_string(a.repeat) + " must be >= 1");
  if (a.warmup < 0) bad_option("--warmup", std::to_string(a.warmup) + " must be >= 0");
  if (a.rows_per_pass < 0)
    bad_option("--rows-per-pass", std::to_string(a.rows_per_pass) + " must be >= 0");
  const int threads = apply_threads(a.threads, "--threads");

  std::vector<Row> rows;
  for (int L : lens) {
    const int Sk = L / a.ratio;
    std::mt19937_64 rng(a.seed + static_cast<std::uint64_t>(L));
    const auto q = random_bf16(static_cast<std::size_t>(L) * a.heads * a.head_dim, rng, 1.0f);
    const auto k = random_bf16(static_cast<std::size_t>(Sk) * a.head_dim, rng, 1.0f);
    const auto w = random_bf16(static_cast<std::size_t>(L) * a.heads, rng, 0.01f);
    for (IndexerPrecision prec : precs) {
      CompactIndexerGeometry g;
      g.format = QkvFormat::bshd;
      g.batch = 1;
      g.max_seqlen_q = L;
      g.max_seqlen_k = Sk;
      g.heads = a.heads;
      g.head_dim = a.head_dim;
      g.topk = a.topk;
      g.ratio = a.ratio;
      g.precision = prec;
      g.rows_per_pass = a.rows_per_pass;
      const CompactIndexerPlan plan = CompactIndexerPlan::make(g);
      HostWorkspace ws(workspace_bytes(plan));
      std::vector<std::int32_t> idx(static_cast<std::size_t>(L) * a.topk);
      std::vector<float> logits(idx.size()), softmax(idx.size());
      ops::CompactIndexerInputs in;
      in.q = {q.data(), DType::bf16, {1, L, a.heads, a.head_dim}};
      in.k = {k.data(), DType::bf16, {1, Sk, a.head_dim}};
      in.weights = {w.data(), DType::bf16, {1, L, a.heads}};
      ops::CompactIndexerOutputs out;
      out.indices = {idx.data(), DType::i32, {1, L, a.topk}};
      out.logits = {logits.data(), DType::f32, {1, L, a.topk}};
      out.softmax = {softmax.data(), DType::f32, {1, L, a.topk}};
      Row r;
      r.seqlen = L;
      r.precision = prec;
      // Valid pairs: sum over rows of min((t+1) div r, S_k) - what the buffer holds in one pass.
      for (int t = 0; t < L; ++t) r.pairs += std::min((t + 1) / a.ratio, Sk);
      r.workspace = plan.workspace_bytes;
      r.cand_bytes = plan.cand_buffer.bytes;
      r.dense_bytes = 4.0 * L * static_cast<double>(Sk);
      if (!a.quiet) {
        fmt::print(stderr, "csattn bench-indexer: {} tokens, {}\n", L, indexer_precision_name(prec));
        std::fflush(stderr);
      }
      for (int i = 0; i < a.warmup; ++i) ops::compact_indexer_topk(plan, in, out, ws.view());
      for (int i = 0; i < a.repeat; ++i) {
        Stopwatch sw;
        ops::compact_indexer_topk(plan, in, out, ws.view());
        r.ms.push_back(sw.ms());
      }
      rows.push_back(std::move(r));
    }
  }

  auto pairs_per_s = [](const Row& r) { return r.pairs / (median(r.ms) / 1000.0); };
  if (a.json) {
    using ojson = nlohmann::ordered_json;
    ojson j;
    j["command"] = "bench-indexer";
    j["heads"] = a.heads;
    j["head_dim"] = a.head_dim;
    j["topk"] = a.topk;
    j["ratio"] = a.ratio;
    j["rows_per_pass"] = a.rows_per_pass;
    j["threads"] = threads;
    j["repeat"] = a.repeat;
    ojson list = ojson::array();
    for (const Row& r : rows)
      list.push_back({{"seqlen", r.seqlen},
                      {"indexer_precision", indexer_precision_name(r.precision)},
                      {"pairs", r.pairs},
                      {"ms", json_number(median(r.ms))},
                      {"pairs_per_s", json_number(pairs_per_s(r))},
                      {"candidate_buffer_bytes", r.cand_bytes},
                      {"workspace_bytes", r.workspace},
                      {"dense_scores_bytes", r.dense_bytes},
                      {"ms_runs", r.ms}});
    j["results"] = std::move(list);
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("csattn bench-indexer: H {} x D {}, top-{}, ratio {}, rows per pass {}, threads {}, "
             "median of {} runs\n\n",
             a.heads, a.head_dim, a.topk, a.ratio,
             a.rows_per_pass > 0 ? std::to_string(a.rows_per_pass) : std::string("all"), threads,
             a.repeat);
  fmt::print("{:>7}  {:<5}  {:>12}  {:>10}  {:>12}  {:>12}  {:>12}  {:>12}\n", "tokens", "prec",
             "pairs", "ms", "pairs/s", "cand MiB", "wspace MiB", "dense MiB");
  for (const Row& r : rows)
    fmt::print("{:>7}  {:<5}  {:>12}  {:>10.1f}  {:>12.3e}  {:>12.2f}  {:>12.2f}  {:>12.2f}\n",
               r.seqlen, indexer_precision_name(r.precision), r.pairs, median(r.ms),
               pairs_per_s(r), r.cand_bytes / 1048576.0, r.workspace / 1048576.0,
               r.dense_bytes / 1048576.0);
  std::fflush(stdout);
  return 0;
}

}  // namespace

Command add_bench_indexer_command(CLI::App& app) {
  auto a = std::make_shared<BenchIndexerArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench-indexer",
      "Compact indexer forward + top-k alone: scored pairs per second and memory");
  cmd->add_option("--seqlens", a->seqlens, "Sequence lengths, comma list [default: 1024,4096,16384]")
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_option("--indexer-precision", a->precisions, "bf16 and/or mxfp8, comma list [default: both]")
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_option("--heads", a->heads, "Indexer heads H")->capture_default_str();
  cmd->add_option("--head-dim", a->head_dim, "Indexer head dim D")->capture_default_str();
  cmd->add_option("--topk", a->topk, "Top-k width K")->capture_default_str();
  cmd->add_option("--ratio", a->ratio, "Compression ratio r")->capture_default_str();
  cmd->add_option("--rows-per-pass", a->rows_per_pass,
                  "Chunked variant: rows scored per pass (0 = one pass)")
      ->capture_default_str();
  cmd->add_option("--repeat", a->repeat, "Timed runs (the median is reported)")->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "Untimed runs first")->capture_default_str();
  cmd->add_option("--threads", a->threads, "OpenMP threads (0 = default)");
  cmd->add_option("--seed", a->seed, "Seed of the random operands")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON instead of the table");
  cmd->add_flag("-q,--quiet", a->quiet, "No progress lines on stderr");
  return [a]() { return run_bench_indexer(*a); };
}

}  // namespace csattn::cli
