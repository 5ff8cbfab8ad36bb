// The HDF5 checkpoint format: convert_to_hdf5 + Hdf5Source (independent I/O,
// no MPI) give byte-for-byte the slices SafetensorsSource gives, for every TP
// style; types, chunks, attributes, atomic writes and errors.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <ATen/core/Tensor.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>
#include <hdf5.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/hdf5_source.h"
#include "checkpoint/hdf5_writer.h"
#include "checkpoint/safetensors_source.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/shard_loader.h"
#include "checkpoint/slice_plan.h"
#include "runtime/error.h"
#include "test_data.h"

namespace tprun::checkpoint {
namespace {

namespace fs = std::filesystem;

using test::TempDir;

struct Spec {
  std::string name;
  Dtype dtype;
  std::vector<int64_t> shape;
};

const std::vector<Spec> kSpecs = {
    {"attn.qkv.weight", Dtype::BF16, {72, 72}},
    {"attn.qkv.bias", Dtype::BF16, {72}},
    {"proj.weight", Dtype::F16, {16, 24}},
    {"mlp.weight", Dtype::F32, {24, 16}},
    {"conv.weight", Dtype::F32, {8, 12, 3}},  // 3-D: trailing dims travel with dim 1
    {"conv4.weight", Dtype::F16, {4, 8, 3, 3}},
    {"ids", Dtype::I64, {8, 4}},
    {"bytes", Dtype::U8, {4, 16}},
    {"mask", Dtype::BOOL, {8}},
    {"f64", Dtype::F64, {4, 8}},
    {"fp8.weight", Dtype::F8_E4M3, {8, 8}},
    {"scale", Dtype::F32, {}},
    {"empty", Dtype::F32, {0, 8}},
    {"odd", Dtype::F32, {5, 3}},
    {"nibbles", Dtype::F4, {4, 4}},
    {"complex", Dtype::C64, {4, 8}},
};

uint64_t nbytes_of(const Spec& s) { return StoredTensor{s.name, s.dtype, s.shape}.nbytes(); }

// Writes `specs` with deterministic random bytes into dir/<file>; keeps the bytes alive in `store`.
void write_specs(const std::string& path, const std::vector<Spec>& specs, std::vector<std::vector<uint8_t>>& store,
                 uint32_t seed, const std::map<std::string, std::string>& metadata = {{"format", "pt"}}) {
  std::mt19937 gen(seed);
  std::vector<TensorPayload> payload;
  for (const auto& s : specs) {
    store.emplace_back(nbytes_of(s));
    for (auto& b : store.back()) b = static_cast<uint8_t>(gen());
    TensorPayload p;
    p.name = s.name;
    p.dtype = s.dtype;
    p.shape = s.shape;
    p.data = store.back().data();
    payload.push_back(std::move(p));
  }
  write_safetensors(path, std::move(payload), metadata);
}

const char* kConfig =
    "{\n  \"_class_name\": \"FluxTransformer2DModel\",\n  \"num_layers\": 19,\n  \"alpha\": [1, 2]\n}\n";

// A component folder (config.json + one safetensors file) and its HDF5 conversion.
struct Fixture {
  TempDir dir;
  std::vector<std::vector<uint8_t>> bytes;
  std::string component, h5;
  Fixture(const std::vector<Spec>& specs = kSpecs, int tp_chunks = 8) {
    component = dir / "transformer";
    fs::create_directories(component);
    write_file_atomically(component + "/config.json", kConfig, false);
    write_specs(component + "/diffusion_pytorch_model.safetensors", specs, bytes, 7);
    h5 = dir / "transformer.h5";
    Hdf5WriteOptions o;
    o.tp_chunks = tp_chunks;
    convert_to_hdf5(ComponentCheckpoint::open(component), h5, o);
  }
};

struct StyleCase {
  ShardStyle style;
  std::vector<int64_t> blocks;
  bool absolute = false;
};

const std::vector<StyleCase> kStyles = {
    {ShardStyle::Replicated, {}},
    {ShardStyle::Colwise, {}},
    {ShardStyle::Rowwise, {}},
    {ShardStyle::PackedColwise, {1, 1}},
    {ShardStyle::PackedColwise, {1, 1, 1, 3, 3}},
    {ShardStyle::PackedRowwise, {1, 1}},
    {ShardStyle::PackedRowwise, {1, 1, 1, 3, 3}},
    {ShardStyle::PackedColwise, {24, 48}, true},
};

std::vector<uint8_t> read_with(WeightSource& src, const std::string& name, const ShardRequest& r, SlicePlan& plan) {
  const StoredTensor info = src.describe(name);
  plan = plan_slice(name, info.shape, dtype_bits(info.dtype), r);
  std::vector<uint8_t> out(plan.bytes + 1, 0xAB);  // one guard byte
  src.read_slice(name, r, plan, out.data());
  EXPECT_EQ(out.back(), 0xAB) << name << ": wrote past the slice";
  out.pop_back();
  return out;
}

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  at::Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), static_cast<size_t>(x.numel() * x.element_size())) == 0;
}

