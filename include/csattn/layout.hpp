// SeqLayout: how rows of a packed (THD) batch split into sequences. BSHD is THD with equal
// lengths. Physical geometry (positions, windows, compression blocks) comes from the padded
// cumulative lengths; the real ones only mark padding rows (for the loss).
#pragma once
#include <cstdint>
#include <vector>

namespace csattn {

class SeqLayout {
 public:
  SeqLayout() = default;
  // cu_seqlens: B+1 real cumulative lengths. cu_seqlens_padded: B+1 physical cumulative
  // lengths (empty = no padding). Validates both.
  static SeqLayout thd(std::vector<std::int32_t> cu_seqlens,
                       std::vector<std::int32_t> cu_seqlens_padded = {});
  static SeqLayout bshd(int batch, int seqlen);  // B equal-length sequences
  static SeqLayout from_lengths(const std::vector<int>& lengths,
                                const std::vector<int>& padded_lengths = {});

  // Throws csattn::Error unless the layout covers exactly total_rows rows.
  void check_rows(std::int64_t total_rows) const;

  int num_segments() const { return static_cast<int>(cu_.size()) - 1; }
  std::int64_t total_rows() const { return cu_padded_.empty() ? 0 : cu_padded_.back(); }
  std::int64_t real_rows() const;               // sum of real lengths
  int seg_start(int b) const { return cu_padded_[b]; }
  int seg_len(int b) const { return cu_padded_[b + 1] - cu_padded_[b]; }  // physical
  int real_len(int b) const { return cu_[b + 1] - cu_[b]; }
  int max_seg_len() const;
  bool has_padding() const;
  const std::vector<std::int32_t>& cu_seqlens() const { return cu_; }
  const std::vector<std::int32_t>& cu_seqlens_padded() const { return cu_padded_; }

 private:
  std::vector<std::int32_t> cu_;         // real
  std::vector<std::int32_t> cu_padded_;  // physical (== cu_ when unpadded)
};

}  // namespace csattn
