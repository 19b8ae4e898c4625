#include "cp_run.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <CLI/CLI.hpp>
#ifdef CSATTN_HAVE_CUDA
#include <cuda_runtime.h>
#endif
#include <fmt/core.h>

#include "cli_util.hpp"
#include "csattn/comm.hpp"
#include "csattn/cp.hpp"
#include "csattn/error.hpp"
#include "csattn/safetensors.hpp"
#include "report.hpp"
#include "run_job.hpp"

namespace csattn::cli {

void add_cp_options(CLI::App& run, CpArgs& a) {
  a.mode_opt = run.add_option("--cp-mode", a.mode,
                              "Context parallelism: contiguous or two_chunk. Under mpirun the "
                              "ranks come from mpirun's environment; without it, --cp-ranks")
                   ->type_name("MODE");
  run.add_option("--cp-ranks", a.ranks,
                 "Context-parallel ranks as threads of this process (no mpirun) [default: 1]")
      ->type_name("P");
}

bool wants_context_parallel(const CpArgs& args) {
  return !args.mode.empty() || args.ranks > 0 || mpi_launched();
}

namespace {

// Per rank and layer, what the report shows (gathered to rank 0 as doubles).
enum Stat {
  kRows, kHalo, kOwned, kSlots, kPairs, kFlops, kIndexerPairs, kFwdSent, kFwdRecv, kBwdSent,
  kBwdRecv, kFwdMs, kBwdMs, kStats
};
using StatRow = std::array<double, kStats>;

struct CpLayerReport {
  std::vector<StatRow> ranks;
};

// For every row of `from`, its row in `to` (same sequences, `to` padded at least as much).
std::vector<std::int64_t> row_map(const SeqLayout& from, const SeqLayout& to) {
  std::vector<std::int64_t> map;
  map.reserve(static_cast<std::size_t>(from.total_rows()));
  for (int s = 0; s < from.num_segments(); ++s)
    for (int p = 0; p < from.seg_len(s); ++p) map.push_back(to.seg_start(s) + p);
  return map;
}

Tensor spread_rows(const Tensor& t, const std::vector<std::int64_t>& map, std::int64_t rows) {
  Shape shape = t.shape();
  shape[0] = rows;
  Tensor out(t.dtype(), shape);  // added rows are zero
  const std::size_t rb = t.nbytes() / static_cast<std::size_t>(t.dim(0));
  for (std::size_t i = 0; i < map.size(); ++i)
    std::memcpy(static_cast<unsigned char*>(out.data()) + static_cast<std::size_t>(map[i]) * rb,
                static_cast<const unsigned char*>(t.data()) + i * rb, rb);
  return out;
}

Tensor pick_rows(const Tensor& t, const std::vector<std::int64_t>& map) {
  Shape shape = t.shape();
  shape[0] = static_cast<std::int64_t>(map.size());
  Tensor out(t.dtype(), shape);
  const std::size_t rb = t.nbytes() / static_cast<std::size_t>(t.dim(0));
  for (std::size_t i = 0; i < map.size(); ++i)
    std::memcpy(static_cast<unsigned char*>(out.data()) + i * rb,
                static_cast<const unsigned char*>(t.data()) + static_cast<std::size_t>(map[i]) * rb,
                rb);
  return out;
}

std::string kib(double bytes) { return fmt::format("{:.1f}", bytes / 1024.0); }

void print_cp_table(const RunPlan& plan, const std::vector<LayerResult>& layers,
                    const std::vector<CpLayerReport>& cp, const std::string& header) {
  fmt::print("{}\n", header);
  fmt::print("{:>5}  {:<4}  {:>4}  {:>7}  {:>5}  {:>10}  {:>11}  {:>11}  {:>10}  {:>10}  "
             "{:>10}  {:>10}  {:>8}  {:>8}\n",
             "layer", "type", "rank", "rows", "halo", "attn GFLOP", "attn pairs", "idx pairs",
             "fwd tx KiB", "fwd rx KiB", "bwd tx KiB", "bwd rx KiB", "fwd ms", "bwd ms");
  for (std::size_t l = 0; l < layers.size(); ++l)
    for (std::size_t r = 0; r < cp[l].ranks.size(); ++r) {
      const StatRow& s = cp[l].ranks[r];
      fmt::print("{:>5}  {:<4}  {:>4}  {:>7}  {:>5}  {:>10.4f}  {:>11}  {:>11}  {:>10}  {:>10}  "
                 "{:>10}  {:>10}  {:>8.1f}  {:>8}\n",
                 layers[l].layer.label(), layer_kind_name(layers[l].kind), r, s[kRows], s[kHalo],
                 s[kFlops] / 1e9, s[kPairs],
                 layers[l].kind == LayerKind::csa ? fmt::format("{}", s[kIndexerPairs]) : "-",
                 kib(s[kFwdSent]), kib(s[kFwdRecv]),
                 plan.backward ? kib(s[kBwdSent]) : "-", plan.backward ? kib(s[kBwdRecv]) : "-",
                 s[kFwdMs], plan.backward ? fmt::format("{:.1f}", s[kBwdMs]) : "-");
    }
  fmt::print("balance (max / mean over ranks; 1.00 = perfect):");
  for (std::size_t l = 0; l < layers.size(); ++l) {
    auto ratio = [&](int k) {
      double mx = 0, sum = 0;
      for (const StatRow& s : cp[l].ranks) {
        mx = std::max(mx, s[k]);
        sum += s[k];
      }
      return sum > 0 ? mx * cp[l].ranks.size() / sum : 1.0;
    };
    fmt::print(" layer {} {} attention {:.2f}", layers[l].layer.label(), layer_kind_name(layers[l].kind),
               ratio(kFlops));
    if (layers[l].kind == LayerKind::csa) fmt::print(", indexer {:.2f}", ratio(kIndexerPairs));
    fmt::print("{}", l + 1 < layers.size() ? ";" : "\n");
  }
  std::fflush(stdout);
}

// The whole job on one rank. Rank 0 prints the report and writes --save.
// Makes `device` current for this thread (the GPU layers are created on it).
void select_gpu(int device) {
#ifdef CSATTN_HAVE_CUDA
  require(cudaSetDevice(device) == cudaSuccess, ErrorKind::Internal,
          "cudaSetDevice(" + std::to_string(device) + ") failed");
#else
  (void)device;
#endif
}

// comm: the host collectives of the report; layer_comm: the layers' (comm itself on the
// CPU; NCCL or the in-process group on the GPU).
void cp_job(Communicator& comm, Communicator& layer_comm, const RunPlan& plan, CpMode mode) {
  const int P = comm.size(), rank = comm.rank();
  const bool root = rank == 0;
  const SeqLayout padded = pad_for_context_parallel(plan.layout, mode, P);
  const CpPartition part = CpPartition::build(padded, mode, P);
  const std::vector<std::int64_t> map = row_map(plan.layout, padded);
  const Tensor x_local = local_rows_of(spread_rows(plan.x, map, padded.total_rows()), part, rank);
  const Tensor dy_local =
      local_rows_of(spread_rows(plan.grad_output, map, padded.total_rows()), part, rank);
  std::vector<double> x64;
  if (root && plan.check_rows > 0) x64 = plan.x.to_f64();

  RunReport report;
  std::vector<CpLayerReport> cp_reports;
  TensorMap saved;
  const int n_layers = static_cast<int>(plan.layers.size());
  Stopwatch total;
  for (int li = 0; li < n_layers; ++li) {
    const LayerSpec& spec = plan.layers[static_cast<std::size_t>(li)];
    const AttentionConfig& cfg = spec.cfg;
    LayerResult res;
    res.index = spec.index;
    res.layer = spec.layer;
    res.compress_ratio = cfg.compress_ratio;
    res.kind = cfg.kind();
    res.tokens = plan.layout.total_rows();
    if (root && plan.progress)
      fmt::print(stderr, "csattn: [{}/{}] layer {} ({}): running on {} ranks\n", li + 1,
                 n_layers, spec.layer.label(), layer_kind_name(res.kind), P);
    LayerWeights weights = plan.file_weights ? *plan.file_weights
                                             : LayerWeights::random(cfg, plan.seed + static_cast<std::uint64_t>(spec.index));
    const ContextParallelLayer layer(cfg, std::move(weights), plan.run_options);

    StatRow mine{};
    Stopwatch fwd_sw;
    const CpLayerOutputs fwd = layer.forward(layer_comm, part, x_local);
    mine[kFwdMs] = fwd_sw.ms();
    CpLayerGradients grads;
    if (plan.backward) {
      Stopwatch bwd_sw;
      grads = layer.backward(layer_comm, fwd, dy_local, 1.0f);
      mine[kBwdMs] = bwd_sw.ms();
    }
    const CpWork& w = fwd.work;
    mine[kRows] = static_cast<double>(w.local_rows);
    mine[kHalo] = static_cast<double>(w.halo_rows);
    mine[kOwned] = static_cast<double>(w.owned_compressed);
    mine[kSlots] = static_cast<double>(w.compressed_slots);
    mine[kPairs] = static_cast<double>(w.attention_pairs);
    mine[kFlops] = w.attention_flops;
    mine[kIndexerPairs] = static_cast<double>(w.indexer_pairs);
    mine[kFwdSent] = static_cast<double>(w.forward_comm.bytes_sent);
    mine[kFwdRecv] = static_cast<double>(w.forward_comm.bytes_received);
    mine[kBwdSent] = static_cast<double>(grads.backward_comm.bytes_sent);
    mine[kBwdRecv] = static_cast<double>(grads.backward_comm.bytes_received);
    std::vector<double> all(static_cast<std::size_t>(P) * kStats);
    comm.all_gather(comm_buffer(mine.data(), mine.size()), comm_buffer(all.data(), all.size()))
        .wait();

    // Global results on rank 0 (over the original layout).
    const Tensor output = gather_rows(comm, part, fwd.output);
    Tensor topk;
    if (cfg.has_indexer()) topk = gather_rows(comm, part, fwd.topk_indices);
    double loss = fwd.indexer_loss;
    comm.all_reduce(comm_buffer(&loss, 1), ReduceOp::sum).wait();
    Tensor grad_input;
    if (plan.backward) {
      grad_input = gather_rows(comm, part, grads.grad_input);
      all_reduce_sum(comm, grads.grad);
    }
    if (!root) continue;

    CpLayerReport cr;
    for (int r = 0; r < P; ++r) {
      StatRow s{};
      std::copy(all.begin() + static_cast<long>(r) * kStats,
                all.begin() + static_cast<long>(r + 1) * kStats, s.begin());
      cr.ranks.push_back(s);
      res.forward_ms = std::max(res.forward_ms, s[kFwdMs]);
      if (plan.backward) res.backward_ms = std::max(res.backward_ms, s[kBwdMs]);
    }
    LayerOutputs global;
    global.output = pick_rows(output, map);
    if (cfg.has_indexer()) global.topk_indices = pick_rows(topk, map);
    global.indexer_loss = static_cast<float>(loss);
    Tensor dx;
    if (plan.backward) dx = pick_rows(grad_input, map);
    record_layer(plan, spec, global, plan.backward ? &dx : nullptr,
                 plan.backward ? &grads.grad : nullptr, res, saved);
    if (plan.check_rows > 0) res.check = check_with_oracle(cfg, plan, layer.weights(), x64, global);
    if (plan.progress)
      fmt::print(stderr, "csattn: [{}/{}] layer {} ({}): forward {:.1f} ms{}\n", li + 1, n_layers,
                 spec.layer.label(), layer_kind_name(res.kind), res.forward_ms,
                 plan.backward ? fmt::format(", backward {:.1f} ms", res.backward_ms) : "");
    report.layers.push_back(res);
    cp_reports.push_back(std::move(cr));
  }
  if (!root) return;
  report.total_ms = total.ms();
  if (!plan.save_file.empty()) {
    auto meta = save_metadata(plan);
    meta["csattn.cp_mode"] = cp_mode_name(mode);
    meta["csattn.cp_ranks"] = std::to_string(P);
    save_safetensors(plan.save_file, saved, meta);
  }
  std::string header = fmt::format("context parallel: {} over {} ranks ({})", cp_mode_name(mode),
                                   P, comm.backend());
  if (padded.total_rows() != plan.layout.total_rows())
    header += fmt::format("; batch padded from {} to {} rows ({}), padding rows dropped from "
                          "the results",
                          plan.layout.total_rows(), padded.total_rows(),
                          mode == CpMode::two_chunk
                              ? fmt::format("every sequence a multiple of 2P = {}", 2 * P)
                              : fmt::format("total a multiple of P = {}", P));
  if (plan.json) {
    nlohmann::ordered_json j = run_report_json(plan, report);
    nlohmann::ordered_json c;
    c["mode"] = cp_mode_name(mode);
    c["ranks"] = P;
    c["backend"] = comm.backend();
    c["padded_rows"] = padded.total_rows();
    nlohmann::ordered_json layers = nlohmann::ordered_json::array();
    for (std::size_t l = 0; l < cp_reports.size(); ++l) {
      nlohmann::ordered_json per_rank = nlohmann::ordered_json::array();
      for (const StatRow& s : cp_reports[l].ranks)
        per_rank.push_back({{"rows", s[kRows]}, {"halo_rows", s[kHalo]},
                            {"owned_compressed", s[kOwned]}, {"compressed_slots", s[kSlots]},
                            {"attention_pairs", s[kPairs]}, {"attention_flops", s[kFlops]},
                            {"indexer_pairs", s[kIndexerPairs]},
                            {"forward_bytes_sent", s[kFwdSent]},
                            {"forward_bytes_received", s[kFwdRecv]},
                            {"backward_bytes_sent", s[kBwdSent]},
                            {"backward_bytes_received", s[kBwdRecv]},
                            {"forward_ms", s[kFwdMs]}, {"backward_ms", s[kBwdMs]}});
      layers.push_back({{"index", report.layers[l].index}, {"name", report.layers[l].layer.prefix()}, {"ranks", per_rank}});
    }
    c["layers"] = layers;
    j["context_parallel"] = c;
    fmt::print("{}\n", j.dump(2));
  } else {
    print_run_table(plan, report);
    fmt::print("\n");
    print_cp_table(plan, report.layers, cp_reports, header);
  }
}

}  // namespace

int run_context_parallel(const RunPlan& plan, const CpArgs& args) {
  const bool gpu = plan.run_options.device == Device::cuda;
  const int gpus = gpu ? visible_gpus() : 0;
  if (mpi_launched()) {
    if (args.mode.empty())
      throw Error(ErrorKind::InvalidArgument,
                  "--cp-mode: this process is one of several MPI ranks: choose the "
                  "context-parallel mode with --cp-mode contiguous or --cp-mode two_chunk");
    if (args.ranks > 0)
      bad_option("--cp-ranks", "runs ranks as threads of one process; under mpirun the ranks "
                               "come from mpirun (-np)");
    const CpMode mode = parse_cp_mode(args.mode);
    std::unique_ptr<Communicator> comm = mpi_world();
    if (!gpu) {
      cp_job(*comm, *comm, plan, mode);
      return 0;
    }
    // One GPU per rank: the launcher's node-local rank modulo the visible GPUs.
    require(nccl_available(), ErrorKind::Unsupported,
            "--device cuda under mpirun: the ranks' GPUs talk through NCCL, which this build "
            "lacks; use --device cpu");
    const int local = launcher_local_rank() >= 0 ? launcher_local_rank() : comm->rank();
    std::unique_ptr<Communicator> nccl = nccl_communicator(*comm, local % gpus);
    cp_job(*comm, *nccl, plan, mode);
    return 0;
  }
  if (args.mode.empty()) bad_option("--cp-ranks", "needs --cp-mode contiguous or two_chunk");
  if (args.ranks < 0) bad_option("--cp-ranks", std::to_string(args.ranks) + " must be >= 1");
  const CpMode mode = parse_cp_mode(args.mode);
  const int P = std::max(args.ranks, 1);
  // Threads on the GPU: one GPU per rank through NCCL where there are enough, else every
  // rank on GPU 0 through the in-process group.
  const bool one_gpu_each = gpu && nccl_available() && gpus >= P;
  if (gpu && plan.progress)
    fmt::print(stderr, "csattn: {} ranks {}\n", P,
               one_gpu_each ? "on one GPU each (NCCL)" : "sharing GPU 0 (in-process group)");
  run_local_ranks(P, [&](Communicator& comm) {
    if (!one_gpu_each) {
      if (gpu) select_gpu(0);
      cp_job(comm, comm, plan, mode);
      return;
    }
    std::unique_ptr<Communicator> nccl = nccl_communicator(comm, comm.rank());
    cp_job(comm, *nccl, plan, mode);
  });
  return 0;
}

}  // namespace csattn::cli
