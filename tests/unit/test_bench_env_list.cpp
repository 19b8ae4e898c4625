// The benchmarks' list variables (bench/env_list.hpp): the defaults when unset or empty, the
// listed values in order, and a named error for every malformed list.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "env_list.hpp"

namespace csattn {
namespace {

constexpr const char* kVar = "CSATTN_TEST_BENCH_LIST";

std::vector<int> read(const char* value, int min_value = 1, int multiple_of = 1) {
  if (value == nullptr)
    unsetenv(kVar);
  else
    setenv(kVar, value, 1);
  return bench::int_list_from_env(kVar, {7, 9}, "token counts", min_value, multiple_of);
}

TEST(BenchEnvList, UnsetOrEmptyGivesTheDefaults) {
  EXPECT_EQ(read(nullptr), (std::vector<int>{7, 9}));
  EXPECT_EQ(read(""), (std::vector<int>{7, 9}));
  unsetenv(kVar);
}

TEST(BenchEnvList, ValuesInTheirOrder) {
  EXPECT_EQ(read("16384,4096,131072"), (std::vector<int>{16384, 4096, 131072}));
  EXPECT_EQ(read("0,128", 0), (std::vector<int>{0, 128}));
  EXPECT_EQ(read("4096, 8192"), (std::vector<int>{4096, 8192}));  // (a space after a comma)
  EXPECT_EQ(read("32768", 1, 4), (std::vector<int>{32768}));
  unsetenv(kVar);
}

TEST(BenchEnvList, MalformedListsAreErrorsNamingTheVariable) {
  for (const char* bad : {",", "1,", ",1", "1,,2", "12k", "-4", "0", "16777216"}) {
    SCOPED_TRACE(bad);
    try {
      read(bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(kVar), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("token counts"), std::string::npos) << e.what();
    }
  }
  try {
    read("4098", 1, 4);
    ADD_FAILURE() << "accepted 4098 as a multiple of 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("divisible by 4"), std::string::npos) << e.what();
  }
  unsetenv(kVar);
}

}  // namespace
}  // namespace csattn
