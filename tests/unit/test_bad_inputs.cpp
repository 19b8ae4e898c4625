// Every bad input gives csattn::Error with a message naming the problem, never a crash.
#include <gtest/gtest.h>

#include <functional>

#include "test_util.hpp"

namespace csattn {
namespace {

using namespace testing_util;

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no csattn::Error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << needle << "'";
  }
}

TEST(BadInputs, MalformedCuSeqlens) {
  expect_error([] { SeqLayout::thd({1, 5, 9}); }, "cu_seqlens[0]");
  expect_error([] { SeqLayout::thd({0, 5, 3}); }, "not monotone");
  expect_error([] { SeqLayout::thd({0}); }, "at least 2");
  expect_error([] { SeqLayout::thd({0, 6, 9}, {0, 5, 9}); }, "real length 6 > padded length 5");
  expect_error([] { SeqLayout::thd({0, 5, 9}, {0, 5}); }, "entries");
  expect_error([] { SeqLayout::from_lengths({4, 5}, {4}); }, "padded seqlens");
  expect_error([] { SeqLayout::from_lengths({-1}); }, "seqlens[0]");
  AttentionConfig cfg = tiny_config(0);
  HybridAttentionLayer layer(cfg, LayerWeights::random(cfg, 1), RunOptions{});
  // Last entry not equal to the row count.
  expect_error([&] { layer.forward(random_tensor(10, cfg.d_model, 2), SeqLayout::thd({0, 4, 9})); },
               "10 rows");
}

TEST(BadInputs, ConfigValues) {
  AttentionConfig c = tiny_config(0);
  c.compress_ratio = 8;
  expect_error([&] { c.validate(); }, "compress ratio 8");
  c = tiny_config(0);
  c.o_groups = 3;
  expect_error([&] { c.validate(); }, "o_groups");
  c = tiny_config(0);
  c.rope_dim = 7;
  expect_error([&] { c.validate(); }, "rope_dim");
  c = tiny_config(0);
  c.rope_dim = 64;
  expect_error([&] { c.validate(); }, "head_dim");
  c = tiny_config(4);
  c.index_head_dim = 24;
  expect_error([&] { c.validate(); }, "power of two");
  c = tiny_config(4);
  c.index_topk = 0;
  expect_error([&] { c.validate(); }, "index_topk");
  c = tiny_config(0);
  c.norm_eps = 0;
  expect_error([&] { c.validate(); }, "norm_eps");
  c = tiny_config(0);
  c.loss_coeff = -1;
  expect_error([&] { c.validate(); }, "loss_coeff");
  expect_error([] { ModelConfig::preset("huge"); }, "unknown preset");
  expect_error([] { ModelConfig::preset("tiny").layer(3); }, "layer 3");
}

TEST(BadInputs, TensorShapes) {
  AttentionConfig cfg = tiny_config(4);
  const LayerWeights w = LayerWeights::random(cfg, 1);
  HybridAttentionLayer layer(cfg, w, RunOptions{});
  const SeqLayout layout = SeqLayout::from_lengths({12});
  expect_error([&] { layer.forward(random_tensor(12, cfg.d_model + 1, 2), layout); },
               "hidden_states");
  const LayerOutputs out = layer.forward(random_tensor(12, cfg.d_model, 2), layout);
  expect_error([&] { layer.backward(out, random_tensor(11, cfg.d_model, 3)); }, "grad_output");
  expect_error([&] { layer.backward(LayerOutputs{}, random_tensor(12, cfg.d_model, 3)); },
               "forward");
  // A forced selection that points at an invisible entry or has the wrong shape.
  std::vector<std::int32_t> sel(12 * 3, -1);
  sel[0] = 0;  // row 0 sees no compressed entry
  expect_error([&] { layer.forward(random_tensor(12, cfg.d_model, 2), layout,
                                   Tensor::from_i32(sel, {12, 3})); }, "topk[0, 0]");
  expect_error([&] { layer.forward(random_tensor(12, cfg.d_model, 2), layout,
                                   Tensor::from_i32(std::vector<std::int32_t>(12, -1), {12, 1})); },
               "topk has shape");
  // Weights of another config.
  AttentionConfig other = tiny_config(128);
  expect_error([&] { HybridAttentionLayer(other, w, RunOptions{}); }, "attn.");
  // Without a GPU (or a CUDA build) a cuda layer is refused with the reason.
  if (!cuda_available())
    expect_error([&] { HybridAttentionLayer(cfg, w, RunOptions{Precision::bf16, Device::cuda}); },
                 "cuda");
  // The GPU computes in bf16 only.
  if (cuda_available())
    expect_error([&] { HybridAttentionLayer(cfg, w, RunOptions{Precision::fp32, Device::cuda}); },
                 "bf16");
}

}  // namespace
}  // namespace csattn
