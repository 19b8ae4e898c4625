// SeqLayout validation: malformed cu_seqlens are rejected with a message naming the entry.
#include "csattn/layout.hpp"

#include <algorithm>
#include <string>

#include "csattn/error.hpp"

namespace csattn {

namespace {

void check_cumulative(const std::vector<std::int32_t>& cu, const char* name) {
  require(cu.size() >= 2, ErrorKind::InvalidArgument,
          std::string(name) + " needs at least 2 entries (B+1 with B >= 1), got " +
              std::to_string(cu.size()));
  require(cu[0] == 0, ErrorKind::InvalidArgument,
          std::string(name) + "[0] = " + std::to_string(cu[0]) + ", expected 0");
  for (std::size_t i = 1; i < cu.size(); ++i) {
    require(cu[i] >= cu[i - 1], ErrorKind::InvalidArgument,
            std::string(name) + " is not monotone: entry " + std::to_string(i) + " = " +
                std::to_string(cu[i]) + " < entry " + std::to_string(i - 1) + " = " +
                std::to_string(cu[i - 1]));
  }
}

}  // namespace

SeqLayout SeqLayout::thd(std::vector<std::int32_t> cu_seqlens,
                         std::vector<std::int32_t> cu_seqlens_padded) {
  check_cumulative(cu_seqlens, "cu_seqlens");
  SeqLayout l;
  if (cu_seqlens_padded.empty()) cu_seqlens_padded = cu_seqlens;
  check_cumulative(cu_seqlens_padded, "cu_seqlens_padded");
  require(cu_seqlens_padded.size() == cu_seqlens.size(), ErrorKind::InvalidArgument,
          "cu_seqlens_padded has " + std::to_string(cu_seqlens_padded.size()) +
              " entries but cu_seqlens has " + std::to_string(cu_seqlens.size()));
  for (std::size_t b = 0; b + 1 < cu_seqlens.size(); ++b) {
    const int real = cu_seqlens[b + 1] - cu_seqlens[b];
    const int padded = cu_seqlens_padded[b + 1] - cu_seqlens_padded[b];
    require(real <= padded, ErrorKind::InvalidArgument,
            "sequence " + std::to_string(b) + " has real length " + std::to_string(real) +
                " > padded length " + std::to_string(padded));
  }
  l.cu_ = std::move(cu_seqlens);
  l.cu_padded_ = std::move(cu_seqlens_padded);
  return l;
}

SeqLayout SeqLayout::bshd(int batch, int seqlen) {
  require(batch >= 1, ErrorKind::InvalidArgument,
          "batch = " + std::to_string(batch) + " must be >= 1");
  require(seqlen >= 0, ErrorKind::InvalidArgument,
          "seqlen = " + std::to_string(seqlen) + " must be >= 0");
  std::vector<std::int32_t> cu(static_cast<std::size_t>(batch) + 1);
  for (int b = 0; b <= batch; ++b) cu[static_cast<std::size_t>(b)] = b * seqlen;
  return thd(cu);
}

SeqLayout SeqLayout::from_lengths(const std::vector<int>& lengths,
                                  const std::vector<int>& padded_lengths) {
  require(!lengths.empty(), ErrorKind::InvalidArgument, "seqlens is empty");
  require(padded_lengths.empty() || padded_lengths.size() == lengths.size(),
          ErrorKind::InvalidArgument,
          "padded seqlens has " + std::to_string(padded_lengths.size()) +
              " entries but seqlens has " + std::to_string(lengths.size()));
  std::vector<std::int32_t> cu{0}, cup{0};
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    require(lengths[b] >= 0, ErrorKind::InvalidArgument,
            "seqlens[" + std::to_string(b) + "] = " + std::to_string(lengths[b]) +
                " must be >= 0");
    cu.push_back(cu.back() + lengths[b]);
    cup.push_back(cup.back() + (padded_lengths.empty() ? lengths[b] : padded_lengths[b]));
  }
  return thd(cu, padded_lengths.empty() ? std::vector<std::int32_t>{} : cup);
}

void SeqLayout::check_rows(std::int64_t total) const {
  require(!cu_padded_.empty(), ErrorKind::InvalidArgument, "the sequence layout is empty");
  require(cu_padded_.back() == total, ErrorKind::InvalidArgument,
          "the last entry of cu_seqlens" + std::string(has_padding() ? "_padded" : "") +
              " is " + std::to_string(cu_padded_.back()) + " but the batch has " +
              std::to_string(total) + " rows");
}

std::int64_t SeqLayout::real_rows() const {
  std::int64_t n = 0;
  for (int b = 0; b < num_segments(); ++b) n += real_len(b);
  return n;
}

int SeqLayout::max_seg_len() const {
  int m = 0;
  for (int b = 0; b < num_segments(); ++b) m = std::max(m, seg_len(b));
  return m;
}

bool SeqLayout::has_padding() const { return cu_ != cu_padded_; }

}  // namespace csattn
