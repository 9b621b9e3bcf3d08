// SPDX-License-Identifier: Apache-2.0
#include "core/model/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/base/error.h"
#include "tests/support/special_files.h"

#include <unistd.h>

namespace batchlens::model {
namespace {

namespace fs = std::filesystem;
using base::ErrorCode;
using Json = nlohmann::json;
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

constexpr std::uint64_t kSeed = 20240611;

/// Each test gets its own empty directory under the system temp dir, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("batchlens-safetensors-" + std::to_string(::getpid()) +
                                        "-" + info->test_suite_name() + "-" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  /// Names of everything in `dir` (one level).
  static std::vector<std::string> listing(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

using SafetensorsRoundTrip = TempDirTest;
using SafetensorsView = TempDirTest;
using SafetensorsForeignFile = TempDirTest;
using SafetensorsCorruption = TempDirTest;
using SafetensorsWrite = TempDirTest;
using CheckpointTest = TempDirTest;

/// Writes `length` (default: the header's size) as LE u64, then header, then data.
void write_raw(const fs::path& path, std::string_view header, const std::string& data,
               std::optional<std::uint64_t> length = std::nullopt) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const std::uint64_t n = length.value_or(header.size());
  for (int i = 0; i < 8; ++i) {
    out.put(static_cast<char>((n >> (8 * i)) & 0xFFU));
  }
  out << header << data;
}

/// Overwrites the 8-byte header length of an existing file.
void patch_length(const fs::path& path, std::uint64_t n) {
  std::fstream io(path, std::ios::binary | std::ios::in | std::ios::out);
  for (int i = 0; i < 8; ++i) {
    io.put(static_cast<char>((n >> (8 * i)) & 0xFFU));
  }
}

std::uint64_t read_length(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) {
    n |= static_cast<std::uint64_t>(static_cast<unsigned char>(in.get())) << (8 * i);
  }
  return n;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Little-endian bytes of float values, for hand-built files.
std::string f32_bytes(const std::vector<float>& values) {
  std::string out(values.size() * sizeof(float), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

/// Succeeds when f throws ErrorException with `code` and a message containing every needle.
template <class F>
::testing::AssertionResult fails_with(F&& f, ErrorCode code,
                                      const std::vector<std::string>& needles) {
  try {
    std::forward<F>(f)();
  } catch (const base::ErrorException& e) {
    const std::string& message = e.error().message;
    if (e.error().code != code) {
      return ::testing::AssertionFailure()
             << "code " << base::to_string(e.error().code) << ", expected " << base::to_string(code)
             << ": " << message;
    }
    for (const auto& needle : needles) {
      if (message.find(needle) == std::string::npos) {
        return ::testing::AssertionFailure() << "message lacks \"" << needle << "\": " << message;
      }
    }
    return ::testing::AssertionSuccess() << message;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "not an ErrorException: " << e.what();
  }
  return ::testing::AssertionFailure() << "nothing was thrown";
}

::testing::AssertionResult open_fails(const fs::path& path, ErrorCode code,
                                      std::vector<std::string> needles) {
  needles.push_back(path.filename().string());
  return fails_with([&] { (void)SafetensorsFile::open(path); }, code, needles);
}

/// Random bit patterns of `dtype`, NaN payloads, infinities and -0 included for floats.
at::Tensor random_tensor(c10::ScalarType dtype, at::IntArrayRef shape, at::Generator& gen) {
  const auto bits = [&](c10::ScalarType int_type, std::int64_t lo, std::int64_t hi) {
    return at::randint(lo, hi, shape, gen, at::TensorOptions().dtype(at::kLong))
        .to(int_type)
        .view(dtype);
  };
  switch (dtype) {
    case at::kBool:
      return at::randint(0, 2, shape, gen, at::TensorOptions().dtype(at::kLong)).to(at::kBool);
    case at::kBFloat16:
    case at::kHalf:
      return bits(at::kShort, -32768, 32768);
    case at::kFloat:
      return bits(at::kInt, std::numeric_limits<std::int32_t>::min(),
                  std::numeric_limits<std::int32_t>::max());
    case at::kDouble:
      return bits(at::kLong, std::numeric_limits<std::int64_t>::min(),
                  std::numeric_limits<std::int64_t>::max());
    case at::kByte:
      return at::randint(0, 256, shape, gen, at::TensorOptions().dtype(at::kLong)).to(dtype);
    case at::kChar:
      return at::randint(-128, 128, shape, gen, at::TensorOptions().dtype(at::kLong)).to(dtype);
    case at::kShort:
      return bits(at::kShort, -32768, 32768);
    case at::kInt:
      return bits(at::kInt, std::numeric_limits<std::int32_t>::min(),
                  std::numeric_limits<std::int32_t>::max());
    default:
      return bits(at::kLong, std::numeric_limits<std::int64_t>::min(),
                  std::numeric_limits<std::int64_t>::max());
  }
}

/// Bitwise equality: floats are compared through an integer view so NaN payloads count.
bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) {
    return false;
  }
  switch (a.scalar_type()) {
    case at::kBFloat16:
    case at::kHalf:
      return at::equal(a.view(at::kShort), b.view(at::kShort));
    case at::kFloat:
      return at::equal(a.view(at::kInt), b.view(at::kInt));
    case at::kDouble:
      return at::equal(a.view(at::kLong), b.view(at::kLong));
    default:
      return at::equal(a, b);
  }
}

const std::vector<std::pair<std::string, c10::ScalarType>>& all_dtypes() {
  static const std::vector<std::pair<std::string, c10::ScalarType>> dtypes = {
      {"BF16", at::kBFloat16}, {"F16", at::kHalf}, {"F32", at::kFloat}, {"F64", at::kDouble},
      {"I64", at::kLong},      {"I32", at::kInt},  {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},       {"BOOL", at::kBool}};
  return dtypes;
}

// ---------------------------------------------------------------------------------------------
// Round trips

TEST_F(SafetensorsRoundTrip, EveryDtypeBitwise) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(kSeed);
  NamedTensors tensors;
  for (const auto& [name, dtype] : all_dtypes()) {
    // Odd sizes so 1- and 2-byte tensors would misalign what follows if layout were naive.
    tensors.emplace_back("t." + name, random_tensor(dtype, {3, 5}, gen));
  }
  const fs::path path = dir_ / "all.safetensors";
  write_safetensors(path, tensors);

