// The csattn program, run as a child process (its path is CSATTN_CLI_PATH): exit codes,
// one-line errors, the report, --config, --save, --inputs, --weights, bench.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "csattn/layer.hpp"
#include <nlohmann/json.hpp>

#include "csattn/config.hpp"
#include "csattn/cp.hpp"
#include "csattn/device_memory.hpp"
#include "csattn/layout.hpp"
#include "csattn/safetensors.hpp"
#include "csattn/tensor.hpp"
#include "csattn/weights.hpp"

#ifndef CSATTN_CLI_PATH
#error "CSATTN_CLI_PATH must name the csattn binary"
#endif

namespace csattn {
namespace {

struct CliResult {
  int status = -1;
  std::string out;
  std::string err;
};

// A path in the test temp dir, unique per test and process.
std::string temp_path(const std::string& suffix) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(info->test_suite_name()) + "_" + info->name() + "_" +
                           std::to_string(::getpid()) + "_" + suffix;
  return (std::filesystem::path(::testing::TempDir()) / ("csattn_cli_" + name)).string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Runs `csattn <args>`; stdout and stderr are captured separately.
CliResult run_cli(const std::string& args) {
  const std::string err_path = temp_path("stderr.txt");
  const std::string cmd =
      std::string("'") + CSATTN_CLI_PATH + "' " + args + " 2>'" + err_path + "'";
  CliResult r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed for: " << cmd;
    return r;
  }
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int st = ::pclose(pipe);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = read_file(err_path);
  std::filesystem::remove(err_path);
  return r;
}

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  if (!s.empty() && s.back() != '\n') ++n;
  return n;
}

// Status 2, exactly one line on stderr, "csattn: error:" and the problem in it.
void expect_usage_error(const std::string& args, const std::vector<std::string>& needles) {
  SCOPED_TRACE("csattn " + args);
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.status, 2) << "stdout:\n" << r.out << "stderr:\n" << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << "stderr:\n" << r.err;
  EXPECT_EQ(r.err.rfind("csattn: error: ", 0), 0u) << r.err;
  for (const std::string& needle : needles)
    EXPECT_NE(r.err.find(needle), std::string::npos) << "'" << needle << "' not in: " << r.err;
}

nlohmann::json parse_json(const CliResult& r) {
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "stdout is not JSON (" << e.what() << "):\n" << r.out;
    return nlohmann::json::object();
  }
}

TEST(Cli, RunTinyPrintsEveryLayerType) {
  const CliResult r = run_cli("run --preset tiny --seqlens 5,9,17 --check-rows 4");
  ASSERT_EQ(r.status, 0) << "stdout:\n" << r.out << "stderr:\n" << r.err;
  for (const char* type : {"SWA", "CSA", "HCA"})
    EXPECT_NE(r.out.find(type), std::string::npos) << type << " missing from:\n" << r.out;
  EXPECT_NE(r.out.find("5,9,17"), std::string::npos) << r.out;
}

TEST(Cli, RunJsonReportMatchesTheOracleInFp32) {
  const CliResult r = run_cli(
      "run --preset tiny --seqlens 5,9,40 --padded-seqlens 8,9,44 --check-rows 8 --dtype fp32 "
      "--json");
  ASSERT_EQ(r.status, 0) << "stdout:\n" << r.out << "stderr:\n" << r.err;
  const nlohmann::json j = parse_json(r);
  ASSERT_TRUE(j.contains("layers"));
  ASSERT_EQ(j["layers"].size(), 3u);
  EXPECT_EQ(j["precision"], "fp32");
  EXPECT_EQ(j["seqlens"], nlohmann::json({5, 9, 40}));
  EXPECT_EQ(j["padded_seqlens"], nlohmann::json({8, 9, 44}));
  const char* types[] = {"SWA", "CSA", "HCA"};
  for (std::size_t i = 0; i < 3; ++i) {
    const nlohmann::json& l = j["layers"][i];
    SCOPED_TRACE(l.dump());
    EXPECT_EQ(l["type"], types[i]);
    EXPECT_EQ(l["tokens"], 61);
    ASSERT_TRUE(l["check"].is_object());
    EXPECT_EQ(l["check"]["rows"], 8);
    ASSERT_TRUE(l["check"]["rel_diff"].is_number());
    EXPECT_LT(l["check"]["rel_diff"].get<double>(), 1e-4);
    EXPECT_GT(l["check"]["max_abs_ref"].get<double>(), 0.0);
    ASSERT_TRUE(l["grad_weights_norm"].is_number());
    EXPECT_GT(l["grad_weights_norm"].get<double>(), 0.0);
    if (i == 1) {
      ASSERT_TRUE(l["check"]["topk_match_fraction"].is_number());
    }
  }
}

