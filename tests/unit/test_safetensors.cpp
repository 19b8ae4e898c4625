// safetensors: bitwise round trips of every dtype, the on-disk layout (parsed here without
// the library), and one test per malformed-file error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "csattn/error.hpp"
#include "csattn/safetensors.hpp"

using namespace csattn;
using nlohmann::json;

namespace {

// Unique per process and test: test cases run in parallel as separate processes.
std::string temp_path(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "csattn_st_" + info->test_suite_name() + "_" + info->name() +
         "_" + std::to_string(::getpid()) + "_" + tag + ".safetensors";
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string u64_le(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

// A hand-made file: the length field, the header text, then `data_bytes` bytes.
std::string raw_file(const std::string& header, std::size_t data_bytes) {
  return u64_le(header.size()) + header + std::string(data_bytes, '\x01');
}

Tensor random_tensor(DType dt, Shape shape, std::uint32_t seed) {
  Tensor t(dt, std::move(shape));
  std::mt19937 rng(seed);
  auto* b = static_cast<unsigned char*>(t.data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) b[i] = static_cast<unsigned char>(rng());
  return t;
}

// Runs `f`, expects a csattn::Error of kind Io whose message holds every one of `parts`.
template <class F>
void expect_io_error(F f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no csattn::Error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Io) << e.what();
    for (const auto& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message lacks '" << p << "': " << e.what();
    }
  }
}

class SafetensorsFile : public ::testing::Test {
 protected:
  void TearDown() override {
    std::error_code ec;
    for (const auto& p : paths_) std::filesystem::remove_all(p, ec);
  }
  std::string path(const std::string& tag = "f") {
    paths_.push_back(temp_path(tag));
    return paths_.back();
  }
  std::vector<std::string> paths_;
};

TensorMap every_dtype() {
  TensorMap m;
  m["a.f32"] = random_tensor(DType::f32, {3, 5}, 1);
  m["b.bf16"] = random_tensor(DType::bf16, {7}, 2);
  m["c.f16"] = random_tensor(DType::f16, {2, 3, 2}, 3);
  m["d.f64"] = random_tensor(DType::f64, {4}, 4);
  m["e.i32"] = Tensor::from_i32({-1, 0, 2147483647, -2147483647 - 1}, {2, 2});
  m["f.i64"] = random_tensor(DType::i64, {3}, 6);
  m["g.e4m3"] = random_tensor(DType::e4m3, {9}, 7);
  m["h.e8m0"] = random_tensor(DType::e8m0, {5}, 8);
  m["i.scalar"] = Tensor::scalar_f32(-0.75f);
  m["j.empty"] = Tensor(DType::bf16, {0, 4});
  return m;
}

}  // namespace

TEST_F(SafetensorsFile, RoundTripEveryDTypeBitwise) {
  const std::string p = path();
  const TensorMap in = every_dtype();
  save_safetensors(p, in);
  const TensorMap out = load_safetensors(p);
  ASSERT_EQ(out.size(), in.size());
  for (const auto& [name, t] : in) {
    SCOPED_TRACE(name);
    ASSERT_EQ(out.count(name), 1u);
    const Tensor& u = out.at(name);
    EXPECT_EQ(u.dtype(), t.dtype());
    EXPECT_EQ(u.shape(), t.shape());
    ASSERT_EQ(u.nbytes(), t.nbytes());
    if (t.nbytes()) {
      EXPECT_EQ(std::memcmp(u.data(), t.data(), t.nbytes()), 0);
    }
  }
  EXPECT_EQ(out.at("i.scalar").numel(), 1);
  EXPECT_EQ(out.at("i.scalar").to_f32(), std::vector<float>{-0.75f});
}