  const auto file = SafetensorsFile::open(path);
  ASSERT_EQ(file->tensors().size(), tensors.size());
  for (const auto& [name, expected] : tensors) {
    SCOPED_TRACE(name);
    const TensorInfo& info = file->tensors().at(name);
    EXPECT_EQ(info.name, name);
    EXPECT_EQ(info.dtype, expected.scalar_type());
    EXPECT_EQ(info.shape, (std::vector<std::int64_t>{3, 5}));
    EXPECT_EQ(info.end - info.begin, 15 * expected.element_size());
    EXPECT_EQ(info.file, path);
    const at::Tensor got = file->tensor(name);
    EXPECT_EQ(got.device(), at::kCPU);
    EXPECT_TRUE(bitwise_equal(got, expected));
    EXPECT_TRUE(at::equal(got.view(at::kByte), expected.contiguous().view(at::kByte)));
  }
}

TEST_F(SafetensorsRoundTrip, Bf16SpecialValuesBitwise) {
  // +0, -0, +inf, -inf, quiet NaN, NaN with payload, smallest subnormal, largest finite.
  const std::vector<std::int16_t> patterns = {0x0000, static_cast<std::int16_t>(0x8000),
                                              0x7F80, static_cast<std::int16_t>(0xFF80),
                                              0x7FC0, 0x7FA5,
                                              0x0001, 0x7F7F};
  const at::Tensor bits = at::tensor(at::ArrayRef<std::int16_t>(patterns), at::kShort);
  const at::Tensor bf16 = bits.view(at::kBFloat16);
  const fs::path path = dir_ / "bf16.safetensors";
  write_safetensors(path, {{"special", bf16}});

  const at::Tensor got = SafetensorsFile::open(path)->tensor("special");
  ASSERT_EQ(got.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(got.view(at::kShort), bits));
}

TEST_F(SafetensorsRoundTrip, ScalarsAndZeroSizeTensors) {
  const at::Tensor scalar = at::scalar_tensor(3.5, at::kFloat);
  const at::Tensor scalar_i64 = at::scalar_tensor(-7, at::kLong);
  const at::Tensor empty1 = at::empty({0}, at::kFloat);
  const at::Tensor empty3 = at::empty({3, 0, 2}, at::kBFloat16);
  const at::Tensor after = at::arange(4, at::kInt);
  const fs::path path = dir_ / "edge.safetensors";
  write_safetensors(path, {{"scalar", scalar},
                           {"scalar_i64", scalar_i64},
                           {"empty1", empty1},
                           {"empty3", empty3},
                           {"after", after}});

  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->tensors().at("scalar").shape, std::vector<std::int64_t>{});
  const at::Tensor s = file->tensor("scalar");
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item<float>(), 3.5F);
  EXPECT_EQ(file->tensor("scalar_i64").item<std::int64_t>(), -7);

  const TensorInfo& e3 = file->tensors().at("empty3");
  EXPECT_EQ(e3.begin, e3.end);
  EXPECT_EQ(e3.shape, (std::vector<std::int64_t>{3, 0, 2}));
  const at::Tensor got3 = file->tensor("empty3");
  EXPECT_EQ(got3.sizes(), empty3.sizes());
  EXPECT_EQ(got3.scalar_type(), at::kBFloat16);
  EXPECT_EQ(got3.numel(), 0);
  EXPECT_EQ(file->tensor("empty1").sizes(), at::IntArrayRef({0}));
  EXPECT_TRUE(at::equal(file->tensor("after"), after));
}

TEST_F(SafetensorsRoundTrip, MetadataRoundTrip) {
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"note", "quotes \" and \\ and ünïcode"}, {"empty", ""}};
  const fs::path with = dir_ / "with.safetensors";
  write_safetensors(with, {{"x", at::ones({2}, at::kFloat)}}, metadata);
  EXPECT_EQ(SafetensorsFile::open(with)->metadata(), metadata);

  const fs::path without = dir_ / "without.safetensors";
  write_safetensors(without, {{"x", at::ones({2}, at::kFloat)}});
  EXPECT_TRUE(SafetensorsFile::open(without)->metadata().empty());
  EXPECT_EQ(read_text(without).find("__metadata__"), std::string::npos);
}

TEST_F(SafetensorsRoundTrip, NoTensorsAtAll) {
  const fs::path path = dir_ / "none.safetensors";
  write_safetensors(path, {}, {{"k", "v"}});
  const auto file = SafetensorsFile::open(path);
  EXPECT_TRUE(file->tensors().empty());
  EXPECT_EQ(file->metadata().at("k"), "v");
}

TEST_F(SafetensorsRoundTrip, NonContiguousAndOffsetInputsAreWrittenRowMajor) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(kSeed + 1);
  const at::Tensor base = at::randn({6, 4}, gen, at::TensorOptions().dtype(at::kFloat));
  const at::Tensor transposed = base.t();             // [4, 6], strides (1, 4)
  const at::Tensor sliced = base.slice(0, 2, 5);      // [3, 4], storage offset 8
  const at::Tensor strided = base.slice(1, 0, 4, 2);  // [6, 2], stride 2
  ASSERT_FALSE(transposed.is_contiguous());
  ASSERT_NE(sliced.storage_offset(), 0);
  const fs::path path = dir_ / "views.safetensors";
  write_safetensors(path, {{"t", transposed}, {"s", sliced}, {"k", strided}});

  const auto file = SafetensorsFile::open(path);
  EXPECT_TRUE(at::equal(file->tensor("t"), transposed));
  EXPECT_TRUE(at::equal(file->tensor("s"), sliced));
  EXPECT_TRUE(at::equal(file->tensor("k"), strided));
  EXPECT_TRUE(file->tensor("t").is_contiguous());
}

