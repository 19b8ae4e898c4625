// Context parallelism (spec 02, issue 4): the packed batch's rows are split over the ranks of
// a Communicator and every rank computes the layer for its own rows, with results equal to
// the single-rank layer's rows (bit for bit in the fp32 forward).
//
// Each rank owns a list of row pieces (CpPartition). `contiguous` gives rank r the rows
// [r*L, (r+1)*L) (Megatron's mode); `two_chunk` splits every sequence into 2P equal chunks
// and gives rank r chunks r and 2P-1-r, which balances the causal cost of long sequences.
// Per layer, every piece needs the D_w = max(window, D_c) hidden rows before it (the halo,
// from whichever ranks own them); compressed groups belong to the rank holding their last
// row, are all-gathered rank-major and found through the sequence-major map; gradients go
// back the same ways (halo gradients summed into their owners' rows, reduce-scatter for the
// compressed rows). docs/design.md walks through a two_chunk example.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "csattn/comm.hpp"
#include "csattn/config.hpp"
#include "csattn/layer.hpp"
#include "csattn/layout.hpp"
#include "csattn/tensor.hpp"
#include "csattn/weights.hpp"

namespace csattn {

enum class CpMode { contiguous, two_chunk };
const char* cp_mode_name(CpMode mode);             // "contiguous", "two_chunk"
CpMode parse_cp_mode(const std::string& name);     // throws csattn::Error naming the choices

// Global rows [begin, end).
struct RowPiece {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
};

// Which rows every rank owns, from global metadata only (identical on every rank, no
// communication). Length rules, checked by build() with an error that says what to pad:
//  - contiguous: the total row count T (cu_seqlens_padded[-1]) is a multiple of P;
//  - two_chunk: every sequence's padded length is a multiple of 2P (empty sequences are
//    fine): a sequence of length n is cut into 2P chunks of n/(2P) rows.
// pad_for_context_parallel() produces a layout that satisfies them.
class CpPartition {
 public:
  CpPartition() = default;
  static CpPartition build(const SeqLayout& layout, CpMode mode, int ranks);

  const SeqLayout& layout() const { return layout_; }
  CpMode mode() const { return mode_; }
  int ranks() const { return ranks_; }
  std::int64_t total_rows() const { return layout_.total_rows(); }
  // Ascending; pieces that touch are merged (two_chunk: chunk P-1 and P of a sequence on
  // rank P-1, or the last chunk of one sequence and the first of the next on rank 0).
  const std::vector<RowPiece>& pieces(int rank) const;
  std::int64_t local_rows(int rank) const;
  // The global rows of a rank in local order (ascending).
  std::vector<int> rows(int rank) const;
  int owner(std::int64_t row) const { return row_owner_[static_cast<std::size_t>(row)]; }
  // The row's index among its owner's local rows.
  int local_index(std::int64_t row) const { return row_local_[static_cast<std::size_t>(row)]; }

 private:
  SeqLayout layout_;
  CpMode mode_ = CpMode::contiguous;
  int ranks_ = 1;
  std::vector<std::vector<RowPiece>> pieces_;
  std::vector<int> row_owner_, row_local_;
};

// The smallest padding of `layout` that `mode` accepts on `ranks` ranks. Real lengths are
// kept, so every added row is a padding row (it changes no real row's result, no gradient
// and not the loss). two_chunk: every padded sequence length is rounded up to a multiple of
// 2P. contiguous: the last sequence's padding grows until T is a multiple of P and at least
// P * min_local_rows (pass D_w to satisfy the halo rule below).
SeqLayout pad_for_context_parallel(const SeqLayout& layout, CpMode mode, int ranks,
                                   int min_local_rows = 0);

// Per layer and rank: the work and the traffic, for load-balance reports.
struct CpWork {
  std::int64_t local_rows = 0;
  std::int64_t halo_rows = 0;          // rows received before the pieces
  std::int64_t owned_compressed = 0;   // compressed groups this rank computes
  std::int64_t compressed_slots = 0;   // C, the per-rank slots of the all-gather
  std::int64_t attention_pairs = 0;    // (query, key) pairs of the attention
  double attention_flops = 0.0;        // forward: 4 * H * D per pair (QK^T and PV)
  std::int64_t indexer_pairs = 0;      // (query, candidate) pairs the indexer scores
  CommStats forward_comm;              // this rank's traffic in the forward
};

struct CpSavedActivations;  // backend-private state kept for backward

struct CpLayerOutputs {
  Tensor output;          // [local rows, d_model] f32, this rank's rows in local order
  Tensor topk_indices;    // CSA: [local rows, index_topk] i32, as the single-rank rows
  float indexer_loss = 0.0f;  // this rank's share: the sum over ranks is the CP=1 loss
  CpWork work;
  std::shared_ptr<const CpSavedActivations> saved;
};

struct CpLayerGradients {
  Tensor grad_input;                    // [local rows, d_model]: the rows' full gradients
  std::map<std::string, Tensor> grad;  // this rank's share: summed over ranks = CP=1
  CommStats backward_comm;
};

// Where forward_device writes this rank's results (device memory; topk and loss optional).
struct CpDeviceOutputs {
  void* y = nullptr;             // bf16 [local rows, d_model]
  std::int32_t* topk = nullptr;  // CSA: i32 [local rows, index_topk]
  float* loss = nullptr;         // one float: this rank's share of the indexer loss
};

struct CpLayerOptions {
  // Fill the compressed slots no rank owns (and the halo buffer before it is filled) with
  // NaN instead of zeros: a reference to them then poisons the result. For tests.
  bool poison_unused = false;
};

namespace cuda { class CudaCpLayer; }

// One attention layer under context parallelism. forward and backward are collective: every
// rank of `comm` calls them, in the same order, with the same partition, config and weights.
// Before any other collective the ranks all-gather a checksum of the layout, the partition,
// the config and the weights plus their local argument checks, so a disagreement or a bad
// local argument gives every rank the same csattn::Error instead of a hang.
// With RunOptions::device = cuda the rank runs on the CUDA device current when the layer is
// constructed (bf16 only), with a communicator that takes device buffers (NCCL, or the
// in-process group for ranks sharing one GPU); the activations stay on the device between
// forward and backward, and backward must follow the forward it differentiates. A contiguous
// partition additionally needs L = T/P >= D_w (the halo comes from one neighbour, as in the
// spec); two_chunk takes its halo from as many ranks as needed.
class ContextParallelLayer {
 public:
  ContextParallelLayer(AttentionConfig cfg, LayerWeights weights, RunOptions options = {},
                       CpLayerOptions cp_options = {});

