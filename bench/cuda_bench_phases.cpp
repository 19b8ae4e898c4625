// Where the wgmma kernels' time goes: one launch each with clock() stamps at the phase
// boundaries (AttentionForwardStamps in kernels.hpp, AttentionBackwardStamps in
// backward_kernels.hpp, IndexerStamps in indexer_topk_tiled.hpp), after a warm-up launch:
// the attention kernels at 32K keys and 4096 queries, the indexer on one 32K-token
// sequence. Stamps of one multiprocessor share its clock; differences are taken modulo 2^32.
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "csattn/config.hpp"
#include "cuda/backward_kernels.hpp"
#include "cuda/device_arena.hpp"
#include "cuda/indexer_topk_plan.hpp"
#include "cuda/indexer_topk_tiled.hpp"
#include "cuda/kernels.hpp"
#include "cuda/timing.hpp"
#include "cuda/workspace.hpp"
#include "cuda_bench.hpp"
#include "one_sequence_metadata.hpp"
#include "sparse_attention_inputs.hpp"

namespace csattn::bench {

namespace {

using json = nlohmann::json;
using cuda::AttentionBackwardStamps;
using cuda::AttentionForwardStamps;
using cuda::IndexerStamps;

// Copies the stamps of one launch to the host (zeroed before it: 0 = not reached).
template <class Launch>
std::vector<unsigned> stamps_of(long count, Launch&& launch) {
  cuda::DeviceArena buf;  // freed on every path, a failed launch included
  auto* dev = reinterpret_cast<unsigned*>(buf.reserve(sizeof(unsigned) * count));
  CSATTN_CUDA_CHECK(cudaMemset(dev, 0, sizeof(unsigned) * count));
  launch(dev);
  CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<unsigned> h(static_cast<std::size_t>(count));
  CSATTN_CUDA_CHECK(cudaMemcpy(h.data(), dev, sizeof(unsigned) * h.size(), cudaMemcpyDeviceToHost));
  return h;
}

// Stamp row `r` of warpgroup `wg` of CTA `cta` in the layouts the three kernels share:
// stamps[((cta * groups + wg) * (rows + 1) + r) * phases + p], row `rows` the extra row (item,
// block or CTA).
const unsigned* stamp_row(const std::vector<unsigned>& h, int groups, int rows, int phases, int cta, int wg,
                          int r) {
  return h.data() + ((static_cast<long>(cta) * groups + wg) * (rows + 1) + r) * phases;
}

// One warpgroup's stamps averaged over the CTAs whose extra row is complete (its `extra`
// stamps all written): per row (key tile or pair) the time from stamp p - 1 to p for
// p = 1 .. last, over the rows up to the first whose stamp `last` is 0; per CTA the extra
// row's steps.
struct PhaseMeans {
  std::vector<double> step;   // [last], cycles per row
  double row_span = 0.0;      // cycles per row, stamp last - stamp 0
  std::vector<double> extra;  // [extra - 1], cycles per CTA
  long rows = 0, ctas = 0;
};

PhaseMeans phase_means(const std::vector<unsigned>& h, int ctas, int groups, int wg, int rows, int phases,
                       int last, int extra) {
  PhaseMeans m;
  m.step.assign(static_cast<std::size_t>(last), 0.0);
  m.extra.assign(static_cast<std::size_t>(extra - 1), 0.0);
  for (int cta = 0; cta < ctas; ++cta) {
    const unsigned* x = stamp_row(h, groups, rows, phases, cta, wg, rows);
    bool complete = true;
    for (int p = 0; p < extra; ++p) complete = complete && x[p] != 0u;
    if (!complete) continue;  // no stamped item / block here
    ++m.ctas;
    for (int p = 1; p < extra; ++p) m.extra[p - 1] += static_cast<double>(x[p] - x[p - 1]);  // modulo 2^32
    for (int r = 0; r < rows; ++r) {
      const unsigned* s = stamp_row(h, groups, rows, phases, cta, wg, r);
      if (s[last] == 0u) break;  // fewer rows
      for (int p = 1; p <= last; ++p) m.step[p - 1] += static_cast<double>(s[p] - s[p - 1]);
      m.row_span += static_cast<double>(s[last] - s[0]);
      ++m.rows;
    }
  }
  for (double& v : m.step) v = m.rows > 0 ? v / m.rows : 0.0;
  m.row_span = m.rows > 0 ? m.row_span / m.rows : 0.0;
  for (double& v : m.extra) v = m.ctas > 0 ? v / m.ctas : 0.0;
  return m;
}

// The forward's phase names per warpgroup (producer, consumer 0, consumer 1): phase p is the
// time from stamp p - 1 to stamp p (kernels.hpp); "b0.lo" is key buffer 0's dims 0-255, a "+"
// phase includes the gather issued before the wait.
constexpr const char* kForwardPhases[3][7] = {
    {"free b0.lo", "+free b0.hi", "+free b1.hi", "+free b1.lo", "last gather", nullptr, nullptr},
    {"softmax 0 + P0", "P0 V0", "wait m1/P1", "rescale", "b0.lo", "P1V1 + b0.hi", "next S0"},
    {"ready b1.hi", "ready b1.lo", "S1", "wait m0/P0", "P0V0 + softmax 1", "P0V0 + rescale", "P1 V1"}};
constexpr int kForwardLastStamp[3] = {5, 7, 7};  // each warpgroup's final stamp of a pair

// The forward's phases (cycles per key-tile pair, per warpgroup) over the stamped item of
// each CTA. Also the hand-over consumer 1 waits for m_0 and P_0 (consumer 0's stamp 1 minus
// consumer 1's stamp 3, same pair, same multiprocessor), the consumers' Q wait and tail per item.
json attention_forward_phases_case(int heads, int topk, int keys, int queries) {
  using Stamps = AttentionForwardStamps;
  const SparseAttentionInputs in(heads, topk, keys, queries, false);
  in.forward();
  const std::vector<unsigned> h = stamps_of(Stamps::count(), [&](unsigned* dev) {
    cuda::launch_sparse_attention_wgmma(in.d, in.m, in.q, in.kv, in.comp, in.sink, in.topk_dev,
                                        in.out, in.lse, nullptr, dev);
  });
  json j{{"heads", heads}, {"topk", topk}, {"keys", keys}, {"queries", queries},
         {"item", Stamps::item}, {"tensor_floor_cycles_per_pair", 2.0 * 2 * 2 * 64 * 64 * 512 / 4096.0}};
  // The kernel timed with stamps off and on alike (the attention section's median of 5 after
  // 2 warm-ups): the gap is what writing the stamps costs, i.e. how far the stamps speak for
  // an unstamped run. (The twentieth session's compile-time-plain instance of the early-P_0
  // kernel ran slower than its stamped one; the kernel now has one instance.)
  {
    cuda::DeviceArena buf;
    auto* dev = reinterpret_cast<unsigned*>(buf.reserve(sizeof(unsigned) * Stamps::count()));
    auto launch = [&](unsigned* stamps) {
      cuda::launch_sparse_attention_wgmma(in.d, in.m, in.q, in.kv, in.comp, in.sink, in.topk_dev,
                                          in.out, in.lse, nullptr, stamps);
    };
    j["timed_ms"]["stamps_off"] = cuda::median_event_ms([&] { launch(nullptr); }, nullptr, 2, 5);
    j["timed_ms"]["stamps_on"] = cuda::median_event_ms([&] { launch(dev); }, nullptr, 2, 5);
  }
  static const char* const item_names[3] = {"to first pair", "pairs", "tail"};
  for (int wg = 0; wg < 3; ++wg) {
    const PhaseMeans pm = phase_means(h, Stamps::ctas, 3, wg, Stamps::pairs, Stamps::phases, kForwardLastStamp[wg], 4);
    json w;
    for (int p = 0; p < kForwardLastStamp[wg]; ++p) w["cycles_per_pair"][kForwardPhases[wg][p]] = pm.step[p];
    w["pair_cycles"] = pm.row_span;
    w["pairs"] = pm.rows;
    w["items"] = pm.ctas;
    for (int p = 0; p < 3; ++p) w["item_cycles"][item_names[p]] = pm.extra[p];
    j[wg == 0 ? "producer" : wg == 1 ? "consumer0" : "consumer1"] = w;
  }
  // Consumer 1's wait for m_0 and P_0 alone: consumer 0's stamp 1 (both published) past
  // consumer 1's stamp 3 (its S_1 done), same pair, same multiprocessor's clock.
  double p0_wait = 0.0;
  long p0_pairs = 0;
  for (int cta = 0; cta < Stamps::ctas; ++cta)
    for (int pair = 0; pair < Stamps::pairs; ++pair) {
      const unsigned* c0 = stamp_row(h, 3, Stamps::pairs, Stamps::phases, cta, 1, pair);
      const unsigned* c1 = stamp_row(h, 3, Stamps::pairs, Stamps::phases, cta, 2, pair);
      if (c0[1] == 0u || c1[7] == 0u) break;
      const int d = static_cast<int>(c0[1] - c1[3]);  // signed: consumer 0 may be early
      p0_wait += d > 0 ? d : 0;
      ++p0_pairs;
    }
  j["consumer1"]["p0_wait_cycles_per_pair"] = p0_pairs > 0 ? p0_wait / p0_pairs : 0.0;
  return j;
}

void print_forward_phases(const json& j) {
  std::printf("H%d top-k %d, %d keys: %.1f pairs an item (stamped item %d of CTAs 0-%d); tensor floor %.0f cycles a pair\n",
              j["heads"].get<int>(), j["topk"].get<int>(), j["keys"].get<int>(),
              j["consumer0"]["items"].get<long>() > 0
                  ? j["consumer0"]["pairs"].get<double>() / j["consumer0"]["items"].get<double>()
                  : 0.0,
              j["item"].get<int>(), AttentionForwardStamps::ctas - 1,
              j["tensor_floor_cycles_per_pair"].get<double>());
  std::printf("  timed: stamps off %.3f ms, stamps on %.3f ms\n", j["timed_ms"]["stamps_off"].get<double>(),
              j["timed_ms"]["stamps_on"].get<double>());
  static const char* const wgs[3] = {"producer", "consumer0", "consumer1"};
  for (int k = 0; k < 3; ++k) {
    const json& w = j[wgs[k]];
    std::printf("  %-10s", wgs[k]);
    for (int p = 0; p < kForwardLastStamp[k]; ++p)
      std::printf(" | %s %.0f", kForwardPhases[k][p], w["cycles_per_pair"][kForwardPhases[k][p]].get<double>());
    std::printf(" | pair %.0f\n", w["pair_cycles"].get<double>());
    std::printf("  %-10s   item: to first pair %.0f, pairs %.0f, tail %.0f", "",
                w["item_cycles"]["to first pair"].get<double>(), w["item_cycles"]["pairs"].get<double>(),
                w["item_cycles"]["tail"].get<double>());
    if (w.contains("p0_wait_cycles_per_pair"))
      std::printf("; P0 hand-over wait alone %.0f a pair", w["p0_wait_cycles_per_pair"].get<double>());
    std::printf("\n");
  }
}

// Where the wgmma backward's time goes: one launch with clock() stamps at its phase
// boundaries (AttentionBackwardStamps), after a warm-up launch; per warpgroup the mean cycles
// per key tile of each phase over the first wave's CTAs, and the prologue (key list, Q / dO,
// D_row) and epilogue (dQ store) per CTA.
json attention_backward_phases_case(int heads, int topk, int keys, int queries) {
  using Stamps = AttentionBackwardStamps;
  const SparseAttentionInputs in(heads, topk, keys, queries, true);
  in.forward();
  in.backward();
  auto launch = [&](unsigned* stamps) {
    cuda::launch_attention_backward_wgmma(in.d, in.m, in.q, in.kv, in.comp, in.sink, in.topk_dev,
                                          in.out, in.lse, in.dout, in.dq, in.dkv, in.dcomp, in.dsink,
                                          nullptr, cuda::GradChunk{}, cuda::KeyGradWrites::all, stamps);
  };
  const std::vector<unsigned> h = stamps_of(Stamps::count(), launch);
  static const char* const names[] = {"ready wait", "S / dP",  "hand-over",           "dQ",
                                      "dK chunk 0", "flush 0", "dK chunk 1 + flush 1"};
  json j{{"heads", heads}, {"topk", topk}, {"keys", keys}, {"queries", queries}};
  // Timed with stamps off and on alike (the attention_backward section's median of 5 after a
  // warm-up). Unlike the forward, the backward still has a compile-time stamped instance
  // (kStamps): the forward's ran faster than its plain twin (perf.md, twenty-first session),
  // and these two times say whether the backward's does too.
  {
    cuda::DeviceArena buf;
    auto* dev = reinterpret_cast<unsigned*>(buf.reserve(sizeof(unsigned) * Stamps::count()));
    j["timed_ms"]["stamps_off"] = cuda::median_event_ms([&] { launch(nullptr); }, nullptr, 1, 5);
    j["timed_ms"]["stamps_on"] = cuda::median_event_ms([&] { launch(dev); }, nullptr, 1, 5);
  }
  for (int wg = 0; wg < 2; ++wg) {
    const PhaseMeans pm = phase_means(h, Stamps::ctas, 2, wg, Stamps::tiles, Stamps::phases, 7, 4);
    json w;
    for (int p = 0; p < 7; ++p) w["cycles_per_tile"][names[p]] = pm.step[p];
    w["tile_cycles"] = pm.row_span;
    w["prologue_cycles"] = pm.extra[0];  // CTA row: 0 entry, 1 loop entry, 2 loop exit, 3 exit
    w["epilogue_cycles"] = pm.extra[2];
    w["ctas"] = pm.ctas;
    w["tiles"] = pm.rows;
    j[wg == 0 ? "wg0" : "wg1"] = w;
  }
  return j;
}

// The overlapped indexer's selecting phases (IndexerOverlapTotals, count .. write).
constexpr const char* kOverlapSelectPhases[5] = {"count", "digit1", "digit2", "threshold", "write"};
static_assert(sizeof(kOverlapSelectPhases) / sizeof(kOverlapSelectPhases[0]) ==
                  cuda::IndexerOverlapTotals::selected - cuda::IndexerOverlapTotals::count,
              "a name for each selecting phase of the totals");

// The wgmma indexers' phases, Flash CSA geometry (64 heads x 128, top-512), one sequence of
// `tokens` rows with random operands. The two-warpgroup kernel: per warpgroup the mean cycles
// of each phase per key tile over the stamped block's first run (its 4 query rows against
// their visible compressed keys), and the block's set-up, scoring and selection. The
// overlapped kernel (the default): per block, where its scoring and selecting sides spend
// their time (IndexerOverlapTotals), means over the CTAs.
json indexer_phases_case(int tokens) {
  using Stamps = IndexerStamps;
  using Totals = cuda::IndexerOverlapTotals;
  AttentionConfig cfg = ModelConfig::preset("flash").base;
  cfg.compress_ratio = 4;
  const int T = tokens, Nc = tokens / 4, HI = cfg.index_n_heads, DI = cfg.index_head_dim;
  cuda::LayerDims d = cuda::make_dims(cfg, T, 1, T);
  d.rows = T;
  cuda::DeviceArena qi, w_eff, keys, topk, scratch, meta_buf;
  qi.reserve(sizeof(bf16) * T * HI * DI);
  w_eff.reserve(sizeof(float) * T * HI);
  keys.reserve(sizeof(bf16) * Nc * DI);
  topk.reserve(sizeof(std::int32_t) * T * d.topk);
  scratch.reserve(cuda::indexer_topk_scratch_bytes(d));
  meta_buf.reserve(one_sequence_metadata_bytes(T));
  fill_random_bf16(static_cast<bf16*>(qi.base), static_cast<std::size_t>(T) * HI * DI, 21);
  fill_random_bf16(static_cast<bf16*>(keys.base), static_cast<std::size_t>(Nc) * DI, 22);
  std::vector<float> wh(static_cast<std::size_t>(T) * HI);
  for (std::size_t i = 0; i < wh.size(); ++i) wh[i] = (i % 7 == 3 ? -0.5f : 1.0f) / 64.0f;
  CSATTN_CUDA_CHECK(cudaMemcpy(w_eff.base, wh.data(), wh.size() * 4, cudaMemcpyHostToDevice));
  const cuda::DeviceMetadata m = upload_one_sequence_metadata(meta_buf.base, T, T, Nc, 0);
  const auto* q_ptr = static_cast<const bf16*>(qi.base);
  const auto* w_ptr = static_cast<const float*>(w_eff.base);
  const auto* k_ptr = static_cast<const bf16*>(keys.base);
  auto* ids = static_cast<std::int32_t*>(topk.base);
  auto launch = [&](unsigned* stamps) {
    cuda::launch_indexer_topk_wgmma(d, m, q_ptr, w_ptr, k_ptr, ids, scratch.base, nullptr, stamps);
  };
  launch(nullptr);  // warm-up
  const std::vector<unsigned> h = stamps_of(Stamps::count(), launch);
  static const char* const names[5] = {"keys ready", "next load", "MMA", "head sums", "store+count"};
  json j{{"tokens", T}, {"block", Stamps::block},
         {"tensor_floor_cycles_per_tile", 2.0 * 64 * 256 * DI / 4096.0}};
  static const char* const block_names[3] = {"to queries ready", "scoring", "selection"};
  for (int wg = 0; wg < 2; ++wg) {
    const PhaseMeans pm = phase_means(h, Stamps::ctas, 2, wg, Stamps::tiles, Stamps::phases, 5, 4);
    json w;
    for (int p = 0; p < 5; ++p) w["cycles_per_tile"][names[p]] = pm.step[p];
    w["tile_cycles"] = pm.row_span;
    w["tiles"] = pm.rows;
    w["blocks"] = pm.ctas;
    for (int p = 0; p < 3; ++p) w["block_cycles"][block_names[p]] = pm.extra[p];
    j[wg == 0 ? "wg0" : "wg1"] = w;
  }

  // The overlapped kernel's totals (a warm-up launch first; zeroed: CTAs past the grid stay 0).
  cuda::DeviceArena totals_buf;
  auto* totals = reinterpret_cast<unsigned long long*>(totals_buf.reserve(sizeof(unsigned long long) * Totals::size()));
  auto launch_overlap = [&](unsigned long long* t) {
    cuda::launch_indexer_topk_wgmma_overlap(d, m, q_ptr, w_ptr, k_ptr, ids, scratch.base, nullptr, {}, t);
  };
  launch_overlap(nullptr);
  CSATTN_CUDA_CHECK(cudaMemset(totals, 0, sizeof(unsigned long long) * Totals::size()));
  launch_overlap(totals);
  CSATTN_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<unsigned long long> t(static_cast<std::size_t>(Totals::size()));
  CSATTN_CUDA_CHECK(cudaMemcpy(t.data(), totals, sizeof(unsigned long long) * t.size(), cudaMemcpyDeviceToHost));
  double blocks = 0, scoring_side[3] = {}, rows[Totals::rows][Totals::row_slots] = {};
  for (int c = 0; c < Totals::ctas; ++c) {
    const unsigned long long* x = t.data() + static_cast<long>(c) * Totals::slots;
    blocks += static_cast<double>(x[Totals::blocks]);
    for (int k = 0; k < 3; ++k) scoring_side[k] += static_cast<double>(x[Totals::free_wait + k]);
    for (int r = 0; r < Totals::rows; ++r)
      for (int k = 0; k < Totals::row_slots; ++k) rows[r][k] += static_cast<double>(x[Totals::row_slot(r, k)]);
  }
  json o{{"blocks", blocks}};
  if (blocks > 0) {  // none on a card of more SMs (the two-warpgroup kernel ran)
    static const char* const side_names[3] = {"ticket + free wait", "setup", "scoring"};
    for (int k = 0; k < 3; ++k) o["scoring_side_cycles_per_block"][side_names[k]] = scoring_side[k] / blocks;
    for (int r = 0; r < Totals::rows; ++r) {
      json w{{"selected_blocks", rows[r][Totals::selected]},
             {"scored_wait_per_block", rows[r][Totals::scored_wait] / blocks}};
      if (rows[r][Totals::selected] > 0)
        for (int k = Totals::count; k < Totals::selected; ++k)
          w["cycles_per_selected_block"][kOverlapSelectPhases[k - Totals::count]] = rows[r][k] / rows[r][Totals::selected];
      o["select_rows"].push_back(w);
    }
  }
  j["overlap"] = o;
  return j;
}

}  // namespace

json indexer_phases() {
  std::printf("\nwgmma indexer phases (one %d-token sequence; cycles per key tile of a warpgroup, mean over "
              "the CTAs' stamped block)\n", 32768);
  std::fprintf(stderr, "cuda_bench: indexer phases\n");
  json j = indexer_phases_case(32768);
  std::printf("tensor floor %.0f cycles a tile (8 x m64n256k16 with the pipe to itself)\n",
              j["tensor_floor_cycles_per_tile"].get<double>());
  for (const char* wg : {"wg0", "wg1"}) {
    const json& w = j[wg];
    std::printf("  %s", wg);
    for (const char* name : {"keys ready", "next load", "MMA", "head sums", "store+count"})
      std::printf(" | %s %.0f", name, w["cycles_per_tile"][name].get<double>());
    std::printf(" | tile %.0f (%ld tiles)\n", w["tile_cycles"].get<double>(), w["tiles"].get<long>());
    std::printf("      block: to queries ready %.0f, scoring %.0f, selection %.0f (%ld blocks)\n",
                w["block_cycles"]["to queries ready"].get<double>(), w["block_cycles"]["scoring"].get<double>(),
                w["block_cycles"]["selection"].get<double>(), w["blocks"].get<long>());
  }
  const json& o = j["overlap"];
  if (o["blocks"].get<double>() > 0) {
    const json& s = o["scoring_side_cycles_per_block"];
    std::printf("overlapped kernel (the default), cycles a block over all %.0f blocks:\n", o["blocks"].get<double>());
    std::printf("  scoring warpgroups | ticket + free wait %.0f | setup %.0f | scoring %.0f\n",
                s["ticket + free wait"].get<double>(), s["setup"].get<double>(), s["scoring"].get<double>());
    for (std::size_t r = 0; r < o["select_rows"].size(); ++r) {
      const json& w = o["select_rows"][r];
      std::printf("  selecting warp %zu   | scored wait %.0f a block", r, w["scored_wait_per_block"].get<double>());
      if (w.contains("cycles_per_selected_block")) {
        std::printf(" | per selected block (%.0f):", w["selected_blocks"].get<double>());
        for (const char* name : kOverlapSelectPhases)
          std::printf(" %s %.0f", name, w["cycles_per_selected_block"][name].get<double>());
      }
      std::printf("\n");
    }
  } else {
    std::printf("overlapped kernel: not run (more multiprocessors than its slots; the two-warpgroup kernel ran)\n");
  }
  return j;
}

json attention_forward_phases() {
  json out = json::array();
  std::printf("\nwgmma attention forward phases, default schedule whatever CSATTN_ATTENTION says "
              "(cycles per key-tile pair, mean over the CTAs' stamped item)\n");
  for (auto [heads, topk] : {std::pair{64, 512}, std::pair{128, 1024}}) {
    std::fprintf(stderr, "cuda_bench: attention forward phases H %d top-k %d\n", heads, topk);
    json j = attention_forward_phases_case(heads, topk, 32768, 4096);
    print_forward_phases(j);
    out.push_back(j);
  }
  return out;
}

json attention_backward_phases() {
  json out = json::array();
  std::printf("\nwgmma attention backward phases (cycles per 64-key tile, mean over the first "
              "wave's CTAs; prologue / epilogue per CTA)\n");
  std::printf("%-14s %3s %7s %7s %9s %7s %7s %7s %9s %7s %8s %8s\n", "shape", "WG", "ready",
              "S/dP", "hand-over", "dQ", "dK 0", "flush 0", "dK1+fl 1", "tile", "prologue",
              "epilogue");
  for (auto [heads, topk] : {std::pair{64, 512}, std::pair{128, 1024}}) {
    std::fprintf(stderr, "cuda_bench: attention backward phases H %d top-k %d\n", heads, topk);
    json j = attention_backward_phases_case(heads, topk, 32768, 4096);
    std::printf("H%-3d top-k %-4d timed: stamps off %.3f ms, stamps on %.3f ms\n", heads, topk,
                j["timed_ms"]["stamps_off"].get<double>(), j["timed_ms"]["stamps_on"].get<double>());
    for (const char* wg : {"wg0", "wg1"}) {
      const json& w = j[wg];
      const json& c = w["cycles_per_tile"];
      std::printf("H%-3d top-k %-4d %3s %7.0f %7.0f %9.0f %7.0f %7.0f %7.0f %9.0f %7.0f %8.0f %8.0f\n",
                  heads, topk, wg, c["ready wait"].get<double>(), c["S / dP"].get<double>(),
                  c["hand-over"].get<double>(), c["dQ"].get<double>(),
                  c["dK chunk 0"].get<double>(), c["flush 0"].get<double>(),
                  c["dK chunk 1 + flush 1"].get<double>(), w["tile_cycles"].get<double>(),
                  w["prologue_cycles"].get<double>(), w["epilogue_cycles"].get<double>());
    }
    out.push_back(j);
  }
  return out;
}

}  // namespace csattn::bench
