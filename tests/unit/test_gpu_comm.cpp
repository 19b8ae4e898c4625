// Communicators on device buffers: the in-process group with P ranks sharing one GPU (the
// single-GPU path of GPU context parallelism) and the NCCL backend (one rank per visible GPU,
// bootstrapped through an in-process group; with one GPU a one-rank communicator). Every
// result is compared with the same operation computed on the host. Skips without a GPU (and
// the NCCL cases without NCCL).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "csattn/comm.hpp"
#include "csattn/error.hpp"
#include "csattn/layer.hpp"

#ifdef CSATTN_HAVE_CUDA
#include "cuda_test_util.hpp"

namespace csattn {
namespace {

using testing_util::DeviceArray;

template <class T>
CommBuffer device_buffer(DeviceArray<T>& a, DType dt) {
  return CommBuffer{a.get(), a.size(), dt, Device::cuda};
}

// The operations every backend must get right, on device buffers, checked against host
// arithmetic. `stream` is the caller's stream (null: the default stream).
void exercise(Communicator& comm, cudaStream_t stream) {
  const int P = comm.size(), r = comm.rank();
  const std::size_t n = 1000;
  // all_gather f32: block s of the output is rank s's input.
  std::vector<float> in(n);
  for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<float>(r * 10000 + static_cast<int>(i));
  DeviceArray<float> d_in(in), d_out(n * static_cast<std::size_t>(P));
  d_out.fill_bytes(0xFF);
  comm.all_gather(device_buffer(d_in, DType::f32), device_buffer(d_out, DType::f32), stream).wait();
  const std::vector<float> got = d_out.download();
  for (int s = 0; s < P; ++s)
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(got[static_cast<std::size_t>(s) * n + i], static_cast<float>(s * 10000 + static_cast<int>(i)))
          << "all_gather rank " << r << " block " << s << " element " << i;

  // reduce_scatter_sum f64 and i64: block r of the sum over ranks.
  std::vector<double> rs(n * static_cast<std::size_t>(P));
  std::vector<std::int64_t> rsi(rs.size());
  for (std::size_t i = 0; i < rs.size(); ++i) {
    rs[i] = 0.25 * static_cast<double>(i) + r;
    rsi[i] = static_cast<std::int64_t>(i) * (r + 1) + (std::int64_t{1} << 40);
  }
  DeviceArray<double> d_rs(rs), d_rs_out(n);
  DeviceArray<std::int64_t> d_rsi(rsi), d_rsi_out(n);
  d_rs_out.fill_bytes(0xFF);
  d_rsi_out.fill_bytes(0xFF);
  CommRequest a = comm.reduce_scatter_sum(device_buffer(d_rs, DType::f64), device_buffer(d_rs_out, DType::f64), stream);
  CommRequest b =
      comm.reduce_scatter_sum(device_buffer(d_rsi, DType::i64), device_buffer(d_rsi_out, DType::i64), stream);
  a.wait();
  b.wait();
  const std::vector<double> rs_got = d_rs_out.download();
  const std::vector<std::int64_t> rsi_got = d_rsi_out.download();
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t g = static_cast<std::size_t>(r) * n + i;
    double want = 0.0;
    std::int64_t want_i = 0;
    for (int s = 0; s < P; ++s) {
      want += 0.25 * static_cast<double>(g) + s;
      want_i += static_cast<std::int64_t>(g) * (s + 1) + (std::int64_t{1} << 40);
    }
    ASSERT_EQ(rs_got[i], want) << "reduce_scatter f64 rank " << r << " element " << i;  // exact: small integers / 4
    ASSERT_EQ(rsi_got[i], want_i) << "reduce_scatter i64 rank " << r << " element " << i;
  }

  // all_reduce i32: sum, max, min.
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    std::vector<std::int32_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>((static_cast<int>(i) * 7 + r * 13) % 101 - 50);
    DeviceArray<std::int32_t> d_v(v);
    comm.all_reduce(device_buffer(d_v, DType::i32), op, stream).wait();
    const std::vector<std::int32_t> v_got = d_v.download();
    for (std::size_t i = 0; i < n; ++i) {
      std::int32_t want = 0;
      for (int s = 0; s < P; ++s) {
        const std::int32_t x = static_cast<std::int32_t>((static_cast<int>(i) * 7 + s * 13) % 101 - 50);
        want = s == 0 ? x : op == ReduceOp::sum ? want + x : op == ReduceOp::max ? std::max(want, x) : std::min(want, x);
      }
      ASSERT_EQ(v_got[i], want) << "all_reduce rank " << r << " element " << i;
    }
  }

