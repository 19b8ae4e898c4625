#include "cp/agreement.hpp"

#include <algorithm>
#include <cstring>

#include "csattn/error.hpp"

namespace csattn::cp {

std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::uint64_t checksum(const std::vector<std::int32_t>& v) {
  const std::uint64_t n = v.size();
  return fnv1a(v.data(), v.size() * sizeof(std::int32_t), fnv1a(&n, sizeof(n)));
}

namespace {

// Folds one field's bytes into the hash (its size first, so adjacent fields cannot alias).
template <typename T>
void mix(std::uint64_t& h, const T& v) {
  const std::uint64_t n = sizeof(T);
  h = fnv1a(&v, sizeof(T), fnv1a(&n, sizeof(n), h));
}

}  // namespace

std::uint64_t checksum(const AttentionConfig& c) {
  // Field by field, no text formatting: the ranks run the same build, so equal configs have
  // equal bytes (doubles compared bitwise, which is what "the same config" means here).
  std::uint64_t h = 1469598103934665603ull;
  for (int v : {c.d_model, c.n_heads, c.head_dim, c.rope_dim, c.q_lora_rank, c.o_groups,
                c.o_lora_rank, c.window, c.compress_ratio, c.index_n_heads, c.index_head_dim,
                c.index_topk, c.yarn_original_max_pos})
    mix(h, v);
  for (double v : {c.rope_theta, c.compress_rope_theta, c.yarn_factor, c.yarn_beta_fast,
                   c.yarn_beta_slow, c.norm_eps, c.loss_coeff})
    mix(h, v);
  for (bool v : {c.sparse_loss, c.per_token_loss}) mix(h, static_cast<unsigned char>(v));
  mix(h, static_cast<int>(c.indexer_precision));
  return h;
}

std::uint64_t checksum(const LayerWeights& w) {
  std::uint64_t h = 1469598103934665603ull;
  for (const ParamInfo& p : w.params()) {
    h = fnv1a(p.name.data(), p.name.size(), h);
    const Tensor& t = w.get(p.name);
    h = fnv1a(t.data(), t.nbytes(), h);
  }
  return h;
}

namespace {

constexpr std::size_t kItems = 8;
constexpr std::size_t kMessageWords = 48;  // 384 bytes of error text
constexpr std::size_t kRecordWords = 1 + kItems + kMessageWords;

}  // namespace

void agree(Communicator& comm, const char* operation, const std::vector<AgreementItem>& items,
           const std::string& local_error) {
  require(items.size() <= kItems, ErrorKind::Internal, "too many agreement items");
  const int P = comm.size();
  std::vector<std::int64_t> mine(kRecordWords, 0), all(kRecordWords * static_cast<std::size_t>(P));
  mine[0] = local_error.empty() ? 0 : 1;
  for (std::size_t i = 0; i < items.size(); ++i)
    std::memcpy(&mine[1 + i], &items[i].value, sizeof(std::uint64_t));
  const std::size_t n = std::min(local_error.size(), kMessageWords * 8 - 1);
  std::memcpy(&mine[1 + kItems], local_error.data(), n);
  comm.all_gather_host(mine.data(), mine.size(), all.data());  // NCCL too

  const std::string prefix = std::string(operation) + ": ";
  for (int r = 0; r < P; ++r) {
    const std::int64_t* rec = all.data() + static_cast<std::size_t>(r) * kRecordWords;
    if (rec[0] == 0) continue;
    const char* text = reinterpret_cast<const char*>(rec + 1 + kItems);
    throw Error(ErrorKind::InvalidArgument,
                prefix + "rank " + std::to_string(r) + " of " + std::to_string(P) + ": " +
                    std::string(text, strnlen(text, kMessageWords * 8)));
  }
  for (std::size_t i = 0; i < items.size(); ++i)
    for (int r = 1; r < P; ++r)
      if (all[static_cast<std::size_t>(r) * kRecordWords + 1 + i] != all[1 + i])
        throw Error(ErrorKind::InvalidArgument,
                    prefix + "the ranks disagree on " + items[i].what + ": rank " +
                        std::to_string(r) + " differs from rank 0 (every rank must pass the " +
                        "same global value)");
}

}  // namespace csattn::cp