TEST_F(SafetensorsFile, HeaderLayoutAndMetadata) {
  const std::string p = path();
  const TensorMap in = every_dtype();
  save_safetensors(p, in, {{"format", "pt"}, {"note", "x y"}});
  const std::string bytes = read_all(p);
  ASSERT_GE(bytes.size(), 8u);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u) << "data section not 8-byte aligned";
  ASSERT_LE(8 + n, bytes.size());
  const std::string text = bytes.substr(8, n);
  EXPECT_EQ(text.front(), '{');
  EXPECT_EQ(text.find_last_not_of(' ') + 1, text.find_last_of('}') + 1);  // only space padding
  const json h = json::parse(text);

  EXPECT_EQ(h.at("__metadata__"), (json{{"format", "pt"}, {"note", "x y"}}));
  std::uint64_t expect_begin = 0;
  std::size_t total = 0;
  for (const auto& [name, t] : in) {  // name order, contiguous
    SCOPED_TRACE(name);
    const json& e = h.at(name);
    EXPECT_EQ(e.at("shape").get<Shape>(), t.shape());
    const auto off = e.at("data_offsets").get<std::vector<std::uint64_t>>();
    ASSERT_EQ(off.size(), 2u);
    EXPECT_EQ(off[0], expect_begin);
    EXPECT_EQ(off[1], expect_begin + t.nbytes());
    if (t.nbytes()) {
      EXPECT_EQ(std::memcmp(bytes.data() + 8 + n + off[0], t.data(), t.nbytes()), 0);
    }
    expect_begin = off[1];
    total += t.nbytes();
  }
  EXPECT_EQ(bytes.size(), 8 + n + total);
  EXPECT_EQ(h.at("a.f32").at("dtype"), "F32");
  EXPECT_EQ(h.at("b.bf16").at("dtype"), "BF16");
  EXPECT_EQ(h.at("c.f16").at("dtype"), "F16");
  EXPECT_EQ(h.at("d.f64").at("dtype"), "F64");
  EXPECT_EQ(h.at("e.i32").at("dtype"), "I32");
  EXPECT_EQ(h.at("f.i64").at("dtype"), "I64");
  EXPECT_EQ(h.at("g.e4m3").at("dtype"), "F8_E4M3");
  EXPECT_EQ(h.at("h.e8m0").at("dtype"), "U8");

  // Metadata is not a tensor.
  EXPECT_EQ(load_safetensors(p).count("__metadata__"), 0u);
}

TEST_F(SafetensorsFile, NoMetadataKeyWhenEmpty) {
  const std::string p = path();
  save_safetensors(p, {{"x", Tensor::scalar_f32(1.0f)}});
  const std::string bytes = read_all(p);
  EXPECT_FALSE(json::parse(bytes.substr(8, bytes.size() - 12)).contains("__metadata__"));
}

TEST_F(SafetensorsFile, ReadsHandMadeFilesWithE8M0NameAndGaps) {
  const std::string p = path();
  // A gap between tensors and a key order that is not name order are both legal.
  const std::string header =
      R"({"z":{"dtype":"F8_E8M0","shape":[2],"data_offsets":[0,2]},)"
      R"("a":{"dtype":"F32","shape":[],"data_offsets":[4,8]},"__metadata__":{"k":"v"}})";
  std::string data = "\x7F\x80ga";  // e8m0 127 -> 1, 128 -> 2, then two unused bytes
  const float one = 1.0f;
  data.append(reinterpret_cast<const char*>(&one), 4);
  write_all(p, u64_le(header.size()) + header + data);
  const TensorMap m = load_safetensors(p);
  EXPECT_EQ(m.at("z").dtype(), DType::e8m0);
  EXPECT_EQ(m.at("z").to_f32(), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(m.at("a").to_f32(), std::vector<float>{1.0f});
}

TEST_F(SafetensorsFile, EmptyMapRoundTrips) {
  const std::string p = path();
  save_safetensors(p, {});
  EXPECT_TRUE(load_safetensors(p).empty());
}

// ---- errors -------------------------------------------------------------------------------

TEST_F(SafetensorsFile, MissingFile) {
  const std::string p = path("does_not_exist");
  expect_io_error([&] { load_safetensors(p); }, {p, "no such file"});
}

TEST_F(SafetensorsFile, ShorterThanLengthField) {
  const std::string p = path();
  write_all(p, "abc");
  expect_io_error([&] { load_safetensors(p); }, {p, "3 bytes"});
}

TEST_F(SafetensorsFile, TruncatedDataSection) {
  const std::string p = path();
  save_safetensors(p, {{"alpha", random_tensor(DType::f32, {4}, 1)},
                       {"beta", random_tensor(DType::f32, {4}, 2)}});
  const std::string bytes = read_all(p);
  write_all(p, bytes.substr(0, bytes.size() - 3));  // cuts into "beta"
  expect_io_error([&] { load_safetensors(p); }, {p, "'beta'", "truncated"});
}

TEST_F(SafetensorsFile, TruncatedHeader) {
  const std::string p = path();
  save_safetensors(p, {{"alpha", random_tensor(DType::f32, {4}, 1)}});
  write_all(p, read_all(p).substr(0, 20));  // length field intact, header cut
  expect_io_error([&] { load_safetensors(p); }, {p, "header length"});
}

TEST_F(SafetensorsFile, ImplausibleHeaderLength) {
  const std::string p = path();
  write_all(p, u64_le(~0ull) + "{}");
  expect_io_error([&] { load_safetensors(p); }, {p, "header length"});
}

TEST_F(SafetensorsFile, BadJson) {
  const std::string p = path();
  write_all(p, raw_file(R"({"a": {"dtype": "F32", )", 0));
  expect_io_error([&] { load_safetensors(p); }, {p, "not valid JSON"});
}

TEST_F(SafetensorsFile, HeaderNotAnObject) {
  const std::string p = path();
  write_all(p, raw_file("[1, 2]", 0));
  expect_io_error([&] { load_safetensors(p); }, {p, "not a JSON object"});
}

TEST_F(SafetensorsFile, OffsetsOutOfRange) {
  const std::string p = path();
  write_all(p, raw_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 16));
  expect_io_error([&] { load_safetensors(p); }, {p, "'w'", "[8, 24]", "16 bytes"});
}

