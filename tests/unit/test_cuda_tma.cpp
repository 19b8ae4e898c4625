// bf16_rows_tensor_map (src/cuda/tma.hpp), the TMA descriptor the wgmma indexer loads its key
// tiles through: bad shapes are refused on the host before the driver is asked (no GPU
// needed), and on a GPU a good map encodes while a misaligned base is refused by the driver
// with the reason. (What the map loads is checked by the indexer's own tests, id for id.)
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

TEST(TmaMap, EncodesAGoodMapAndRefusesAMisalignedBase) {
  SKIP_WITHOUT_GPU();
  testing_util::DeviceArray<std::uint16_t> keys(1000 * 128 + 8);
  const bf16* base = reinterpret_cast<const bf16*>(keys.get());
  EXPECT_NO_THROW((void)bf16_rows_tensor_map(base, 1000, 128, 64, 64));
  EXPECT_NO_THROW((void)bf16_rows_tensor_map(base, 1000, 64, 64, 64));
  std::string message;
  EXPECT_EQ(kind_of(1000, 128, 64, 64, base + 1, &message), ErrorKind::Unsupported);  // 2-byte aligned
  EXPECT_NE(message.find("16-byte aligned"), std::string::npos) << message;
}

}  // namespace
}  // namespace csattn
#endif  // CSATTN_HAVE_CUDA