TEST(Cli, RunBf16IsCloseToTheOracle) {
  const CliResult r = run_cli("run --preset tiny --seqlens 30,50 --check-rows 6 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = parse_json(r);
  EXPECT_EQ(j["precision"], "bf16");
  ASSERT_EQ(j["layers"].size(), 3u);
  for (const auto& l : j["layers"]) {
    SCOPED_TRACE(l.dump());
    ASSERT_TRUE(l["check"]["rel_diff"].is_number());
    EXPECT_LT(l["check"]["rel_diff"].get<double>(), 3e-2);
  }
}

TEST(Cli, RunWithoutBackwardHasNoGradients) {
  const CliResult r =
      run_cli("run --preset tiny --seqlens 20 --ratio 4 --no-backward --check-rows 0 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = parse_json(r);
  ASSERT_EQ(j["layers"].size(), 1u);
  EXPECT_TRUE(j["layers"][0]["backward_ms"].is_null());
  EXPECT_TRUE(j["layers"][0]["check"].is_null());
  EXPECT_EQ(j["backward"], false);
}

TEST(Cli, BadOptionsExitWithStatus2AndOneLine) {
  expect_usage_error("run --preset tiny --ratio 7", {"--ratio", "7"});
  expect_usage_error("run --preset tiny --ratio 0,4,x", {"--ratio", "x"});
  expect_usage_error("run --preset tiny --dtype fp8", {"--dtype", "fp8"});
  expect_usage_error("run --preset tiny --seqlens 4,x", {"--seqlens", "x"});
  expect_usage_error("run --preset tiny --seqlens 4,-3", {"--seqlens", "-3"});
  expect_usage_error("run --preset tiny --seqlens 9,9 --padded-seqlens 9,7",
                     {"--padded-seqlens", "7"});
  expect_usage_error("run --preset tiny --seqlens 9,9 --padded-seqlens 12", {"--padded-seqlens"});
  expect_usage_error("run --preset huge", {"--preset", "huge"});
  expect_usage_error("run --preset tiny --topk 0", {"--topk"});
  expect_usage_error("run --preset tiny --window -1", {"--window"});
  expect_usage_error("run --preset tiny --check-rows -2", {"--check-rows"});
  expect_usage_error("run --preset tiny --topk abc", {"abc"});
  expect_usage_error("run --preset tiny --frobnicate", {"--frobnicate"});
  expect_usage_error("run --preset tiny --layer 9", {"--layer", "9"});
  expect_usage_error("run --preset tiny --config /nonexistent/csattn/config.json",
                     {"/nonexistent/csattn/config.json"});
  expect_usage_error("run --preset tiny --weights /nonexistent/csattn/w.safetensors",
                     {"--weights"});
  expect_usage_error("", {});
  expect_usage_error("config --preset nope", {"nope"});
  expect_usage_error("bench --preset tiny --repeat 0", {"--repeat"});
  expect_usage_error("bench --device tpu", {"--device", "tpu"});
  expect_usage_error("run --preset tiny --device tpu", {"--device", "tpu"});
#ifdef CSATTN_HAVE_CUDA  // checked before the GPU is looked for
  expect_usage_error("bench --device cuda --sections attention,bogus", {"--sections", "bogus"});
#endif
  if (!csattn::cuda_available()) {  // without a GPU the cuda device is refused with the reason
    expect_usage_error("bench --device cuda", {"--device", "cuda"});
    expect_usage_error("run --preset tiny --device cuda", {"--device", "cuda"});
  }
}

TEST(Cli, CommCheckVerifiesEveryOperation) {
  const CliResult r = run_cli("comm-check --ranks 3 --mib 0.25 --iters 2");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* op : {"all_gather", "reduce_scatter", "all_reduce_sum", "all_reduce_max", "ring_exchange"})
    EXPECT_NE(r.out.find(op), std::string::npos) << op << "\n" << r.out;
  EXPECT_EQ(r.out.find("WRONG"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 ranks"), std::string::npos) << r.out;
  // One rank: no exchange, the collectives still checked.
  const CliResult one = run_cli("comm-check --ranks 1 --mib 0.1 --iters 1");
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_EQ(one.out.find("ring_exchange"), std::string::npos) << one.out;
  expect_usage_error("comm-check --backend tcp", {"--backend", "tcp"});
  expect_usage_error("comm-check --mib 0", {"--mib"});
  expect_usage_error("comm-check --iters 0", {"--iters"});
  expect_usage_error("comm-check --device tpu", {"--device", "tpu"});
  if (!csattn::cuda_available()) {  // no GPU: the device and NCCL are refused with the reason
    expect_usage_error("comm-check --device cuda", {"--device cuda"});
    expect_usage_error("comm-check --backend nccl", {"nccl"});
  }
}

TEST(Cli, HelpExitsZero) {
  for (const char* args : {"--help", "run --help", "bench --help", "config --help", "comm-check --help",
                           "info --help"}) {
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.status, 0) << args << "\n" << r.err;
    EXPECT_FALSE(r.out.empty()) << args;
  }
  // --help of run documents the --save naming.
  const std::string help = run_cli("run --help").out;
  for (const char* what : {"layers.<i> (e.g. layers.1.topk_indices)", "mtp.<K>"})
    EXPECT_NE(help.find(what), std::string::npos) << what;
}

TEST(Cli, VersionAndInfo) {
  const std::string version = CSATTN_PROJECT_VERSION;  // CMake's project version
  const CliResult v = run_cli("--version");
  ASSERT_EQ(v.status, 0) << v.err;
  EXPECT_EQ(v.out, "csattn " + version + "\n");

  const CliResult text = run_cli("info");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_EQ(text.out.rfind("csattn " + version + "\n", 0), 0u) << text.out;
  EXPECT_NE(text.out.find("communicators:"), std::string::npos) << text.out;

  const CliResult r = run_cli("info --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = parse_json(r);
  EXPECT_EQ(j["version"], version);
#ifdef CSATTN_HAVE_CUDA
  EXPECT_TRUE(j["cuda_backend"].get<bool>());
  EXPECT_EQ(j["cuda_target"], "sm_90a");
  EXPECT_GE(j["cuda_runtime_version"].get<int>(), 12000);
#else
  EXPECT_FALSE(j["cuda_backend"].get<bool>());
  EXPECT_EQ(j["cuda_target"], "");
#endif
  EXPECT_GE(j["cpu_threads"].get<int>(), 1);
  // Either GPUs or the reason there are none, and the same answer as the layer's check.
  EXPECT_EQ(j["gpus"].empty(), !j["gpu_note"].get<std::string>().empty()) << r.out;
  EXPECT_EQ(!j["gpus"].empty(), cuda_available()) << r.out;
  for (const auto& g : j["gpus"]) {
    EXPECT_EQ(g["runs_kernels"].get<bool>(), g["compute_capability"] == "9.0") << g.dump();
    EXPECT_GT(g["multiprocessors"].get<int>(), 0) << g.dump();
    EXPECT_GT(g["memory_bytes"].get<std::size_t>(), 0u) << g.dump();
  }
}

TEST(Cli, MemoryPlansTheGpuLayerWithoutAGpu) {
#ifdef CSATTN_HAVE_CUDA
  const CliResult r = run_cli("memory --preset tiny,flash --seqlens 100,4096 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = parse_json(r);
  ASSERT_EQ(j.size(), 4u) << r.out;  // 2 models x 2 lengths
  for (const auto& e : j) {
    const std::string model = e["model"];
    const int L = e["seqlen"];
    const csattn::ModelConfig mc = csattn::ModelConfig::preset(model);
    std::size_t weights = 0, activations = 0, backward = 0;
    for (int ratio : mc.compress_ratios) {  // every attention layer of the model
      csattn::AttentionConfig c = mc.base;
      c.compress_ratio = ratio;
      const csattn::DeviceMemoryPlan m = csattn::plan_device_memory(c, L, 1, L);
      weights += m.weights;
      activations += m.forward_workspace;
      backward = std::max(backward, m.backward_workspace);
    }
    EXPECT_EQ(e["all_layers"]["training_step_bytes"].get<std::size_t>(), weights + activations + backward)
        << model << " " << L;
    for (auto [name, ratio] : {std::pair{"SWA", 0}, std::pair{"CSA", 4}, std::pair{"HCA", 128}}) {
      csattn::AttentionConfig c = mc.base;
      c.compress_ratio = ratio;
      const csattn::DeviceMemoryPlan m = csattn::plan_device_memory(c, L, 1, L);
      const auto& got = e["layers"][name];
      ASSERT_FALSE(got.is_null()) << model << " has no " << name << " row";
      EXPECT_EQ(got["weights_bytes"].get<std::size_t>(), m.weights) << model << " " << name;
      EXPECT_EQ(got["forward_workspace_bytes"].get<std::size_t>(), m.forward_workspace);
      EXPECT_EQ(got["backward_workspace_bytes"].get<std::size_t>(), m.backward_workspace);
      EXPECT_EQ(got["training_step_bytes"].get<std::size_t>(), m.training_step());
      EXPECT_GT(m.forward_workspace, 0u);
    }
  }
  const CliResult text = run_cli("memory --preset pro --seqlens 65536 --ratios 4 --deterministic");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("pro, one sequence of 65536 tokens, deterministic backward"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("CSA"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("SWA"), std::string::npos) << "--ratios 4 lists CSA only:\n" << text.out;
  // --cp-ranks: the rank of the context-parallel layer that needs the most.
  const CliResult cp = run_cli("memory --preset flash --seqlens 32768 --ratios 4 --cp-ranks 4 --json");
  ASSERT_EQ(cp.status, 0) << cp.err;
  const nlohmann::json cj = parse_json(cp);
  ASSERT_EQ(cj.size(), 1u) << cp.out;
  EXPECT_EQ(cj[0]["context_parallel"]["ranks"], 4);
  EXPECT_EQ(cj[0]["context_parallel"]["mode"], "two_chunk");
  {
    csattn::AttentionConfig c = csattn::ModelConfig::preset("flash").base;
    c.compress_ratio = 4;
    const csattn::CpPartition part = csattn::CpPartition::build(
        csattn::pad_for_context_parallel(csattn::SeqLayout::from_lengths({32768}), csattn::CpMode::two_chunk, 4),
        csattn::CpMode::two_chunk, 4);
    std::size_t worst = 0;
    for (const csattn::DeviceMemoryPlan& m : csattn::plan_cp_device_memory(c, part))
      worst = std::max(worst, m.training_step());
    EXPECT_EQ(cj[0]["layers"]["CSA"]["training_step_bytes"].get<std::size_t>(), worst);
    EXPECT_GT(cj[0]["layers"]["CSA"]["context_parallel_bytes"].get<std::size_t>(), 0u);
  }
  expect_usage_error("memory --cp-ranks 0", {"--cp-ranks", "0"});
  expect_usage_error("memory --cp-ranks 2 --cp-mode ring", {"--cp-mode", "ring"});
  expect_usage_error("memory --seqlens 0", {"--seqlens", "0"});
  expect_usage_error("memory --ratios 3", {"--ratios", "3"});
  expect_usage_error("memory --preset huge", {"--preset", "huge"});
#else
  expect_usage_error("memory", {"CUDA backend"});
#endif
}

TEST(Cli, ConfigPrintsThePresetAsJson) {
  const CliResult r = run_cli("config --preset flash");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = parse_json(r);
  EXPECT_EQ(j["hidden_size"], 4096);
  EXPECT_EQ(j["num_attention_heads"], 64);
  EXPECT_EQ(j["compress_ratios"].size(), 44u);
  // The library reads it back as the same preset.
  const ModelConfig m = ModelConfig::from_hf_json_text(r.out, ModelConfig::preset("tiny"));
  EXPECT_EQ(m.base.d_model, 4096);
  EXPECT_EQ(m.compress_ratios, ModelConfig::preset("flash").compress_ratios);
}

TEST(Cli, ConfigFileRoundTripAndFlagsOverride) {
  const CliResult cfg = run_cli("config --preset small");
  ASSERT_EQ(cfg.status, 0) << cfg.err;
  const std::string path = temp_path("config.json");
  write_file(path, cfg.out);

  // --preset tiny only fills keys the file lacks: the dims come from the file (small);
  // --topk and --window override the file.
  const CliResult r = run_cli("run --config '" + path +
                              "' --preset tiny --topk 8 --window 32 --seqlens 5,9,17 "
                              "--check-rows 2 --no-backward --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = parse_json(r);
  EXPECT_EQ(j["config"]["hidden_size"], 256);
  EXPECT_EQ(j["config"]["index_topk"], 8);
  EXPECT_EQ(j["config"]["sliding_window"], 32);
  EXPECT_EQ(j["config_file"], path);
  // Without --ratio, every layer of the config's compress_ratios runs.
  ASSERT_EQ(j["layers"].size(), 3u);
  EXPECT_EQ(j["layers"][1]["type"], "CSA");

  // A partial config: missing keys come from --preset.
  write_file(path, R"({"hidden_size": 96, "compress_ratios": [4, 1], "unknown": true})");
  const CliResult p =
      run_cli("run --config '" + path + "' --preset tiny --seqlens 12 --check-rows 2 --json");
  ASSERT_EQ(p.status, 0) << p.err;
  const nlohmann::json pj = parse_json(p);
  EXPECT_EQ(pj["config"]["hidden_size"], 96);
  EXPECT_EQ(pj["config"]["num_attention_heads"], 4);
  ASSERT_EQ(pj["layers"].size(), 2u);
  EXPECT_EQ(pj["layers"][0]["type"], "CSA");
  EXPECT_EQ(pj["layers"][1]["type"], "SWA");

  // A config with a wrong type: one line naming the key.
  write_file(path, R"({"hidden_size": "wide"})");
  expect_usage_error("run --config '" + path + "' --preset tiny", {"hidden_size"});
  std::filesystem::remove(path);
}

TEST(Cli, SaveWritesEveryTensorWithLayerPrefixes) {
  const std::string out = temp_path("out.safetensors");
  const CliResult r =
      run_cli("run --preset tiny --seqlens 7,13 --check-rows 0 --save '" + out + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const TensorMap m = load_safetensors(out);
  const ModelConfig model = ModelConfig::preset("tiny");
  const int ratios[] = {0, 4, 128};
  for (int i = 0; i < 3; ++i) {
    const std::string pre = "layers." + std::to_string(i) + ".";
    SCOPED_TRACE(pre);
    ASSERT_TRUE(m.count(pre + "output"));
    EXPECT_EQ(m.at(pre + "output").shape(), (Shape{20, 64}));
    ASSERT_TRUE(m.count(pre + "indexer_loss"));
    EXPECT_EQ(m.at(pre + "indexer_loss").numel(), 1);
    EXPECT_EQ(m.count(pre + "topk_indices"), i == 1 ? 1u : 0u);
    ASSERT_TRUE(m.count(pre + "grad.hidden_states"));
    EXPECT_EQ(m.at(pre + "grad.hidden_states").shape(), (Shape{20, 64}));
    AttentionConfig cfg = model.base;
    cfg.compress_ratio = ratios[i];
    for (const ParamInfo& p : layer_params(cfg)) {
      ASSERT_TRUE(m.count(pre + "grad." + p.name)) << p.name;
      EXPECT_EQ(m.at(pre + "grad." + p.name).shape(), p.shape) << p.name;
    }
  }
  EXPECT_EQ(m.at("layers.1.topk_indices").shape(), (Shape{20, model.base.index_topk}));
  std::filesystem::remove(out);
}

TEST(Cli, InputsAndWeightsFiles) {
  const ModelConfig model = ModelConfig::preset("tiny");
  AttentionConfig cfg = model.base;
  cfg.compress_ratio = 4;
  const std::string weights = temp_path("weights.safetensors");
  LayerWeights::random(cfg, 1234).save(weights);

  const int T = 30;
  std::vector<float> x(static_cast<std::size_t>(T) * 64);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37 % 101) - 50) / 25.0f;
  const std::string inputs = temp_path("inputs.safetensors");
  save_safetensors(inputs, {{"hidden_states", Tensor::from_f32(x, {T, 64})},
                            {"cu_seqlens", Tensor::from_i32({0, 11, 30}, {3})}});

  const std::string out = temp_path("out.safetensors");
  const CliResult r = run_cli("run --preset tiny --ratio 4 --weights '" + weights +
                              "' --inputs '" + inputs + "' --check-rows 4 --json --save '" +
                              out + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = parse_json(r);
  EXPECT_EQ(j["seqlens"], nlohmann::json({11, 19}));
  ASSERT_EQ(j["layers"].size(), 1u);
  EXPECT_EQ(j["layers"][0]["type"], "CSA");
  // One layer: no name prefix.
  const TensorMap m = load_safetensors(out);
  EXPECT_TRUE(m.count("output"));
  EXPECT_TRUE(m.count("topk_indices"));
  EXPECT_TRUE(m.count("grad.attn.wq_a.weight"));

  // --weights without a ratio, weights of the wrong layer type, inputs with a bad shape.
  expect_usage_error("run --preset tiny --weights '" + weights + "'", {"--ratio"});
  expect_usage_error("run --preset tiny --ratio 128 --weights '" + weights + "'", {});
  save_safetensors(inputs, {{"hidden_states", Tensor::from_f32(x, {T, 64})},
                            {"cu_seqlens", Tensor::from_i32({0, 11, 29}, {3})}});
  expect_usage_error("run --preset tiny --ratio 4 --inputs '" + inputs + "'", {"hidden_states"});
  expect_usage_error("run --preset tiny --inputs '" + inputs + "' --seqlens 4", {"--seqlens"});
  for (const std::string& p : {weights, inputs, out}) std::filesystem::remove(p);
}

// The release's MTP module has an attention layer, mtp.0.attn.*, whose ratio is the entry
// of compress_ratios after the num_hidden_layers main ones. `--layer mtp.0` (or its index)
// runs it; `csattn checkpoint` lists and loads it; bad or missing layers are named.
TEST(Cli, MtpModuleLayer) {
  ModelConfig model = ModelConfig::preset("tiny");
  model.compress_ratios = {0, 4, 0};
  model.num_hidden_layers = 2;
  const std::filesystem::path dir = temp_path("mtp");
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << model.to_hf_json();
  const std::string single = temp_path("mtp_single.safetensors");
  TensorMap ckpt;
  LayerWeights::random(model.layer(1), 5).save(single);
  for (auto& [name, t] : load_safetensors(single)) ckpt.emplace("layers.1." + name, t);
  LayerWeights::random(model.layer(2), 6).save(single);  // the MTP module's (SWA) layer
  for (auto& [name, t] : load_safetensors(single)) ckpt.emplace("mtp.0." + name, t);
  ckpt.emplace("mtp.0.e_proj.weight", Tensor(DType::bf16, {4, 64}));
  save_safetensors((dir / "model.safetensors").string(), ckpt);

  const std::string out_mtp = temp_path("out_mtp.safetensors");
  const std::string out_index = temp_path("out_mtp_index.safetensors");
  const std::string out_single = temp_path("out_mtp_file.safetensors");
  const std::string common = " --seqlens 20,9 --check-rows 0 -q --save '";
  const CliResult r = run_cli("run --preset tiny --weights '" + dir.string() + "' --layer mtp.0" +
                              common + out_mtp + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const CliResult r2 = run_cli("run --preset tiny --weights '" + dir.string() + "' --layer 2" +
                               common + out_index + "'");
  ASSERT_EQ(r2.status, 0) << r2.err;
  const CliResult r3 = run_cli("run --preset tiny --ratio 0 --weights '" + single + "'" + common +
                               out_single + "'");
  ASSERT_EQ(r3.status, 0) << r3.err;
  const TensorMap a = load_safetensors(out_mtp), b = load_safetensors(out_index),
                  c = load_safetensors(out_single);
  for (const char* name : {"output", "grad.hidden_states", "grad.attn.wq_b.weight"}) {
    ASSERT_TRUE(a.count(name) && b.count(name) && c.count(name)) << name;
    EXPECT_EQ(a.at(name).to_f32(), c.at(name).to_f32()) << name;
    EXPECT_EQ(b.at(name).to_f32(), c.at(name).to_f32()) << name;
  }

  const CliResult k = run_cli("checkpoint '" + dir.string() + "' --preset tiny --load --json");
  ASSERT_EQ(k.status, 0) << k.err;
  const nlohmann::json kj = parse_json(k);
  ASSERT_EQ(kj["layers"].size(), 2u);
  EXPECT_EQ(kj["layers"][0]["layer"], 1);
  EXPECT_EQ(kj["layers"][0]["config_type"], "CSA");
  EXPECT_TRUE(kj["layers"][1]["layer"].is_null());
  EXPECT_EQ(kj["layers"][1]["name"], "mtp.0");
  EXPECT_EQ(kj["layers"][1]["model_index"], 2);
  EXPECT_EQ(kj["layers"][1]["type_from_tensors"], "SWA");
  EXPECT_EQ(kj["layers"][1]["config_type"], "SWA");
  EXPECT_EQ(kj["layers"][1]["load"], "ok");
  EXPECT_EQ(k.err, "");  // a small read, stderr not a terminal: no progress lines
  const CliResult quiet = run_cli("checkpoint '" + dir.string() + "' --preset tiny --load -q");
  EXPECT_EQ(quiet.status, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "");
  EXPECT_NE(quiet.out.find("2 of 2 layers load"), std::string::npos) << quiet.out;
  const CliResult table = run_cli("checkpoint '" + dir.string() + "' --preset tiny");
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find(" mtp.0  SWA  SWA"), std::string::npos) << table.out;

  const std::string w = "run --preset tiny --weights '" + dir.string() + "' --layer ";
  expect_usage_error(w + "mtp.1", {"--layer", "mtp.1 does not exist", "2 main layers", "(mtp.0)"});
  expect_usage_error(w + "layers.2", {"--layer", "layers.2 does not exist"});
  expect_usage_error(w + "last", {"--layer", "'last' is not a layer"});
  expect_usage_error(w + "02", {"--layer", "'02' is not a layer", "leading zeros"});
  // With several layers, --save names each by the checkpoint's name: the MTP module's
  // entry is mtp.0, not layers.2.
  const std::string out_all = temp_path("out_mtp_all.safetensors");
  const CliResult all = run_cli("run --config '" + (dir / "config.json").string() +
                                "' --preset tiny --seqlens 20 --check-rows 0 -q --save '" + out_all + "'");
  ASSERT_EQ(all.status, 0) << all.err;
  const TensorMap saved = load_safetensors(out_all);
  for (const char* name : {"layers.0.output", "layers.1.output", "mtp.0.output"})
    EXPECT_TRUE(saved.count(name)) << name;
  EXPECT_FALSE(saved.count("layers.2.output"));
  // Reports name it too: the table's layer column and the JSON's "name".
  const CliResult named = run_cli("run --config '" + (dir / "config.json").string() +
                                  "' --preset tiny --seqlens 20 --check-rows 0 --json");
  ASSERT_EQ(named.status, 0) << named.err;
  const nlohmann::json nj = parse_json(named);
  ASSERT_EQ(nj["layers"].size(), 3u);
  EXPECT_EQ(nj["layers"][1]["name"], "layers.1");
  EXPECT_EQ(nj["layers"][2]["name"], "mtp.0");
  EXPECT_EQ(nj["layers"][2]["index"], 2);
  const CliResult text = run_cli("run --config '" + (dir / "config.json").string() +
                                 "' --preset tiny --seqlens 20 --check-rows 0 -q");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("mtp.0  SWA"), std::string::npos) << text.out;
  std::filesystem::remove(out_all);
  // Without num_hidden_layers (the tiny preset) an MTP module has no place in compress_ratios.
  expect_usage_error("run --preset tiny --layer mtp.0", {"--layer", "num_hidden_layers"});
  // A config.json without num_hidden_layers: the checkpoint lists the module, cannot load it.
  model.num_hidden_layers = 0;
  std::ofstream(dir / "config.json") << model.to_hf_json();
  const CliResult unknown = run_cli("checkpoint '" + dir.string() + "' --preset tiny --load");
  EXPECT_EQ(unknown.status, 2) << unknown.out << unknown.err;
  EXPECT_NE(unknown.out.find("does not give num_hidden_layers"), std::string::npos) << unknown.out;
  // --config FILE takes the place of the checkpoint's config.json: with num_hidden_layers
  // the module has its entry again, and every layer loads.
  model.num_hidden_layers = 2;
  const std::string given = temp_path("mtp_config.json");
  std::ofstream(given) << model.to_hf_json();
  const CliResult with_config =
      run_cli("checkpoint '" + dir.string() + "' --config '" + given + "' --preset tiny --load --json");
  ASSERT_EQ(with_config.status, 0) << with_config.out << with_config.err;
  const nlohmann::json gj = parse_json(with_config);
  EXPECT_EQ(gj["config_file"], given);
  EXPECT_EQ(gj["layers"][1]["model_index"], 2);
  EXPECT_EQ(gj["layers"][1]["load"], "ok");
  std::ofstream(given) << "{\"compress_ratios\": [0, 7]}";
  expect_usage_error("checkpoint '" + dir.string() + "' --config '" + given + "'", {"--config", "7"});
  std::filesystem::remove(given);
  std::filesystem::remove_all(dir);
  for (const std::string& p : {single, out_mtp, out_index, out_single}) std::filesystem::remove(p);
}

// The DeepSeek-V4 release layout: a directory with config.json, model.safetensors.index.json
// and shards whose linear weights are F8_E4M3 with an F8_E8M0 scale per 128 x 128 block.
// `--weights DIR --layer 1` reads config.json and the layer; its outputs equal those of the
// same layer given as dequantized bf16 weights in one file.
TEST(Cli, ReleaseCheckpointDirectory) {
  ModelConfig model = ModelConfig::preset("tiny");
  model.compress_ratios = {0, 4, 128};
  AttentionConfig cfg = model.base;
  cfg.compress_ratio = 4;
  const std::filesystem::path dir = temp_path("release");
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << model.to_hf_json();

  LayerWeights dequantized = LayerWeights::random(cfg, 77);
  TensorMap shard1, shard2;
  for (const ParamInfo& p : dequantized.params()) {
    const std::string name = "layers.1." + p.name;
    TensorMap& shard = (p.group == ParamGroup::main) ? shard1 : shard2;
    const bool fp8 = p.file_dtype == DType::bf16 && p.shape.size() == 2 &&
                     p.name.find("compressor") == std::string::npos;
    float* v = dequantized.f32(p.name);
    if (!fp8) {
      Tensor t = Tensor::from_f32(dequantized.get(p.name).to_f32(), p.shape);
      if (p.file_dtype == DType::bf16) {
        Tensor b(DType::bf16, p.shape);
        for (std::int64_t i = 0; i < b.numel(); ++i) b.ptr<std::uint16_t>()[i] = float_to_bf16_bits(v[i]);
        t = std::move(b);
      }
      shard.emplace(name, std::move(t));
      continue;
    }
    // Scale 2^-3 for every block; values quantized to E4M3 at that scale.
    const std::int64_t rows = p.shape[0], cols = p.shape[1];
    Tensor q(DType::e4m3, p.shape), s(DType::e8m0, {(rows + 127) / 128, (cols + 127) / 128});
    for (std::int64_t i = 0; i < s.numel(); ++i) static_cast<std::uint8_t*>(s.data())[i] = 127 - 3;
    for (std::int64_t i = 0; i < rows * cols; ++i) {
      const std::uint8_t b = float_to_e4m3_bits(v[i] * 8.0f);
      static_cast<std::uint8_t*>(q.data())[i] = b;
      v[i] = e4m3_bits_to_float(b) / 8.0f;
    }
    shard.emplace(name, std::move(q));
    shard.emplace("layers.1." + p.name.substr(0, p.name.size() - 7) + ".scale", std::move(s));
  }
  save_safetensors((dir / "model-00001-of-00002.safetensors").string(), shard1);
  save_safetensors((dir / "model-00002-of-00002.safetensors").string(), shard2);
  nlohmann::json index = {{"weight_map", nlohmann::json::object()}};
  for (const auto& [n, t] : shard1) index["weight_map"][n] = "model-00001-of-00002.safetensors";
  for (const auto& [n, t] : shard2) index["weight_map"][n] = "model-00002-of-00002.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  const std::string single = temp_path("dequantized.safetensors");
  dequantized.save(single);

  const std::string out_release = temp_path("out_release.safetensors");
  const std::string out_single = temp_path("out_single.safetensors");
  const CliResult r = run_cli("run --preset tiny --weights '" + dir.string() +
                              "' --layer 1 --seqlens 20,9 --check-rows 4 --json --save '" +
                              out_release + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = parse_json(r);
  EXPECT_EQ(j["config_file"], (dir / "config.json").string());
  ASSERT_EQ(j["layers"].size(), 1u);
  EXPECT_EQ(j["layers"][0]["type"], "CSA");
  const CliResult r2 = run_cli("run --preset tiny --ratio 4 --weights '" + single +
                               "' --seqlens 20,9 --check-rows 0 -q --save '" + out_single + "'");
  ASSERT_EQ(r2.status, 0) << r2.err;
  const TensorMap a = load_safetensors(out_release), b = load_safetensors(out_single);
  for (const char* name : {"output", "topk_indices", "grad.hidden_states", "grad.attn.wq_b.weight"}) {
    ASSERT_TRUE(a.count(name) && b.count(name)) << name;
    EXPECT_EQ(a.at(name).to_f32(), b.at(name).to_f32()) << name;
  }
  // A missing layer names the layers the checkpoint has.
  expect_usage_error("run --preset tiny --weights '" + dir.string() + "' --layer 2", {"layers.2.attn", "in it: 1"});

  // `csattn checkpoint`: layer 1 from the headers (CSA by its tensors and by config.json),
  // then loaded; a second layer of the wrong type for the config fails --load (status 2).
  const CliResult c = run_cli("checkpoint '" + dir.string() + "' --preset tiny --load --json");
  ASSERT_EQ(c.status, 0) << c.err;
  nlohmann::json cj = parse_json(c);
  EXPECT_EQ(cj["config_file"], (dir / "config.json").string());
  ASSERT_EQ(cj["layers"].size(), 1u);
  EXPECT_EQ(cj["layers"][0]["layer"], 1);
  EXPECT_EQ(cj["layers"][0]["name"], "layers.1");
  EXPECT_EQ(cj["layers"][0]["model_index"], 1);
  EXPECT_EQ(cj["layers"][0]["type_from_tensors"], "CSA");
  EXPECT_EQ(cj["layers"][0]["config_type"], "CSA");
  EXPECT_EQ(cj["layers"][0]["tensors"], 18 + 7);  // 18 parameters, the 7 FP8 linears' scales
  EXPECT_EQ(cj["layers"][0]["fp8_weights"], 7);
  EXPECT_EQ(cj["layers"][0]["load"], "ok");
  EXPECT_EQ(cj["layers"][0]["files"].size(), 2u);
  {
    TensorMap extra;
    for (auto& [n, t] : shard1)
      if (n.find(".compressor.") == std::string::npos) extra.emplace("layers.2." + n.substr(9), t);
    save_safetensors((dir / "model-00003-of-00003.safetensors").string(), extra);
    for (const auto& [n, t] : extra) index["weight_map"][n] = "model-00003-of-00003.safetensors";
    std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  }
  const CliResult bad = run_cli("checkpoint '" + dir.string() + "' --preset tiny --load");
  EXPECT_EQ(bad.status, 2) << bad.out << bad.err;
  EXPECT_NE(bad.out.find("1 of 2 layers load"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("(differs)"), std::string::npos) << bad.out;  // SWA tensors, HCA config

  // A config.json found through --weights DIR that does not parse: the error says where it
  // came from (the user gave no --config); a checkpoint without attention layers is refused.
  std::ofstream(dir / "config.json") << "{\"hidden_size\": \"big\"}";
  expect_usage_error("run --preset tiny --weights '" + dir.string() + "' --layer 1",
                     {(dir / "config.json").string(), "the config.json of --weights", "hidden_size"});
  expect_usage_error("checkpoint '" + dir.string() + "'", {"the checkpoint's config.json", "hidden_size"});
  expect_usage_error("checkpoint '" + single + "'", {single, "no attention layers"});
  std::filesystem::remove_all(dir);
  for (const std::string& p : {single, out_release, out_single}) std::filesystem::remove(p);
}

TEST(Cli, BenchJson) {
  const CliResult r =
      run_cli("bench --preset tiny --seqlens 32 --ratio 0,4 --repeat 1 --warmup 0 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = parse_json(r);
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& row : j["results"]) {
    EXPECT_EQ(row["tokens"], 32);
    EXPECT_GT(row["forward_tokens_per_s"].get<double>(), 0.0);
    EXPECT_GT(row["forward_backward_tokens_per_s"].get<double>(), 0.0);
  }
}

// --indexer-precision mxfp8: the CSA top-k comes from the MXFP8 compact indexer; the report
// and the saved metadata say so; attention on that selection still matches the oracle.
TEST(Cli, RunMxfp8Indexer) {
  const std::string save = temp_path("mx.safetensors");
  const CliResult r = run_cli("run --preset tiny --seqlens 60,33 --ratio 4 --indexer-precision "
                              "mxfp8 --check-rows 6 --json --save '" + save + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = parse_json(r);
  EXPECT_EQ(j["indexer_precision"], "mxfp8");
  ASSERT_EQ(j["layers"].size(), 1u);
  EXPECT_LT(j["layers"][0]["check"]["rel_diff"].get<double>(), 3e-2);
  const TensorMap m = load_safetensors(save);
  ASSERT_TRUE(m.count("topk_indices"));
  const std::string bytes = read_file(save);
  ASSERT_GT(bytes.size(), 8u);
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len));
  EXPECT_EQ(header["__metadata__"]["csattn.indexer_precision"], "mxfp8");
  std::filesystem::remove(save);
  const CliResult table = run_cli("run --preset tiny --seqlens 20 --ratio 4 --indexer-precision "
                                  "mxfp8 --check-rows 0");
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find("indexer mxfp8"), std::string::npos) << table.out;
}

TEST(Cli, BadIndexerPrecision) {
  expect_usage_error("run --preset tiny --indexer-precision fp8", {"--indexer-precision", "fp8"});
  // MXFP8 needs index_head_dim % 32 == 0: a 16-dim indexer is refused with a clear message.
  const std::string cfg = temp_path("cfg.json");
  write_file(cfg, "{\"index_head_dim\": 16}");
  expect_usage_error("run --preset tiny --config '" + cfg + "' --ratio 4 --indexer-precision mxfp8",
                     {"index_head_dim", "32", "mxfp8"});
  // The same config runs with the bf16 indexer, and SWA / HCA layers have no indexer.
  EXPECT_EQ(run_cli("run --preset tiny --config '" + cfg + "' --ratio 4 --seqlens 12 --check-rows 0").status, 0);
  EXPECT_EQ(run_cli("run --preset tiny --config '" + cfg + "' --ratio 0,128 --seqlens 12 "
                    "--indexer-precision mxfp8 --check-rows 0").status, 0);
  std::filesystem::remove(cfg);
}

TEST(Cli, BenchIndexerJson) {
  const CliResult r = run_cli("bench-indexer --seqlens 64,100 --heads 4 --head-dim 64 --topk 8 "
                              "--repeat 1 --warmup 0 --rows-per-pass 16 --json -q");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = parse_json(r);
  ASSERT_EQ(j["results"].size(), 4u);  // 2 lengths x {bf16, mxfp8}
  for (const auto& row : j["results"]) {
    EXPECT_GT(row["pairs_per_s"].get<double>(), 0.0);
    // Chunked: 16 rows x min(S_k, S_q div 4) floats at most.
    const int L = row["seqlen"].get<int>();
    EXPECT_EQ(row["candidate_buffer_bytes"].get<std::int64_t>(), 4 * 16 * (L / 4));
    std::int64_t pairs = 0;
    for (int t = 0; t < L; ++t) pairs += (t + 1) / 4;
    EXPECT_EQ(row["pairs"].get<std::int64_t>(), pairs);
  }
  expect_usage_error("bench-indexer --indexer-precision fp16", {"--indexer-precision", "fp16"});
  expect_usage_error("bench-indexer --head-dim 48 --indexer-precision mxfp8 --seqlens 8",
                     {"head_dim", "48"});
}

}  // namespace
}  // namespace csattn
