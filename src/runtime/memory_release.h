#pragma once
// Giving memory this process has freed back to the system, so that a phase
// that drops large buffers (a load's staging copies, text encoders freed
// between a staged job's phases) lowers the process's RSS and not only its
// own accounting. Freed memory otherwise stays where it was allocated:
// glibc keeps freed heap chunks below the mmap threshold mapped (only the top
// of the heap is trimmed, and only past M_TRIM_THRESHOLD), and libtorch's
// CUDA caching allocators keep freed device blocks and pinned host blocks for
// reuse.

#include <cstdint>

namespace tprun {

// Gives memory the process freed back to the system: glibc's heap
// (malloc_trim(0): the free pages inside the heap too, not only its top) and,
// where a CUDA device is in use (libtorch's CUDA caching allocator was
// initialised), libtorch's caching allocators (emptyCache of the device
// allocator and of the pinned host allocator). Never initialises CUDA.
// Returns the RSS drop in bytes (VmRSS before - after, 0 if it grew), for
// logging.
uint64_t release_free_memory();

}  // namespace tprun
