// How the process's host allocator treats large blocks (a process-wide setting).
//
// glibc serves every block above its mmap threshold (dynamic, at most 32 MiB by default)
// with a fresh mapping and unmaps it on free. A CPU layer call allocates its activations
// anew (hundreds of MiB at the Flash shape), so each call gets fresh pages, which the kernel
// zero-fills on first touch: on this project's 2-core development machine that was 25-43%
// of a Flash-shape training step (docs/perf.md, CPU section). retain_freed_host_memory()
// serves blocks up to 1 GiB from the heap and stops trimming it, so they are reused. The
// price: the resident set stays at its peak (freed memory is kept for reuse, not returned).
//
// The csattn program calls it at start. A library user decides for their own process (the
// Python module exposes it as csattn.retain_freed_host_memory()). GLIBC_TUNABLES can set
// the same thresholds without a code change.
#pragma once

namespace csattn {

// Returns true when the allocator took the settings (glibc), false where they do not exist.
bool retain_freed_host_memory();

}  // namespace csattn