  // x_local: [partition.local_rows(comm.rank()), d_model], this rank's rows in local order.
  CpLayerOutputs forward(Communicator& comm, const CpPartition& partition,
                         const Tensor& x_local) const;
  CpLayerGradients backward(Communicator& comm, const CpLayerOutputs& fwd,
                            const Tensor& grad_output_local, float grad_indexer_loss = 1.0f) const;

  // Device memory in and out (RunOptions::device = cuda), for frameworks that own tensors
  // and streams: x_local bf16 [local rows, d_model] on the layer's device; out.y bf16 of the
  // same shape, out.topk i32 [local rows, index_topk] and out.loss (one float, this rank's
  // share) - both optional (null). `stream` is a cudaStream_t (null: the default stream):
  // the layer's work starts after what `stream` has queued and `stream` waits for it
  // (events; the host never waits on `stream`). The call returns after its collectives have
  // run (they wait on the host), so it cannot be captured in a CUDA graph. Collective.
  void forward_device(Communicator& comm, const CpPartition& partition, const void* x_local,
                      const CpDeviceOutputs& out, void* stream = nullptr) const;
  // The gradients of the last forward_device: dy_local bf16, dx_local fp32, both [local
  // rows, d_model]. The layer reads x_local / dy_local and writes y / dx_local in place (no
  // copies of the rank's rows): all four 4-byte aligned. The weight gradients (this rank's share, fp32) stay on the device until
  // the next backward: device_gradients(), by release name. Collective.
  // grad_indexer_loss_on_device: the loss's upstream gradient as a device float, read by the
  // kernels instead of grad_indexer_loss (as DeviceLayer::backward: no host read; ready on
  // `stream`, valid until the backward has run there).
  void backward_device(Communicator& comm, const void* dy_local, float* dx_local,
                       float grad_indexer_loss = 1.0f, void* stream = nullptr,
                       const float* grad_indexer_loss_on_device = nullptr) const;
  std::map<std::string, const float*> device_gradients() const;

  const AttentionConfig& config() const { return cfg_; }
  const LayerWeights& weights() const { return weights_; }
  const RunOptions& options() const { return options_; }
  // D_c (compressor left context: 8 for m = 4, m for m = 128, 0 for SWA) and D_w.
  int halo_rows() const;

 private:
  AttentionConfig cfg_;
  LayerWeights weights_;
  RunOptions options_;
  CpLayerOptions cp_options_;
  std::uint64_t weights_checksum_ = 0;
  // Device cuda: the rank's GPU layer (created on the current device by the constructor).
  std::shared_ptr<cuda::CudaCpLayer> gpu_;
  // The layout checksum of the last forward_device (0: none yet); backward_device agrees on it.
  mutable std::uint64_t device_layout_ = 0;

  void agree_forward(Communicator& comm, const CpPartition& part,
                     const std::string& local_error) const;
};

// ---- moving global tensors in and out of the local row order ----

// Rows of a [T, ...] tensor that `rank` owns, in local order.
Tensor local_rows_of(const Tensor& global, const CpPartition& partition, int rank);
// Collective: rank `root` gets the global [T, cols] tensor assembled from every rank's local
// rows; the other ranks get an empty tensor. f32 and i32 tensors.
Tensor gather_rows(Communicator& comm, const CpPartition& partition, const Tensor& local,
                   int root = 0);
// Collective: every f32 tensor summed over the ranks, in place, in map order.
void all_reduce_sum(Communicator& comm, std::map<std::string, Tensor>& tensors);

}  // namespace csattn