TEST_F(SafetensorsRoundTrip, HeaderIsPaddedAndDataAligned) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(kSeed + 2);
  NamedTensors tensors = {{"a_byte", random_tensor(at::kByte, {3}, gen)},
                          {"b_f64", random_tensor(at::kDouble, {2}, gen)},
                          {"c_bf16", random_tensor(at::kBFloat16, {5}, gen)},
                          {"d_i32", random_tensor(at::kInt, {1}, gen)}};
  const fs::path path = dir_ / "aligned.safetensors";
  write_safetensors(path, tensors);

  const std::uint64_t n = read_length(path);
  EXPECT_EQ(n % 8, 0U);
  const std::string text = read_text(path);
  const std::string header = text.substr(8, n);
  const auto last = header.find_last_not_of(' ');
  ASSERT_NE(last, std::string::npos);
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - last - 1, 8U);  // at most 7 padding spaces

  // ref: prepare() orders data by descending dtype size, so each tensor is aligned.
  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->tensors().at("b_f64").begin, 0U);
  EXPECT_LT(file->tensors().at("d_i32").begin, file->tensors().at("c_bf16").begin);
  EXPECT_LT(file->tensors().at("c_bf16").begin, file->tensors().at("a_byte").begin);
  for (const auto& [name, expected] : tensors) {
    const at::Tensor got = file->tensor(name);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(got.data_ptr()) % got.element_size(), 0U) << name;
    EXPECT_TRUE(bitwise_equal(got, expected)) << name;
  }
}

// ---------------------------------------------------------------------------------------------
// Zero-copy views

TEST_F(SafetensorsView, ViewKeepsMappingAliveAfterFileIsDropped) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(kSeed + 3);
  const at::Tensor expected = at::randn({16, 8}, gen, at::TensorOptions().dtype(at::kFloat));
  const fs::path path = dir_ / "alive.safetensors";
  write_safetensors(path, {{"w", expected}});

  auto file = SafetensorsFile::open(path);
  const std::weak_ptr<const SafetensorsFile> weak = file;
  at::Tensor view = file->tensor("w");
  // Zero-copy: two views share the mapped bytes rather than each owning a copy.
  EXPECT_EQ(file->tensor("w").data_ptr(), view.data_ptr());

  file.reset();
  EXPECT_FALSE(weak.expired()) << "the view must keep the mapping alive";
  EXPECT_TRUE(at::equal(view, expected));
  EXPECT_FLOAT_EQ(view.sum().item<float>(), expected.sum().item<float>());

  view = at::Tensor();
  EXPECT_TRUE(weak.expired()) << "dropping the last view must release the mapping";
}

TEST_F(SafetensorsView, UnknownNameIsInvalidArgument) {
  const fs::path path = dir_ / "one.safetensors";
  write_safetensors(path, {{"w", at::zeros({2}, at::kFloat)}});
  const auto file = SafetensorsFile::open(path);
  EXPECT_TRUE(fails_with([&] { (void)file->tensor("nope"); }, ErrorCode::InvalidArgument,
                         {"nope", "one.safetensors"}));
}

// ---------------------------------------------------------------------------------------------
// In memory (a trained preset's checkpoint bundled in the binary)

TEST_F(SafetensorsView, FromMemoryReadsAsTheFileAndViewsTheBytes) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(kSeed + 4);
  NamedTensors tensors;
  for (const auto& [name, dtype] : all_dtypes()) {
    tensors.emplace_back("t." + name, random_tensor(dtype, {3, 5}, gen));
  }
  const fs::path path = dir_ / "bundle.safetensors";
  write_safetensors(path, tensors, {{"format", "pt"}});
  const std::string bytes = read_text(path);  // outlives every view, as static data does

  const Checkpoint ckpt = Checkpoint::from_memory("preset x (bundled)", bytes.data(), bytes.size());
  EXPECT_EQ(ckpt.path(), fs::path("preset x (bundled)"));
  EXPECT_EQ(ckpt.metadata().at("format"), "pt");
  ASSERT_EQ(ckpt.names().size(), tensors.size());
  for (const auto& [name, expected] : tensors) {
    SCOPED_TRACE(name);
    const at::Tensor got = ckpt.tensor(name);
    EXPECT_TRUE(bitwise_equal(got, expected));
    // Zero-copy where aligned: the view points into the caller's bytes.
    const auto* p = static_cast<const char*>(got.data_ptr());
    if (reinterpret_cast<std::uintptr_t>(p) % expected.element_size() == 0) {
      EXPECT_TRUE(p >= bytes.data() && p < bytes.data() + bytes.size());
    }
  }
}

TEST_F(SafetensorsView, FromMemoryRefusesWhatOpenRefuses) {
  const fs::path path = dir_ / "good.safetensors";
  write_safetensors(path, {{"a", at::ones({4}, at::kFloat)}, {"b", at::ones({4}, at::kFloat)}});
  const std::string bytes = read_text(path);
  EXPECT_TRUE(fails_with([&] { (void)SafetensorsFile::from_memory("m", bytes.data(), 5); },
                         ErrorCode::FileUnrecognised, {"m", "5 bytes"}));
  EXPECT_TRUE(fails_with([&] { (void)SafetensorsFile::from_memory("m", nullptr, 0); },
                         ErrorCode::FileUnrecognised, {"0 bytes"}));
  EXPECT_TRUE(
      fails_with([&] { (void)SafetensorsFile::from_memory("m", bytes.data(), bytes.size() - 3); },
                 ErrorCode::FileCorrupted, {"m", "'b'", "truncated"}));
  std::string lying = bytes;
  lying[0] = static_cast<char>(0xFF);  // header length far past the end
  EXPECT_TRUE(fails_with([&] { (void)Checkpoint::from_memory("m", lying.data(), lying.size()); },
                         ErrorCode::FileCorrupted, {"m", "header length"}));
}

// ---------------------------------------------------------------------------------------------
// Files written by other tools