TEST(Hdf5, SlicesAreByteIdenticalToSafetensorsForEveryStyle) {
  Fixture f;
  auto ckpt = std::make_shared<const ComponentCheckpoint>(ComponentCheckpoint::open(f.component));
  SafetensorsSource st(ckpt);
  Hdf5Source h5(f.h5);
  EXPECT_FALSE(h5.collective());
  ASSERT_EQ(h5.tensor_names(), st.tensor_names());
  int compared = 0, split = 0;
  uint64_t expected_bytes = 0;
  for (const auto& name : st.tensor_names()) {
    const StoredTensor a = st.describe(name), b = h5.describe(name);
    EXPECT_EQ(a.dtype, b.dtype) << name;
    EXPECT_EQ(a.shape, b.shape) << name;
    for (const auto& sc : kStyles) {
      for (int tp : {1, 2, 4}) {
        for (int rank = 0; rank < tp; ++rank) {
          ShardRequest r;
          r.style = sc.style;
          r.blocks = sc.blocks;
          r.blocks_absolute = sc.absolute;
          r.tp_size = tp;
          r.tp_rank = rank;
          SlicePlan plan;
          try {
            plan = plan_slice(name, a.shape, dtype_bits(a.dtype), r);
          } catch (const CheckpointError&) {
            // Not splittable this way; Hdf5Source refuses it as well.
            if (tp > 1 && sc.style != ShardStyle::Replicated) {
              std::vector<uint8_t> buf(a.nbytes() + 1);
              EXPECT_THROW(h5.read_slice(name, r, plan, buf.data()), CheckpointError) << name;
            }
            continue;
          }
          SCOPED_TRACE(fmt::format("{} {} [{}] tp {} rank {}", name, shard_style_name(sc.style),
                                   fmt::join(sc.blocks, ","), tp, rank));
          SlicePlan p1, p2;
          const auto want = read_with(st, name, r, p1);
          const auto got = read_with(h5, name, r, p2);
          EXPECT_EQ(p1.bytes, p2.bytes);
          EXPECT_TRUE(want == got) << "slice bytes differ";
          expected_bytes += p1.bytes;
          ++compared;
          if (tp > 1 && sc.style != ShardStyle::Replicated) ++split;
        }
      }
    }
  }
  EXPECT_GT(compared, 300);
  EXPECT_GT(split, 200);
  EXPECT_EQ(h5.bytes_read(), expected_bytes);
  EXPECT_EQ(st.bytes_read(), expected_bytes);
}

