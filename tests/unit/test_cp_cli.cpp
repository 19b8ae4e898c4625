// `csattn run` under context parallelism, as a child process: in-process ranks
// (--cp-ranks) and, when mpirun is installed, `mpirun -np 2`. A CP run's --save file holds
// the same tensors as the single-rank run's: outputs and top-k bitwise in fp32, the loss
// (a sum of per-rank fp32 shares) and the gradients within 1e-6 relative. Bad CP options
// exit with status 2 and one line.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "csattn/layer.hpp"
#include "csattn/safetensors.hpp"

#ifndef CSATTN_CLI_PATH
#error "CSATTN_CLI_PATH must name the csattn binary"
#endif

namespace csattn {
namespace {

struct Result {
  int status = -1;
  std::string out, err;
};

std::string temp_path(const std::string& suffix) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return (std::filesystem::path(::testing::TempDir()) /
          ("csattn_cp_" + std::string(info->name()) + "_" + std::to_string(::getpid()) + "_" + suffix))
      .string();
}

Result run(const std::string& cmd_line) {
  const std::string err_path = temp_path("stderr.txt");
  Result r;
  FILE* pipe = ::popen((cmd_line + " 2>'" + err_path + "'").c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int st = ::pclose(pipe);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream in(err_path);
  std::ostringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  std::filesystem::remove(err_path);
  return r;
}

std::string cli() { return std::string("'") + CSATTN_CLI_PATH + "' "; }

const char* kArgs =
    "run --preset tiny --dtype fp32 --seqlens 9,140,3,170 --padded-seqlens 12,140,4,170 -q ";

// Same names and shapes; outputs and top-k bitwise; everything else within 1e-6.
void expect_same_results(const std::string& single, const std::string& cp) {
  const TensorMap a = load_safetensors(single), b = load_safetensors(cp);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    const Tensor& u = b.at(name);
    ASSERT_EQ(t.shape(), u.shape()) << name;
    ASSERT_EQ(t.dtype(), u.dtype()) << name;
    const bool exact = name.find("output") != std::string::npos ||
                       name.find("topk") != std::string::npos;
    if (exact) {
      EXPECT_EQ(std::memcmp(t.data(), u.data(), t.nbytes()), 0) << name;
      continue;
    }
    const std::vector<float> x = t.to_f32(), y = u.to_f32();
    double m = 0, s = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      m = std::max(m, static_cast<double>(std::fabs(x[i] - y[i])));
      s = std::max(s, static_cast<double>(std::fabs(x[i])));
    }
    EXPECT_LE(m, 1e-6 * s) << name;
  }
}

TEST(CpCli, InProcessRanksSaveTheSingleRankFile) {
  const std::string one = temp_path("one.safetensors"), cp = temp_path("cp.safetensors");
  ASSERT_EQ(run(cli() + kArgs + "--save '" + one + "'").status, 0);
  const Result r = run(cli() + kArgs + "--cp-mode two_chunk --cp-ranks 3 --save '" + cp + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("context parallel: two_chunk over 3 ranks (local)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("batch padded from 326 to 336 rows"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("balance (max / mean over ranks"), std::string::npos);
  expect_same_results(one, cp);
  const Result j = run(cli() + kArgs + "--cp-mode contiguous --cp-ranks 2 --json");
  ASSERT_EQ(j.status, 0) << j.err;
  EXPECT_NE(j.out.find("\"context_parallel\""), std::string::npos);
  EXPECT_NE(j.out.find("\"attention_flops\""), std::string::npos);
  std::filesystem::remove(one);
  std::filesystem::remove(cp);
}

// The MXFP8 indexer under CP: the ranks select through the same compact op.
TEST(CpCli, Mxfp8IndexerSavesTheSingleRankFile) {
  const std::string one = temp_path("one.safetensors"), cp = temp_path("cp.safetensors");
  const std::string args = std::string(kArgs) + "--ratio 4 --indexer-precision mxfp8 ";
  ASSERT_EQ(run(cli() + args + "--save '" + one + "'").status, 0);
  const Result r = run(cli() + args + "--cp-mode two_chunk --cp-ranks 2 --save '" + cp + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  expect_same_results(one, cp);
  std::filesystem::remove(one);
  std::filesystem::remove(cp);
}

TEST(CpCli, MpirunSavesTheSingleRankFile) {
#ifndef CSATTN_HAVE_MPI
  GTEST_SKIP() << "this build has no MPI communicator (CSATTN_WITH_MPI=OFF or MPI not found)";
#endif
  const Result which = run("command -v mpirun");
  if (which.status != 0) GTEST_SKIP() << "mpirun is not installed";
  const std::string one = temp_path("one.safetensors"), cp = temp_path("mpi.safetensors");
  ASSERT_EQ(run(cli() + kArgs + "--save '" + one + "'").status, 0);
  const Result r = run("mpirun --allow-run-as-root --oversubscribe -np 2 " + cli() + kArgs +
                       "--cp-mode contiguous --save '" + cp + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("context parallel: contiguous over 2 ranks (mpi)"), std::string::npos) << r.out;
  expect_same_results(one, cp);
  std::filesystem::remove(one);
  std::filesystem::remove(cp);
}

TEST(CpCli, BadOptionsExitTwoWithOneLine) {
  const std::string small = "run --preset tiny -q --seqlens 5,7 ";
  for (const std::string& args :
       {small + "--cp-ranks 2", small + "--cp-mode zigzag",
        small + "--cp-mode contiguous --cp-ranks 2 --ratio 128",
        small + "--cp-mode two_chunk --cp-ranks -1"}) {
    const Result r = run(cli() + args);
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_EQ(r.err.rfind("csattn: error: ", 0), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
  // The GPU context-parallel run: refused with the reason where there is no GPU, and where
  // there is one (2 ranks as threads on it), it runs.
  const std::string on_gpu = small + "--cp-mode two_chunk --cp-ranks 2 --device cuda";
  const Result g = run(cli() + on_gpu);
  if (csattn::cuda_available()) {
    EXPECT_EQ(g.status, 0) << on_gpu << ": " << g.err;
  } else {
    EXPECT_EQ(g.status, 2) << on_gpu;
    EXPECT_EQ(g.err.rfind("csattn: error: ", 0), 0u) << on_gpu << ": " << g.err;
    EXPECT_EQ(std::count(g.err.begin(), g.err.end(), '\n'), 1) << on_gpu << ": " << g.err;
  }
  const Result r = run(cli() + small + "--cp-mode contiguous --cp-ranks 2 --ratio 128");
  EXPECT_NE(r.err.find("pad the batch to at least P*D_w = 256 rows"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace csattn