TEST_F(SafetensorsForeignFile, UnpaddedHeaderWithMisalignedDataReadsCorrectly) {
  // 55-byte header: data starts at byte 63, misaligned for F32; values must still be right.
  const std::string header = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
  ASSERT_NE((8 + header.size()) % 4, 0U);
  const fs::path path = dir_ / "unpadded.safetensors";
  write_raw(path, header, f32_bytes({1.5F, -2.0F, 1e30F}));

  const at::Tensor got = SafetensorsFile::open(path)->tensor("w");
  EXPECT_TRUE(at::equal(got, at::tensor({1.5F, -2.0F, 1e30F})));
}

TEST_F(SafetensorsForeignFile, AnyKeyOrderSpacePaddingAndUnknownFieldsAccepted) {
  // Data of "b" precedes "a"; keys unordered; an extra field; header padded with spaces.
  const std::string header = R"({"b":{"shape":[2],"dtype":"F32","data_offsets":[0,8],"extra":1},)"
                             R"("a":{"dtype":"I8","shape":[2,2],"data_offsets":[8,12]},)"
                             R"("__metadata__":{"format":"pt"}})" +
                             std::string(13, ' ');
  const fs::path path = dir_ / "foreign.safetensors";
  write_raw(path, header, f32_bytes({4.0F, 5.0F}) + std::string("\x01\x02\xFF\x00", 4));

  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_TRUE(at::equal(file->tensor("b"), at::tensor({4.0F, 5.0F})));
  EXPECT_TRUE(
      at::equal(file->tensor("a"),
                at::tensor({1, 2, -1, 0}, at::TensorOptions().dtype(at::kChar)).view({2, 2})));
}

TEST_F(SafetensorsForeignFile, ZeroSizeTensorsBetweenOthersAreValid) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("z1":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]},)"
                             R"("z2":{"dtype":"BF16","shape":[0],"data_offsets":[4,4]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  const fs::path path = dir_ / "zeros.safetensors";
  write_raw(path, header, f32_bytes({1.0F, 2.0F}));

  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->tensor("z1").sizes(), at::IntArrayRef({0, 3}));
  EXPECT_EQ(file->tensor("z2").scalar_type(), at::kBFloat16);
  EXPECT_EQ(file->tensor("b").item<float>(), 2.0F);
}

// ---------------------------------------------------------------------------------------------
// Corruption: every case names the file (and the tensor where there is one)

constexpr std::string_view kGoodHeader =
    R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

TEST_F(SafetensorsCorruption, MissingFile) {
  EXPECT_TRUE(open_fails(dir_ / "absent.safetensors", ErrorCode::FileNotFound, {}));
}

TEST_F(SafetensorsCorruption, DirectoryIsNotASafetensorsFile) {
  EXPECT_TRUE(open_fails(dir_, ErrorCode::FileUnrecognised, {"regular file"}));
}

TEST_F(SafetensorsCorruption, ShorterThanEightBytes) {
  const fs::path empty = dir_ / "empty.safetensors";
  std::ofstream(empty).close();
  EXPECT_TRUE(open_fails(empty, ErrorCode::FileUnrecognised, {"0 bytes"}));

  const fs::path tiny = dir_ / "tiny.safetensors";
  std::ofstream(tiny, std::ios::binary) << "abcde";
  EXPECT_TRUE(open_fails(tiny, ErrorCode::FileUnrecognised, {"5 bytes"}));
}

TEST_F(SafetensorsCorruption, TruncatedFile) {
  const fs::path path = dir_ / "cut.safetensors";
  write_safetensors(path, {{"a", at::ones({4}, at::kFloat)}, {"b", at::ones({4}, at::kFloat)}});
  fs::resize_file(path, fs::file_size(path) - 3);
  // "b" is laid out last (same dtype size: name order), so it is the one cut short.
  EXPECT_TRUE(open_fails(path, ErrorCode::FileCorrupted, {"'b'", "truncated"}));
}

TEST_F(SafetensorsCorruption, TruncatedInsideHeader) {
  const fs::path path = dir_ / "cut_header.safetensors";
  write_safetensors(path, {{"a", at::ones({4}, at::kFloat)}});
  fs::resize_file(path, 20);
  EXPECT_TRUE(open_fails(path, ErrorCode::FileCorrupted, {"header length"}));
}

TEST_F(SafetensorsCorruption, LyingHeaderLength) {
  const fs::path path = dir_ / "lying.safetensors";
  write_safetensors(path, {{"w", at::ones({4}, at::kFloat)}});
  const auto size = fs::file_size(path);
  patch_length(path, size);  // needs 8 more bytes than the file has
  EXPECT_TRUE(open_fails(path, ErrorCode::FileCorrupted, {"lying header length"}));
}

TEST_F(SafetensorsCorruption, AbsurdHeaderLength) {
  const fs::path path = dir_ / "absurd.safetensors";
  write_raw(path, kGoodHeader, f32_bytes({1, 2}), 200'000'000);
  EXPECT_TRUE(open_fails(path, ErrorCode::FileCorrupted, {"200000000", "exceeds"}));

  const fs::path huge = dir_ / "huge.safetensors";
  write_raw(huge, kGoodHeader, f32_bytes({1, 2}), std::numeric_limits<std::uint64_t>::max());
  EXPECT_TRUE(open_fails(huge, ErrorCode::FileCorrupted, {"exceeds"}));
}

TEST_F(SafetensorsCorruption, NonJsonHeader) {
  const fs::path garbage = dir_ / "garbage.safetensors";
  write_raw(garbage, "this is not json", "");
  EXPECT_TRUE(open_fails(garbage, ErrorCode::FileUnrecognised, {"'{'"}));

  const fs::path broken = dir_ / "broken.safetensors";
  write_raw(broken, R"({"w": {"dtype": "F32", )", "");
  EXPECT_TRUE(open_fails(broken, ErrorCode::FileUnrecognised, {"JSON"}));

  const fs::path array = dir_ / "array.safetensors";
  write_raw(array, "[1, 2]  ", "");
  EXPECT_TRUE(open_fails(array, ErrorCode::FileUnrecognised, {}));

  const fs::path zero = dir_ / "zero_length.safetensors";
  write_raw(zero, "", f32_bytes({1}));
  EXPECT_TRUE(open_fails(zero, ErrorCode::FileUnrecognised, {}));
}

