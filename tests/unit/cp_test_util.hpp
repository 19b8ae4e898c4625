// Helpers of the context-parallel tests: run a layer on P in-process ranks and assemble the
// global results, and compare them with the single-rank layer.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "csattn/comm.hpp"
#include "csattn/cp.hpp"
#include "test_util.hpp"

namespace csattn::testing_util {

// The global results of a CP run, assembled from every rank's rows and shares.
struct CpRun {
  std::vector<float> output;           // [T, d]
  std::vector<std::int32_t> topk;      // [T, K] (CSA)
  std::vector<float> grad_input;       // [T, d]
  double loss = 0.0;                   // sum of the ranks' shares
  std::map<std::string, std::vector<double>> grad;  // summed over ranks (in double)
  std::vector<CpWork> work;            // per rank
  std::vector<CommStats> backward_comm;
  std::vector<float> rank_loss;                           // per rank (summed by finish_run)
  std::vector<std::map<std::string, Tensor>> rank_grad;  // per rank (summed by finish_run)
};

inline void scatter_rows(const std::vector<float>& local, const CpPartition& part, int rank,
                         int cols, std::vector<float>& global) {
  const std::vector<int> rows = part.rows(rank);
  for (std::size_t i = 0; i < rows.size(); ++i)
    std::memcpy(global.data() + static_cast<std::size_t>(rows[i]) * cols,
                local.data() + i * cols, sizeof(float) * cols);
}

// How many of the partition's ranks own no real row (padding rows only).
inline int ranks_without_real_rows(const SeqLayout& layout, const CpPartition& part) {
  int idle = 0;
  for (int r = 0; r < part.ranks(); ++r) {
    bool real = false;
    for (int g : part.rows(r))
      for (int s = 0; s < layout.num_segments(); ++s)
        real = real || (g >= layout.seg_start(s) && g < layout.seg_start(s) + layout.real_len(s));
    idle += real ? 0 : 1;
  }
  return idle;
}

// A CP run's results before any rank reports (rows NaN, top-k -2: a row no rank wrote shows).
inline CpRun empty_run(const AttentionConfig& cfg, const CpPartition& part) {
  const int P = part.ranks();
  const std::size_t T = static_cast<std::size_t>(part.total_rows()), d = static_cast<std::size_t>(cfg.d_model);
  CpRun run;
  run.output.assign(T * d, std::nanf(""));
  run.grad_input.assign(T * d, std::nanf(""));
  if (cfg.has_indexer()) run.topk.assign(T * static_cast<std::size_t>(cfg.index_topk), -2);
  run.work.resize(static_cast<std::size_t>(P));
  run.backward_comm.resize(static_cast<std::size_t>(P));
  run.rank_loss.assign(static_cast<std::size_t>(P), 0.0f);
  run.rank_grad.resize(static_cast<std::size_t>(P));
  return run;
}

// Rank r's forward and backward into the run (each rank writes only its own rows and slots).
inline void record_forward(CpRun& run, const AttentionConfig& cfg, const CpPartition& part, int r,
                           const CpLayerOutputs& out) {
  const int d = cfg.d_model, K = cfg.index_topk;
  scatter_rows(out.output.to_f32(), part, r, d, run.output);
  if (cfg.has_indexer()) {
    const std::vector<int> rows = part.rows(r);
    const std::int32_t* t = out.topk_indices.ptr<std::int32_t>();
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::copy(t + i * K, t + (i + 1) * K, run.topk.begin() + static_cast<long>(rows[i]) * K);
  }
  run.rank_loss[static_cast<std::size_t>(r)] = out.indexer_loss;
  run.work[static_cast<std::size_t>(r)] = out.work;
}
inline void record_backward(CpRun& run, const AttentionConfig& cfg, const CpPartition& part, int r,
                            const CpLayerGradients& g) {
  scatter_rows(g.grad_input.to_f32(), part, r, cfg.d_model, run.grad_input);
  run.rank_grad[static_cast<std::size_t>(r)] = g.grad;
  run.backward_comm[static_cast<std::size_t>(r)] = g.backward_comm;
}

// After every rank: the loss and the parameter gradients summed over ranks (in double).
inline void finish_run(CpRun& run) {
  for (std::size_t r = 0; r < run.rank_loss.size(); ++r) {
    run.loss += run.rank_loss[r];
    for (const auto& [name, t] : run.rank_grad[r]) {
      std::vector<double>& acc = run.grad[name];
      const std::vector<float> v = t.to_f32();
      acc.resize(v.size(), 0.0);
      for (std::size_t i = 0; i < v.size(); ++i) acc[i] += v[i];
    }
  }
}

inline CpRun run_cp(const AttentionConfig& cfg, const LayerWeights& w, const CpPartition& part,
                    const Tensor& x, const Tensor& dy, RunOptions opt = {Precision::fp32},
                    bool backward = true, CpLayerOptions cp_opt = {true}) {
  CpRun run = empty_run(cfg, part);
  const ContextParallelLayer layer(cfg, w, opt, cp_opt);
  run_local_ranks(part.ranks(), [&](Communicator& comm) {
    const int r = comm.rank();
    const CpLayerOutputs out = layer.forward(comm, part, local_rows_of(x, part, r));
    record_forward(run, cfg, part, r, out);
    if (backward) record_backward(run, cfg, part, r, layer.backward(comm, out, local_rows_of(dy, part, r)));
  });
  finish_run(run);
  return run;
}

// max |a - b| / max |b| (0 when both are 0); NaN gives +inf.
template <class A, class B>
double rel_diff(const std::vector<A>& a, const std::vector<B>& b) {
  double m = 0.0, s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (!(d == d)) return INFINITY;
    m = std::max(m, d);
    s = std::max(s, std::fabs(static_cast<double>(b[i])));
  }
  return s > 0.0 ? m / s : m;
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace csattn::testing_util
