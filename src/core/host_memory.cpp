#include "csattn/host_memory.hpp"

#include <cstdlib>  // defines __GLIBC__ where the C library is glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace csattn {

bool retain_freed_host_memory() {
#if defined(__GLIBC__)
  // Blocks up to 1 GiB from the heap (mallopt takes an int; larger ones are still mapped),
  // and the heap's free top never given back: a training step frees several GiB at once at
  // the Flash shape, and any finite trim threshold below that returns the pages, which the
  // next call faults in again (measured: a 1 GiB trim threshold kept almost all the cost).
  return mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1 && mallopt(M_TRIM_THRESHOLD, -1) == 1;
#else
  return false;
#endif
}

}  // namespace csattn