TEST_F(SafetensorsCorruption, OverlappingOffsets) {
  const fs::path path = dir_ / "overlap.safetensors";
  write_raw(path,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            f32_bytes({1, 2, 3}));
  EXPECT_TRUE(open_fails(path, ErrorCode::FileCorrupted, {"'b'", "overlap", "'a'"}));
}

TEST_F(SafetensorsCorruption, ZeroSizeTensorInsideAnother) {
  const fs::path path = dir_ / "inside.safetensors";
  write_raw(path,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
            f32_bytes({1, 2}));
  EXPECT_TRUE(open_fails(path, ErrorCode::FileCorrupted, {"'z'", "overlap"}));
}

TEST_F(SafetensorsCorruption, SizeDoesNotMatchDtypeTimesShape) {
  const fs::path path = dir_ / "size.safetensors";
  write_raw(path, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32_bytes({1, 2}));
  EXPECT_TRUE(open_fails(path, ErrorCode::FileCorrupted, {"'w'", "needs 12"}));

  const fs::path scalar = dir_ / "scalar.safetensors";
  write_raw(scalar, R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,4]}})", f32_bytes({1}));
  EXPECT_TRUE(open_fails(scalar, ErrorCode::FileCorrupted, {"'s'", "needs 8"}));
}

TEST_F(SafetensorsCorruption, ShapeProductOverflows) {
  const fs::path path = dir_ / "overflow.safetensors";
  write_raw(path, R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
            f32_bytes({1, 2}));
  EXPECT_TRUE(open_fails(path, ErrorCode::FileCorrupted, {"'w'", "overflow"}));
}

TEST_F(SafetensorsCorruption, UnknownDtype) {
  const fs::path path = dir_ / "dtype.safetensors";
  write_raw(path, R"({"w":{"dtype":"F8_X","shape":[2],"data_offsets":[0,2]}})", "ab");
  EXPECT_TRUE(open_fails(path, ErrorCode::FileCorrupted, {"'w'", "F8_X"}));

  const fs::path number = dir_ / "dtype_number.safetensors";
  write_raw(number, R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,2]}})", "ab");
  EXPECT_TRUE(open_fails(number, ErrorCode::FileCorrupted, {"'w'", "dtype"}));
}

TEST_F(SafetensorsCorruption, ValidButUnsupportedDtypeIsUnrecognised) {
  const fs::path path = dir_ / "u16.safetensors";
  write_raw(path, R"({"w":{"dtype":"U16","shape":[2],"data_offsets":[0,4]}})", "abcd");
  EXPECT_TRUE(open_fails(path, ErrorCode::FileUnrecognised, {"'w'", "U16"}));
}

TEST_F(SafetensorsCorruption, OffsetsOutOfRange) {
  const fs::path path = dir_ / "range.safetensors";
  write_raw(path, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", f32_bytes({1, 2}));
  EXPECT_TRUE(open_fails(path, ErrorCode::FileCorrupted, {"'w'", "out of range"}));
}

TEST_F(SafetensorsCorruption, BeginAfterEnd) {
  const fs::path path = dir_ / "reversed.safetensors";
  write_raw(path, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", f32_bytes({1, 2}));
  EXPECT_TRUE(open_fails(path, ErrorCode::FileCorrupted, {"'w'", "begin after"}));
}

TEST_F(SafetensorsCorruption, NegativeDimension) {
  const fs::path path = dir_ / "negative.safetensors";
  write_raw(path, R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32_bytes({1, 2}));
  EXPECT_TRUE(open_fails(path, ErrorCode::FileCorrupted, {"'w'", "negative"}));

  const fs::path fractional = dir_ / "fractional.safetensors";
  write_raw(fractional, R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})",
            f32_bytes({1, 2}));
  EXPECT_TRUE(open_fails(fractional, ErrorCode::FileCorrupted, {"'w'", "non-integer"}));
}

TEST_F(SafetensorsCorruption, NonIntegerOffsets) {
  for (const std::string offsets : {"[0, 8.0]", R"(["0", "8"])", "[-1, 7]", "[0]", "[0, 4, 8]"}) {
    SCOPED_TRACE(offsets);
    const fs::path path = dir_ / "offsets.safetensors";
    write_raw(path, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":)" + offsets + "}}",
              f32_bytes({1, 2}));
    EXPECT_TRUE(open_fails(path, ErrorCode::FileCorrupted, {"'w'", "data_offsets"}));
  }
}

