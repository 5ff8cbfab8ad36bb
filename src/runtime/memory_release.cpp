#include "runtime/memory_release.h"

#include <malloc.h>

#include <exception>

#ifdef TPRUN_TORCH_HAS_CUDA
#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#endif

#include "runtime/host_memory.h"

namespace tprun {
namespace {

// libtorch's CUDA caches: the device blocks its caching allocator holds
// unused, then the pinned host blocks (host RSS) kept for later copies. Only
// where CUDA is already in use: the allocator is initialised with the CUDA
// context, so an uninitialised one means nothing is cached, and touching CUDA
// here would create a context (hundreds of MB) instead of freeing memory.
void release_cuda_caches() {
#ifdef TPRUN_TORCH_HAS_CUDA
  try {
    auto* device = dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(c10::DeviceType::CUDA));
    if (device == nullptr || !device->initialized()) return;
    device->emptyCache();
    if (auto* host = at::getHostAllocator(at::kCUDA)) host->empty_cache();
  } catch (const std::exception&) {
    // No CUDA allocator registered in this libtorch: nothing is cached.
  }
#endif
}

}  // namespace

uint64_t release_free_memory() {
  const uint64_t before = self_status_bytes("VmRSS");
  release_cuda_caches();
  // glibc (2.8 and later) returns every whole free page of every arena, not
  // only the top of the heap, with madvise(MADV_DONTNEED).
  malloc_trim(0);
  const uint64_t after = self_status_bytes("VmRSS");
  return before > after ? before - after : 0;
}

}  // namespace tprun
