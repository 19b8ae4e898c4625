// AttentionConfig::indexer_precision: names, validation (MXFP8 needs index_head_dim % 32 ==
// 0, any head count; only layers with an indexer care), and the config.json mapping (a run
// option, not a model key).
#include <gtest/gtest.h>

#include "csattn/config.hpp"
#include "csattn/error.hpp"

namespace csattn {
namespace {

TEST(IndexerPrecisionConfig, Names) {
  EXPECT_EQ(parse_indexer_precision("bf16", "x"), IndexerPrecision::bf16);
  EXPECT_EQ(parse_indexer_precision("mxfp8", "x"), IndexerPrecision::mxfp8);
  EXPECT_STREQ(indexer_precision_name(IndexerPrecision::mxfp8), "mxfp8");
  EXPECT_STREQ(indexer_precision_name(IndexerPrecision::bf16), "bf16");
  try {
    (void)parse_indexer_precision("MXFP8", "--indexer-precision");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--indexer-precision"), std::string::npos);
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
  }
}

TEST(IndexerPrecisionConfig, Mxfp8NeedsHeadDimMultipleOf32) {
  AttentionConfig c = ModelConfig::preset("tiny").base;
  c.compress_ratio = 4;
  c.indexer_precision = IndexerPrecision::mxfp8;
  EXPECT_NO_THROW(c.validate());  // 4 heads x 32: not DeepSeek's 64 x 128, and fine
  c.index_head_dim = 16;
  try {
    c.validate();
    ADD_FAILURE() << "index_head_dim 16 accepted for mxfp8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("index_head_dim"), std::string::npos) << e.what();
  }
  c.indexer_precision = IndexerPrecision::bf16;
  EXPECT_NO_THROW(c.validate());
  c.indexer_precision = IndexerPrecision::mxfp8;
  c.compress_ratio = 128;  // HCA: no indexer, nothing to quantize
  EXPECT_NO_THROW(c.validate());
}

TEST(IndexerPrecisionConfig, NotAConfigJsonKey) {
  ModelConfig m = ModelConfig::preset("tiny");
  m.base.indexer_precision = IndexerPrecision::mxfp8;
  EXPECT_EQ(m.to_hf_json().find("precision"), std::string::npos);
  const ModelConfig back = ModelConfig::from_hf_json_text(m.to_hf_json(), m);
  EXPECT_EQ(back.base.indexer_precision, IndexerPrecision::mxfp8);  // kept from defaults
  EXPECT_EQ(back.layer(1).indexer_precision, IndexerPrecision::mxfp8);
}

}  // namespace
}  // namespace csattn