TEST_F(SafetensorsCorruption, MalformedEntries) {
  const fs::path not_object = dir_ / "entry.safetensors";
  write_raw(not_object, R"({"w":[1,2,3]})", "");
  EXPECT_TRUE(open_fails(not_object, ErrorCode::FileCorrupted, {"'w'", "not an object"}));

  const fs::path no_shape = dir_ / "no_shape.safetensors";
  write_raw(no_shape, R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", f32_bytes({1, 2}));
  EXPECT_TRUE(open_fails(no_shape, ErrorCode::FileCorrupted, {"'w'", "\"shape\""}));

  const fs::path bad_meta = dir_ / "meta.safetensors";
  write_raw(bad_meta, R"({"__metadata__":{"epoch":3},)" + std::string(kGoodHeader.substr(1)),
            f32_bytes({1, 2}));
  EXPECT_TRUE(open_fails(bad_meta, ErrorCode::FileCorrupted, {"__metadata__", "epoch"}));
}

TEST_F(SafetensorsCorruption, HoleInDataSection) {
  // ref: Metadata::validate requires offsets contiguous from 0; a hole could hide data.
  const fs::path path = dir_ / "hole.safetensors";
  write_raw(path,
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            f32_bytes({1, 2, 3}));
  EXPECT_TRUE(open_fails(path, ErrorCode::FileCorrupted, {"'b'", "hole"}));

  const fs::path leading = dir_ / "leading.safetensors";
  write_raw(leading, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            f32_bytes({1, 2}));
  EXPECT_TRUE(open_fails(leading, ErrorCode::FileCorrupted, {"'w'", "hole"}));
}

TEST_F(SafetensorsCorruption, TrailingBytesBelongToNoTensor) {
  // ref: read_metadata MetadataIncompleteBuffer: the last tensor must end at end of file.
  const fs::path path = dir_ / "trailing.safetensors";
  write_raw(path, kGoodHeader, f32_bytes({1, 2, 3}));
  EXPECT_TRUE(open_fails(path, ErrorCode::FileCorrupted, {"trailing"}));
}

// ---------------------------------------------------------------------------------------------
// Writing

TEST_F(SafetensorsWrite, RejectsBadNamesAndDtypesWithoutWritingAnything) {
  const fs::path path = dir_ / "bad.safetensors";
  const at::Tensor t = at::ones({2}, at::kFloat);
  EXPECT_TRUE(fails_with(
      [&] {
        write_safetensors(path, {{"", t}});
      },
      ErrorCode::InvalidArgument, {"non-empty"}));
  EXPECT_TRUE(fails_with(
      [&] {
        write_safetensors(path, {{"a", t}, {"b", t}, {"a", t}});
      },
      ErrorCode::InvalidArgument, {"duplicate", "'a'"}));
  EXPECT_TRUE(fails_with(
      [&] {
        write_safetensors(path, {{"__metadata__", t}});
      },
      ErrorCode::InvalidArgument, {"__metadata__"}));
  EXPECT_TRUE(fails_with(
      [&] {
        write_safetensors(path, {{"u", at::Tensor()}});
      },
      ErrorCode::InvalidArgument, {"'u'", "undefined"}));
  EXPECT_TRUE(fails_with(
      [&] {
        write_safetensors(path, {{"c", at::ones({2}, at::kComplexFloat)}});
      },
      ErrorCode::InvalidArgument, {"'c'"}));
  EXPECT_TRUE(fails_with(
      [&] {
        write_safetensors(path, {{std::string("bad\xFF"), t}});
      },
      ErrorCode::InvalidArgument, {"UTF-8"}));
  EXPECT_TRUE(listing(dir_).empty());
}

TEST_F(SafetensorsWrite, UnwritableTargetLeavesNoFileAndNoTemp) {
  // Works as root too: a regular file cannot be a directory.
  const fs::path blocker = dir_ / "blocker";
  std::ofstream(blocker) << "x";
  const fs::path path = blocker / "model.safetensors";
  EXPECT_TRUE(fails_with(
      [&] {
        write_safetensors(path, {{"w", at::ones({2}, at::kFloat)}});
      },
      ErrorCode::IoFailed, {"model.safetensors"}));
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"blocker"});
}

TEST_F(SafetensorsWrite, FailedRenameRemovesTheTempFile) {
  // The temp file is created and filled, then the rename onto a directory fails.
  const fs::path path = dir_ / "occupied";
  fs::create_directories(path / "inside");
  EXPECT_TRUE(fails_with(
      [&] {
        write_safetensors(path, {{"w", at::ones({64}, at::kFloat)}});
      },
      ErrorCode::IoFailed, {"occupied", "rename"}));
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"occupied"});
  EXPECT_EQ(listing(path), std::vector<std::string>{"inside"});
}

TEST_F(SafetensorsWrite, OverwritesAtomicallyAndIsReadableByOthers) {
  const fs::path path = dir_ / "model.safetensors";
  write_safetensors(path, {{"old", at::zeros({8}, at::kFloat)}});
  auto first = SafetensorsFile::open(path);
  const at::Tensor old_view = first->tensor("old");
  first.reset();

  write_safetensors(path, {{"new", at::full({3}, 2.0, at::kFloat)}});
  const auto second = SafetensorsFile::open(path);
  EXPECT_EQ(second->tensors().count("old"), 0U);
  EXPECT_TRUE(at::equal(second->tensor("new"), at::full({3}, 2.0, at::kFloat)));
  // The rename replaced the inode, so a view of the old file still sees its own bytes.
  EXPECT_TRUE(at::equal(old_view, at::zeros({8}, at::kFloat)));
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"model.safetensors"});
  EXPECT_NE(fs::status(path).permissions() & fs::perms::others_read, fs::perms::none);
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

NamedTensors six_tensors(std::uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  NamedTensors tensors;
  for (int i = 0; i < 6; ++i) {
    // 4 x 4 f32 = 64 bytes each; names deliberately out of alphabetical order.
    tensors.emplace_back("layers." + std::to_string(5 - i) + ".weight",
                         at::randn({4, 4}, gen, at::TensorOptions().dtype(at::kFloat)));
  }
  return tensors;
}

