// The parameter table of one attention layer, deterministic random init, and the
// safetensors load/save under the DeepSeek-V4 release names.
#include "csattn/weights.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <set>
#include <utility>

#include "core/block_fp8.hpp"
#include "csattn/checkpoint.hpp"
#include "csattn/error.hpp"
#include "csattn/safetensors.hpp"

namespace csattn {
namespace {

std::string ratio_str(const AttentionConfig& cfg) {
  return "compress_ratio=" + std::to_string(cfg.compress_ratio);
}

// Only what the shapes below need; the full consistency check is AttentionConfig::validate.
void check_dims(const AttentionConfig& cfg) {
  const std::pair<const char*, int> dims[] = {
      {"d_model", cfg.d_model},           {"n_heads", cfg.n_heads},
      {"head_dim", cfg.head_dim},         {"q_lora_rank", cfg.q_lora_rank},
      {"o_groups", cfg.o_groups},         {"o_lora_rank", cfg.o_lora_rank},
      // The indexer's dims only matter in CSA layers; a harmless value elsewhere passes.
      {"index_n_heads", cfg.has_indexer() ? cfg.index_n_heads : 1},
      {"index_head_dim", cfg.has_indexer() ? cfg.index_head_dim : 1}};
  for (const auto& [name, v] : dims) {
    require(v > 0, ErrorKind::InvalidArgument,
            std::string("layer_params: ") + name + " = " + std::to_string(v) +
                ", expected > 0");
  }
  require(cfg.compress_ratio >= 0, ErrorKind::InvalidArgument,
          "layer_params: " + ratio_str(cfg) + ", expected >= 0");
  require((cfg.n_heads * cfg.head_dim) % cfg.o_groups == 0, ErrorKind::InvalidArgument,
          "layer_params: n_heads*head_dim = " + std::to_string(cfg.n_heads * cfg.head_dim) +
              " is not divisible by o_groups = " + std::to_string(cfg.o_groups));
}

// ---- deterministic random init ------------------------------------------------------------
// Each parameter gets its own generator seeded from (seed, name), so its values do not
// depend on the order of the table or on which other parameters exist.

std::uint64_t fnv1a64(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// std::normal_distribution's algorithm differs between standard libraries; Box-Muller on
// mt19937_64 (whose output the standard fixes) gives the same weights everywhere.
class Normal {
 public:
  explicit Normal(std::uint64_t seed) : rng_(seed) {}
  double operator()() {
    const double u1 = 1.0 - uniform();  // (0, 1]: log is finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  double uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }  // [0, 1)
  std::mt19937_64 rng_;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(),
                                                suffix) == 0;
}

// Scales that keep activations O(1): projections N(0, 1/fan_in), norm gains near 1, and
// a clearly non-zero sink and ape so tests exercise them. Returns (mean, std).
std::pair<double, double> init_moments(const ParamInfo& p) {
  if (p.name == "attn.attn_sink" || ends_with(p.name, ".ape")) return {0.0, 0.5};
  if (ends_with(p.name, "norm.weight")) return {1.0, 0.1};
  return {0.0, 1.0 / std::sqrt(static_cast<double>(p.shape.at(1)))};  // weight [out, in]
}

float round_to(DType dt, float v) { return dt == DType::bf16 ? round_bf16(v) : v; }

// ---- loading ------------------------------------------------------------------------------

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::string layers_with_attn(const std::vector<std::string>& names) {
  std::set<CheckpointLayer> layers;
  for (const std::string& name : names)
    if (const std::optional<CheckpointLayer> l = attention_layer_of(name)) layers.insert(*l);
  std::string s;
  for (const CheckpointLayer& l : layers) s += (s.empty() ? "" : ", ") + l.label();
  return s.empty() ? "none" : s;
}

// The layer's tensors: release name ("attn.*") -> name in the checkpoint.
std::map<std::string, std::string> select_layer(const std::vector<std::string>& names,
                                                const std::string& path,
                                                const std::optional<CheckpointLayer>& layer) {
  std::map<std::string, std::string> out;
  if (layer) {
    require(layer->index >= 0, ErrorKind::InvalidArgument,
            "LayerWeights::load: layer = " + layer->prefix() + ", expected >= 0");
    const std::string prefix = layer->prefix() + ".";
    for (const std::string& name : names) {
      if (!starts_with(name, prefix + "attn.")) continue;  // other layers, ffn, embed...
      out.emplace(name.substr(prefix.size()), name);
    }
    require(!out.empty(), ErrorKind::InvalidArgument,
            "LayerWeights::load: '" + path + "' has no tensors named " + prefix +
                "attn.*; layers with attention tensors in it: " + layers_with_attn(names));
    return out;
  }
  for (const std::string& name : names) {
    if (starts_with(name, "layers.") || starts_with(name, "mtp.")) {
      throw Error(ErrorKind::InvalidArgument,
                  "LayerWeights::load: '" + path + "' is a multi-layer checkpoint (tensor '" +
                      name + "'); pass the layer (layers with attention tensors: " +
                      layers_with_attn(names) + ")");
    }
    out.emplace(name, name);
  }
  return out;
}

// A bf16 linear weight, which the release may store as block-scaled FP8.
bool may_be_block_fp8(const ParamInfo& p) {
  return p.file_dtype == DType::bf16 && p.shape.size() == 2 && p.name.ends_with(".weight");
}

// "attn.wq_a.weight" -> "attn.wq_a.scale": where the release keeps an FP8 weight's block
// scales.
std::string scale_name_of(const std::string& weight_name) {
  return weight_name.substr(0, weight_name.size() - std::string(".weight").size()) + ".scale";
}

}  // namespace

std::vector<ParamInfo> layer_params(const AttentionConfig& cfg) {
  check_dims(cfg);
  using D = DType;
  using G = ParamGroup;
  const std::int64_t d = cfg.d_model, hd = cfg.head_dim, qr = cfg.q_lora_rank;
  const std::int64_t hD = static_cast<std::int64_t>(cfg.n_heads) * hd;
  const std::int64_t g = cfg.o_groups, orank = cfg.o_lora_rank;
  std::vector<ParamInfo> p = {
      {"attn.wq_a.weight", {qr, d}, D::bf16, G::main},
      {"attn.q_norm.weight", {qr}, D::bf16, G::main},
      {"attn.wq_b.weight", {hD, qr}, D::bf16, G::main},
      {"attn.wkv.weight", {hd, d}, D::bf16, G::main},
      {"attn.kv_norm.weight", {hd}, D::bf16, G::main},
      {"attn.wo_a.weight", {g * orank, hD / g}, D::bf16, G::main},
      {"attn.wo_b.weight", {d, g * orank}, D::bf16, G::main},
      {"attn.attn_sink", {cfg.n_heads}, D::f32, G::main},
  };
  if (cfg.has_compressor()) {
    const std::int64_t m = cfg.compress_ratio, cw = cfg.coff() * hd;
    p.push_back({"attn.compressor.wkv.weight", {cw, d}, D::bf16, G::main});
    p.push_back({"attn.compressor.wgate.weight", {cw, d}, D::bf16, G::main});
    p.push_back({"attn.compressor.norm.weight", {hd}, D::bf16, G::main});
    p.push_back({"attn.compressor.ape", {m, cw}, D::f32, G::main});
  }
  if (cfg.has_indexer()) {
    const std::int64_t ih = cfg.index_n_heads, id = cfg.index_head_dim;
    p.push_back({"attn.indexer.wq_b.weight", {ih * id, qr}, D::bf16, G::indexer});
    p.push_back({"attn.indexer.weights_proj.weight", {ih, d}, D::bf16, G::indexer});
    p.push_back({"attn.indexer.compressor.wkv.weight", {2 * id, d}, D::bf16, G::indexer});
    p.push_back({"attn.indexer.compressor.wgate.weight", {2 * id, d}, D::bf16, G::indexer});
    p.push_back({"attn.indexer.compressor.norm.weight", {id}, D::bf16, G::indexer});
    p.push_back({"attn.indexer.compressor.ape", {4, 2 * id}, D::f32, G::indexer});
  }
  return p;
}

LayerWeights LayerWeights::random(const AttentionConfig& cfg, std::uint64_t seed) {
  // Each parameter is drawn in fixed chunks, each chunk from its own generator seeded by
  // (seed, name, chunk): the values depend on neither the thread count nor the table order.
  constexpr std::int64_t kChunk = 1 << 16;
  LayerWeights w = zeros(cfg);
  for (const ParamInfo& p : w.params_) {
    const std::uint64_t param_seed = splitmix64(seed ^ splitmix64(fnv1a64(p.name)));
    const auto [mean, stddev] = init_moments(p);
    Tensor& t = w.tensors_.at(p.name);
    float* v = t.ptr<float>();
    const std::int64_t n = t.numel(), chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
    for (std::int64_t c = 0; c < chunks; ++c) {
      Normal normal(c == 0 ? param_seed : splitmix64(param_seed + static_cast<std::uint64_t>(c)));
      for (std::int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i)
        v[i] = round_to(p.file_dtype, static_cast<float>(mean + stddev * normal()));
    }
  }
  return w;
}

LayerWeights LayerWeights::zeros(const AttentionConfig& cfg) {
  LayerWeights w;
  w.cfg_ = cfg;
  w.params_ = layer_params(cfg);
  for (const ParamInfo& p : w.params_) w.tensors_.emplace(p.name, Tensor(DType::f32, p.shape));
  return w;
}

const Tensor& LayerWeights::get(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    throw Error(ErrorKind::InvalidArgument, "LayerWeights: no parameter '" + name +
                                                "' in this layer (" + ratio_str(cfg_) + ")");
  }
  return it->second;
}

Tensor& LayerWeights::get(const std::string& name) {
  return const_cast<Tensor&>(std::as_const(*this).get(name));
}

void LayerWeights::check(const AttentionConfig& cfg) const {
  const auto table = layer_params(cfg);
  std::set<std::string> expected;
  for (const ParamInfo& p : table) {
    expected.insert(p.name);
    const auto it = tensors_.find(p.name);
    require(it != tensors_.end(), ErrorKind::InvalidArgument,
            "LayerWeights::check: missing parameter '" + p.name + "' (" + ratio_str(cfg) + ")");
    const Tensor& t = it->second;
    require(t.dtype() == DType::f32, ErrorKind::DTypeMismatch,
            "LayerWeights::check: parameter '" + p.name + "' is " + dtype_name(t.dtype()) +
                ", expected f32 in memory");
    require(t.shape() == p.shape && t.nbytes() == static_cast<std::size_t>(t.numel()) * 4,
            ErrorKind::ShapeMismatch,
            "LayerWeights::check: parameter '" + p.name + "': expected shape " +
                shape_str(p.shape) + ", got " + shape_str(t.shape()));
  }
  for (const auto& [name, t] : tensors_) {
    require(expected.count(name) != 0, ErrorKind::InvalidArgument,
            "LayerWeights::check: unexpected parameter '" + name + "' (not in a " +
                ratio_str(cfg) + " layer)");
  }
}

LayerWeights LayerWeights::load(const std::string& path, const AttentionConfig& cfg,
                                std::optional<CheckpointLayer> layer) {
  return load(Checkpoint::open(path), cfg, layer);
}

LayerWeights LayerWeights::load(const Checkpoint& ckpt, const AttentionConfig& cfg,
                                std::optional<CheckpointLayer> layer) {
  const std::string& path = ckpt.path();
  const std::map<std::string, std::string> sel = select_layer(ckpt.names(), path, layer);
  LayerWeights w;
  w.cfg_ = cfg;
  w.params_ = layer_params(cfg);
  const std::string where = "LayerWeights::load: '" + path + "': ";
  std::set<std::string> used;  // release names read (parameters and their block scales)
  for (const ParamInfo& p : w.params_) {
    const auto it = sel.find(p.name);
    const std::string file_name = layer ? layer->prefix() + "." + p.name : p.name;
    require(it != sel.end(), ErrorKind::Io,
            where + "missing tensor '" + file_name + "' (" + shape_str(p.shape) + " " +
                dtype_name(p.file_dtype) + ", needed for " + ratio_str(cfg) + ")");
    used.insert(p.name);
    const SafetensorsReader::Entry& e = ckpt.entry(it->second);
    require(e.shape == p.shape, ErrorKind::ShapeMismatch,
            where + "tensor '" + file_name + "': expected shape " + shape_str(p.shape) +
                ", got " + shape_str(e.shape));
    // A bf16 linear weight may come as the release stores it: E4M3 with 128 x 128 block
    // scales beside it (`<name>.scale`), dequantized here.
    if (e.dtype == DType::e4m3 && may_be_block_fp8(p)) {
      const std::string scale = scale_name_of(p.name);
      const auto s = sel.find(scale);
      require(s != sel.end(), ErrorKind::Io,
              where + "tensor '" + file_name + "' is F8_E4M3 but '" + scale_name_of(file_name) +
                  "' (its scale per " + std::to_string(kFp8WeightBlock) + " x " +
                  std::to_string(kFp8WeightBlock) + " block) is missing");
      used.insert(scale);
      w.tensors_.emplace(p.name, dequantize_block_fp8(ckpt.read(it->second), ckpt.read(s->second),
                                                      where + "tensor '" + file_name + "'"));
      continue;
    }
    require(e.dtype == p.file_dtype, ErrorKind::DTypeMismatch,
            where + "tensor '" + file_name + "': expected dtype " + dtype_name(p.file_dtype) +
                (may_be_block_fp8(p) ? " (or F8_E4M3 with 128 x 128 block scales)" : "") +
                ", got " + (e.dtype ? dtype_name(*e.dtype) : e.file_dtype));
    w.tensors_.emplace(p.name, Tensor::from_f32(ckpt.read(it->second).to_f32(), p.shape));
  }
  for (const auto& [name, file_name] : sel) {
    require(used.count(name) != 0, ErrorKind::Io,
            where + "unexpected tensor '" + file_name + "' (not a parameter of a " +
                ratio_str(cfg) + " layer" +
                (name.ends_with(".scale") ? ", nor the block scales of an F8_E4M3 one" : "") + ")");
  }
  return w;
}

void LayerWeights::save(const std::string& path) const {
  check(cfg_);
  TensorMap out;
  for (const ParamInfo& p : params_) {
    const Tensor& src = tensors_.at(p.name);
    if (p.file_dtype == DType::f32) {
      out.emplace(p.name, src);
      continue;
    }
    // bf16: values from random() or load() are already bf16-exact, so this is lossless
    // for them; trained values are rounded to nearest even.
    Tensor t(DType::bf16, p.shape);
    const float* v = src.ptr<float>();
    auto* b = t.ptr<std::uint16_t>();
    for (std::int64_t i = 0; i < t.numel(); ++i) b[i] = float_to_bf16_bits(v[i]);
    out.emplace(p.name, std::move(t));
  }
  save_safetensors(path, out, {{"format", "pt"}});
}

}  // namespace csattn
