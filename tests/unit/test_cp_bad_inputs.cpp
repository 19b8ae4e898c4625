// Bad input under context parallelism never hangs: disagreements between ranks and one
// rank's bad argument give every rank the same clear error; layout rules say what to pad.
#include <gtest/gtest.h>

#include <functional>
#include <mutex>

#include "cp_test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;

// Runs fn on P ranks and returns every rank's error message ("" when it did not throw).
std::vector<std::string> errors_of(int P, const std::function<void(Communicator&)>& fn) {
  std::vector<std::string> errors(static_cast<std::size_t>(P));
  run_local_ranks(P, [&](Communicator& comm) {
    try {
      fn(comm);
    } catch (const Error& e) {
      errors[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  return errors;
}

void expect_same_error(const std::vector<std::string>& errors, const std::string& part) {
  for (const std::string& e : errors) {
    EXPECT_EQ(e, errors[0]);
    EXPECT_NE(e.find(part), std::string::npos) << e;
  }
}

struct BadSetup {
  AttentionConfig cfg = tiny_config(4);
  LayerWeights w = LayerWeights::random(cfg, 3);
  SeqLayout layout = SeqLayout::from_lengths({12, 20, 16});
  Tensor x = random_tensor(48, cfg.d_model, 4);
};

TEST(CpBadInputs, RanksDisagreeOnCuSeqlens) {
  BadSetup s;
  const SeqLayout other = SeqLayout::from_lengths({16, 16, 16});
  const std::vector<std::string> errors = errors_of(3, [&](Communicator& comm) {
    const SeqLayout& mine = comm.rank() == 2 ? other : s.layout;
    const CpPartition part = CpPartition::build(mine, CpMode::contiguous, 3);
    ContextParallelLayer(s.cfg, s.w).forward(comm, part, local_rows_of(s.x, part, comm.rank()));
  });
  expect_same_error(errors, "the ranks disagree on cu_seqlens: rank 2 differs from rank 0");
}

TEST(CpBadInputs, RanksDisagreeOnConfigWeightsAndMode) {
  BadSetup s;
  AttentionConfig other = s.cfg;
  other.index_topk = 4;
  expect_same_error(errors_of(2, [&](Communicator& comm) {
                      const CpPartition part = CpPartition::build(s.layout, CpMode::contiguous, 2);
                      const AttentionConfig& c = comm.rank() == 1 ? other : s.cfg;
                      ContextParallelLayer(c, s.w).forward(comm, part, local_rows_of(s.x, part, comm.rank()));
                    }),
                    "disagree on the layer config");
  const LayerWeights w2 = LayerWeights::random(s.cfg, 99);
  expect_same_error(errors_of(2, [&](Communicator& comm) {
                      const CpPartition part = CpPartition::build(s.layout, CpMode::contiguous, 2);
                      ContextParallelLayer(s.cfg, comm.rank() == 1 ? w2 : s.w)
                          .forward(comm, part, local_rows_of(s.x, part, comm.rank()));
                    }),
                    "disagree on the layer weights");
  const SeqLayout even = SeqLayout::from_lengths({16, 16, 16});
  expect_same_error(errors_of(2, [&](Communicator& comm) {
                      const CpPartition part = CpPartition::build(
                          even, comm.rank() == 0 ? CpMode::contiguous : CpMode::two_chunk, 2);
                      ContextParallelLayer(s.cfg, s.w).forward(comm, part, local_rows_of(s.x, part, comm.rank()));
                    }),
                    "disagree on the partition mode");
}

TEST(CpBadInputs, OneRanksBadShapeFailsEveryRank) {
  BadSetup s;
  const std::vector<std::string> errors = errors_of(3, [&](Communicator& comm) {
    const CpPartition part = CpPartition::build(s.layout, CpMode::contiguous, 3);
    Tensor x = local_rows_of(s.x, part, comm.rank());
    if (comm.rank() == 1) x = random_tensor(15, s.cfg.d_model, 5);
    ContextParallelLayer(s.cfg, s.w).forward(comm, part, x);
  });
  expect_same_error(errors, "rank 1 of 3: hidden_states has shape [15, 64], expected [16, 64]");
}

TEST(CpBadInputs, PartitionForAnotherRankCount) {
  BadSetup s;
  expect_same_error(errors_of(2, [&](Communicator& comm) {
                      const CpPartition part = CpPartition::build(s.layout, CpMode::contiguous, 3);
                      ContextParallelLayer(s.cfg, s.w).forward(comm, part, random_tensor(16, 64, 1));
                    }),
                    "the partition is over 3 ranks but the communicator has 2");
}

TEST(CpBadInputs, ContiguousWidthBelowHaloSaysWhatToPad) {
  AttentionConfig cfg = tiny_config(128);
  const LayerWeights w = LayerWeights::random(cfg, 3);
  const SeqLayout layout = SeqLayout::from_lengths({100, 60});
  const Tensor x = random_tensor(160, cfg.d_model, 4);
  expect_same_error(errors_of(2, [&](Communicator& comm) {
                      const CpPartition part = CpPartition::build(layout, CpMode::contiguous, 2);
                      ContextParallelLayer(cfg, w).forward(comm, part, local_rows_of(x, part, comm.rank()));
                    }),
                    "L = T/P = 160/2 = 80 is smaller than D_w = max(window, D_c) = 128 of this "
                    "HCA layer (its halo must come from the left neighbour alone): pad the batch "
                    "to at least P*D_w = 256 rows");
  // two_chunk takes its halo from several ranks instead: no error.
  EXPECT_TRUE(errors_of(2, [&](Communicator& comm) {
                const CpPartition part = CpPartition::build(layout, CpMode::two_chunk, 2);
                ContextParallelLayer(cfg, w).forward(comm, part, local_rows_of(x, part, comm.rank()));
              })[0].empty());
}

TEST(CpBadInputs, BackwardChecksToo) {
  BadSetup s;
  expect_same_error(errors_of(2, [&](Communicator& comm) {
                      const CpPartition part = CpPartition::build(s.layout, CpMode::contiguous, 2);
                      const ContextParallelLayer layer(s.cfg, s.w);
                      const CpLayerOutputs out = layer.forward(comm, part, local_rows_of(s.x, part, comm.rank()));
                      const Tensor dy = random_tensor(comm.rank() == 0 ? 24 : 23, 64, 6);
                      layer.backward(comm, out, dy);
                    }),
                    "rank 1 of 2: grad_output has shape [23, 64], expected [24, 64]");
}

}  // namespace
}  // namespace csattn
