// GPU benchmarks of the CUDA backend (run on the lent H200 by scripts/gpu-check.sh):
//  1. the ceilings of this run: bf16 GEMM (cuBLAS, 8192^3) and device copy bandwidth;
//  2. the sparse attention kernel at FlashMLA's anchor shapes (4096 queries, random top-k
//     into 8K-64K compressed keys, sink on) plus our 128-row window, and its phases
//     (cuda_bench_phases.cpp);
//  3. the sparse attention backward kernel at the same shapes, and its phases;
//  4. the whole layer forward + backward per layer type at the Flash shape, per stage;
//  5. the indexer KL loss (value + gradients) at the Flash shape, both kernels;
//  6. the indexer + top-k at 32K-128K tokens and the bandwidth-bound kernels.
// Prints a table, writes JSON and an SVG bar chart of the attention figures. Shared by
// `csattn bench --device cuda` and the standalone `csattn_cuda_bench` (bench/cuda_bench.cpp).
#include <cublas_v2.h>
#include <curand.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_random.hpp"
#include "cuda_bench.hpp"
#include "env_list.hpp"
#include "one_sequence_metadata.hpp"
#include "sparse_attention_inputs.hpp"

#include "csattn/device_memory.hpp"
#include "csattn/layer.hpp"
#include "cuda/check.hpp"
#include "cuda/cuda_layer.hpp"
#include "cuda/device_arena.hpp"
#include "cuda/gather_ceiling.hpp"
#include "cuda/backward_kernels.hpp"
#include "cuda/kernels.hpp"
#include "cuda/reduction_ceiling.hpp"
#include "cuda/timing.hpp"
#include "cuda/workspace.hpp"

using namespace csattn;
using namespace csattn::cuda;
using json = nlohmann::json;

namespace csattn::bench {

namespace {
void curand_check(curandStatus_t status, const char* what) {
  require(status == CURAND_STATUS_SUCCESS, ErrorKind::Internal,
          std::string("cuRAND: ") + what + " failed (status " + std::to_string(status) + ")");
}

}  // namespace

// N(0, scale^2) bf16 values drawn on the device: cuRAND's Philox normals (fp32) in chunks of
// at most 64M, rounded to bf16 there. (Drawing them on the host took about a minute per
// benchmark pass at the Pro shapes, on lent device time.)
void fill_random_bf16(cuda::bf16* dev, std::size_t n, std::uint64_t seed, float scale) {
  if (n == 0) return;
  constexpr std::size_t kChunk = std::size_t(1) << 26;  // even: curandGenerateNormal needs it
  const std::size_t cap = std::min(kChunk, n + (n & 1));
  float* tmp = nullptr;
  CSATTN_CUDA_CHECK(cudaMalloc(&tmp, sizeof(float) * cap));
  curandGenerator_t gen;
  curand_check(curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_PHILOX4_32_10), "create generator");
  curand_check(curandSetPseudoRandomGeneratorSeed(gen, seed), "seed");
  for (std::size_t off = 0; off < n; off += cap) {
    const std::size_t m = std::min(cap, n - off);
    curand_check(curandGenerateNormal(gen, tmp, m + (m & 1), 0.0f, scale), "normal draw");
    launch_f32_to_bf16(tmp, dev + off, static_cast<long>(m), nullptr);
  }
  CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
  curandDestroyGenerator(gen);
  CSATTN_CUDA_CHECK(cudaFree(tmp));
}

}  // namespace csattn::bench

using csattn::bench::fill_random_bf16;
using csattn::bench::SparseAttentionInputs;

namespace {

template <class F>
double median_ms(F&& run, int warmup, int iters) {  // on the legacy stream
  return median_event_ms(run, nullptr, warmup, iters);
}

json ceilings() {
  json j;
  const int n = 8192;
  bf16 *A, *B, *C;
  CSATTN_CUDA_CHECK(cudaMalloc(&A, sizeof(bf16) * n * n));
  CSATTN_CUDA_CHECK(cudaMalloc(&B, sizeof(bf16) * n * n));
  CSATTN_CUDA_CHECK(cudaMalloc(&C, sizeof(bf16) * n * n));
  fill_random_bf16(A, static_cast<std::size_t>(n) * n, 1);
  fill_random_bf16(B, static_cast<std::size_t>(n) * n, 2);
  cublasHandle_t h;
  CSATTN_CUBLAS_CHECK(cublasCreate(&h));
  const float one = 1.0f, zero = 0.0f;
  const double ms = median_ms([&] {
    CSATTN_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16BF, n,
                                     B, CUDA_R_16BF, n, &zero, C, CUDA_R_16BF, n,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }, 3, 10);
  j["gemm_bf16_tflops"] = 2.0 * n * n * static_cast<double>(n) / (ms * 1e-3) / 1e12;
  const std::size_t bytes = std::size_t(2) << 30;
  void *src, *dst;
  CSATTN_CUDA_CHECK(cudaMalloc(&src, bytes));
  CSATTN_CUDA_CHECK(cudaMalloc(&dst, bytes));
  CSATTN_CUDA_CHECK(cudaMemset(src, 1, bytes));
  const double cms = median_ms([&] { CSATTN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); }, 3, 10);
  j["copy_tbps"] = 2.0 * bytes / (cms * 1e-3) / 1e12;
  cublasDestroy(h);
  cudaFree(A); cudaFree(B); cudaFree(C); cudaFree(src); cudaFree(dst);
  return j;
}

// The sparse attention forward kernel alone. FLOPs = 2 * H * (512 + 512) per (query, key).
json sparse_attention_case(int heads, int topk, int keys, int queries, double gemm_tflops) {
  const SparseAttentionInputs in(heads, topk, keys, queries, false);
  const double ms = median_ms([&] { in.forward(); }, 2, 5);
  json j = in.record(ms, 2.0 * (512 + 512), gemm_tflops);
  j["key_tbps"] = in.key_tbps(ms);
  return j;
}

// The sparse attention backward kernel alone (the one launch_attention_backward picks;
// CSATTN_ATTENTION_BACKWARD=mma / baseline force an older one), after one forward for O and
// LSE. FLOPs = 2 * H * (3 * 512 + 2 * 512) per (query, key): S, dP, dQ, and the two products
// of dK (P^T dO, dS^T Q). writes other than all (wgmma kernel only, wrong gradients on
// purpose) time the same kernel without its key-gradient reductions (none: what they cost) or
// with those of the even head blocks only (what halving them would buy; KeyGradWrites).
const char* key_grad_writes_label(KeyGradWrites writes) {
  return writes == KeyGradWrites::none               ? " (no dK writes)"
         : writes == KeyGradWrites::even_head_blocks ? " (dK of even head blocks)"
                                                     : "";
}

