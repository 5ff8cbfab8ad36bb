// Checked CUDA and NCCL calls (runtime/cuda_check.h, dist/nccl_check.h): the
// messages name file:line, the call as written and the library's own error.
// CUDA's and NCCL's error names and texts need no GPU, so this runs anywhere.
#include <string>

#include <gtest/gtest.h>

#include "dist/nccl_check.h"
#include "runtime/cuda_check.h"
#include "runtime/device.h"
#include "runtime/error.h"

#ifdef TPRUN_TORCH_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tprun {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(CheckedCall, DeviceErrorKindAndExitCode) {
  DeviceError e("cudaMalloc failed");
  EXPECT_STREQ(e.kind_name(), "device error");
  EXPECT_EQ(e.exit_code(), 8);
  EXPECT_EQ(e.exit_code(), exit_code::kDevice);
  EXPECT_EQ(e.kind(), Error::Kind::Device);
  EXPECT_FALSE(e.all_ranks());
}

TEST(CheckedCall, MessageShortensPathsBelowSrc) {
  EXPECT_EQ(failed_call_message("/work/main/src/dist/nccl_communicator.cpp", 42, "ncclFoo(x)", "bad"),
            "dist/nccl_communicator.cpp:42: ncclFoo(x) failed: bad");
  EXPECT_EQ(failed_call_message("src/runtime/device.cpp", 7, "f()", "t"), "runtime/device.cpp:7: f() failed: t");
  // Outside src/: the base name only.
  EXPECT_EQ(failed_call_message("/home/u/build/tests/thing.cpp", 3, "g()", "t"), "thing.cpp:3: g() failed: t");
  EXPECT_EQ(failed_call_message("plain.cpp", 1, "h()", "t"), "plain.cpp:1: h() failed: t");
}

TEST(CheckedCall, LongCallTextIsClipped) {
  const std::string call = "cudaMemcpyAsync(" + std::string(400, 'x') + ")";
  const std::string m = failed_call_message("src/a.cpp", 1, call.c_str(), "boom");
  EXPECT_LT(m.size(), 260u) << m;
  EXPECT_TRUE(contains(m, "cudaMemcpyAsync(xxxx")) << m;
  EXPECT_FALSE(contains(m, std::string(200, 'x'))) << m;
  EXPECT_TRUE(contains(m, "(" + std::to_string(call.size()) + " chars)")) << m;
  EXPECT_TRUE(contains(m, "failed: boom")) << m;
}

#ifdef TPRUN_TORCH_HAS_CUDA
// The message of TPRUN_CUDA_CHECK(code), and the line the check was on.
std::string cuda_check_message(cudaError_t code, int* line) {
  try {
    // clang-format off
    *line = __LINE__; TPRUN_CUDA_CHECK(code);
    // clang-format on
  } catch (const DeviceError& e) {
    return e.what();
  }
  return "";
}

TEST(CheckedCall, CudaFailureThrowsDeviceErrorNamingFileLineCallAndError) {
  struct Case {
    cudaError_t code;
    const char* name;
  };
  for (const Case c : {Case{cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation"},
                       Case{cudaErrorInvalidValue, "cudaErrorInvalidValue"}}) {
    int line = 0;
    const std::string m = cuda_check_message(c.code, &line);
    ASSERT_FALSE(m.empty()) << c.name << " did not throw";
    EXPECT_TRUE(contains(m, "test_checked_call.cpp:" + std::to_string(line) + ":")) << m;
    EXPECT_TRUE(contains(m, "code failed")) << m;  // the call as written
    EXPECT_TRUE(contains(m, c.name)) << m;
    EXPECT_TRUE(contains(m, cudaGetErrorString(c.code))) << m;
  }
}

TEST(CheckedCall, CudaCheckOfARealCallNamesIt) {
  // No device -1 anywhere: cudaErrorInvalidDevice on a GPU host, no device / no driver elsewhere.
  try {
    TPRUN_CUDA_CHECK(cudaSetDevice(-1));
    FAIL() << "cudaSetDevice(-1) succeeded";
  } catch (const DeviceError& e) {
    EXPECT_TRUE(contains(e.what(), "cudaSetDevice(-1) failed: cudaError")) << e.what();
    EXPECT_TRUE(contains(e.what(), "test_checked_call.cpp:")) << e.what();
  }
  // The failure was read off CUDA's last-error slot: a later check does not see it. (Without a
  // GPU or driver every call fails alike, initialisation errors stay, and there is nothing to see.)
  if (cuda_device_count() > 0) EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CheckedCall, CudaSuccessDoesNotThrow) {
  EXPECT_NO_THROW(TPRUN_CUDA_CHECK(cudaSuccess));
  int evaluated = 0;
  auto call = [&] {
    ++evaluated;
    return cudaSuccess;
  };
  TPRUN_CUDA_CHECK(call());
  EXPECT_EQ(evaluated, 1);  // the call runs exactly once
}

TEST(CheckedCall, CudaFailureTextDoesNotThrow) {
  const std::string t = cuda_failure_text("/x/src/memory/a.cpp", 9, "cudaFree(p)", cudaErrorInvalidValue);
  EXPECT_TRUE(contains(t, "memory/a.cpp:9: cudaFree(p) failed: cudaErrorInvalidValue (")) << t;
}
#endif

TEST(CheckedCall, NcclFailureTextNamesCallAndNcclText) {
  // ncclResult_t values, stable across NCCL versions: 2 ncclSystemError, 4 ncclInvalidArgument, 5 ncclInvalidUsage.
  const std::string m = dist::nccl_failure_text("/w/src/dist/nccl_communicator.cpp", 88,
                                                "ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm_, s)", 4);
  EXPECT_TRUE(contains(m, "dist/nccl_communicator.cpp:88: ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm_, s) "
                          "failed: ncclInvalidArgument"))
      << m;
#ifdef TPRUN_HAVE_NCCL
  EXPECT_TRUE(contains(m, "invalid argument")) << m;  // ncclGetErrorString's text
  EXPECT_TRUE(contains(dist::nccl_failure_text("f.cpp", 1, "c()", 5), "invalid usage"));
  EXPECT_TRUE(contains(dist::nccl_failure_text("f.cpp", 1, "c()", 2), "ncclSystemError (unhandled system error"));
#endif
  const std::string with_last = dist::nccl_failure_text("f.cpp", 1, "ncclCommInitRankConfig(...)", 6, "peer 3 hung up");
  EXPECT_TRUE(contains(with_last, "ncclRemoteError")) << with_last;
  EXPECT_TRUE(contains(with_last, "peer 3 hung up")) << with_last;
  EXPECT_FALSE(contains(dist::nccl_failure_text("f.cpp", 1, "c()", 4, ""), "last NCCL error"));
}

TEST(CheckedCall, NcclCheckThrowsCommError) {
  int line = 0;
  try {
    // clang-format off
    line = __LINE__; TPRUN_NCCL_CHECK(4, nullptr);
    // clang-format on
    FAIL() << "no throw";
  } catch (const CommError& e) {
    EXPECT_TRUE(contains(e.what(), "test_checked_call.cpp:" + std::to_string(line) + ": 4 failed: ncclInvalidArgument"))
        << e.what();
    EXPECT_EQ(e.exit_code(), exit_code::kComm);
  }
  EXPECT_NO_THROW(TPRUN_NCCL_CHECK(0, nullptr));
  EXPECT_EQ(dist::nccl_last_error(nullptr), nullptr);
}

}  // namespace
}  // namespace tprun