TEST(Hdf5, ShardLoaderGivesTheSameTensorsOverBothSources) {
  Fixture f;
  auto ckpt = std::make_shared<const ComponentCheckpoint>(ComponentCheckpoint::open(f.component));
  SafetensorsSource st(ckpt);
  Hdf5Source h5(f.h5);
  std::vector<LoadItem> items;
  for (int tp : {1, 2, 4}) {
    for (int rank = 0; rank < tp; ++rank) {
      auto req = [&](ShardStyle s, std::vector<int64_t> blocks = {}) {
        ShardRequest r;
        r.style = s;
        r.tp_size = tp;
        r.tp_rank = rank;
        r.blocks = std::move(blocks);
        return r;
      };
      items.push_back({"attn.qkv.weight", req(ShardStyle::PackedColwise, {1, 1, 1, 3, 3})});
      items.push_back({"attn.qkv.bias", req(ShardStyle::PackedColwise, {1, 1, 1, 3, 3})});
      items.push_back({"attn.qkv.weight", req(ShardStyle::PackedRowwise, {1, 1})});
      items.push_back({"proj.weight", req(ShardStyle::Rowwise)});
      items.push_back({"mlp.weight", req(ShardStyle::Colwise)});
      items.push_back({"conv.weight", req(ShardStyle::Rowwise)});
      items.push_back({"conv4.weight", req(ShardStyle::Colwise)});
      items.push_back({"ids", req(ShardStyle::Colwise)});
      items.push_back({"bytes", req(ShardStyle::Rowwise)});
      items.push_back({"f64", req(ShardStyle::Rowwise)});
      items.push_back({"scale", req(ShardStyle::Replicated)});
      items.push_back({"empty", req(ShardStyle::Rowwise)});
    }
  }
  for (LoadMode mode : {LoadMode::ShardOnLoad, LoadMode::LoadThenShard}) {
    for (const char* dtype : {"", "fp32"}) {
      std::vector<LoadItem> use = items;
      if (*dtype != '\0') {  // conversion: floating-point weights only
        use.erase(std::remove_if(use.begin(), use.end(),
                                 [](const LoadItem& i) { return i.name == "ids" || i.name == "bytes"; }),
                  use.end());
      }
      LoadOptions o;
      o.mode = mode;
      o.dtype = dtype;
      ShardLoader a(st, o), b(h5, o);
      const auto ta = a.load_many(use);
      const auto tb = b.load_many(use);
      ASSERT_EQ(ta.size(), tb.size());
      for (size_t i = 0; i < ta.size(); ++i)
        EXPECT_TRUE(same_bytes(ta[i], tb[i])) << use[i].name << " mode " << static_cast<int>(mode) << " " << dtype;
      const at::Tensor one_a = a.load("proj.weight", use[3].request), one_b = b.load("proj.weight", use[3].request);
      EXPECT_TRUE(same_bytes(one_a, one_b));
    }
  }
}

TEST(Hdf5, ShardedSourceAndMetadata) {
  TempDir dir;
  const std::string comp = dir / "text_encoder";
  fs::create_directories(comp);
  std::vector<std::vector<uint8_t>> bytes;
  const std::vector<Spec> one = {{"a.weight", Dtype::F32, {8, 8}}, {"b.weight", Dtype::BF16, {16, 4}}};
  const std::vector<Spec> two = {{"c.weight", Dtype::F16, {4, 4}}};
  write_specs(comp + "/model-00001-of-00002.safetensors", one, bytes, 1, {{"format", "pt"}, {"k", "v"}});
  write_specs(comp + "/model-00002-of-00002.safetensors", two, bytes, 2, {{"format", "pt"}});
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map",
                           {{"a.weight", "model-00001-of-00002.safetensors"},
                            {"b.weight", "model-00001-of-00002.safetensors"},
                            {"c.weight", "model-00002-of-00002.safetensors"}}}};
  write_file_atomically(comp + "/model.safetensors.index.json", index.dump(), false);
  const std::string h5 = dir / "te.h5";
  convert_to_hdf5(ComponentCheckpoint::open(comp), h5, {});
  Hdf5Source src(h5);
  EXPECT_EQ(src.tensor_names(), (std::vector<std::string>{"a.weight", "b.weight", "c.weight"}));
  EXPECT_FALSE(src.has_config());
  EXPECT_EQ(src.config(), nlohmann::json::object());
  EXPECT_EQ(hdf5_config(h5), nlohmann::json::object());
  EXPECT_EQ(src.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"k", "v"}}));
  ShardRequest whole;
  SlicePlan plan;
  EXPECT_EQ(read_with(src, "c.weight", whole, plan), bytes[2]);
  EXPECT_EQ(read_with(src, "a.weight", whole, plan), bytes[0]);
  // open_weight_source picks the format.
  auto s1 = open_weight_source(h5);
  auto s2 = open_weight_source(comp);
  EXPECT_NE(dynamic_cast<Hdf5Source*>(s1.get()), nullptr);
  EXPECT_NE(dynamic_cast<SafetensorsSource*>(s2.get()), nullptr);
  EXPECT_EQ(s1->tensor_names(), s2->tensor_names());
}