json sparse_attention_backward_case(int heads, int topk, int keys, int queries,
                                    double gemm_tflops, KeyGradWrites writes) {
  const SparseAttentionInputs in(heads, topk, keys, queries, true);
  in.forward();
  const std::string kernel = attention_backward_kernel_name(in.d);
  double ms;
  if (writes != KeyGradWrites::all) {
    require(kernel == "wgmma", ErrorKind::Unsupported,
            "partial key-gradient writes are a wgmma-kernel measurement");
    ms = median_ms([&] {
      launch_attention_backward_wgmma(in.d, in.m, in.q, in.kv, in.comp, in.sink, in.topk_dev,
                                      in.out, in.lse, in.dout, in.dq, in.dkv, in.dcomp, in.dsink,
                                      nullptr, GradChunk{}, writes);
    }, 1, 5);
  } else {
    ms = median_ms([&] { in.backward(); }, 1, 5);
  }
  json j = in.record(ms, 2.0 * (3 * 512 + 2 * 512), gemm_tflops);
  j["kernel"] = kernel + key_grad_writes_label(writes);
  return j;
}

// A persisting L2 set-aside of `bytes` (a device-wide limit) for one measurement, undone when
// it goes out of scope - also when the measurement throws, so the cases after it have the
// whole L2. `status`: whether the device took it.
struct PersistingL2SetAside {
  cudaError_t status;
  explicit PersistingL2SetAside(std::size_t bytes)
      : status(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, bytes)) {
    if (status != cudaSuccess) (void)cudaGetLastError();
  }
  ~PersistingL2SetAside() {
    cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0);
    cudaCtxResetPersistingL2Cache();
  }
  PersistingL2SetAside(const PersistingL2SetAside&) = delete;
  PersistingL2SetAside& operator=(const PersistingL2SetAside&) = delete;
};