  // exchange: a ring (send to the next rank, receive from the previous), two messages each
  // way so the posting order is checked too.
  if (P > 1) {
    const int next = (r + 1) % P, prev = (r + P - 1) % P;
    std::vector<float> m1(300, static_cast<float>(r)), m2(17, static_cast<float>(100 + r));
    DeviceArray<float> s1(m1), s2(m2), r1(300), r2(17);
    r1.fill_bytes(0xFF);
    r2.fill_bytes(0xFF);
    comm.exchange({{next, device_buffer(s1, DType::f32)}, {next, device_buffer(s2, DType::f32)}},
                  {{prev, device_buffer(r1, DType::f32)}, {prev, device_buffer(r2, DType::f32)}}, stream)
        .wait();
    for (float x : r1.download()) ASSERT_EQ(x, static_cast<float>(prev)) << "exchange, first message";
    for (float x : r2.download()) ASSERT_EQ(x, static_cast<float>(100 + prev)) << "exchange, second message";
  }
  comm.barrier();
}

bool gpu_present() {
  std::string why;
  return cuda_available(&why);
}

TEST(GpuComm, LocalGroupMovesDeviceBuffers) {
  if (!gpu_present()) GTEST_SKIP() << "no GPU";
  for (int P : {1, 3}) {
    run_local_ranks(P, [](Communicator& comm) {
      ASSERT_TRUE(comm.accepts(Device::cuda));
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
      cudaStream_t stream = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      exercise(comm, stream);
      cudaStreamDestroy(stream);
    });
  }
}

TEST(GpuComm, NcclOneRankPerGpu) {
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  if (!gpu_present()) GTEST_SKIP() << "no GPU";
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  const int P = std::min(devices, 4);
  run_local_ranks(P, [](Communicator& boot) {
    const std::unique_ptr<Communicator> nccl = nccl_communicator(boot, boot.rank());
    ASSERT_EQ(nccl->backend(), "nccl");
    ASSERT_EQ(nccl->rank(), boot.rank());
    ASSERT_EQ(nccl->size(), boot.size());
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    exercise(*nccl, stream);
    exercise(*nccl, nullptr);  // the default stream too
    // Host metadata over the device-only backend (the CP layer's agreement) travels through
    // the device.
    const int ranks = boot.size(), r = boot.rank();
    std::vector<std::int64_t> mine{r, 1000 + r, -r}, all(3 * static_cast<std::size_t>(ranks), -7);
    nccl->all_gather_host(mine.data(), mine.size(), all.data());
    for (int s = 0; s < ranks; ++s) {
      ASSERT_EQ(all[3 * static_cast<std::size_t>(s)], s);
      ASSERT_EQ(all[3 * static_cast<std::size_t>(s) + 1], 1000 + s);
      ASSERT_EQ(all[3 * static_cast<std::size_t>(s) + 2], -s);
    }
    // Host buffers are refused with a clear error; so is a bad device.
    std::vector<float> host(4);
    try {
      nccl->all_reduce(comm_buffer(host.data(), host.size()), ReduceOp::sum);
      FAIL() << "host buffer accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cpu buffers"), std::string::npos) << e.what();
    }
    cudaStreamDestroy(stream);
  });
}

TEST(GpuComm, NcclRefusesABadDevice) {
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  if (!gpu_present()) GTEST_SKIP() << "no GPU";
  run_local_ranks(1, [](Communicator& boot) {
    try {
      nccl_communicator(boot, 999);
      FAIL() << "device 999 accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("device 999"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace csattn
#endif  // CSATTN_HAVE_CUDA

namespace csattn {
namespace {

// Every build: the factory exists; without NCCL it says so.
TEST(GpuComm, NcclFactoryWithoutNcclSaysWhy) {
  if (nccl_available()) GTEST_SKIP() << "this build has NCCL";
  run_local_ranks(1, [](Communicator& boot) {
    try {
      nccl_communicator(boot, 0);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("NCCL"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace csattn
