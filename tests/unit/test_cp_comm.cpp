// The in-process communicator: exchange, all-gather, reduce-scatter, all-reduce, barrier,
// non-blocking handles, mismatch detection, abort on failure, byte counters.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "csattn/comm.hpp"
#include "csattn/error.hpp"

namespace csattn {
namespace {

TEST(LocalComm, CollectivesGiveExactRankOrderResults) {
  for (int P : {1, 2, 3, 4}) {
    run_local_ranks(P, [P](Communicator& comm) {
      const int r = comm.rank();
      ASSERT_EQ(comm.size(), P);
      // all_gather: rank-major blocks.
      std::vector<float> in = {float(r), float(10 * r)}, out(static_cast<std::size_t>(2 * P), -1.0f);
      comm.all_gather(comm_buffer(in.data(), 2), comm_buffer(out.data(), out.size())).wait();
      for (int o = 0; o < P; ++o) {
        EXPECT_EQ(out[static_cast<std::size_t>(2 * o)], float(o));
        EXPECT_EQ(out[static_cast<std::size_t>(2 * o + 1)], float(10 * o));
      }
      // reduce_scatter: block b of rank o holds o + b; rank r gets sum_o (o + r).
      std::vector<double> rs_in(static_cast<std::size_t>(P) * 3), rs_out(3, -1.0);
      for (int b = 0; b < P; ++b)
        for (int i = 0; i < 3; ++i) rs_in[static_cast<std::size_t>(b * 3 + i)] = r + b + 0.25 * i;
      comm.reduce_scatter_sum(comm_buffer(rs_in.data(), rs_in.size()), comm_buffer(rs_out.data(), 3)).wait();
      for (int i = 0; i < 3; ++i)
        EXPECT_EQ(rs_out[static_cast<std::size_t>(i)], P * (P - 1) / 2.0 + P * (r + 0.25 * i));
      // all_reduce: sum, max, min.
      std::int64_t v[3] = {r + 1, r + 1, r + 1};
      comm.all_reduce(comm_buffer(&v[0], 1), ReduceOp::sum).wait();
      comm.all_reduce(comm_buffer(&v[1], 1), ReduceOp::max).wait();
      comm.all_reduce(comm_buffer(&v[2], 1), ReduceOp::min).wait();
      EXPECT_EQ(v[0], P * (P + 1) / 2);
      EXPECT_EQ(v[1], P);
      EXPECT_EQ(v[2], 1);
      comm.barrier();
    });
  }
}

TEST(LocalComm, ExchangeAndOutOfOrderWaits) {
  run_local_ranks(3, [](Communicator& comm) {
    const int r = comm.rank(), P = comm.size();
    // Ring exchange, two messages per pair, matched in posting order.
    const int next = (r + 1) % P, prev = (r + P - 1) % P;
    std::vector<std::int32_t> a = {r, r}, b = {100 + r}, ga(2, -1), gb(1, -1);
    CommRequest x = comm.exchange({{next, comm_buffer(a.data(), 2)}, {next, comm_buffer(b.data(), 1)}},
                                  {{prev, comm_buffer(ga.data(), 2)}, {prev, comm_buffer(gb.data(), 1)}});
    // Two collectives posted before any wait, waited in reverse order.
    float one = 1.0f, all[3] = {};
    std::int32_t mx = r;
    CommRequest g = comm.all_gather(comm_buffer(&one, 1), comm_buffer(all, 3));
    CommRequest m = comm.all_reduce(comm_buffer(&mx, 1), ReduceOp::max);
    m.wait();
    g.wait();
    x.wait();
    EXPECT_EQ(ga, (std::vector<std::int32_t>{prev, prev}));
    EXPECT_EQ(gb[0], 100 + prev);
    EXPECT_EQ(mx, 2);
    EXPECT_EQ(all[2], 1.0f);
  });
}

TEST(LocalComm, MismatchedCollectivesAreReported) {
  std::mutex mu;
  std::vector<std::string> errors;
  run_local_ranks(2, [&](Communicator& comm) {
    std::vector<float> in(static_cast<std::size_t>(comm.rank() + 1)), out(in.size() * 2);
    try {
      comm.all_gather(comm_buffer(in.data(), in.size()), comm_buffer(out.data(), out.size())).wait();
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(e.what());
    }
  });
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0], errors[1]);
  EXPECT_NE(errors[0].find("does not match across ranks"), std::string::npos) << errors[0];
}

