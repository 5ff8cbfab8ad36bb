#pragma once
// WeightSource over a validated ComponentCheckpoint: reads only the requested
// byte ranges with pread, one shard file open at a time.

#include <memory>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/weight_source.h"

namespace tprun::checkpoint {

class SafetensorsSource final : public WeightSource {
 public:
  explicit SafetensorsSource(std::shared_ptr<const ComponentCheckpoint> checkpoint);
  ~SafetensorsSource() override;

  const std::string& path() const override { return ckpt_->path(); }
  std::vector<std::string> tensor_names() const override { return ckpt_->tensor_names(); }
  bool contains(const std::string& name) const override { return ckpt_->contains(name); }
  StoredTensor describe(const std::string& name) const override;
  void read_slice(const std::string& name, const ShardRequest& request, const SlicePlan& plan,
                  void* dst) override;
  size_t file_of(const std::string& name) const override { return ckpt_->locate(name).file; }
  uint64_t bytes_read() const override { return bytes_read_; }
  void close() override;

  const ComponentCheckpoint& checkpoint() const { return *ckpt_; }

 private:
  int open_file(size_t index);
  std::shared_ptr<const ComponentCheckpoint> ckpt_;
  int fd_ = -1;
  size_t fd_file_ = static_cast<size_t>(-1);
  uint64_t bytes_read_ = 0;
};

// Reads [offset, offset+len) of `fd` into dst fully (retrying short reads).
// CheckpointError naming `file` on failure or early end of file.
void pread_fully(int fd, void* dst, uint64_t len, uint64_t offset, const std::string& file);

}  // namespace tprun::checkpoint
