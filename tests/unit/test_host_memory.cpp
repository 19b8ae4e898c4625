// retain_freed_host_memory: after it, a large block freed and allocated again is served from
// the pages already touched (no new page faults), which is the whole point; without it glibc
// maps such a block afresh and every page faults again.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cstdlib>  // defines __GLIBC__ where the C library is glibc

#include "csattn/host_memory.hpp"

namespace csattn {
namespace {

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Allocates `bytes`, writes every page, frees; returns the minor page faults it took.
long faults_of_touching(std::size_t bytes) {
  const long before = minor_faults();
  auto* p = static_cast<unsigned char*>(std::malloc(bytes));
  if (p == nullptr) return -1;
  for (std::size_t i = 0; i < bytes; i += 4096) p[i] = static_cast<unsigned char>(i);
  volatile unsigned char sink = p[bytes / 2];
  (void)sink;
  std::free(p);
  return minor_faults() - before;
}

TEST(HostMemory, FreedLargeBlocksAreReusedWithoutPageFaults) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "not glibc: retain_freed_host_memory has nothing to set";
#else
  ASSERT_TRUE(retain_freed_host_memory());
  constexpr std::size_t kBytes = std::size_t(256) << 20;  // past glibc's largest default threshold
  const long pages = static_cast<long>(kBytes / 4096);
  const long first = faults_of_touching(kBytes);
  ASSERT_GE(first, 0) << "malloc of 256 MiB failed";
  const long second = faults_of_touching(kBytes);
  // The first touch may fault (the heap grows); the second reuses those pages.
  EXPECT_LT(second, pages / 20) << "the freed block came back as fresh pages (" << second
                                << " faults for " << pages << " pages; first pass " << first << ")";
#endif
}

}  // namespace
}  // namespace csattn
