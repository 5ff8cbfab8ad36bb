// A request that runs out of memory becomes a RequestError naming it, the
// device and the memory asked for (runtime/out_of_memory.h): the allocators'
// messages parsed (bounded, hostile ones too), a real CPU allocation failure
// and CUDA's exception converted, anything else passed through unchanged.
#include <cstdint>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/out_of_memory.h"
#include "runtime/size_string.h"

namespace tprun {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// CUDA's caching allocator's text (c10/cuda/CUDACachingAllocator.cpp, torch 2.11).
const char* const kCudaText =
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.72 GiB of which 1.10 GiB "
    "is free. Including non-PyTorch memory, this process has 138.61 GiB memory in use. Of the allocated memory "
    "130.02 GiB is allocated by PyTorch, and 7.40 GiB is reserved by PyTorch but unallocated.";

// The exception `thrower` throws, caught.
template <class F>
std::exception_ptr caught(F thrower) {
  try {
    thrower();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

// CUDA's out-of-memory the way the caching allocator raises it.
std::exception_ptr cuda_oom() {
  return caught([] { TORCH_CHECK_WITH(OutOfMemoryError, false, kCudaText); });
}

TEST(OutOfMemory, ParsesBothAllocatorsMessages) {
  // torch 2.11's CPU allocator (posix_memalign failed) and the older wording.
  EXPECT_EQ(parse_requested_bytes("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                                  "memory: you tried to allocate 4503599627370496 bytes. Error code 12 (Cannot "
                                  "allocate memory)"),
            uint64_t{1} << 52);
  EXPECT_EQ(parse_requested_bytes("DefaultCPUAllocator: not enough memory: you tried to allocate 64 bytes."), 64u);
  // CUDA's: two decimals and a binary unit.
  EXPECT_EQ(parse_requested_bytes(kCudaText), 2 * kGiB);
  EXPECT_EQ(parse_requested_bytes("Tried to allocate 20.00 MiB."), uint64_t{20} << 20);
  EXPECT_EQ(parse_requested_bytes("Tried to allocate 1.50 KiB."), 1536u);
  EXPECT_EQ(parse_requested_bytes("Tried to allocate 512 bytes."), 512u);
  EXPECT_EQ(parse_requested_bytes("Tried to allocate 12 B"), 12u);
  EXPECT_EQ(parse_requested_bytes("Tried to allocate 3.00 TiB"), uint64_t{3} << 40);
  EXPECT_EQ(parse_requested_bytes("Tried to allocate 1.25 GiB"), kGiB + kGiB / 4);
  // The first readable amount counts.
  EXPECT_EQ(parse_requested_bytes("tried to allocate lots; Tried to allocate 8 MiB"), uint64_t{8} << 20);
}

TEST(OutOfMemory, HostileMessagesGiveNothing) {
  EXPECT_FALSE(parse_requested_bytes(""));
  EXPECT_FALSE(parse_requested_bytes("CUDA out of memory."));
  // No number: CUDA's message for a size beyond 1 EB.
  EXPECT_FALSE(parse_requested_bytes("CUDA out of memory. Tried to allocate more than 1EB memory."));
  EXPECT_FALSE(parse_requested_bytes("Tried to allocate  bytes"));
  EXPECT_FALSE(parse_requested_bytes("Tried to allocate 2.00"));
  EXPECT_FALSE(parse_requested_bytes("Tried to allocate 2.00 PiB"));
  EXPECT_FALSE(parse_requested_bytes("Tried to allocate 2.00GiB"));
  // Beyond 2^64 - 1 bytes: nothing, never a wrapped number.
  EXPECT_FALSE(parse_requested_bytes("you tried to allocate 99999999999999999999999 bytes"));
  EXPECT_FALSE(parse_requested_bytes("you tried to allocate 18446744073709551616 bytes"));
  EXPECT_EQ(parse_requested_bytes("you tried to allocate 18446744073709551615 bytes"), UINT64_MAX);
  EXPECT_FALSE(parse_requested_bytes("Tried to allocate 17179869184.00 GiB"));
  EXPECT_FALSE(parse_requested_bytes("Tried to allocate 99999999999999999999.5 GiB"));
  // A fraction running past the 4 KiB bound: the unit is never seen.
  EXPECT_EQ(parse_requested_bytes("Tried to allocate 1." + std::string(5000, '0') + " GiB"), std::nullopt);
  EXPECT_EQ(parse_requested_bytes("Tried to allocate 1." + std::string(100, '0') + " GiB"), kGiB);
  // A 100 KB message: only its first 4 KiB are read.
  const std::string filler(100 * 1000, 'x');
  EXPECT_FALSE(parse_requested_bytes(filler + " you tried to allocate 64 bytes"));
  EXPECT_EQ(parse_requested_bytes("you tried to allocate 64 bytes " + filler), 64u);
  // Cut by the 4 KiB bound in the middle of the amount ("... allocate 6").
  const std::string head(kOutOfMemoryMessageScan - 19, ' ');
  EXPECT_FALSE(parse_requested_bytes(head + "tried to allocate 64 bytes"));
  EXPECT_EQ(parse_requested_bytes(std::string(kOutOfMemoryMessageScan - 40, ' ') + "tried to allocate 64 bytes"),
            64u);
  // Many phrases, none readable: bounded work, nothing found.
  std::string many;
  while (many.size() < 100 * 1000) many += "tried to allocate ";
  EXPECT_FALSE(parse_requested_bytes(many));
}

TEST(OutOfMemory, RealCpuAllocationFailureBecomesARequestError) {
  // 4 PiB exceeds the address space: posix_memalign fails on every Linux.
  // torch 2.11's CPU allocator throws a plain c10::Error for it (CAFFE_ENFORCE),
  // not c10::OutOfMemoryError: both count.
  const std::exception_ptr ex = caught([] { (void)at::empty({int64_t{1} << 52}, at::kByte); });
  ASSERT_TRUE(ex) << "allocating 4 PiB did not fail";
  try {
    std::rethrow_exception(ex);
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("you tried to allocate 4503599627370496 bytes"),
              std::string::npos)
        << e.what_without_backtrace();
  } catch (...) {
    FAIL() << "libtorch threw something other than a c10::Error";
  }
  EXPECT_TRUE(is_out_of_memory(ex));
  const RequestError e = out_of_memory_error(ex, "request 'huge'", "cpu");
  const std::string what = e.what();
  EXPECT_EQ(what.rfind("request 'huge' ran out of memory while generating (asked for " +
                           format_size(uint64_t{1} << 52) + " on cpu",
                       0),
            0u)
      << what;
  EXPECT_NE(what.find("can't allocate memory"), std::string::npos) << what;
  EXPECT_NE(what.find("tprun plan"), std::string::npos) << what;
  EXPECT_NE(what.find("a smaller height/width or batch_size"), std::string::npos) << what;
  EXPECT_EQ(e.kind(), Error::Kind::Request);
  EXPECT_EQ(e.exit_code(), exit_code::kRequest);
  EXPECT_FALSE(e.all_ranks());
  // The allocator is usable afterwards.
  EXPECT_EQ(at::empty({1024}, at::kByte).numel(), 1024);
}

TEST(OutOfMemory, CudaOutOfMemoryErrorBecomesARequestError) {
  const std::exception_ptr ex = cuda_oom();
  ASSERT_TRUE(ex);
  try {
    std::rethrow_exception(ex);
  } catch (const c10::OutOfMemoryError&) {
  } catch (...) {
    FAIL() << "TORCH_CHECK_WITH(OutOfMemoryError, ...) threw another class";
  }
  EXPECT_TRUE(is_out_of_memory(ex));
  const std::string what = out_of_memory_error(ex, "request 'a'", "cuda:0").what();
  EXPECT_EQ(what.rfind("request 'a' ran out of memory while generating (asked for 2 GiB on cuda:0", 0), 0u) << what;
  EXPECT_NE(what.find("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"), std::string::npos)
      << what;
  EXPECT_NE(what.find("a larger tp"), std::string::npos) << what;
  EXPECT_NE(what.find("offload or fp8"), std::string::npos) << what;
  // Bounded: a huge allocator message is clipped in the request's error.
  const std::string flood(100 * 1000, 'y');
  const std::exception_ptr big =
      caught([&] { TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 1 MiB. ", flood); });
  const std::string clipped = out_of_memory_error(big, "request 'b'", "cuda:0").what();
  EXPECT_LT(clipped.size(), 2000u);
  EXPECT_NE(clipped.find("asked for 1 MiB on cuda:0"), std::string::npos) << clipped.substr(0, 300);
}

TEST(OutOfMemory, BadAllocAndNestedAllocatorErrorsCount) {
  const std::exception_ptr bad = caught([] { throw std::bad_alloc(); });
  EXPECT_TRUE(is_out_of_memory(bad));
  const std::string what = out_of_memory_error(bad, "request 'c'", "cpu").what();
  EXPECT_EQ(what.rfind("request 'c' ran out of memory while generating (asked for an unknown amount on cpu", 0), 0u)
      << what;
  // The pipelines' own conversion nests the allocator's exception in its
  // RequestError (request_memory.cpp): the original is read through it.
  const std::exception_ptr nested = caught([] {
    try {
      TORCH_CHECK_WITH(OutOfMemoryError, false, kCudaText);
    } catch (...) {
      std::throw_with_nested(RequestError("ran out of memory while generating", true));
    }
  });
  EXPECT_TRUE(is_out_of_memory(nested));
  const std::string from_nested = out_of_memory_error(nested, "requests 'a', 'b'", "cuda:1").what();
  EXPECT_EQ(from_nested.rfind("requests 'a', 'b' ran out of memory while generating (asked for 2 GiB on cuda:1", 0),
            0u)
      << from_nested;
  // A CUDA runtime call that ran out (runtime/cuda_check.h's DeviceError).
  const std::exception_ptr device = caught([] {
    throw DeviceError("checkpoint/x.cpp:1: cudaMallocHost(&p, n) failed: cudaErrorMemoryAllocation (out of memory)");
  });
  EXPECT_TRUE(is_out_of_memory(device));
}

TEST(OutOfMemory, AnythingElsePassesThroughUnchanged) {
  EXPECT_FALSE(is_out_of_memory(nullptr));
  const std::exception_ptr shape = caught([] { TORCH_CHECK(false, "shape mismatch"); });
  EXPECT_FALSE(is_out_of_memory(shape));
  try {
    (void)out_of_memory_error(shape, "request 'a'", "cpu");
    FAIL() << "not rethrown";
  } catch (const c10::Error& e) {
    try {
      std::rethrow_exception(shape);
    } catch (const c10::Error& original) {
      EXPECT_EQ(&e, &original);  // the same object, not a copy
    }
  }
  const std::exception_ptr config = caught([] { throw ConfigError("bad key", true); });
  try {
    (void)out_of_memory_error(config, "request 'a'", "cpu");
    FAIL() << "not rethrown";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "bad key");
    EXPECT_TRUE(e.all_ranks());
  }
  // A request's own error (no allocator exception nested) stays as it is.
  const std::exception_ptr request = caught([] { throw RequestError("NaN latents"); });
  EXPECT_THROW((void)out_of_memory_error(request, "request 'a'", "cpu"), RequestError);
  // The words alone are not an allocator's failure.
  const std::exception_ptr words = caught([] { throw std::runtime_error("out of memory"); });
  EXPECT_FALSE(is_out_of_memory(words));
  EXPECT_THROW((void)out_of_memory_error(words, "request 'a'", "cpu"), std::runtime_error);
  struct NotAnException {};
  const std::exception_ptr odd = caught([] { throw NotAnException{}; });
  EXPECT_THROW((void)out_of_memory_error(odd, "request 'a'", "cpu"), NotAnException);
  EXPECT_THROW((void)out_of_memory_error(nullptr, "request 'a'", "cpu"), Error);
}

// A real allocation failure on the GPU: CUDA's caching allocator refuses
// 1 PiB; the request's error names the device's free and total memory.
TEST(GpuOutOfMemory, RealCudaAllocationFailure) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::exception_ptr ex =
      caught([] { (void)at::empty({int64_t{1} << 50}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0)); });
  ASSERT_TRUE(ex);
  try {
    std::rethrow_exception(ex);
  } catch (const c10::OutOfMemoryError&) {
  } catch (...) {
    FAIL() << "CUDA's allocator threw another class";
  }
  const std::string what = out_of_memory_error(ex, "request 'gpu'", "cuda:0").what();
  EXPECT_EQ(what.rfind("request 'gpu' ran out of memory while generating (asked for 1024 TiB on cuda:0, which has ", 0),
            0u)
      << what;
  EXPECT_NE(what.find(" free of "), std::string::npos) << what;
}

}  // namespace
}  // namespace tprun
