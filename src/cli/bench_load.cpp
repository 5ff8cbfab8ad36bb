// `tprun bench load --model DIR --tp N --rank R --mode M`: loads what rank R
// of a TP group of N needs, in this process alone, and reports wall time, RSS
// growth, peak RSS and bytes read (/proc/self/io rchar). Modes:
//   shard-on-load    the loader reads only this rank's slices
//   load-then-shard  every tensor read whole first, then sliced (diffusers'
//                    enable_parallelism)
//   sequential       a plain sequential read of as many bytes as shard-on-load
//                    reads, in 16 MiB chunks, into memory that is kept (the floor)
//   model-load       the component loaded for real through the model registry
//                    (models::load_model, shard-on-load), exactly as a pipeline
//                    loads it: its own tensor order, dtype and layer cut
// What is read (--plan):
//   table   (default) every tensor of the checkpoint, each with the slice the
//           model's table gives it (a tensor the table does not know: whole)
//   model   the tensors and slices the model's own load reads, found by a dry
//           run of that load (through the registry, with a source that records
//           each read and reads nothing): tensors the model never reads (a
//           Mistral3 checkpoint's vision tower, projector and lm_head) and the
//           layers a --hidden-layers cut leaves out are not read. --hidden-layers
//           (ModelOptions::hidden_layers: the FLUX.2 pipelines' 9,18,27 /
//           10,20,30) implies it; model-load always reads what the model reads.
// --plan-only: print the plan's numbers (checkpoint, slice, replicated and
// skipped bytes) and read nothing.
// --drop: every tensor (every 16 MiB chunk for sequential) is released as
// soon as it has been read, for a rank whose slices do not fit in this
// machine's memory. Bytes read and time are still the load's; peak RSS growth
// is then about the largest single tensor ("largest_item_bytes"), not what a
// rank keeps, and the JSON says "dropped": true.
#include "cli/bench_load.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <set>

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/safetensors_source.h"
#include "checkpoint/shard_loader.h"
#include "cli/model_args.h"
#include "dist/communicator.h"
#include "models/model_registry.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/host_memory.h"
#include "runtime/logging.h"
#include "runtime/size_string.h"

namespace tprun::cli {
namespace po = boost::program_options;
namespace {

uint64_t proc_io(const char* key) {
  std::ifstream in("/proc/self/io");
  std::string k;
  uint64_t v;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

void reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
}

// The TP group this one process plays a rank of: a load calls no collective
// (any call is an internal error), it only needs the group's size and rank.
class SimulatedGroup final : public dist::Communicator {
 public:
  SimulatedGroup(int rank, int size) : dist::Communicator("simulated tp"), rank_(rank), size_(size) {}
  const char* backend() const override { return "none"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(at::Tensor&, const dist::AllReduceOptions&) override { fail("all_reduce"); }
  at::Tensor all_gather(const at::Tensor&, const dist::AllGatherOptions&) override { fail("all_gather"); }
  void broadcast(at::Tensor&, const dist::BroadcastOptions&) override { fail("broadcast"); }
  void barrier() override { fail("barrier"); }

 private:
  [[noreturn]] static void fail(const char* what) {
    throw Error(Error::Kind::Internal, fmt::format("bench load: a model load called {} on its simulated TP group", what));
  }
  int rank_, size_;
};

// A source that records what a load asks for (tensor and shard request, in
// the order asked) and reads nothing: the destination buffers stay untouched
// (fresh, unwritten pages cost no memory), so a dry run of a load larger than
// this machine's memory is fine when the compute dtype is the stored one.
class RecordingSource final : public checkpoint::WeightSource {
 public:
  explicit RecordingSource(checkpoint::WeightSource& inner) : inner_(inner) {}
  const std::string& path() const override { return inner_.path(); }
  std::vector<std::string> tensor_names() const override { return inner_.tensor_names(); }
  bool contains(const std::string& name) const override { return inner_.contains(name); }
  checkpoint::StoredTensor describe(const std::string& name) const override { return inner_.describe(name); }
  void read_slice(const std::string& name, const checkpoint::ShardRequest& request, const checkpoint::SlicePlan&,
                  void*) override {
    reads.push_back({name, request});
  }
  size_t file_of(const std::string& name) const override { return inner_.file_of(name); }
  uint64_t bytes_read() const override { return 0; }
  std::vector<checkpoint::LoadItem> reads;