// Raw HDF5 access for checking what the writer stored.
struct RawDataset {
  hid_t file = -1, ds = -1;
  RawDataset(const std::string& path, const std::string& name) {
    file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ds = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  }
  ~RawDataset() {
    H5Dclose(ds);
    H5Fclose(file);
  }
  std::vector<hsize_t> chunk() const {
    hid_t dcpl = H5Dget_create_plist(ds);
    std::vector<hsize_t> c;
    if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
      c.resize(8);
      c.resize(static_cast<size_t>(H5Pget_chunk(dcpl, 8, c.data())));
    }
    H5Pclose(dcpl);
    return c;
  }
};

TEST(Hdf5, ChunksAlignWithTpSlices) {
  EXPECT_EQ(hdf5_chunk_shape({72, 36}, 2, 8), (std::vector<int64_t>{18, 9}));
  EXPECT_EQ(hdf5_chunk_shape({3072, 3072}, 2, 8), (std::vector<int64_t>{384, 384}));
  EXPECT_EQ(hdf5_chunk_shape({16, 24, 3}, 4, 8), (std::vector<int64_t>{2, 3, 3}));
  EXPECT_EQ(hdf5_chunk_shape({72}, 2, 8), (std::vector<int64_t>{9}));
  EXPECT_EQ(hdf5_chunk_shape({5, 3}, 4, 8), (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(hdf5_chunk_shape({12, 6}, 4, 8), (std::vector<int64_t>{6, 3}));
  EXPECT_TRUE(hdf5_chunk_shape({}, 4, 8).empty());
  EXPECT_TRUE(hdf5_chunk_shape({0, 8}, 4, 8).empty());
  EXPECT_TRUE(hdf5_chunk_shape({1 << 20, 1 << 16}, 4, 1).empty());  // a 256 GiB chunk: contiguous
  Fixture f;
  EXPECT_EQ(RawDataset(f.h5, "attn.qkv.weight").chunk(), (std::vector<hsize_t>{9, 9}));
  EXPECT_EQ(RawDataset(f.h5, "attn.qkv.bias").chunk(), (std::vector<hsize_t>{9}));
  EXPECT_EQ(RawDataset(f.h5, "proj.weight").chunk(), (std::vector<hsize_t>{2, 3}));
  EXPECT_EQ(RawDataset(f.h5, "conv.weight").chunk(), (std::vector<hsize_t>{2, 3, 3}));
  EXPECT_TRUE(RawDataset(f.h5, "scale").chunk().empty());
  EXPECT_TRUE(RawDataset(f.h5, "empty").chunk().empty());
  EXPECT_TRUE(RawDataset(f.h5, "nibbles").chunk().empty());
  Fixture g(kSpecs, 2);
  EXPECT_EQ(RawDataset(g.h5, "attn.qkv.weight").chunk(), (std::vector<hsize_t>{36, 36}));
}

TEST(Hdf5, HalfTypesAreRealHdf5Floats) {
  // Values exactly representable in fp16 and bf16; HDF5 converts the stored
  // custom float types to native float, which proves the type definitions.
  const std::vector<float> values = {1.5f, -2.0f, 0.15625f, 1024.0f, -0.5f, 3.0f, 0.0f, -7.25f};
  TempDir dir;
  std::vector<TensorPayload> payload;
  at::Tensor src = at::tensor(values);
  at::Tensor half = src.to(at::kHalf), bf = src.to(at::kBFloat16);
  for (auto [name, t, dt] : {std::tuple{"h", half, Dtype::F16}, std::tuple{"b", bf, Dtype::BF16}}) {
    TensorPayload p;
    p.name = name;
    p.dtype = dt;
    p.shape = {2, 4};
    p.data = t.data_ptr();
    payload.push_back(p);
  }
  write_safetensors(dir / "w.safetensors", payload);
  convert_to_hdf5(ComponentCheckpoint::open(dir / "w.safetensors"), dir / "w.h5", {});
  for (const char* name : {"h", "b"}) {
    RawDataset raw(dir / "w.h5", name);
    hid_t type = H5Dget_type(raw.ds);
    EXPECT_EQ(H5Tget_class(type), H5T_FLOAT);
    EXPECT_EQ(H5Tget_size(type), 2u);
    size_t spos, epos, esize, mpos, msize;
    H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize);
    const bool b = std::string(name) == "b";
    EXPECT_EQ(spos, 15u);
    EXPECT_EQ(epos, b ? 7u : 10u);
    EXPECT_EQ(esize, b ? 8u : 5u);
    EXPECT_EQ(mpos, 0u);
    EXPECT_EQ(msize, b ? 7u : 10u);
    EXPECT_EQ(H5Tget_ebias(type), b ? 127u : 15u);
    H5Tclose(type);
    std::vector<float> back(values.size());
    ASSERT_GE(H5Dread(raw.ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, back.data()), 0);
    EXPECT_EQ(back, values) << name;
  }
  // The raw bytes of a half-precision dataset are the safetensors bytes.
  Hdf5Source h5(dir / "w.h5");
  SlicePlan plan;
  const auto got = read_with(h5, "b", ShardRequest{}, plan);
  EXPECT_EQ(std::memcmp(got.data(), bf.data_ptr(), got.size()), 0);
}

TEST(Hdf5, OtherDtypesUseReadableHdf5Types) {
  Fixture f;
  auto class_of = [&](const std::string& name) {
    RawDataset raw(f.h5, name);
    hid_t type = H5Dget_type(raw.ds);
    const H5T_class_t cls = H5Tget_class(type);
    const size_t size = H5Tget_size(type);
    H5Tclose(type);
    return std::pair{cls, size};
  };
  EXPECT_EQ(class_of("fp8.weight"), std::pair(H5T_INTEGER, size_t{1}));
  EXPECT_EQ(class_of("mask"), std::pair(H5T_INTEGER, size_t{1}));
  EXPECT_EQ(class_of("complex"), std::pair(H5T_COMPOUND, size_t{8}));
  EXPECT_EQ(class_of("nibbles"), std::pair(H5T_INTEGER, size_t{1}));
  EXPECT_EQ(class_of("f64"), std::pair(H5T_FLOAT, size_t{8}));
  Hdf5Source src(f.h5);
  EXPECT_EQ(src.describe("nibbles").shape, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(src.describe("nibbles").dtype, Dtype::F4);
  EXPECT_EQ(src.describe("complex").dtype, Dtype::C64);
}

TEST(Hdf5, ConfigJsonRoundTripsAsAnAttribute) {
  Fixture f;
  Hdf5Source src(f.h5);
  EXPECT_TRUE(src.has_config());
  EXPECT_EQ(src.config(), nlohmann::json::parse(kConfig));
  EXPECT_EQ(hdf5_config(f.h5), nlohmann::json::parse(kConfig));
  EXPECT_EQ(src.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  // Stored as the file's text (key order kept), not re-serialised.
  RawDataset raw(f.h5, "scale");
  hid_t attr = H5Aopen(raw.file, "config.json", H5P_DEFAULT);
  hid_t type = H5Aget_type(attr);
  std::string text(H5Tget_size(type), '\0');
  H5Aread(attr, type, text.data());
  H5Tclose(type);
  H5Aclose(attr);
  EXPECT_EQ(text, kConfig);

  // A config larger than HDF5's 64 KiB compact attribute limit.
  TempDir dir;
  const std::string comp = dir / "vae";
  fs::create_directories(comp);
  nlohmann::json big = {{"_class_name", "AutoencoderKL"}, {"blob", std::string(200000, 'x')}};
  write_file_atomically(comp + "/config.json", big.dump(), false);
  std::vector<std::vector<uint8_t>> bytes;
  write_specs(comp + "/diffusion_pytorch_model.safetensors", {{"w", Dtype::F32, {4, 4}}}, bytes, 3);
  convert_to_hdf5(ComponentCheckpoint::open(comp), dir / "vae.h5", {});
  EXPECT_EQ(hdf5_config(dir / "vae.h5"), big);
}

TEST(Hdf5, RefusesToOverwriteAndWritesAtomically) {
  Fixture f;
  const auto before = fs::last_write_time(f.h5);
  const auto ck = ComponentCheckpoint::open(f.component);
  try {
    convert_to_hdf5(ck, f.h5, {});
    ADD_FAILURE() << "overwrote an existing file";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(f.h5), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fs::last_write_time(f.h5), before);
  Hdf5WriteOptions o;
  o.overwrite = true;
  o.tp_chunks = 4;
  convert_to_hdf5(ck, f.h5, o);
  EXPECT_EQ(RawDataset(f.h5, "attn.qkv.weight").chunk(), (std::vector<hsize_t>{18, 18}));
  o.tp_chunks = 0;
  EXPECT_THROW(convert_to_hdf5(ck, f.h5, o), ConfigError);
  // A destination in a missing folder fails with its name and leaves nothing behind.
  try {
    convert_to_hdf5(ck, f.dir / "missing/x.h5", {});
    ADD_FAILURE() << "wrote into a missing folder";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("missing/x.h5"), std::string::npos) << e.what();
  }
  for (const auto& e : fs::directory_iterator(f.dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const CheckpointError& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(Hdf5, MissingCorruptAndForeignFilesAreNamed) {
  Fixture f;
  const std::string missing = f.dir / "nope.h5";
  expect_error([&] { Hdf5Source s(missing); }, {missing, "no such file"});
  expect_error([&] { hdf5_config(missing); }, {missing});

  const std::string garbage = f.dir / "garbage.h5";
  write_file_atomically(garbage, std::string(4096, 'z'), false);
  expect_error([&] { Hdf5Source s(garbage); }, {garbage, "not an HDF5 file"});

  // A truncated conversion: valid signature, broken structure.
  const std::string truncated = f.dir / "truncated.h5";
  fs::copy_file(f.h5, truncated);
  fs::resize_file(truncated, fs::file_size(f.h5) / 3);
  expect_error([&] { Hdf5Source s(truncated); }, {truncated});

  // A valid HDF5 file that tprun did not write.
  const std::string foreign = f.dir / "foreign.h5";
  {
    hid_t file = H5Fcreate(foreign.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t dims[1] = {4};
    hid_t space = H5Screate_simple(1, dims, nullptr);
    hid_t ds = H5Dcreate2(file, "x", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(ds);
    H5Sclose(space);
    H5Fclose(file);
  }
  expect_error([&] { Hdf5Source s(foreign); }, {foreign, "not a tprun checkpoint"});
  expect_error([&] { hdf5_config(foreign); }, {foreign, "not a tprun checkpoint"});

  // A tprun file whose dtype attribute disagrees with the storage type.
  const std::string lying = f.dir / "lying.h5";
  fs::copy_file(f.h5, lying);
  {
    hid_t file = H5Fopen(lying.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t ds = H5Dopen2(file, "proj.weight", H5P_DEFAULT);  // F16 data
    ASSERT_GE(H5Adelete(ds, "dtype"), 0);
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, 3);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(ds, "dtype", type, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, type, "F32");
    H5Aclose(attr);
    H5Sclose(space);
    H5Tclose(type);
    H5Dclose(ds);
    H5Fclose(file);
  }
  expect_error([&] { Hdf5Source s(lying); }, {lying, "proj.weight", "F32", "2-byte"});

  Hdf5Source ok(f.h5);
  expect_error([&] { ok.describe("nope"); }, {f.h5, "nope"});
  EXPECT_FALSE(ok.contains("nope"));
  EXPECT_TRUE(ok.contains("attn.qkv.weight"));
  EXPECT_EQ(ok.file_of("attn.qkv.weight"), 0u);
  // Reads after close() reopen the file.
  ok.close();
  SlicePlan plan;
  EXPECT_EQ(read_with(ok, "ids", ShardRequest{}, plan), f.bytes[6]);
}

TEST(Hdf5, TensorNamesWithSlashesAreRefused) {
  TempDir dir;
  std::vector<std::vector<uint8_t>> bytes;
  write_specs(dir / "w.safetensors", {{"a/b", Dtype::F32, {2}}}, bytes, 1);
  expect_error([&] { convert_to_hdf5(ComponentCheckpoint::open(dir / "w.safetensors"), dir / "w.h5", {}); },
               {"a/b"});
  EXPECT_FALSE(fs::exists(dir / "w.h5"));
}

}  // namespace
}  // namespace tprun::checkpoint
