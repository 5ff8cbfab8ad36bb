// The one precompiled header of tprun (target_precompile_headers, shared with
// REUSE_FROM). Only what nearly every translation unit needs and what is slow
// to parse: ATen's Tensor, spdlog/fmt, MPI and the standard library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <mpi.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