TEST_F(SafetensorsFile, BeginAfterEnd) {
  const std::string p = path();
  write_all(p, raw_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 16));
  expect_io_error([&] { load_safetensors(p); }, {p, "'w'", "begin > end"});
}

TEST_F(SafetensorsFile, SizeMismatch) {
  const std::string p = path();
  write_all(p, raw_file(R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", 8));
  expect_io_error([&] { load_safetensors(p); }, {p, "'w'", "[3]", "bf16", "8 bytes"});
}

TEST_F(SafetensorsFile, UnknownDType) {
  const std::string p = path();
  write_all(p, raw_file(R"({"q":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})", 2));
  expect_io_error([&] { load_safetensors(p); }, {p, "'q'", "unknown dtype 'Q4_K'"});
}

TEST_F(SafetensorsFile, OverlappingTensors) {
  const std::string p = path();
  write_all(p, raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        12));
  expect_io_error([&] { load_safetensors(p); }, {p, "'a'", "'b'", "overlaps"});
}

TEST_F(SafetensorsFile, MalformedEntries) {
  const std::string p = path();
  write_all(p, raw_file(R"({"m":{"shape":[2],"data_offsets":[0,8]}})", 8));
  expect_io_error([&] { load_safetensors(p); }, {p, "'m'", "dtype"});
  write_all(p, raw_file(R"({"m":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8));
  expect_io_error([&] { load_safetensors(p); }, {p, "'m'", "non-negative"});
  write_all(p, raw_file(R"({"m":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8));
  expect_io_error([&] { load_safetensors(p); }, {p, "'m'", "non-negative"});
  write_all(p, raw_file(R"({"m":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8));
  expect_io_error([&] { load_safetensors(p); }, {p, "'m'", "data_offsets"});
  write_all(p, raw_file(R"({"m":{"dtype":"F32","shape":[2]}})", 8));
  expect_io_error([&] { load_safetensors(p); }, {p, "'m'", "data_offsets"});
  write_all(p, raw_file(R"({"m":[1,2]})", 8));
  expect_io_error([&] { load_safetensors(p); }, {p, "'m'", "not a JSON object"});
  // A shape whose byte size overflows must not wrap around to a matching size.
  write_all(p, raw_file(R"({"m":{"dtype":"F64","shape":[2305843009213693952],)"
                        R"("data_offsets":[0,0]}})",
                        8));
  expect_io_error([&] { load_safetensors(p); }, {p, "'m'"});
  write_all(p, raw_file(R"({"__metadata__":[1]})", 0));
  expect_io_error([&] { load_safetensors(p); }, {p, "__metadata__"});
}

TEST_F(SafetensorsFile, SaveRejectsBadInput) {
  const std::string p = path();
  expect_io_error([&] { save_safetensors(p, {{"ghost", Tensor()}}); }, {p, "'ghost'"});
  expect_io_error([&] { save_safetensors(p, {{"__metadata__", Tensor::scalar_f32(1)}}); },
                  {p, "__metadata__"});
  const std::string dir = path("dir");
  std::filesystem::create_directories(dir + "/x");
  expect_io_error([&] { save_safetensors(dir + "/x", {}); }, {dir + "/x", "cannot open"});
  std::filesystem::remove_all(dir);
}