TEST(LocalComm, FailingRankReleasesTheOthers) {
  std::atomic<int> released{0};
  try {
    run_local_ranks(3, [&](Communicator& comm) {
      if (comm.rank() == 1) throw Error(ErrorKind::InvalidArgument, "rank one is broken");
      float v = 0.0f;
      try {
        comm.all_reduce(comm_buffer(&v, 1), ReduceOp::sum).wait();  // would hang forever
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rank 1 failed: rank one is broken"), std::string::npos);
        ++released;
        throw;
      }
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank one is broken");  // the root cause, not the abort
  }
  EXPECT_EQ(released.load(), 2);
}

TEST(LocalComm, StatsCountPayloadBytes) {
  run_local_ranks(4, [](Communicator& comm) {
    comm.reset_stats();
    std::vector<float> in(10), out(40), rs(10);
    comm.all_gather(comm_buffer(in.data(), 10), comm_buffer(out.data(), 40)).wait();
    comm.reduce_scatter_sum(comm_buffer(out.data(), 40), comm_buffer(rs.data(), 10)).wait();
    EXPECT_EQ(comm.stats().bytes_sent, 2u * 3 * 40);
    EXPECT_EQ(comm.stats().bytes_received, 2u * 3 * 40);
    EXPECT_EQ(comm.stats().operations, 2u);
  });
}

TEST(Launcher, LocalRankFromTheEnvironment) {
  // Save and clear what a launcher may have set for this test process.
  const char* names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK",
                         "PMI_LOCAL_RANK", "SLURM_LOCALID"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* n : names)
    if (const char* v = std::getenv(n)) saved.emplace_back(n, v);
  for (const char* n : names) unsetenv(n);
  EXPECT_EQ(launcher_local_rank(), -1);
  setenv("SLURM_LOCALID", "3", 1);
  EXPECT_EQ(launcher_local_rank(), 3);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);  // Open MPI's name wins
  EXPECT_EQ(launcher_local_rank(), 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x1", 1);  // not a number: the next one
  EXPECT_EQ(launcher_local_rank(), 3);
  for (const char* n : names) unsetenv(n);
  for (const auto& [n, v] : saved) setenv(n.c_str(), v.c_str(), 1);
}

TEST(LocalComm, BadArguments) {
  run_local_ranks(2, [](Communicator& comm) {
    std::vector<float> in(4), out(7);
    EXPECT_THROW(comm.all_gather(comm_buffer(in.data(), 4), comm_buffer(out.data(), 7)), Error);
    EXPECT_THROW(comm.exchange({{comm.rank(), comm_buffer(in.data(), 4)}}, {}), Error);
#ifdef CSATTN_HAVE_CUDA
    EXPECT_TRUE(comm.accepts(Device::cuda));  // P ranks on one GPU: test_gpu_comm.cpp
#else
    CommBuffer device{in.data(), 4, DType::f32, Device::cuda};
    EXPECT_THROW(comm.all_reduce(device, ReduceOp::sum), Error);  // host buffers only
#endif
  });
  EXPECT_THROW(LocalCommGroup(0), Error);
}

TEST(MpiComm, AvailableInThisBuild) {
#ifdef CSATTN_HAVE_MPI
  EXPECT_TRUE(mpi_available());
#else
  EXPECT_FALSE(mpi_available());
  EXPECT_THROW(mpi_world(), Error);
#endif
}

}  // namespace
}  // namespace csattn

namespace csattn {
namespace {

// all_gather_host on a communicator that takes host buffers is its plain all-gather
// (the NCCL path, staged through the device, is in test_gpu_comm.cpp).
TEST(LocalComm, AllGatherHostIsRankMajor) {
  run_local_ranks(3, [](Communicator& comm) {
    const int r = comm.rank();
    std::vector<std::int64_t> mine{r, 7 * r}, all(6, -1);
    comm.all_gather_host(mine.data(), mine.size(), all.data());
    for (int s = 0; s < 3; ++s) {
      ASSERT_EQ(all[2 * static_cast<std::size_t>(s)], s);
      ASSERT_EQ(all[2 * static_cast<std::size_t>(s) + 1], 7 * s);
    }
  });
}

}  // namespace
}  // namespace csattn
