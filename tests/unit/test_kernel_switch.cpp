// The kernel-choice environment variables (cuda/kernel_switch.hpp): unset or empty is the
// default, an allowed value comes back, anything else throws naming the variable, the value
// and the allowed ones (a typo must not silently measure the default kernel). Host only.
#ifdef CSATTN_HAVE_CUDA
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "csattn/error.hpp"
#include "cuda/kernel_switch.hpp"

namespace csattn {
namespace {

constexpr const char* kVar = "CSATTN_TEST_KERNEL_SWITCH";

TEST(KernelSwitch, UnsetOrEmptyIsTheDefault) {
  unsetenv(kVar);
  EXPECT_EQ(cuda::kernel_switch(kVar, {"mma", "baseline"}), "");
  setenv(kVar, "", 1);
  EXPECT_EQ(cuda::kernel_switch(kVar, {"mma", "baseline"}), "");
  unsetenv(kVar);
}

TEST(KernelSwitch, AllowedValuesComeBack) {
  for (const char* v : {"mma", "baseline"}) {
    setenv(kVar, v, 1);
    EXPECT_EQ(cuda::kernel_switch(kVar, {"mma", "baseline"}), v);
  }
  unsetenv(kVar);
}

TEST(KernelSwitch, UnknownValuesThrowNamingTheChoices) {
  for (const char* v : {"mmaa", "MMA", "default", "wgmma "}) {
    setenv(kVar, v, 1);
    try {
      cuda::kernel_switch(kVar, {"mma", "baseline"});
      ADD_FAILURE() << v << " was accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string(kVar) + "=" + v), std::string::npos) << m;
      EXPECT_NE(m.find("mma, baseline"), std::string::npos) << m;
    }
  }
  unsetenv(kVar);
}

}  // namespace
}  // namespace csattn
#endif  // CSATTN_HAVE_CUDA
