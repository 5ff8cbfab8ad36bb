#pragma once
// Where this rank sits in its tensor-parallel group, as the parallel layers
// and models see it. `comm` may be null when size == 1 (a local, unsharded
// run); with size > 1 it is the group's communicator for tensors on this
// rank's compute device (DeviceMesh::tp_device()).

namespace tprun::dist {
class Communicator;
}

namespace tprun::parallel {

struct TpContext {
  int rank = 0;
  int size = 1;
  dist::Communicator* comm = nullptr;
};

// Internal error unless size > 1 comes with a communicator of that size in
// which this process has `rank` (a model's load checks its context with it).
void check_tp_context(const TpContext& tp);

}  // namespace tprun::parallel
