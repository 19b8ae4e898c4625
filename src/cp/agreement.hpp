// The agreement step that opens every collective CP call: the ranks all-gather a small
// record (checksums of what must be identical on every rank, plus the rank's own argument
// errors) and all take the same decision from the same records, so a disagreement or a bad
// argument on one rank becomes the same csattn::Error on every rank instead of a hang in a
// later collective.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "csattn/comm.hpp"
#include "csattn/config.hpp"
#include "csattn/layout.hpp"
#include "csattn/weights.hpp"

namespace csattn::cp {

// FNV-1a, 64 bit.
std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t h = 1469598103934665603ull);
std::uint64_t checksum(const std::vector<std::int32_t>& v);
std::uint64_t checksum(const AttentionConfig& cfg);
std::uint64_t checksum(const LayerWeights& w);

struct AgreementItem {
  const char* what;     // "cu_seqlens", "the layer config", ...
  std::uint64_t value;  // must be equal on every rank
};

// Collective. `local_error` is this rank's own problem ("" if none). Throws the same
// csattn::Error on every rank when any rank reported an error (the lowest such rank's
// message) or when an item differs between ranks.
void agree(Communicator& comm, const char* operation, const std::vector<AgreementItem>& items,
           const std::string& local_error);

}  // namespace csattn::cp