// One reduction ceiling (reduction_ceiling.hpp): `tiles` tiles of 64 random rows out of `rows`
// gradient rows of 512 fp32. One run from zeros is checked first, element by element - each
// must be exactly what the path adds (1.0f per tile that picked its row; the stores leave
// 1.0f on every row they touch) - then the path is timed; TB/s over the bytes added
// (tiles x 64 x 2 KB). keep_rows: red_row_major_kept's evict_last rows.
json reduction_case(ReductionPath path, int tiles, int rows, int keep_rows = 0) {
  std::mt19937 rng(static_cast<unsigned>(rows) + 7u);
  std::uniform_int_distribution<int> pick(0, rows - 1);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(tiles) * 64);
  for (std::int32_t& id : ids) id = pick(rng);
  const std::size_t floats = static_cast<std::size_t>(rows) * 512;
  DeviceArena ids_mem, dst_mem;  // freed on every exit, the failed check's too
  auto* ids_dev = reinterpret_cast<std::int32_t*>(ids_mem.reserve(ids.size() * 4));
  auto* dst = reinterpret_cast<float*>(dst_mem.reserve(floats * 4));
  CSATTN_CUDA_CHECK(cudaMemcpy(ids_dev, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CSATTN_CUDA_CHECK(cudaMemset(dst, 0, floats * 4));
  launch_reduction_ceiling(path, dst, ids_dev, tiles, nullptr, keep_rows);
  CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> h(floats);
  CSATTN_CUDA_CHECK(cudaMemcpy(h.data(), dst, floats * 4, cudaMemcpyDeviceToHost));
  // Every element of row r holds how often r was picked (the stores: 1 if it was), exactly.
  std::vector<int> picked(static_cast<std::size_t>(rows), 0);
  for (std::int32_t id : ids) ++picked[static_cast<std::size_t>(id)];
  for (std::size_t i = 0; i < floats; ++i) {
    const int n = picked[i / 512];
    const float want = path == ReductionPath::store_flush_layout ? (n > 0 ? 1.0f : 0.0f) : static_cast<float>(n);
    // Compared first, the message built only on a mismatch: require's message, built for each
    // of the 134M floats of the 256K-row case, took minutes (the 2026-12-05 run was killed).
    if (h[i] != want)
      throw Error(ErrorKind::Internal, std::string("reduction ceiling ") + reduction_path_name(path) +
                                           ": row " + std::to_string(i / 512) + " dim " +
                                           std::to_string(i % 512) + " holds " + std::to_string(h[i]) +
                                           ", expected " + std::to_string(want));
  }
  const double ms = median_ms([&] { launch_reduction_ceiling(path, dst, ids_dev, tiles, nullptr, keep_rows); }, 2, 5);
  const double bytes = static_cast<double>(ids.size()) * 512 * 4;
  return json{{"path", reduction_path_name(path)}, {"tiles", tiles}, {"rows", rows}, {"kept_rows", keep_rows},
              {"ms", ms}, {"tbps", bytes / (ms * 1e-3) / 1e12}, {"checked", true}};
}

// The gather ceiling (gather_ceiling.hpp) at the attention benchmark's shapes: 4096 queries,
// each reading its 128 window rows (of 4096 raw rows) and `topk` random rows of `keys`
// compressed rows, once per 64-head block (head_blocks consecutive items a query, as the
// forward's items; GatherRows says which of those rows an item takes); timed without and then
// with the streams (each item also reading 64 KB of Q and writing 64 KB of O), on the same
// table and ids: two results. Each is checked first (the kernel's word sum against the host's;
// the bench's Q is bytes 0x01, so only the test, with random Q words, checks which Q an item
// reads), then timed; gathered TB/s over the rows moved (once per head block: twice the
// attention table's per-query key TB/s at Pro), and the forward's roofline: its FLOPs of the
// same queries over the time (all the query's rows, window included, whichever rows moved).
// GatherRows: `all` of the query's rows for every head block; `shared`: the head blocks of a
// query share its rows, each gathering 1 / head_blocks of them (what a cluster of the query's
// CTAs that forwards the rest between them would fetch); `topk_only`: its top-k rows alone,
// the window rows skipped (the bound on what keeping window rows on chip from one token to
// the next could buy).
enum class GatherRows { all, shared, topk_only };
const char* gather_rows_name(GatherRows r) {
  return r == GatherRows::all ? "all" : r == GatherRows::shared ? "shared" : "top-k";
}
// `copy`: how the rows move (gather_ceiling.hpp: 16-byte cp.async, or eight 128-byte TMA boxes
// a row).
std::vector<json> gather_cases(int head_blocks, int topk, int keys, double copy_tbps, GatherRows rows,
                               GatherCopy copy) {
  constexpr int kQueries = 4096, kWindow = 128, kRawRows = 4096;
  const bool split = rows == GatherRows::shared;
  const int window = rows == GatherRows::topk_only ? 0 : kWindow;  // the window rows an item takes
  const int full = kWindow + topk;                                  // the forward's key list
  const int list = window + topk, per_item = split ? list / head_blocks : list;
  const int items = kQueries * head_blocks;
  require(per_item % 64 == 0 && per_item * (split ? head_blocks : 1) == list, ErrorKind::InvalidArgument,
          "gathers: the rows an item takes must be whole 64-row tiles");
  const long table_rows = kRawRows + static_cast<long>(keys);
  std::mt19937 rng(static_cast<unsigned>(keys * 7 + topk));
  std::vector<std::uint32_t> table(static_cast<std::size_t>(table_rows) * 256);
  for (std::uint32_t& w : table) w = rng();
  std::vector<std::uint32_t> row_sum(static_cast<std::size_t>(table_rows), 0u);
  for (long r = 0; r < table_rows; ++r)
    for (int k = 0; k < 256; ++k) row_sum[static_cast<std::size_t>(r)] += table[static_cast<std::size_t>(r) * 256 + k];
  std::uniform_int_distribution<int> pick(0, keys - 1);
  // Per query, its head blocks' items in turn: each a copy of the query's list, or (split)
  // consecutive parts of it.
  std::vector<std::int32_t> ids(static_cast<std::size_t>(items) * per_item);
  std::vector<std::int32_t> query_list(static_cast<std::size_t>(list));
  for (int qi = 0; qi < kQueries; ++qi) {
    for (int j = 0; j < window; ++j) query_list[j] = (qi - kWindow + 1 + j + kRawRows) % kRawRows;
    for (int j = 0; j < topk; ++j) query_list[window + j] = kRawRows + pick(rng);
    std::int32_t* first = ids.data() + static_cast<std::size_t>(qi) * head_blocks * per_item;
    for (int hb = 0; hb < head_blocks; ++hb)
      std::copy_n(query_list.begin() + (split ? hb * per_item : 0), per_item,
                  first + static_cast<std::size_t>(hb) * per_item);
  }
  std::uint32_t key_sum = 0;
  for (std::int32_t id : ids) key_sum += row_sum[static_cast<std::size_t>(id)];
  const std::size_t stream_bytes = static_cast<std::size_t>(items) * 64 * 1024;
  // One arena an array (an arena is one block); freed on every exit, the failed check's too.
  DeviceArena table_mem, ids_mem, sum_mem, q_mem, out_mem;
  auto* table_dev = reinterpret_cast<bf16*>(table_mem.reserve(table.size() * 4));
  auto* ids_dev = reinterpret_cast<std::int32_t*>(ids_mem.reserve(ids.size() * 4));
  auto* sum_dev = reinterpret_cast<unsigned*>(sum_mem.reserve(4));
  auto* q_dev = reinterpret_cast<bf16*>(q_mem.reserve(stream_bytes));
  auto* out_dev = reinterpret_cast<bf16*>(out_mem.reserve(stream_bytes));
  CSATTN_CUDA_CHECK(cudaMemcpy(table_dev, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CSATTN_CUDA_CHECK(cudaMemcpy(ids_dev, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CSATTN_CUDA_CHECK(cudaMemset(q_dev, 0x01, stream_bytes));
  std::vector<json> results;
  for (bool streams : {false, true}) {
    // Q: bytes 0x01, every one of its words 0x01010101.
    const std::uint32_t want = key_sum + (streams ? static_cast<std::uint32_t>(stream_bytes / 4) * 0x01010101u : 0u);
    CSATTN_CUDA_CHECK(cudaMemset(sum_dev, 0, 4));
    auto run = [&] {
      launch_gather_ceiling(table_dev, ids_dev, items, per_item, q_dev, out_dev, streams, sum_dev, nullptr, copy,
                            table_rows);
    };
    run();
    unsigned got = 0;
    CSATTN_CUDA_CHECK(cudaMemcpy(&got, sum_dev, 4, cudaMemcpyDeviceToHost));
    if (got != want)
      throw Error(ErrorKind::Internal, std::string("gather ceiling") + (streams ? " with Q / O" : "") +
                                           ": word sum " + std::to_string(got) + ", expected " + std::to_string(want));
    const double ms = median_ms(run, 2, 5);
    const double gathered_bytes = static_cast<double>(ids.size()) * 1024;
    const double tbps = gathered_bytes / (ms * 1e-3) / 1e12;
    // The forward's FLOPs over the same queries: 2 x 64 x 1,024 a (head block, key) pair.
    const double flops = static_cast<double>(kQueries) * head_blocks * full * 2.0 * 64 * 1024;
    results.push_back(json{{"head_blocks", head_blocks}, {"topk", topk},        {"keys", keys},
                           {"queries", kQueries},      {"window", kWindow},    {"streams", streams},
                           {"rows", gather_rows_name(rows)}, {"ms", ms},           {"gathered_tbps", tbps},
                           {"copy", gather_copy_name(copy)},
                           {"fraction_of_copy", tbps / copy_tbps}, {"roofline_tflops", flops / (ms * 1e-3) / 1e12},
                           {"checked", true}});
  }
  return results;
}

// The indexer KL loss alone (value + gradients) at the Flash or Pro shape: one sequence of
// `tokens`, window 128, the preset's top-k like the indexer's (every visible entry when they
// fit, else random ones), the forward attention's LSE as input. FLOPs per (row, candidate)
// pair, counted once: teacher 2*H*512 + predictor 2*64*128 + dqI and dK 2 * 2*64*128
// (114,688 at H = 64; recomputation, the dense loss's window pass and second teacher pass not
// counted). `kept`: the layer's way (the automatic kernel choice) - the value launch (the
// forward's, timed as value_ms: the wgmma teacher, then the rows kernel's predictor pass)
// keeps the teacher for the timed gradient launch (launch_indexer_loss's `kept`, with
// own_selection: the gradient-only instance), which then skips the teacher's work; the same FLOPs are counted, so its TFLOPS compare with the plain
// row's (the tensor-core rows kernel alone, its value launch with its own mma.sync teacher).
json indexer_loss_case(int tokens, bool sparse, IndexerLossKernel kernel, double gemm_tflops,
                       const std::string& preset, bool kept = false) {
  AttentionConfig cfg = ModelConfig::preset(preset).base;
  cfg.compress_ratio = 4;
  const int H = cfg.n_heads, D = cfg.head_dim, HI = cfg.index_n_heads, DI = cfg.index_head_dim;
  const int K = cfg.index_topk, T = tokens, Nc = tokens / 4;
  LayerDims d = make_dims(cfg, T, 1, T);
  d.rows = T;
  std::vector<void*> bufs;
  auto dev = [&](std::size_t bytes) { void* p; CSATTN_CUDA_CHECK(cudaMalloc(&p, bytes)); bufs.push_back(p); return p; };
  auto* q = static_cast<bf16*>(dev(sizeof(bf16) * T * H * D));
  auto* attn = static_cast<bf16*>(dev(sizeof(bf16) * T * H * D));
  auto* kv = static_cast<bf16*>(dev(sizeof(bf16) * T * D));
  auto* comp = static_cast<bf16*>(dev(sizeof(bf16) * Nc * D));
  auto* qi = static_cast<bf16*>(dev(sizeof(bf16) * T * HI * DI));
  auto* dqi = static_cast<bf16*>(dev(sizeof(bf16) * T * HI * DI));
  auto* keys = static_cast<bf16*>(dev(sizeof(bf16) * Nc * DI));
  auto* lse = static_cast<float*>(dev(sizeof(float) * T * H));
  auto* w_eff = static_cast<float*>(dev(sizeof(float) * T * HI));
  auto* dweff = static_cast<float*>(dev(sizeof(float) * T * HI));
  auto* dkeys = static_cast<float*>(dev(sizeof(float) * Nc * DI));
  auto* rows = static_cast<float*>(dev(sizeof(float) * T));
  auto* sink = static_cast<float*>(dev(sizeof(float) * H));
  auto* sel = static_cast<std::int32_t*>(dev(sizeof(std::int32_t) * T * K));
  void* meta_buf = dev(csattn::bench::one_sequence_metadata_bytes(T));
  // q: 4096 random rows, repeated (host generation of 0.5 G normals would dominate).
  const int q_rows = std::min(T, 4096);
  fill_random_bf16(q, static_cast<std::size_t>(q_rows) * H * D, 11, 1.0f);
  for (int r = q_rows; r < T; r += q_rows)
    CSATTN_CUDA_CHECK(cudaMemcpy(q + static_cast<std::size_t>(r) * H * D, q,
                                 sizeof(bf16) * std::min(q_rows, T - r) * H * D, cudaMemcpyDeviceToDevice));
  fill_random_bf16(kv, static_cast<std::size_t>(T) * D, 12);
  fill_random_bf16(comp, static_cast<std::size_t>(Nc) * D, 13);
  fill_random_bf16(qi, static_cast<std::size_t>(T) * HI * DI, 14);
  fill_random_bf16(keys, static_cast<std::size_t>(Nc) * DI, 15);
  std::mt19937_64 rng(16);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> wh(static_cast<std::size_t>(T) * HI), sh(H, 0.5f);
  for (auto& x : wh) x = nd(rng) / std::sqrt(static_cast<float>(HI * DI));
  CSATTN_CUDA_CHECK(cudaMemcpy(w_eff, wh.data(), wh.size() * 4, cudaMemcpyHostToDevice));
  CSATTN_CUDA_CHECK(cudaMemcpy(sink, sh.data(), sh.size() * 4, cudaMemcpyHostToDevice));
  std::vector<std::int32_t> selh(static_cast<std::size_t>(T) * K, -1), pool(Nc);
  double pairs = 0.0;
  for (int t = 0; t < T; ++t) {
    const int vis = (t + 1) / 4, n = std::min(vis, K);
    for (int i = 0; i < vis; ++i) pool[i] = i;
    for (int k = 0; k < n && vis > K; ++k) std::swap(pool[k], pool[k + rng() % (vis - k)]);
    std::sort(pool.begin(), pool.begin() + n);
    std::copy(pool.begin(), pool.begin() + n, selh.begin() + static_cast<long>(t) * K);
    pairs += sparse ? n : vis;
  }
  CSATTN_CUDA_CHECK(cudaMemcpy(sel, selh.data(), selh.size() * 4, cudaMemcpyHostToDevice));
  const DeviceMetadata m = csattn::bench::upload_one_sequence_metadata(meta_buf, T, T, Nc, 0);
  launch_sparse_attention(d, m, q, kv, comp, sink, sel, attn, lse, nullptr);
  auto* scale = static_cast<float*>(dev(sizeof(float)));  // the mean's 1 / T, on the device
  const float scale_h = 1.0f / T;
  CSATTN_CUDA_CHECK(cudaMemcpy(scale, &scale_h, sizeof(float), cudaMemcpyHostToDevice));
  IndexerLossArgs a;
  a.qi = qi; a.w_eff = w_eff; a.keys = keys; a.q = q; a.kv = kv; a.comp = comp; a.sink = sink;
  a.topk = sel; a.lse = lse; a.sparse = sparse; a.scale = scale;
  auto* kept_buf = kept ? static_cast<float*>(dev(sizeof(float) * 2 * (static_cast<std::size_t>(T) * K + T))) : nullptr;
  auto* loss = static_cast<float*>(dev(sizeof(float)));
  const IndexerLossKernel launch_kernel = kept ? IndexerLossKernel::automatic : kernel;
  const double value_ms = median_ms([&] {
    launch_indexer_loss(d, m, a, rows, loss, false, 0.0f, nullptr, nullptr, nullptr, kept_buf, nullptr,
                        launch_kernel);
  }, 1, 3);
  const double ms = median_ms([&] {
    CSATTN_CUDA_CHECK(cudaMemsetAsync(dkeys, 0, sizeof(float) * Nc * DI, nullptr));
    // (own_selection where kept, as the layer's backward: every id here is visible)
    launch_indexer_loss(d, m, a, rows, nullptr, true, 1.0f, dqi, dweff, dkeys, kept_buf, nullptr, launch_kernel,
                        false, kept);
  }, 1, 3);
  // The kept value launch's first part alone (the wgmma teacher; the rest of value_ms is the
  // rows kernel's predictor pass and KL): what taking the predictor's logits from the
  // indexer's own scores would leave of the forward's loss work (design.md, "the indexer
  // loss"). Timed last: at 128 heads it zeroes `kept` first, which the gradient launch reads.
  // -1 where the launch has no separate teacher.
  double teacher_ms = -1.0;
  if (kept && sparse && indexer_teacher_wgmma_supported(d))
    teacher_ms = median_ms([&] { launch_indexer_teacher_wgmma(d, m, a, kept_buf, nullptr); }, 1, 3);
  const double flops = pairs * (2.0 * H * D + 3 * 2.0 * HI * DI);
  json j{{"preset", preset}, {"heads", H}, {"tokens", T}, {"loss", sparse ? "sparse" : "dense"},
         {"kernel", kernel == IndexerLossKernel::baseline ? "baseline" : kept ? "tensor_core_kept" : "tensor_core"},
         {"pairs", pairs}, {"ms", ms}, {"value_ms", value_ms}, {"teacher_ms", teacher_ms},
         {"tflops", flops / (ms * 1e-3) / 1e12}};
  j["fraction_of_gemm"] = j["tflops"].get<double>() / gemm_tflops;
  for (void* p : bufs) cudaFree(p);
  return j;
}

json layer_case(const std::string& preset, int ratio, int tokens, bool backward = false,
                bool deterministic = false) {
  AttentionConfig cfg = ModelConfig::preset(preset).base;
  cfg.compress_ratio = ratio;
  const LayerWeights w = LayerWeights::random(cfg, 11);
  // Device memory the layer holds at its peak: runs never allocate (workspaces are planned
  // and grown before a run), so what is gone after the last run is the peak of the step.
  std::size_t free_before = 0, free_after = 0, total_mem = 0;
  CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
  CSATTN_CUDA_CHECK(cudaMemGetInfo(&free_before, &total_mem));
  CudaLayer layer(cfg, w);
  layer.set_deterministic(deterministic);
  std::mt19937_64 rng(12);
  std::normal_distribution<float> dist;
  std::vector<float> xv(static_cast<std::size_t>(tokens) * cfg.d_model);
  for (float& v : xv) v = dist(rng);
  layer.forward(Tensor::from_f32(xv, {tokens, cfg.d_model}), SeqLayout::from_lengths({tokens}), Tensor());
  const ForwardProfile prof = layer.profile(2, 5);
  StageProfile bprof;
  if (backward) {
    std::vector<float> gv(xv.size());
    for (float& v : gv) v = dist(rng);
    layer.backward(Tensor::from_f32(gv, {tokens, cfg.d_model}), 1.0f);
    bprof = layer.profile_backward(1, 3);
  }
  const double backward_ms = bprof.total_ms;
  CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
  CSATTN_CUDA_CHECK(cudaMemGetInfo(&free_after, &total_mem));
  json j{{"preset", preset}, {"type", layer_kind_name(layer_kind(ratio))}, {"tokens", tokens},
         {"forward_ms", prof.total_ms}, {"tokens_per_s", tokens / (prof.total_ms * 1e-3)},
         {"workspace_bytes", prof.workspace_bytes}};
  j["device_bytes"] = layer.device_bytes();
  j["measured_peak_bytes"] = free_before > free_after ? free_before - free_after : 0;
  {  // the host plan (csattn memory) for the same step: device_bytes must equal it
    const DeviceMemoryPlan plan = plan_device_memory(cfg, tokens, 1, tokens, deterministic);
    j["planned_bytes"] = backward ? plan.training_step() : plan.forward_only();
  }
  if (backward) {
    j["backward_ms"] = backward_ms;
    j["train_step_tokens_per_s"] = tokens / ((prof.total_ms + backward_ms) * 1e-3);
  }
  for (const StageTime& s : prof.stages) j["stages_ms"][s.name] = s.ms;
  for (const StageTime& s : bprof.stages) j["backward_stages_ms"][s.name] = s.ms;
  if (ratio == 4) {
    // Indexer FLOPs = 2 * H_I * D_I per causally valid (query, compressed key) pair.
    double pairs = 0.0;
    for (int t = 0; t < tokens; ++t) pairs += std::min((t + 1) / 4, tokens / 4);
    const double ms = j["stages_ms"]["indexer top-k"].get<double>();
    j["indexer_pairs"] = pairs;
    j["indexer_tflops"] = 2.0 * cfg.index_n_heads * cfg.index_head_dim * pairs / (ms * 1e-3) / 1e12;
  }
  return j;
}

// The sparse attention figures as an SVG bar chart against the GEMM ceiling of the run.
void write_svg(const json& report, const std::string& path) {
  const double gemm = report["ceilings"]["gemm_bf16_tflops"].get<double>();
  const int width = 720, bar_h = 26, left = 150;
  const auto& cases = report["sparse_attention"];
  const int height = 60 + bar_h * static_cast<int>(cases.size());
  const double scale = (width - left - 80) / std::max(gemm, 1.0);
  std::ofstream o(path);
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<text x=\"10\" y=\"20\" font-size=\"14\">csattn sparse attention forward, "
    << report["device"].get<std::string>() << " (bf16 GEMM ceiling " << static_cast<int>(gemm)
    << " TFLOPS)</text>\n";
  int i = 0;
  for (const auto& c : cases) {
    const double tf = c["tflops"].get<double>();
    const int y = 40 + i++ * bar_h;
    char label[64], value[64];
    std::snprintf(label, sizeof label, "H%d k%d %dK", c["heads"].get<int>(), c["topk"].get<int>(),
                  c["keys"].get<int>() / 1024);
    std::snprintf(value, sizeof value, "%.1f TFLOPS (%.1f%%)", tf, 100.0 * tf / gemm);
    o << "<text x=\"10\" y=\"" << y + 16 << "\">" << label << "</text>\n";
    o << "<rect x=\"" << left << "\" y=\"" << y + 4 << "\" width=\"" << tf * scale
      << "\" height=\"" << bar_h - 8 << "\" fill=\"#4878cf\"/>\n";
    o << "<text x=\"" << left + tf * scale + 6 << "\" y=\"" << y + 16 << "\">" << value << "</text>\n";
  }
  const double gx = left + gemm * scale;
  o << "<line x1=\"" << gx << "\" y1=\"30\" x2=\"" << gx << "\" y2=\"" << height - 10
    << "\" stroke=\"#c44\" stroke-dasharray=\"4,3\"/>\n</svg>\n";
}

}  // namespace

namespace csattn::bench {

int run_cuda_bench(const std::string& out_path, const std::string& svg_path,
                   const std::vector<std::string>& chosen) {
  // Each table row reaches a pipe (`| tee`) as soon as it is measured: a run killed by a
  // device script's timeout keeps the rows it finished (stdout is block-buffered there).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // The sections to run: `chosen`, else CSATTN_BENCH_SECTIONS (comma list), else all.
  std::string sections;
  for (const std::string& c : chosen) sections += "," + c;
  if (!sections.empty()) {
    sections += ",";
  } else if (const char* sections_env = std::getenv("CSATTN_BENCH_SECTIONS")) {
    sections = "," + std::string(sections_env) + ",";
  }
  auto want = [&](const char* name) {
    return sections.empty() || sections.find("," + std::string(name) + ",") != std::string::npos;
  };
  try {
    std::string why;
    if (!device_available(&why)) {
      std::fprintf(stderr, "cuda_bench: %s\n", why.c_str());
      return 2;
    }
    cudaDeviceProp prop;
    CSATTN_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    json report;
    report["device"] = prop.name;
    report["sm_count"] = prop.multiProcessorCount;
    std::fprintf(stderr, "cuda_bench: ceilings...\n");
    report["ceilings"] = ceilings();
    const double gemm = report["ceilings"]["gemm_bf16_tflops"];
    std::printf("device %s: bf16 GEMM %.0f TFLOPS, copy %.2f TB/s\n\n", prop.name, gemm,
                report["ceilings"]["copy_tbps"].get<double>());
    if (want("attention")) {
      std::printf("sparse attention (4096 queries, window 128 + top-k random ids, D 512, sink;\n"
                  "key TB/s: the window + top-k rows of every query, 1 KB each, per second)\n");
      std::printf("%6s %6s %7s %10s %9s %8s %8s\n", "heads", "topk", "keys", "ms", "TFLOPS", "of GEMM", "key TB/s");
      for (auto [heads, topk] : {std::pair{64, 512}, std::pair{128, 1024}})
        for (int keys : {8192, 32768, 65536}) {
          std::fprintf(stderr, "cuda_bench: sparse attention H %d top-k %d keys %d\n", heads, topk, keys);
          json j = sparse_attention_case(heads, topk, keys, 4096, gemm);
          std::printf("%6d %6d %7d %10.3f %9.1f %8.3f %8.2f\n", heads, topk, keys, j["ms"].get<double>(),
                      j["tflops"].get<double>(), j["fraction_of_gemm"].get<double>(), j["key_tbps"].get<double>());
          report["sparse_attention"].push_back(j);
        }
      // Where the time goes inside the wgmma kernel (clock() stamps of one launch).
      report["attention_forward_phases"] = attention_forward_phases();
    }
    if (want("attention_backward")) {
      std::printf("\nsparse attention backward (same shapes; FLOPs = 2*H*keys*(3*512 + 2*512) per query)\n");
      std::printf("%6s %6s %7s %10s %9s %8s  %s\n", "heads", "topk", "keys", "ms", "TFLOPS", "of GEMM", "kernel");
      for (auto [heads, topk] : {std::pair{64, 512}, std::pair{128, 1024}})
        for (int keys : {8192, 32768, 65536}) {
          std::string kernel;  // the real run's, first; the measurement modes need the wgmma kernel
          for (KeyGradWrites writes : {KeyGradWrites::all, KeyGradWrites::none, KeyGradWrites::even_head_blocks}) {
            if (writes != KeyGradWrites::all && kernel != "wgmma") continue;
            if (writes == KeyGradWrites::even_head_blocks && heads < 128) continue;  // one head block
            std::fprintf(stderr, "cuda_bench: sparse attention backward H %d top-k %d keys %d%s\n",
                         heads, topk, keys, key_grad_writes_label(writes));
            json j = sparse_attention_backward_case(heads, topk, keys, 4096, gemm, writes);
            if (writes == KeyGradWrites::all) kernel = j["kernel"].get<std::string>();
            std::printf("%6d %6d %7d %10.3f %9.1f %8.3f  %s\n", heads, topk, keys, j["ms"].get<double>(),
                        j["tflops"].get<double>(), j["fraction_of_gemm"].get<double>(),
                        j["kernel"].get<std::string>().c_str());
            report["sparse_attention_backward"].push_back(j);
          }
        }
      // A model of one key-range pass (measured out: perf.md, twenty-seventh session): a
      // 32K-key Pro backward split into 4 ranges of 8K compressed keys gives each query ~256 of
      // its 1024 top-k ids a pass, with every dK line of the range resident in L2. Timed here
      // as its own shape (top-k 256 into 8K keys; the window in every pass, where the real
      // passes would take it once): if it runs near the 8K row's rate, the passes would lift
      // 32K / 64K towards it, less their extra Q / dO reads and dQ sums.
      {
        std::fprintf(stderr, "cuda_bench: sparse attention backward pass model\n");
        json j = sparse_attention_backward_case(128, 256, 8192, 4096, gemm, KeyGradWrites::all);
        j["model"] = "one of 4 key-range passes of a 32K-key Pro backward";
        std::printf("%6d %6d %7d %10.3f %9.1f %8.3f  %s (a key-range pass model)\n", 128, 256, 8192,
                    j["ms"].get<double>(), j["tflops"].get<double>(), j["fraction_of_gemm"].get<double>(),
                    j["kernel"].get<std::string>().c_str());
        report["attention_backward_pass_model"] = j;
      }
      // (A persisting L2 window over the compressed rows' dK was measured here: +0.3% at 32K
      // keys, -39% at 64K; perf.md, twenty-ninth session.)
      // Where the time goes inside the wgmma kernel (clock() stamps of one launch).
      if (!report["sparse_attention_backward"].empty() &&
          report["sparse_attention_backward"].front()["kernel"] == "wgmma")
        report["attention_backward_phases"] = attention_backward_phases();
    }
    if (want("reductions")) {
      // What adding dK tiles into the key-gradient rows can reach (the attention backward's
      // largest cost), by path; rows 16K = 32 MB (a 64K-key CSA layer's compressed rows, in
      // L2) and 256K = 512 MB (DRAM).
      std::printf("\nreductions of 64-row x 512-fp32 tiles into random gradient rows (TB/s of fp32 added)\n");
      std::printf("%-66s %8s %8s %9s\n", "path", "rows", "ms", "TB/s");
      for (int rows : {16384, 262144})
        for (ReductionPath path : {ReductionPath::red_flush_layout, ReductionPath::red_row_major,
                                   ReductionPath::red_half_lines, ReductionPath::bulk_shared,
                                   ReductionPath::store_flush_layout}) {
          std::fprintf(stderr, "cuda_bench: reductions %s rows %d\n", reduction_path_name(path), rows);
          // A path whose sum check fails is reported and the section goes on (a measurement,
          // not an operator: the other paths and sections still mean something).
          try {
            json j = reduction_case(path, 32768, rows);
            std::printf("%-66s %8d %8.3f %9.2f\n", reduction_path_name(path), rows, j["ms"].get<double>(),
                        j["tbps"].get<double>());
            report["reductions"].push_back(j);
          } catch (const Error& e) {
            std::printf("%-66s %8d   FAILED: %s\n", reduction_path_name(path), rows, e.what());
            report["reductions"].push_back(json{{"path", reduction_path_name(path)}, {"rows", rows}, {"error", e.what()}});
            if (cudaGetLastError() != cudaSuccess) throw;  // a sticky device error ends the run
          }
        }
      // Does a fixed set of rows stay in L2 under random reductions into more rows than L2
      // holds (the attention backward's dK rows at 32K / 64K keys: 64 / 128 MB)? The row-major
      // reductions with the rows of half the L2 at evict_last, without and then with a
      // persisting L2 set-aside of their size (a device-wide limit: set around the case, then
      // restored). If they stay, their share of the reductions hits L2 and the rate rises over
      // the plain case's; an evict_last hint on the attention backward's own reductions
      // gained nothing without a set-aside (perf.md, eighteenth session).
      {
        int device = 0, l2_bytes = 0, max_set_aside = 0;
        CSATTN_CUDA_CHECK(cudaGetDevice(&device));
        CSATTN_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
        CSATTN_CUDA_CHECK(cudaDeviceGetAttribute(&max_set_aside, cudaDevAttrMaxPersistingL2CacheSize, device));
        const int keep_rows = l2_bytes / 2 / (512 * 4);
        std::printf("\nL2 residency under random reductions (4 rows x 128 B a warp instruction; kept: the first %d "
                    "rows, %.1f MB, at evict_last)\n",
                    keep_rows, keep_rows * 2048.0 / 1e6);
        std::printf("%8s %-34s %8s %9s\n", "rows", "case", "ms", "TB/s");
        for (int rows : {32768, 65536}) {
          for (int variant = 0; variant < 3; ++variant) {
            const char* label = variant == 0 ? "plain" : variant == 1 ? "kept, hint only" : "kept, hint + set-aside";
            std::size_t set_aside = 0;
            std::optional<PersistingL2SetAside> kept_in_l2;  // undone at the end of the case
            if (variant == 2) {
              set_aside = std::min<std::size_t>(static_cast<std::size_t>(keep_rows) * 2048, max_set_aside);
              kept_in_l2.emplace(set_aside);
              if (kept_in_l2->status != cudaSuccess) {
                std::printf("%8d %-34s   set-aside refused: %s\n", rows, label, cudaGetErrorString(kept_in_l2->status));
                continue;
              }
            }
            json j = reduction_case(variant == 0 ? ReductionPath::red_row_major : ReductionPath::red_row_major_kept,
                                    32768, rows, variant == 0 ? 0 : keep_rows);
            kept_in_l2.reset();
            j["case"] = label;
            j["set_aside_bytes"] = set_aside;
            std::printf("%8d %-34s %8.3f %9.2f\n", rows, label, j["ms"].get<double>(), j["tbps"].get<double>());
            report["l2_residency"].push_back(j);
          }
        }
      }
    }
    if (want("gathers")) {
      // The forward's memory roofline: its key gathers (and Q / O streams) alone.
      const double copy = report["ceilings"]["copy_tbps"].get<double>();
      std::printf("\nkey-row gathers alone, the attention forward's pattern (cp.async, 16 B; gathered TB/s over the\n"
                  "rows moved; roofline: the forward's FLOPs of the same queries over this time - its TFLOPS\n"
                  "bound. rows: each 64-head block gathers all its query's rows, or (shared) half of them, what\n"
                  "a cluster of a query's two head blocks forwarding the other half between them would fetch, or\n"
                  "(top-k) its top-k rows alone, the window rows skipped: what window reuse could at most buy.\n"
                  "copy: 16-byte cp.async as the forward, or eight 128-byte TMA boxes a row - the issue rate a\n"
                  "TMA-multicast cluster forward would live on; last, as a fault there would end the run)\n");
      std::printf("%6s %6s %7s %7s %8s %9s %9s %8s %9s  %s\n", "heads", "topk", "keys", "rows", "Q / O", "ms",
                  "gathered", "of copy", "roofline", "copy");
      struct GatherShape {
        int heads, topk;
        GatherRows rows;
        GatherCopy copy;
      };
      constexpr GatherCopy kCpAsync = GatherCopy::cp_async, kTma = GatherCopy::tma_boxes;
      for (GatherShape g : {GatherShape{64, 512, GatherRows::all, kCpAsync},
                            GatherShape{128, 1024, GatherRows::all, kCpAsync},
                            GatherShape{128, 1024, GatherRows::shared, kCpAsync},
                            GatherShape{64, 512, GatherRows::topk_only, kCpAsync},
                            GatherShape{64, 512, GatherRows::all, kTma}, GatherShape{128, 1024, GatherRows::all, kTma}})
        for (int keys : {8192, 32768, 65536}) {
          const char* how = gather_copy_name(g.copy);
          std::fprintf(stderr, "cuda_bench: gathers H %d top-k %d keys %d, rows %s, %s\n", g.heads, g.topk, keys,
                       gather_rows_name(g.rows), how);
          try {
            for (const json& j : gather_cases(g.heads / 64, g.topk, keys, copy, g.rows, g.copy)) {
              std::printf("%6d %6d %7d %7s %8s %9.3f %9.2f %8.3f %9.1f  %s\n", g.heads, g.topk, keys,
                          gather_rows_name(g.rows), j["streams"].get<bool>() ? "yes" : "no",
                          j["ms"].get<double>(), j["gathered_tbps"].get<double>(),
                          j["fraction_of_copy"].get<double>(), j["roofline_tflops"].get<double>(), how);
              report["gathers"].push_back(j);
            }
          } catch (const Error& e) {
            std::printf("%6d %6d %7d   FAILED: %s\n", g.heads, g.topk, keys, e.what());
            report["gathers"].push_back(
                json{{"heads", g.heads}, {"keys", keys}, {"rows", gather_rows_name(g.rows)}, {"copy", how},
                     {"error", e.what()}});
            if (cudaGetLastError() != cudaSuccess) throw;  // a sticky device error ends the run
          }
        }
    }
    if (want("layer")) {
      std::printf("\nlayer forward + backward (flash shape, one sequence)\n");
      std::printf("%5s %7s %10s %10s %12s %9s %9s  forward stages (ms)\n", "type", "tokens", "fwd ms",
                  "bwd ms", "tokens/s", "peak GiB", "plan GiB");
      // CSATTN_BENCH_LAYER_TOKENS (comma list) picks the sequence lengths.
      const std::vector<int> token_list =
          int_list_from_env("CSATTN_BENCH_LAYER_TOKENS", {4096, 16384, 65536}, "token counts");
      for (int tokens : token_list)
        for (int ratio : {0, 4, 128}) {
          std::fprintf(stderr, "cuda_bench: layer ratio %d tokens %d\n", ratio, tokens);
          json j = layer_case("flash", ratio, tokens, true);
          // Each stage's time and its share of the pass, largest first.
          auto stage_list = [](const json& stages_ms) {
            std::vector<std::pair<double, std::string>> v;
            double total = 0.0;
            for (auto& [k, ms] : stages_ms.items()) {
              v.emplace_back(ms.get<double>(), k);
              total += ms.get<double>();
            }
            std::sort(v.rbegin(), v.rend());
            std::string out;
            char buf[160];
            for (const auto& [ms, k] : v) {
              std::snprintf(buf, sizeof buf, "%s %.3f (%.0f%%); ", k.c_str(), ms, total > 0 ? 100.0 * ms / total : 0.0);
              out += buf;
            }
            return out;
          };
          const std::string stages = stage_list(j["stages_ms"]);
          std::printf("%5s %7d %10.2f %10.2f %12.0f %9.2f %9.2f  %s\n", j["type"].get<std::string>().c_str(),
                      tokens, j["forward_ms"].get<double>(), j["backward_ms"].get<double>(),
                      j["train_step_tokens_per_s"].get<double>(),
                      j["measured_peak_bytes"].get<double>() / (1u << 30),
                      j["planned_bytes"].get<double>() / (1u << 30), stages.c_str());
          const std::string bstages = stage_list(j["backward_stages_ms"]);
          std::printf("%5s %7s %10s %10s %12s %9s %9s  backward stages (ms): %s\n", "", "", "", "", "", "", "",
                      bstages.c_str());
          report["layer_forward"].push_back(j);
        }
    }
    if (want("deterministic")) {
      // What the fixed-order key-gradient sums cost: the same backward in both modes.
      std::printf("\nbackward, fast (atomic) vs deterministic mode (flash shape, one sequence)\n");
      std::printf("%5s %7s %12s %12s %8s %10s\n", "type", "tokens", "fast ms", "determ. ms", "ratio", "peak GiB");
      // HCA at 128K: long segments' rows see many compressed entries (the key-stationary
      // pass's scale). CSATTN_BENCH_DET_TOKENS / CSATTN_BENCH_DET_RATIOS (comma lists) pick
      // the cases instead: every listed ratio at every listed token count.
      std::vector<std::pair<int, int>> det_cases{{4096, 0},  {4096, 4},  {4096, 128},   {16384, 0},
                                                 {16384, 4}, {16384, 128}, {131072, 128}};
      if (std::getenv("CSATTN_BENCH_DET_TOKENS") || std::getenv("CSATTN_BENCH_DET_RATIOS")) {
        det_cases.clear();
        for (int tokens : int_list_from_env("CSATTN_BENCH_DET_TOKENS", {4096, 16384}, "token counts"))
          for (int ratio : int_list_from_env("CSATTN_BENCH_DET_RATIOS", {0, 4, 128}, "layer ratios (0, 4, 128)", 0)) {
            // (Checked here, not minutes later in the case itself.)
            require(ratio == 0 || ratio == 4 || ratio == 128, ErrorKind::InvalidArgument,
                    "CSATTN_BENCH_DET_RATIOS: the layer ratios are 0, 4 and 128, not " + std::to_string(ratio));
            det_cases.emplace_back(tokens, ratio);
          }
      }
      for (auto [tokens, ratio] : det_cases) {
        std::fprintf(stderr, "cuda_bench: deterministic backward ratio %d tokens %d\n", ratio, tokens);
        json fast = layer_case("flash", ratio, tokens, true, false);
        json det = layer_case("flash", ratio, tokens, true, true);
        const double f = fast["backward_ms"].get<double>(), dt = det["backward_ms"].get<double>();
        std::printf("%5s %7d %12.2f %12.2f %8.2f %10.2f", fast["type"].get<std::string>().c_str(), tokens, f, dt,
                    dt / f, det["measured_peak_bytes"].get<double>() / (1u << 30));
        // The attention stage in both modes (and HCA's key-stationary compressed rows).
        const json& fs = fast["backward_stages_ms"];
        const json& ds = det["backward_stages_ms"];
        if (fs.contains("attention") && ds.contains("attention"))
          std::printf("  attention %.2f -> %.2f", fs["attention"].get<double>(), ds["attention"].get<double>());
        if (ds.contains("attention keyed rows"))
          std::printf(" + keyed rows %.2f", ds["attention keyed rows"].get<double>());
        std::printf("\n");
        report["deterministic_backward"].push_back(
            json{{"type", fast["type"]}, {"tokens", tokens}, {"fast_ms", f}, {"deterministic_ms", dt},
                 {"deterministic_stages_ms", det["backward_stages_ms"]},
                 {"deterministic_peak_bytes", det["measured_peak_bytes"]}});
      }
    }
    if (want("indexer")) {
      std::printf("\nindexer + top-k (flash CSA layer, one sequence; FLOPs = 2*64*128 per valid pair)\n");
      std::printf("%7s %12s %10s %9s\n", "tokens", "pairs", "ms", "TFLOPS");
      for (int tokens : {32768, 65536, 131072}) {
        std::fprintf(stderr, "cuda_bench: indexer at %d tokens\n", tokens);
        json j = layer_case("flash", 4, tokens);
        std::printf("%7d %12.0f %10.3f %9.1f\n", tokens, j["indexer_pairs"].get<double>(),
                    j["stages_ms"]["indexer top-k"].get<double>(), j["indexer_tflops"].get<double>());
        report["indexer"].push_back(j);
      }
      // Where the time goes inside the wgmma indexer (clock() stamps of one launch).
      report["indexer_phases"] = indexer_phases();
    }
    if (want("elementwise")) {
      std::fprintf(stderr, "cuda_bench: elementwise kernels\n");
      report["elementwise"] = elementwise_benchmarks(report["ceilings"]["copy_tbps"].get<double>());
    }
    if (want("indexer_loss")) {
      std::printf("\nindexer loss + gradients (CSA, one sequence; FLOPs = 2*H*512 + 3*2*64*128 per pair: "
                  "114,688 at H 64, 180,224 at H 128)\n");
      std::printf("(ms: the gradient launch; value ms: the value launch alone, the forward's; "
                  "tensor_core_kept: the layer's path, the gradient launch reusing the value launch's teacher;\n"
                  " teacher ms: the kept value launch's wgmma teacher alone, the rest of value ms is the rows "
                  "kernel's predictor pass)\n");
      std::printf("%6s %7s %7s %17s %12s %10s %9s %9s %11s\n", "preset", "tokens", "loss", "kernel", "pairs", "ms",
                  "TFLOPS", "value ms", "teacher ms");
      constexpr auto base = IndexerLossKernel::baseline;
      constexpr auto tc = IndexerLossKernel::tensor_core;
      for (auto [preset, tokens, sparse, kernel, kept] :
           {std::tuple{"flash", 4096, true, base, false}, std::tuple{"flash", 4096, true, tc, false},
            std::tuple{"flash", 4096, true, tc, true}, std::tuple{"flash", 16384, true, tc, false},
            std::tuple{"flash", 16384, true, tc, true}, std::tuple{"flash", 4096, false, tc, false},
            std::tuple{"pro", 4096, true, base, false}, std::tuple{"pro", 4096, true, tc, false},
            std::tuple{"pro", 4096, true, tc, true}, std::tuple{"pro", 4096, false, tc, false}}) {
        std::fprintf(stderr, "cuda_bench: indexer loss %s at %d tokens\n", preset, tokens);
        json j = indexer_loss_case(tokens, sparse, kernel, gemm, preset, kept);
        const double teacher_ms = j["teacher_ms"].get<double>();
        char teacher[16] = "-";
        if (teacher_ms >= 0.0) std::snprintf(teacher, sizeof(teacher), "%.3f", teacher_ms);
        std::printf("%6s %7d %7s %17s %12.0f %10.3f %9.1f %9.3f %11s\n", preset, tokens, j["loss"].get<std::string>().c_str(),
                    j["kernel"].get<std::string>().c_str(), j["pairs"].get<double>(), j["ms"].get<double>(),
                    j["tflops"].get<double>(), j["value_ms"].get<double>(), teacher);
        report["indexer_loss"].push_back(j);
      }
    }
    if (want("cp")) report["context_parallel"] = cp_benchmarks();
    if (!out_path.empty()) std::ofstream(out_path) << report.dump(2) << "\n";
    if (!svg_path.empty() && report.contains("sparse_attention")) write_svg(report, svg_path);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_bench: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace csattn::bench
