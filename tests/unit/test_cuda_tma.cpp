// bf16_rows_tensor_map and bf16_heads_tensor_map (src/cuda/tma.hpp), the TMA descriptors the
// wgmma indexer loads its key tiles through and the wgmma attention forward stores O through:
// bad shapes are refused on the host before the driver is asked (no GPU needed), and on a GPU
// a good map encodes while a misaligned base is refused by the driver with the reason. (What
// the maps move is checked by the indexer's and the forward's own tests, value for value.)
#ifdef CSATTN_HAVE_CUDA
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "csattn/error.hpp"
#include "cuda/tma.hpp"
#include "cuda_test_util.hpp"
#include "test_util.hpp"

namespace csattn {
namespace {

using cuda::bf16;
using cuda::bf16_rows_tensor_map;

ErrorKind kind_of(long rows, int cols, int box_rows, int box_cols, const bf16* base,
                  std::string* message = nullptr) {
  try {
    (void)bf16_rows_tensor_map(base, rows, cols, box_rows, box_cols);
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.kind();
  }
  ADD_FAILURE() << "no error for " << rows << " x " << cols << ", box " << box_rows << " x " << box_cols;
  return ErrorKind::Internal;
}

TEST(TmaMap, BadShapesAreRefusedBeforeTheDriver) {
  // Any non-null, 16-byte aligned address: the checks come before the driver sees it.
  const bf16* base = reinterpret_cast<const bf16*>(static_cast<std::uintptr_t>(1) << 20);
  std::string message;
  EXPECT_EQ(kind_of(0, 128, 64, 64, base, &message), ErrorKind::InvalidArgument);
  EXPECT_NE(message.find("0 x 128"), std::string::npos) << message;
  EXPECT_EQ(kind_of(-5, 128, 64, 64, base), ErrorKind::InvalidArgument);
  EXPECT_EQ(kind_of(100, 0, 64, 64, base), ErrorKind::InvalidArgument);
  EXPECT_EQ(kind_of(100, 128, 64, 32, base), ErrorKind::InvalidArgument);   // not 128 bytes wide
  EXPECT_EQ(kind_of(100, 128, 64, 128, base), ErrorKind::InvalidArgument);  // 256 bytes wide
  EXPECT_EQ(kind_of(100, 128, 0, 64, base), ErrorKind::InvalidArgument);
  EXPECT_EQ(kind_of(100, 128, 257, 64, base), ErrorKind::InvalidArgument);  // TMA boxes <= 256
}

TEST(TmaMap, BadHeadsShapesAreRefusedBeforeTheDriver) {
  bf16* base = reinterpret_cast<bf16*>(static_cast<std::uintptr_t>(1) << 20);
  auto kind = [&](long tokens, int heads, int cols, int box_heads, int box_cols) {
    try {
      (void)cuda::bf16_heads_tensor_map(base, tokens, heads, cols, box_heads, box_cols);
    } catch (const Error& e) {
      return e.kind();
    }
    ADD_FAILURE() << "no error for " << tokens << " x " << heads << " x " << cols;
    return ErrorKind::Internal;
  };
  EXPECT_EQ(kind(0, 64, 512, 8, 64), ErrorKind::InvalidArgument);
  EXPECT_EQ(kind(10, 0, 512, 8, 64), ErrorKind::InvalidArgument);
  EXPECT_EQ(kind(10, 64, 0, 8, 64), ErrorKind::InvalidArgument);
  EXPECT_EQ(kind(10, 64, 512, 8, 32), ErrorKind::InvalidArgument);   // not 128 bytes wide
  EXPECT_EQ(kind(10, 64, 512, 0, 64), ErrorKind::InvalidArgument);
  EXPECT_EQ(kind(10, 64, 512, 257, 64), ErrorKind::InvalidArgument);  // TMA boxes <= 256
}

TEST(TmaMap, EncodesAGoodMapAndRefusesAMisalignedBase) {
  SKIP_WITHOUT_GPU();
  testing_util::DeviceArray<std::uint16_t> keys(1000 * 128 + 8);
  const bf16* base = reinterpret_cast<const bf16*>(keys.get());
  EXPECT_NO_THROW((void)bf16_rows_tensor_map(base, 1000, 128, 64, 64));
  EXPECT_NO_THROW((void)bf16_rows_tensor_map(base, 1000, 64, 64, 64));
  std::string message;
  EXPECT_EQ(kind_of(1000, 128, 64, 64, base + 1, &message), ErrorKind::Unsupported);  // 2-byte aligned
  EXPECT_NE(message.find("16-byte aligned"), std::string::npos) << message;
  bf16* out = reinterpret_cast<bf16*>(keys.get());
  EXPECT_NO_THROW((void)cuda::bf16_heads_tensor_map(out, 100, 20, 512, 8, 64));  // 20 heads: partial boxes
  try {
    (void)cuda::bf16_heads_tensor_map(out + 4, 100, 20, 512, 8, 64);  // 8-byte aligned
    ADD_FAILURE() << "a misaligned heads map was encoded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported) << e.what();
  }
}

}  // namespace
}  // namespace csattn
#endif  // CSATTN_HAVE_CUDA
