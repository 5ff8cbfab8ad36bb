#include "parallel/tp_context.h"

#include <fmt/format.h>

#include "dist/communicator.h"
#include "runtime/error.h"

namespace tprun::parallel {

void check_tp_context(const TpContext& tp) {
  if (tp.size > 1 && (!tp.comm || tp.comm->size() != tp.size || tp.comm->rank() != tp.rank)) {
    throw Error(Error::Kind::Internal, fmt::format("TpContext {}/{} does not match its communicator", tp.rank, tp.size));
  }
}

}  // namespace tprun::parallel
