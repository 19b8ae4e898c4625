// `csattn info`: the version, what this build holds and the GPUs it sees (build_info.hpp),
// as text or --json. What a bug report should carry.
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "commands.hpp"
#include "csattn/build_info.hpp"

namespace csattn::cli {

namespace {

std::string cuda_version(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }

std::string yes_no(bool b) { return b ? "yes" : "no"; }

void print_text(const BuildInfo& b) {
  fmt::print("csattn {}\n", b.version);
  if (b.cuda_backend)
    fmt::print("  CUDA backend: yes, {} (runtime {}, driver {})\n", b.cuda_target,
               cuda_version(b.cuda_runtime_version),
               b.cuda_driver_version > 0 ? cuda_version(b.cuda_driver_version) : std::string("none"));
  else
    fmt::print("  CUDA backend: no\n");
  fmt::print("  communicators: threads yes, MPI {}, NCCL {}\n", yes_no(b.mpi), yes_no(b.nccl));
  fmt::print("  CPU: {} OpenMP threads, projections through {}\n", b.cpu_threads,
             b.cblas ? "CBLAS" : "the built-in GEMM");
  if (b.gpus.empty()) fmt::print("  GPUs: none ({})\n", b.gpu_note);
  for (const GpuInfo& g : b.gpus)
    fmt::print("  GPU {}: {}, compute {}.{}, {} SMs, {:.1f} GiB, {} KiB shared memory per block{}\n",
               g.index, g.name, g.major, g.minor, g.multiprocessors,
               static_cast<double>(g.memory_bytes) / (1 << 30), g.smem_per_block_optin / 1024,
               g.runs_kernels ? "" : fmt::format(" - not usable: the kernels are built for {} only",
                                                 b.cuda_target));
}

}  // namespace

Command add_info_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "info", "The version, the backends and communicators of this build and the GPUs it sees");
  cmd->add_flag("--json", *json, "One JSON object instead of text");
  return [json]() {
    const BuildInfo b = build_info();
    if (*json) fmt::print("{}\n", to_json(b));
    else print_text(b);
    return 0;
  };
}

}  // namespace csattn::cli
