// CpPartition and pad_for_context_parallel: which rows each rank owns.
#include <algorithm>
#include <string>

#include "csattn/cp.hpp"
#include "csattn/error.hpp"

namespace csattn {

const char* cp_mode_name(CpMode mode) {
  return mode == CpMode::contiguous ? "contiguous" : "two_chunk";
}

CpMode parse_cp_mode(const std::string& name) {
  if (name == "contiguous") return CpMode::contiguous;
  if (name == "two_chunk") return CpMode::two_chunk;
  throw Error(ErrorKind::InvalidArgument,
              "unknown context-parallel mode '" + name + "': expected contiguous or two_chunk");
}

namespace {

std::int64_t round_up(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }

void add_piece(std::vector<RowPiece>& pieces, std::int64_t begin, std::int64_t end) {
  if (end <= begin) return;
  if (!pieces.empty() && pieces.back().end == begin) {
    pieces.back().end = end;  // touching pieces merge
    return;
  }
  pieces.push_back({begin, end});
}

}  // namespace

CpPartition CpPartition::build(const SeqLayout& layout, CpMode mode, int ranks) {
  require(ranks >= 1, ErrorKind::InvalidArgument,
          "context parallelism needs at least 1 rank, got " + std::to_string(ranks));
  const std::int64_t T = layout.total_rows();
  require(T >= 1, ErrorKind::InvalidArgument,
          "the batch has no rows: context parallelism needs at least one row");
  CpPartition p;
  p.layout_ = layout;
  p.mode_ = mode;
  p.ranks_ = ranks;
  p.pieces_.resize(static_cast<std::size_t>(ranks));
  const std::string pad_hint = " (cu_seqlens_padded; real lengths stay, added rows are padding)";
  if (mode == CpMode::contiguous) {
    require(T % ranks == 0, ErrorKind::InvalidArgument,
            "contiguous partition over " + std::to_string(ranks) +
                " ranks needs the total row count to be a multiple of " +
                std::to_string(ranks) + ", got " + std::to_string(T) +
                " rows: pad the last sequence by " + std::to_string(round_up(T, ranks) - T) +
                " rows to " + std::to_string(round_up(T, ranks)) + " rows in all" + pad_hint);
    const std::int64_t L = T / ranks;
    for (int r = 0; r < ranks; ++r) add_piece(p.pieces_[static_cast<std::size_t>(r)], r * L, (r + 1) * L);
  } else {
    const int chunks = 2 * ranks;
    for (int s = 0; s < layout.num_segments(); ++s) {
      const int n = layout.seg_len(s);
      require(n % chunks == 0, ErrorKind::InvalidArgument,
              "two_chunk partition over " + std::to_string(ranks) +
                  " ranks cuts every sequence into 2P = " + std::to_string(chunks) +
                  " equal chunks, so every padded length must be a multiple of " +
                  std::to_string(chunks) + ": sequence " + std::to_string(s) +
                  " has padded length " + std::to_string(n) + "; pad it to " +
                  std::to_string(round_up(n, chunks)) + pad_hint);
    }
    for (int s = 0; s < layout.num_segments(); ++s) {
      const std::int64_t start = layout.seg_start(s), c = layout.seg_len(s) / chunks;
      for (int r = 0; r < ranks; ++r) {
        auto& pieces = p.pieces_[static_cast<std::size_t>(r)];
        add_piece(pieces, start + r * c, start + (r + 1) * c);
        const int mirror = chunks - 1 - r;
        add_piece(pieces, start + mirror * c, start + (mirror + 1) * c);
      }
    }
  }
  p.row_owner_.assign(static_cast<std::size_t>(T), -1);
  p.row_local_.assign(static_cast<std::size_t>(T), -1);
  for (int r = 0; r < ranks; ++r) {
    int local = 0;
    for (const RowPiece& piece : p.pieces_[static_cast<std::size_t>(r)])
      for (std::int64_t g = piece.begin; g < piece.end; ++g) {
        p.row_owner_[static_cast<std::size_t>(g)] = r;
        p.row_local_[static_cast<std::size_t>(g)] = local++;
      }
  }
  for (std::int64_t g = 0; g < T; ++g)
    require(p.row_owner_[static_cast<std::size_t>(g)] >= 0, ErrorKind::Internal,
            "partition leaves row " + std::to_string(g) + " without an owner");
  return p;
}

const std::vector<RowPiece>& CpPartition::pieces(int rank) const {
  require(rank >= 0 && rank < ranks_, ErrorKind::InvalidArgument,
          "rank " + std::to_string(rank) + " of a partition over " + std::to_string(ranks_) +
              " ranks");
  return pieces_[static_cast<std::size_t>(rank)];
}

std::int64_t CpPartition::local_rows(int rank) const {
  std::int64_t n = 0;
  for (const RowPiece& piece : pieces(rank)) n += piece.size();
  return n;
}

std::vector<int> CpPartition::rows(int rank) const {
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(local_rows(rank)));
  for (const RowPiece& piece : pieces(rank))
    for (std::int64_t g = piece.begin; g < piece.end; ++g) out.push_back(static_cast<int>(g));
  return out;
}

SeqLayout pad_for_context_parallel(const SeqLayout& layout, CpMode mode, int ranks,
                                   int min_local_rows) {
  require(ranks >= 1, ErrorKind::InvalidArgument,
          "context parallelism needs at least 1 rank, got " + std::to_string(ranks));
  const int B = layout.num_segments();
  std::vector<int> real(static_cast<std::size_t>(B)), padded(static_cast<std::size_t>(B));
  for (int s = 0; s < B; ++s) {
    real[static_cast<std::size_t>(s)] = layout.real_len(s);
    padded[static_cast<std::size_t>(s)] = layout.seg_len(s);
  }
  if (mode == CpMode::two_chunk) {
    for (int& n : padded) n = static_cast<int>(round_up(n, 2 * ranks));
  } else {
    const std::int64_t T = layout.total_rows();
    const std::int64_t target =
        round_up(std::max<std::int64_t>({T, std::int64_t{ranks} * std::max(min_local_rows, 0),
                                         std::int64_t{1}}),
                 ranks);
    padded.back() += static_cast<int>(target - T);
  }
  return SeqLayout::from_lengths(real, padded);
}

}  // namespace csattn
