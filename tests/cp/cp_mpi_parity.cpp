// Context-parallel parity over MPI: run under `mpirun -np P` (ctest runs it with P = 3).
// Every rank builds the same global batch, runs the single-rank layer itself as the
// reference, then the ContextParallelLayer over MPI_COMM_WORLD, and checks its own rows
// (fp32 forward bitwise, input gradients within 1e-6 relative), the loss and the parameter
// gradients summed over ranks (1e-6 relative), for {contiguous, two_chunk} x {SWA, CSA
// sparse, CSA dense, HCA}. Every rank exits with the same status (the failure count is
// all-reduced); rank 0 prints one line per case and "N passed, N failed".
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "csattn/comm.hpp"
#include "csattn/cp.hpp"
#include "csattn/error.hpp"
#include "csattn/layer.hpp"

namespace {

using namespace csattn;

std::vector<float> seeded(std::size_t n, std::uint64_t seed) {
  // A small deterministic generator (identical on every rank).
  std::vector<float> v(n);
  std::uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>((s >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
  }
  return v;
}

double rel_diff(const float* a, const float* b, std::size_t n) {
  double m = 0.0, s = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(d == d)) return INFINITY;
    m = std::max(m, d);
    s = std::max(s, std::fabs(static_cast<double>(b[i])));
  }
  return s > 0 ? m / s : m;
}

// Returns an empty string on success, else what failed.
std::string run_case(Communicator& comm, CpMode mode, int ratio, bool sparse) {
  AttentionConfig cfg = ModelConfig::preset("tiny").base;
  cfg.compress_ratio = ratio;
  cfg.window = 8;
  cfg.index_topk = 3;
  cfg.loss_coeff = 0.5;
  cfg.sparse_loss = sparse;
  cfg.validate();
  const int P = comm.size(), rank = comm.rank();
  const std::vector<int> real = ratio == 128 ? std::vector<int>{5, 300, 131, 3, 260}
                                             : std::vector<int>{5, 37, 3, 64, 21, 1, 30};
  const std::vector<int> padded = ratio == 128 ? std::vector<int>{8, 300, 140, 3, 264}
                                               : std::vector<int>{6, 40, 3, 64, 24, 4, 33};
  const int d_w = std::max(cfg.window, ratio == 4 ? 8 : ratio);
  const SeqLayout layout =
      pad_for_context_parallel(SeqLayout::from_lengths(real, padded), mode, P, d_w);
  const CpPartition part = CpPartition::build(layout, mode, P);
  const int T = static_cast<int>(layout.total_rows()), d = cfg.d_model;
  const LayerWeights w = LayerWeights::random(cfg, 31);
  const Tensor x = Tensor::from_f32(seeded(static_cast<std::size_t>(T) * d, 1), {T, d});
  const Tensor dy = Tensor::from_f32(seeded(static_cast<std::size_t>(T) * d, 2), {T, d});

  const RunOptions opt{Precision::fp32};
  const HybridAttentionLayer single(cfg, w, opt);
  const LayerOutputs ref = single.forward(x, layout);
  const LayerGradients gref = single.backward(ref, dy);

  const ContextParallelLayer layer(cfg, w, opt, CpLayerOptions{true});
  const CpLayerOutputs out = layer.forward(comm, part, local_rows_of(x, part, rank));
  CpLayerGradients g = layer.backward(comm, out, local_rows_of(dy, part, rank));

  std::string why;
  const Tensor ref_rows = local_rows_of(ref.output, part, rank);
  if (std::memcmp(ref_rows.data(), out.output.data(), ref_rows.nbytes()) != 0)
    why += " output not bitwise equal;";
  if (cfg.has_indexer()) {
    const Tensor ref_topk = local_rows_of(ref.topk_indices, part, rank);
    if (std::memcmp(ref_topk.data(), out.topk_indices.data(), ref_topk.nbytes()) != 0)
      why += " topk differs;";
  }
  const Tensor ref_dx = local_rows_of(gref.grad_input, part, rank);
  if (rel_diff(g.grad_input.ptr<float>(), ref_dx.ptr<float>(),
               static_cast<std::size_t>(ref_dx.numel())) > 1e-6)
    why += " grad_input;";
  double loss = out.indexer_loss;
  comm.all_reduce(comm_buffer(&loss, 1), ReduceOp::sum).wait();
  if (std::fabs(loss - ref.indexer_loss) > 1e-6 * std::fabs(ref.indexer_loss)) why += " loss;";
  all_reduce_sum(comm, g.grad);
  for (const auto& [name, t] : gref.grad)
    if (rel_diff(g.grad.at(name).ptr<float>(), t.ptr<float>(), static_cast<std::size_t>(t.numel())) > 1e-6)
      why += " grad " + name + ";";
  return why;
}

}  // namespace

int main() {
  std::unique_ptr<Communicator> comm;
  try {
    comm = mpi_world();
  } catch (const Error& e) {
    std::fprintf(stderr, "cp_mpi_parity: %s\n", e.what());
    return 2;
  }
  const int rank = comm->rank();
  int failed = 0, passed = 0;
  for (CpMode mode : {CpMode::contiguous, CpMode::two_chunk})
    for (auto [ratio, sparse] : {std::pair{0, true}, std::pair{4, true}, std::pair{4, false},
                                 std::pair{128, true}}) {
      std::string why;
      try {
        why = run_case(*comm, mode, ratio, sparse);
      } catch (const std::exception& e) {
        // The other ranks may be blocked in a collective this rank will never join: end the
        // job here (mpirun stops every rank when one exits without MPI_Finalize) instead of
        // hanging until the ctest timeout.
        std::fprintf(stderr, "rank %d: exception: %s\n", rank, e.what());
        std::fflush(stderr);
        std::_Exit(3);
      }
      // Every rank must agree on the verdict.
      std::int32_t bad = why.empty() ? 0 : 1;
      comm->all_reduce(comm_buffer(&bad, 1), ReduceOp::max).wait();
      const std::string name = std::string(cp_mode_name(mode)) + " " +
                               layer_kind_name(layer_kind(ratio)) +
                               (ratio == 4 ? (sparse ? " sparse" : " dense") : "");
      if (!why.empty()) std::fprintf(stderr, "rank %d: %s:%s\n", rank, name.c_str(), why.c_str());
      if (rank == 0)
        std::printf("[%s] P=%d %s\n", bad ? "FAILED" : "passed", comm->size(), name.c_str());
      (bad ? failed : passed)++;
    }
  if (rank == 0) std::printf("%d passed, %d failed\n", passed, failed);
  std::fflush(stdout);
  return failed == 0 ? 0 : 1;
}