TEST_F(CheckpointTest, ShardedRoundTrip) {
  const NamedTensors tensors = six_tensors(kSeed + 4);
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  const fs::path dir = dir_ / "ckpt";             // created by write_checkpoint
  write_checkpoint(dir, tensors, 150, metadata);  // 2 x 64 bytes per shard

  EXPECT_EQ(listing(dir),
            (std::vector<std::string>{
                "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  const Json index = Json::parse(read_text(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index.at("metadata").at("total_size").get<std::uint64_t>(), 6U * 64U);
  const Json& weight_map = index.at("weight_map");
  ASSERT_EQ(weight_map.size(), 6U);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    // Input order is kept: tensors 0,1 in shard 1, 2,3 in shard 2, 4,5 in shard 3.
    EXPECT_EQ(weight_map.at(tensors[i].first).get<std::string>(),
              "model-0000" + std::to_string(i / 2 + 1) + "-of-00003.safetensors");
  }

  const Checkpoint ckpt = Checkpoint::open(dir);
  EXPECT_EQ(ckpt.path(), dir);
  std::vector<std::string> expected_names;
  for (const auto& entry : tensors) {
    expected_names.push_back(entry.first);
  }
  std::sort(expected_names.begin(), expected_names.end());
  EXPECT_EQ(ckpt.names(), expected_names);
  EXPECT_EQ(ckpt.metadata(), metadata);
  for (const auto& [name, expected] : tensors) {
    EXPECT_TRUE(ckpt.contains(name));
    EXPECT_EQ(ckpt.info(name).file.filename().string(), weight_map.at(name).get<std::string>());
    EXPECT_EQ(ckpt.info(name).dtype, at::kFloat);
    EXPECT_TRUE(at::equal(ckpt.tensor(name), expected)) << name;
  }
  EXPECT_FALSE(ckpt.contains("layers.6.weight"));
}

TEST_F(CheckpointTest, OversizedTensorGetsItsOwnShard) {
  const NamedTensors tensors = {{"s1", at::ones({4}, at::kFloat)},
                                {"big", at::ones({100}, at::kFloat)},  // 400 bytes > limit
                                {"s2", at::ones({4}, at::kFloat)},
                                {"s3", at::ones({4}, at::kFloat)}};
  write_checkpoint(dir_, tensors, 100);
  const Checkpoint ckpt = Checkpoint::open(dir_);
  EXPECT_EQ(ckpt.info("s1").file.filename(), "model-00001-of-00003.safetensors");
  EXPECT_EQ(ckpt.info("big").file.filename(), "model-00002-of-00003.safetensors");
  EXPECT_EQ(ckpt.info("s2").file.filename(), "model-00003-of-00003.safetensors");
  EXPECT_EQ(ckpt.info("s3").file.filename(), "model-00003-of-00003.safetensors");
  EXPECT_TRUE(at::equal(ckpt.tensor("big"), at::ones({100}, at::kFloat)));
}

TEST_F(CheckpointTest, SingleFileWhenEverythingFits) {
  const NamedTensors tensors = six_tensors(kSeed + 5);
  write_checkpoint(dir_, tensors, 1 << 20, {{"k", "v"}});
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"model.safetensors"});

  for (const fs::path& path : {dir_, dir_ / "model.safetensors"}) {
    const Checkpoint ckpt = Checkpoint::open(path);
    EXPECT_EQ(ckpt.names().size(), tensors.size());
    EXPECT_EQ(ckpt.metadata().at("k"), "v");
    for (const auto& [name, expected] : tensors) {
      EXPECT_TRUE(at::equal(ckpt.tensor(name), expected)) << name;
    }
  }
}

TEST_F(CheckpointTest, SingleFileRewriteRemovesStaleIndex) {
  write_checkpoint(dir_, six_tensors(kSeed + 6), 100);
  ASSERT_TRUE(fs::exists(dir_ / "model.safetensors.index.json"));
  write_checkpoint(dir_, {{"only", at::ones({2}, at::kFloat)}}, 1 << 20);
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors.index.json"));
  EXPECT_EQ(Checkpoint::open(dir_).names(), std::vector<std::string>{"only"});
}

TEST_F(CheckpointTest, ViewsOutliveTheCheckpoint) {
  const NamedTensors tensors = six_tensors(kSeed + 7);
  write_checkpoint(dir_, tensors, 150);
  at::Tensor view;
  {
    const Checkpoint ckpt = Checkpoint::open(dir_);
    view = ckpt.tensor(tensors[3].first);
  }
  EXPECT_TRUE(at::equal(view, tensors[3].second));
}

TEST_F(CheckpointTest, WriteRejectsBadInputBeforeWritingAnything) {
  const fs::path dir = dir_ / "ckpt";
  const at::Tensor t = at::ones({4}, at::kFloat);
  EXPECT_TRUE(fails_with(
      [&] {
        write_checkpoint(dir, {{"a", t}, {"b", t}, {"a", t}}, 16);
      },
      ErrorCode::InvalidArgument, {"duplicate", "'a'"}));
  EXPECT_TRUE(fails_with(
      [&] {
        write_checkpoint(dir, {{"a", t}}, 0);
      },
      ErrorCode::InvalidArgument, {"max_shard_bytes"}));
  EXPECT_FALSE(fs::exists(dir));
}

TEST_F(CheckpointTest, MissingPathOrEmptyDirectory) {
  EXPECT_TRUE(fails_with([&] { (void)Checkpoint::open(dir_ / "nowhere"); }, ErrorCode::FileNotFound,
                         {"nowhere"}));
  EXPECT_TRUE(fails_with([&] { (void)Checkpoint::open(dir_); }, ErrorCode::FileNotFound,
                         {dir_.filename().string(), "model.safetensors"}));
}

TEST_F(CheckpointTest, UnknownNameIsInvalidArgument) {
  write_checkpoint(dir_, {{"w", at::ones({2}, at::kFloat)}}, 1024);
  const Checkpoint ckpt = Checkpoint::open(dir_);
  EXPECT_TRUE(fails_with([&] { (void)ckpt.info("ghost"); }, ErrorCode::InvalidArgument, {"ghost"}));
  EXPECT_TRUE(
      fails_with([&] { (void)ckpt.tensor("ghost"); }, ErrorCode::InvalidArgument, {"ghost"}));
}

TEST_F(CheckpointTest, IndexNamingMissingShard) {
  write_checkpoint(dir_, six_tensors(kSeed + 8), 150);
  fs::remove(dir_ / "model-00002-of-00003.safetensors");
  EXPECT_TRUE(fails_with([&] { (void)Checkpoint::open(dir_); }, ErrorCode::FileCorrupted,
                         {"model.safetensors.index.json", "model-00002-of-00003.safetensors"}));
}

TEST_F(CheckpointTest, IndexNamingTensorAbsentFromItsShard) {
  write_checkpoint(dir_, six_tensors(kSeed + 9), 150);
  const fs::path index_path = dir_ / "model.safetensors.index.json";
  Json index = Json::parse(read_text(index_path));
  index["weight_map"]["ghost.weight"] = "model-00001-of-00003.safetensors";
  std::ofstream(index_path) << index.dump();
  EXPECT_TRUE(fails_with([&] { (void)Checkpoint::open(dir_); }, ErrorCode::FileCorrupted,
                         {"'ghost.weight'", "model-00001-of-00003.safetensors"}));
}