 private:
  checkpoint::WeightSource& inner_;
};

// The compute dtype that keeps a checkpoint's tensors as stored (fp32 | bf16 |
// fp16): the dtype of most of its bytes.
std::string stored_compute_dtype(const checkpoint::ComponentCheckpoint& ck) {
  uint64_t f32 = 0, bf16 = 0, f16 = 0;
  for (const auto& name : ck.tensor_names()) {
    const auto* e = ck.locate(name).entry;
    if (e->dtype == checkpoint::Dtype::BF16) bf16 += e->nbytes();
    else if (e->dtype == checkpoint::Dtype::F16) f16 += e->nbytes();
    else f32 += e->nbytes();
  }
  return bf16 >= f16 && bf16 > f32 ? "bf16" : f16 > f32 ? "fp16" : "fp32";
}

// --device: cpu or cuda[:N] on a GPU this process sees; ConfigError naming --device otherwise.
c10::Device parse_bench_device(const std::string& device) {
  if (device == "cpu") return c10::Device(c10::kCPU);
  const DeviceChoice c = choose_device(device, 0, cuda_device_count(), cuda_built());
  return c10::Device(c.device);
}

// The device's memory in use now (total less free less libtorch's cached free blocks); nullopt on CPU.
std::optional<uint64_t> device_used_bytes(const c10::Device& dev) {
  if (!dev.is_cuda()) return std::nullopt;
  const HostMemory m = device_memory(dev.index() < 0 ? 0 : dev.index());
  if (m.limits.empty()) return std::nullopt;
  return m.limits.front().used;
}

}  // namespace

void add_load_bench_options(po::options_description& desc) {
  po::options_description o("Load benchmark (bench load)");
  o.add_options()
      ("model", po::value<std::string>(), "component folder (e.g. from tools/make_sparse_checkpoint.py)")
      ("tp", po::value<int>()->default_value(1), "TP size of the simulated group")
      ("rank", po::value<int>()->default_value(0), "which TP rank this process plays")
      ("mode", po::value<std::string>()->default_value("shard-on-load"),
       "shard-on-load | load-then-shard | sequential | model-load")
      ("plan", po::value<std::string>()->default_value("table"),
       "what is read: table (every tensor of the checkpoint, sliced by the model's table) | model (what the "
       "model's own load reads: a dry run of it)")
      ("hidden-layers", po::value<std::string>(),
       "decoder text encoders: the hidden states the caller needs (FLUX.2: 9,18,27 klein, 10,20,30 dev); later "
       "layers, the final norm and lm_head are not read. Implies --plan model")
      ("dtype", po::value<std::string>()->default_value(""), "compute dtype (default: as stored)")

      ("shard-modulation", po::bool_switch(), "shard the AdaLN modulation linears (rowwise_split_input)")
      ("plan-only", po::bool_switch(), "print what would be read (JSON: slice, replicated, skipped bytes); read nothing")
      ("drop", po::bool_switch(),
       "release each tensor (sequential: each 16 MiB chunk) right after it is read: for slices that do not fit "
       "in memory; peak RSS growth is then the largest single tensor");
  desc.add(o);
}

int run_load_bench(const po::variables_map& vm) {
  // Log lines (a model load narrates) to stderr, at --log-level: stdout is the JSON line.
  init_logging({0, 1, vm.count("log-level") ? vm["log-level"].as<std::string>() : std::string(), ""});
  if (!vm.count("model")) throw ConfigError("bench load needs --model DIR", true);
  const std::string model = vm["model"].as<std::string>();
  const int tp = vm["tp"].as<int>(), rank = vm["rank"].as<int>();
  const std::string mode = vm["mode"].as<std::string>();
  const bool drop = vm["drop"].as<bool>();
  if (mode != "sequential" && mode != "shard-on-load" && mode != "load-then-shard" && mode != "model-load") {
    throw ConfigError(
        fmt::format("--mode '{}' is not shard-on-load, load-then-shard, sequential or model-load", mode), true);
  }
  if (tp < 1 || rank < 0 || rank >= tp) throw ConfigError(fmt::format("--rank {} is not a rank of tp {}", rank, tp), true);
  if (drop && mode == "model-load") throw ConfigError("--drop does not apply to --mode model-load (the model keeps its weights)", true);
  std::string plan = vm["plan"].as<std::string>();
  if (plan != "table" && plan != "model") throw ConfigError(fmt::format("--plan '{}' is not table or model", plan), true);
  auto ck = std::make_shared<const checkpoint::ComponentCheckpoint>(checkpoint::ComponentCheckpoint::open(model));
  const std::string config_path = model + "/config.json";
  models::ModelOptions topts;
  topts.shard_modulation = vm["shard-modulation"].as<bool>();
  if (vm.count("hidden-layers")) {
    topts.hidden_layers = parse_hidden_layers(vm["hidden-layers"].as<std::string>());
    plan = "model";
  }
  if (mode == "model-load") plan = "model";
  auto table = models::model_table_for(ck->config(), config_path, topts);
  if (!table) throw ConfigError(fmt::format("{}: no model table for this class; cannot plan slices", model), true);
  // --device (a session option of every bench): where the slices go, cpu unless named (cuda, cuda:N);
  // on a GPU the JSON line also gives the device memory the load holds.
  std::string device = vm.count("device") ? vm["device"].as<std::string>() : std::string();
  if (device.empty()) device = "cpu";
  const c10::Device dev = parse_bench_device(device);
  if (dev.is_cuda() && mode == "sequential") throw ConfigError("--device: the sequential read is a host read; run it without --device", true);
  SimulatedGroup group(rank, tp);
  const parallel::TpContext tp_context{rank, tp, tp > 1 ? &group : nullptr};

  std::vector<checkpoint::LoadItem> plan_items;
  if (plan == "table") {
    for (const auto& name : ck->tensor_names()) {
      // Tensors the model does not know are read whole.
      plan_items.push_back({name, table->find(name) ? table->request(name, rank, tp) : checkpoint::ShardRequest{}});
    }
  } else {
    // A dry run of the model's own load, in the stored dtype (no conversion
    // touches the unread buffers); the model is dropped at once.
    checkpoint::SafetensorsSource real(ck);
    RecordingSource rec(real);
    models::ModelOptions o = topts;
    o.dtype = stored_compute_dtype(*ck);
    (void)models::load_model(rec, ck->config(), config_path, tp_context, o);
    plan_items = std::move(rec.reads);
  }
  std::vector<checkpoint::LoadItem> items;
  uint64_t slice_bytes = 0, replicated_bytes = 0, planned_full = 0, skipped_bytes = 0, largest_planned = 0;
  int64_t skipped_tensors = 0;
  {
    std::set<std::string> planned;
    for (const auto& it : plan_items) planned.insert(it.name);
    for (const auto& name : ck->tensor_names()) {
      if (planned.count(name)) continue;
      skipped_bytes += ck->locate(name).entry->nbytes();
      ++skipped_tensors;
    }
  }
  for (auto& it : plan_items) {
    const std::string& name = it.name;
    const auto* e = ck->locate(name).entry;
    const uint64_t b = checkpoint::plan_slice(name, e->shape, checkpoint::dtype_bits(e->dtype), it.request).bytes;
    largest_planned = std::max(largest_planned, b);
    if (it.request.style == checkpoint::ShardStyle::Replicated) {
      replicated_bytes += b;
    } else {
      slice_bytes += b;
      planned_full += e->nbytes();
    }
    items.push_back(std::move(it));
  }
  plan_items.clear();
  if (vm["plan-only"].as<bool>()) {
    nlohmann::json j = {{"model", model},
                        {"class", table->cls},
                        {"plan", plan},
                        {"hidden_layers", topts.hidden_layers},
                        {"shard_modulation", topts.shard_modulation},
                        {"tp", tp},
                        {"rank", rank},
                        {"checkpoint_bytes", ck->total_bytes()},
                        {"slice_bytes", slice_bytes},
                        {"replicated_bytes", replicated_bytes},
                        {"planned_full_bytes", planned_full},
                        {"largest_item_bytes", largest_planned},
                        {"skipped_bytes", skipped_bytes},
                        {"skipped_tensors", skipped_tensors},
                        {"tensors", items.size()}};
    std::cout << j.dump() << "\n";
    return 0;
  }

  // The device's context exists before the clock starts (its memory is not the load's).
  const std::optional<uint64_t> device_used_before = device_used_bytes(dev);
  const uint64_t rss_before = self_status_bytes("VmRSS");
  reset_peak_rss();
  // Reading /proc/self/io adds its own ~100 bytes to rchar: measured here
  // (two reads back to back) and left out of read_bytes.
  const uint64_t rchar_probe = proc_io("rchar:");
  const uint64_t rchar_before = proc_io("rchar:");
  const uint64_t rchar_self = rchar_before - rchar_probe;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<at::Tensor> held;
  std::unique_ptr<models::Model> loaded_model;
  uint64_t held_bytes = 0, loaded_bytes = 0, largest_item = 0;
  if (mode == "model-load") {
    checkpoint::SafetensorsSource src(ck);
    models::ModelOptions o = topts;
    o.dtype = vm["dtype"].as<std::string>().empty() ? stored_compute_dtype(*ck) : vm["dtype"].as<std::string>();
    o.device = device;
    loaded_model = models::load_model(src, ck->config(), config_path, tp_context, o);
    loaded_bytes = held_bytes = loaded_model->bytes_loaded();
    largest_item = largest_planned;
  } else if (mode == "sequential") {
    // The same number of bytes, read front to back in 16 MiB reads into
    // memory that is kept (a load has to land its bytes somewhere), with the
    // same page-cache advice as the loader. With --drop each chunk still
    // lands in fresh memory (its own mapping, unmapped once read), so the
    // floor keeps the page-fault cost a real load pays: a reused buffer
    // would make it 3-4x faster than the kept read.
    const uint64_t want = slice_bytes + replicated_bytes;
    constexpr uint64_t kChunk = 16u << 20;
    std::vector<std::unique_ptr<char[]>> kept;
    uint64_t done = 0;
    for (const auto& f : ck->files()) {
      int fd = ::open(f.file.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw CheckpointError(fmt::format("{}: cannot open", f.file));
      for (uint64_t off = f.data_start; off < f.file_size && done < want;) {
        const uint64_t n = std::min<uint64_t>({kChunk, f.file_size - off, want - done});
        if (drop) {
          void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
          if (p == MAP_FAILED) throw Error(Error::Kind::Internal, fmt::format("mmap of {} bytes failed", n));
          checkpoint::pread_fully(fd, p, n, off, f.file);
          ::munmap(p, n);
        } else {
          kept.emplace_back(new char[n]);
          checkpoint::pread_fully(fd, kept.back().get(), n, off, f.file);
        }
        ::posix_fadvise(fd, static_cast<off_t>(off), static_cast<off_t>(n), POSIX_FADV_DONTNEED);
        off += n;
        done += n;
        largest_item = std::max(largest_item, n);
      }
      ::close(fd);
    }
    loaded_bytes = done;
    held_bytes = drop ? 0 : done;
  } else {
    checkpoint::LoadOptions o;
    if (mode == "load-then-shard") o.mode = checkpoint::LoadMode::LoadThenShard;
    o.dtype = vm["dtype"].as<std::string>();
    o.device = device;
    checkpoint::SafetensorsSource src(ck);
    checkpoint::ShardLoader loader(src, o);
    auto nbytes = [](const at::Tensor& t) { return static_cast<uint64_t>(t.numel()) * t.element_size(); };
    if (!drop) {
      held = loader.load_many(items);
      for (const auto& t : held) {
        loaded_bytes += nbytes(t);
        largest_item = std::max(largest_item, nbytes(t));
      }
      held_bytes = loaded_bytes;
    } else {
      // load_many's order (file by file, one open at a time), each tensor
      // released as soon as it is read; load-then-shard reads each whole
      // tensor, slices it and drops both (it never holds the state dict).
      std::vector<size_t> order(items.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return src.file_of(items[a].name) < src.file_of(items[b].name); });
      for (size_t i : order) {
        const uint64_t b = nbytes(loader.load(items[i].name, items[i].request));
        loaded_bytes += b;
        largest_item = std::max(largest_item, b);
      }
      src.close();
    }
  }
  synchronize_device(device);  // the last copies and conversions done before the clock stops
  const std::optional<uint64_t> device_used_after = device_used_bytes(dev);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t rchar_after = proc_io("rchar:");
  const uint64_t read = rchar_after - rchar_before >= rchar_self ? rchar_after - rchar_before - rchar_self : 0;
  const uint64_t peak = self_status_bytes("VmHWM");
  nlohmann::json j = {{"model", model},
                      {"mode", mode},
                      {"shard_modulation", topts.shard_modulation},
                      {"class", table->cls},
                      {"plan", plan},
                      {"hidden_layers", topts.hidden_layers},
                      {"skipped_bytes", skipped_bytes},
                      {"skipped_tensors", skipped_tensors},
                      {"tp", tp},
                      {"rank", rank},
                      {"checkpoint_bytes", ck->total_bytes()},
                      {"slice_bytes", slice_bytes},
                      {"replicated_bytes", replicated_bytes},
                      {"planned_full_bytes", planned_full},
                      {"dropped", drop},
                      {"loaded_bytes", loaded_bytes},
                      {"largest_item_bytes", largest_item},
                      {"held_bytes", held_bytes},
                      {"seconds", secs},
                      {"read_bytes", read},
                      {"rchar_self_bytes", rchar_self},
                      {"rss_before", rss_before},
                      {"peak_rss", peak},
                      {"peak_growth", peak > rss_before ? peak - rss_before : 0},
                      {"device", device}};
  if (device_used_before && device_used_after) {
    // What the load holds on the device: its memory in use (not counting blocks libtorch's caching
    // allocator keeps free) after the load less before it; equal to the kept slices where nothing
    // else allocated on the device.
    j["device_bytes_after_load"] = *device_used_after > *device_used_before ? *device_used_after - *device_used_before : 0;
  }
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace tprun::cli
