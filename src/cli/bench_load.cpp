// `tprun bench load --model DIR --tp N --rank R --mode M`: loads what rank R
// of a TP group of N needs, in this process alone, and reports wall time, RSS
// growth, peak RSS and bytes read (/proc/self/io rchar). Modes:
//   shard-on-load    the loader reads only this rank's slices
//   load-then-shard  every tensor read whole first, then sliced (diffusers'
//                    enable_parallelism)
//   sequential       a plain sequential read of as many bytes as shard-on-load
//                    reads, in 16 MiB chunks, into memory that is kept (the floor)
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

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/safetensors_source.h"
#include "checkpoint/shard_loader.h"
#include "models/model_registry.h"
#include "runtime/error.h"
#include "runtime/size_string.h"

namespace tprun::cli {
namespace po = boost::program_options;
namespace {

uint64_t proc_status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(std::string(key).size()));
  }
  return 0;
}

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

}  // namespace

void add_load_bench_options(po::options_description& desc) {
  po::options_description o("Load benchmark (bench load)");
  o.add_options()
      ("model", po::value<std::string>(), "component folder (e.g. from tools/make_sparse_checkpoint.py)")
      ("tp", po::value<int>()->default_value(1), "TP size of the simulated group")
      ("rank", po::value<int>()->default_value(0), "which TP rank this process plays")
      ("mode", po::value<std::string>()->default_value("shard-on-load"),
       "shard-on-load | load-then-shard | sequential")
      ("dtype", po::value<std::string>()->default_value(""), "compute dtype (default: as stored)")
      ("shard-modulation", po::bool_switch(), "shard the AdaLN modulation linears (rowwise_split_input)")
      ("drop", po::bool_switch(),
       "release each tensor (sequential: each 16 MiB chunk) right after it is read: for slices that do not fit "
       "in memory; peak RSS growth is then the largest single tensor");
  desc.add(o);
}

int run_load_bench(const po::variables_map& vm) {
  if (!vm.count("model")) throw ConfigError("bench load needs --model DIR", true);
  const std::string model = vm["model"].as<std::string>();
  const int tp = vm["tp"].as<int>(), rank = vm["rank"].as<int>();
  const std::string mode = vm["mode"].as<std::string>();
  const bool drop = vm["drop"].as<bool>();
  if (mode != "sequential" && mode != "shard-on-load" && mode != "load-then-shard") {
    throw ConfigError(fmt::format("--mode '{}' is not shard-on-load, load-then-shard or sequential", mode), true);
  }
  if (tp < 1 || rank < 0 || rank >= tp) throw ConfigError(fmt::format("--rank {} is not a rank of tp {}", rank, tp), true);
  auto ck = std::make_shared<const checkpoint::ComponentCheckpoint>(checkpoint::ComponentCheckpoint::open(model));
  models::ModelOptions topts;
  topts.shard_modulation = vm["shard-modulation"].as<bool>();
  auto table = models::model_table_for(ck->config(), model + "/config.json", topts);
  if (!table) throw ConfigError(fmt::format("{}: no model table for this class; cannot plan slices", model), true);

  std::vector<checkpoint::LoadItem> items;
  uint64_t slice_bytes = 0, replicated_bytes = 0, planned_full = 0;
  for (const auto& name : ck->tensor_names()) {
    // Tensors the model does not know are read whole.
    checkpoint::LoadItem it{name, table->find(name) ? table->request(name, rank, tp) : checkpoint::ShardRequest{}};
    const auto* e = ck->locate(name).entry;
    const uint64_t b = checkpoint::plan_slice(name, e->shape, checkpoint::dtype_bits(e->dtype), it.request).bytes;
    if (it.request.style == checkpoint::ShardStyle::Replicated) {
      replicated_bytes += b;
    } else {
      slice_bytes += b;
      planned_full += e->nbytes();
    }
    items.push_back(std::move(it));
  }

  const uint64_t rss_before = proc_status_kb("VmRSS:") * 1024;
  reset_peak_rss();
  // Reading /proc/self/io adds its own ~100 bytes to rchar: measured here
  // (two reads back to back) and left out of read_bytes.
  const uint64_t rchar_probe = proc_io("rchar:");
  const uint64_t rchar_before = proc_io("rchar:");
  const uint64_t rchar_self = rchar_before - rchar_probe;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<at::Tensor> held;
  uint64_t held_bytes = 0, loaded_bytes = 0, largest_item = 0;
  if (mode == "sequential") {
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
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t rchar_after = proc_io("rchar:");
  const uint64_t read = rchar_after - rchar_before >= rchar_self ? rchar_after - rchar_before - rchar_self : 0;
  const uint64_t peak = proc_status_kb("VmHWM:") * 1024;
  nlohmann::json j = {{"model", model},
                      {"mode", mode},
                      {"shard_modulation", topts.shard_modulation},
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
                      {"peak_growth", peak > rss_before ? peak - rss_before : 0}};
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace tprun::cli