TEST_F(CheckpointTest, TensorInTwoShards) {
  write_safetensors(dir_ / "a.safetensors", {{"x", at::ones({2}, at::kFloat)}});
  write_safetensors(dir_ / "b.safetensors",
                    {{"x", at::zeros({2}, at::kFloat)}, {"y", at::ones({1}, at::kFloat)}});
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"metadata":{},"weight_map":{"x":"a.safetensors","y":"b.safetensors"}})";
  EXPECT_TRUE(fails_with([&] { (void)Checkpoint::open(dir_); }, ErrorCode::FileCorrupted,
                         {"'x'", "a.safetensors", "b.safetensors"}));
}

TEST_F(CheckpointTest, MalformedIndex) {
  const fs::path index_path = dir_ / "model.safetensors.index.json";
  write_safetensors(dir_ / "a.safetensors", {{"x", at::ones({2}, at::kFloat)}});
  for (const std::string text :
       {"not json", "[]", R"({"metadata":{}})", R"({"weight_map":{}})", R"({"weight_map":{"x":3}})",
        R"({"weight_map":{"x":"../a.safetensors"}})", R"({"weight_map":{"x":"/etc/passwd"}})"}) {
    SCOPED_TRACE(text);
    std::ofstream(index_path, std::ios::trunc) << text;
    EXPECT_TRUE(fails_with([&] { (void)Checkpoint::open(dir_); }, ErrorCode::FileCorrupted,
                           {"model.safetensors.index.json"}));
  }
}

TEST_F(CheckpointTest, CorruptShardReportsTheShard) {
  write_checkpoint(dir_, six_tensors(kSeed + 10), 150);
  const fs::path shard = dir_ / "model-00003-of-00003.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 1);
  EXPECT_TRUE(fails_with([&] { (void)Checkpoint::open(dir_); }, ErrorCode::FileCorrupted,
                         {"model-00003-of-00003.safetensors", "truncated"}));
}

TEST(SafetensorsDtypeName, MapsEverySupportedDtype) {
  for (const auto& [name, dtype] : all_dtypes()) {
    EXPECT_EQ(safetensors_dtype_name(dtype), name);
  }
  EXPECT_TRUE(fails_with([] { (void)safetensors_dtype_name(at::kComplexDouble); },
                         ErrorCode::InvalidArgument, {"ComplexDouble"}));
}

// ---------------------------------------------------------------------------------------------
// issue #14: nesting limits and special files

TEST_F(SafetensorsCorruption, DeeplyNestedHeaderIsRefusedWithoutRecursing) {
  const std::size_t depth = 100000;
  const fs::path deep = dir_ / "deep.safetensors";
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  write_raw(deep, R"({"w":{"dtype":"F32","shape":)" + nested + R"(,"data_offsets":[0,8]}})",
            f32_bytes({1, 2}));
  EXPECT_TRUE(open_fails(deep, ErrorCode::FileUnrecognised, {"header", "more than 64 deep"}));

  // Within the limit, a nested shape is refused by naming the dimension, not by dumping it.
  const fs::path nested_shape = dir_ / "nested_shape.safetensors";
  write_raw(nested_shape,
            R"({"w":{"dtype":"F32","shape":[2,)" + std::string(50, '[') + std::string(50, ']') +
                R"(],"data_offsets":[0,8]}})",
            f32_bytes({1, 2}));
  try {
    (void)SafetensorsFile::open(nested_shape);
    ADD_FAILURE() << "opened";
  } catch (const base::ErrorException& e) {
    EXPECT_EQ(e.error().code, ErrorCode::FileCorrupted);
    EXPECT_NE(std::string(e.what()).find("non-integer dimension (index 1)"), std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find("[["), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointTest, DeeplyNestedIndexIsRefused) {
  write_checkpoint(dir_, six_tensors(kSeed + 11), 150);
  std::ofstream(dir_ / "model.safetensors.index.json", std::ios::trunc)
      << R"({"weight_map": )" << std::string(100000, '{') << std::string(100000, '}') << "}";
  EXPECT_TRUE(fails_with([&] { (void)Checkpoint::open(dir_); }, ErrorCode::FileCorrupted,
                         {"model.safetensors.index.json", "more than 64 deep"}));
}

/// Expects Checkpoint::open(dir) to fail with FileUnrecognised naming a FIFO, without blocking.
void expect_fifo_refused(const fs::path& fifo, const fs::path& open_path) {
  const base::Error error =
      batchlens::test::expect_refused_without_blocking(fifo, [&]() -> base::Result<void> {
        return base::guarded([&] { (void)Checkpoint::open(open_path); });
      });
  EXPECT_EQ(error.code, ErrorCode::FileUnrecognised) << error.message;
  EXPECT_NE(error.message.find("FIFO"), std::string::npos) << error.message;
  EXPECT_NE(error.message.find(fifo.filename().string()), std::string::npos) << error.message;
}

TEST_F(CheckpointTest, FifosAreRefusedWithoutBlocking) {
  // model.safetensors, the file given directly, the index and a shard.
  const fs::path single = dir_ / "model.safetensors";
  batchlens::test::make_fifo(single);
  expect_fifo_refused(single, dir_);
  expect_fifo_refused(single, single);
  fs::remove(single);

  write_checkpoint(dir_, six_tensors(kSeed + 12), 150);
  const fs::path shard = dir_ / "model-00002-of-00003.safetensors";
  batchlens::test::make_fifo(shard);
  expect_fifo_refused(shard, dir_);

  const fs::path index = dir_ / "model.safetensors.index.json";
  batchlens::test::make_fifo(index);
  expect_fifo_refused(index, dir_);
}

}  // namespace
}  // namespace batchlens::model
