#include "parallel/matmul_trace.h"

namespace tprun::parallel {
namespace {
thread_local MatmulRecorder* t_current = nullptr;
}

MatmulRecorder::MatmulRecorder() : outer_(t_current) { t_current = this; }
MatmulRecorder::~MatmulRecorder() { t_current = outer_; }

void MatmulRecorder::record(const MatmulShape& shape) {
  if (t_current) t_current->shapes_.push_back(shape);
}

}  // namespace tprun::parallel
