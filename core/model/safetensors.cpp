// SPDX-License-Identifier: Apache-2.0
#include "core/model/safetensors.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>
#include <system_error>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "core/base/atomic_file.h"
#include "core/base/error.h"
#include "core/base/input.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// The format stores little-endian data and the reader hands out zero-copy views of it.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors views need a LE host");

namespace batchlens::model {
namespace {

using base::ErrorCode;
using base::raise;
using Json = nlohmann::json;
namespace fs = std::filesystem;

// ref: safetensors/src/tensor.rs MAX_HEADER_SIZE
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::size_t kLengthBytes = 8;  // the little-endian u64 header length
constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kIndexFileName = "model.safetensors.index.json";
constexpr std::string_view kSingleFileName = "model.safetensors";

struct DtypeName {
  std::string_view name;
  c10::ScalarType type;
};

// The safetensors dtypes that LibTorch 1.13 can represent.
constexpr std::array<DtypeName, 10> kDtypes = {{
    {"BOOL", c10::ScalarType::Bool},
    {"U8", c10::ScalarType::Byte},
    {"I8", c10::ScalarType::Char},
    {"I16", c10::ScalarType::Short},
    {"F16", c10::ScalarType::Half},
    {"BF16", c10::ScalarType::BFloat16},
    {"I32", c10::ScalarType::Int},
    {"F32", c10::ScalarType::Float},
    {"F64", c10::ScalarType::Double},
    {"I64", c10::ScalarType::Long},
}};

// Valid safetensors dtypes (ref: safetensors Dtype) that LibTorch 1.13 has no type for.
constexpr std::array<std::string_view, 10> kUnsupportedDtypes = {
    "U16", "U32", "U64", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64"};

/// Concatenates string pieces in one buffer (messages built inside loops).
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string out;
  ((out += parts), ...);
  return out;
}

using base::errno_text;

[[noreturn]] void file_error(ErrorCode code, const fs::path& file, const std::string& what) {
  raise(code, file.string() + ": " + what);
}

[[noreturn]] void tensor_error(const fs::path& file, const std::string& name,
                               const std::string& what) {
  raise(ErrorCode::FileCorrupted, file.string() + ": tensor '" + name + "': " + what);
}

std::uint64_t read_u64_le(const unsigned char* bytes) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < kLengthBytes; ++i) {
    value |= static_cast<std::uint64_t>(bytes[i]) << (8 * i);
  }
  return value;
}

std::array<unsigned char, kLengthBytes> encode_u64_le(std::uint64_t value) {
  std::array<unsigned char, kLengthBytes> bytes{};
  for (std::size_t i = 0; i < kLengthBytes; ++i) {
    bytes[i] = static_cast<unsigned char>((value >> (8 * i)) & 0xFFU);
  }
  return bytes;
}

/// Closes a file descriptor on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  FdCloser(FdCloser&&) = delete;
  FdCloser& operator=(FdCloser&&) = delete;
  ~FdCloser() { ::close(fd_); }

 private:
  int fd_;
};

c10::ScalarType parse_dtype(const fs::path& file, const std::string& name, const Json& value) {
  if (!value.is_string()) {
    tensor_error(file, name, "\"dtype\" is not a string");
  }
  const auto& text = value.get_ref<const std::string&>();
  for (const auto& entry : kDtypes) {
    if (entry.name == text) {
      return entry.type;
    }
  }
  if (std::find(kUnsupportedDtypes.begin(), kUnsupportedDtypes.end(), text) !=
      kUnsupportedDtypes.end()) {
    raise(ErrorCode::FileUnrecognised, file.string() + ": tensor '" + name + "': dtype '" + text +
                                           "' is valid safetensors but not supported here");
  }
  tensor_error(file, name, "unknown dtype '" + text + "'");
}

std::vector<std::int64_t> parse_shape(const fs::path& file, const std::string& name,
                                      const Json& value) {
  if (!value.is_array()) {
    tensor_error(file, name, "\"shape\" is not an array");
  }
  std::vector<std::int64_t> shape;
  shape.reserve(value.size());
  // Messages name the dimension, never dump the value (it could be any JSON).
  for (std::size_t i = 0; i < value.size(); ++i) {
    const Json& dim = value[i];
    const std::string which = "index " + std::to_string(i);
    if (!dim.is_number_integer()) {
      tensor_error(file, name, "shape has a non-integer dimension (" + which + ")");
    }
    if (!dim.is_number_unsigned()) {
      tensor_error(file, name, "shape has a negative dimension (" + which + ")");
    }
    const auto d = dim.get<std::uint64_t>();
    if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      tensor_error(file, name, "shape has a dimension too large (" + which + ")");
    }
    shape.push_back(static_cast<std::int64_t>(d));
  }
  return shape;
}

std::pair<std::uint64_t, std::uint64_t> parse_offsets(const fs::path& file, const std::string& name,
                                                      const Json& value) {
  if (!value.is_array() || value.size() != 2) {
    tensor_error(file, name, "\"data_offsets\" is not a [begin, end] pair");
  }
  for (const auto& v : value) {
    if (!v.is_number_unsigned()) {
      tensor_error(file, name, "data_offsets are not non-negative integers");
    }
  }
  return {value[0].get<std::uint64_t>(), value[1].get<std::uint64_t>()};
}

/// "[2, 3]"; at most 8 dimensions are shown.
std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i == 8) {
      out += ", ... (" + std::to_string(shape.size()) + " dimensions)";
      break;
    }
    out += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  }
  return out + "]";
}

/// Parses one header entry and checks it on its own: begin <= end, inside the data section,
/// and end - begin == product(shape) * dtype size.
TensorInfo parse_entry(const fs::path& file, const std::string& name, const Json& entry,
                       std::uint64_t data_size) {
  if (!entry.is_object()) {
    tensor_error(file, name, "header entry is not an object");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) {
      tensor_error(file, name, std::string("header entry lacks \"") + key + "\"");
    }
  }
  TensorInfo info;
  info.name = name;
  info.file = file;
  info.dtype = parse_dtype(file, name, entry.at("dtype"));
  info.shape = parse_shape(file, name, entry.at("shape"));
  std::tie(info.begin, info.end) = parse_offsets(file, name, entry.at("data_offsets"));

  const std::string offsets =
      "[" + std::to_string(info.begin) + ", " + std::to_string(info.end) + ")";
  if (info.begin > info.end) {
    tensor_error(file, name, "data_offsets " + offsets + " begin after they end");
  }
  if (info.end > data_size) {
    tensor_error(file, name,
                 "data_offsets " + offsets + " reach past the data section of " +
                     std::to_string(data_size) + " bytes (file truncated or offsets out of range)");
  }
  // ref: Metadata::validate: checked product, ValidationOverflow / TensorInvalidInfo.
  std::uint64_t bytes = c10::elementSize(info.dtype);
  for (const auto d : info.shape) {
    if (__builtin_mul_overflow(bytes, static_cast<std::uint64_t>(d), &bytes)) {
      tensor_error(file, name, "shape x dtype size overflows");
    }
  }
  if (info.end - info.begin != bytes) {
    tensor_error(file, name,
                 "data_offsets " + offsets + " hold " + std::to_string(info.end - info.begin) +
                     " bytes but " + c10::toString(info.dtype) + " shape " +
                     shape_text(info.shape) + " needs " + std::to_string(bytes));
  }
  return info;
}

struct ParsedHeader {
  std::size_t data_offset = 0;
  std::map<std::string, TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
};

/// Validates the whole of a mapped file. ref: SafeTensors::read_metadata and
/// Metadata::validate in safetensors/src/tensor.rs.
ParsedHeader parse_file(const fs::path& file, const unsigned char* bytes, std::uint64_t size) {
  const std::uint64_t n = read_u64_le(bytes);
  // ref: read_metadata checks HeaderTooLarge before InvalidHeaderLength.
  if (n > kMaxHeaderBytes) {
    file_error(ErrorCode::FileCorrupted, file,
               "header length " + std::to_string(n) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (n > size - kLengthBytes) {
    file_error(ErrorCode::FileCorrupted, file,
               "header length " + std::to_string(n) + " is larger than the " +
                   std::to_string(size - kLengthBytes) +
                   " bytes that follow it (lying header length or truncated file)");
  }
  const char* text = reinterpret_cast<const char*>(bytes + kLengthBytes);
  // ref: read_metadata InvalidHeaderStart (safetensors >= 0.4): a header must open with '{'.
  if (n == 0 || text[0] != '{') {
    file_error(ErrorCode::FileUnrecognised, file,
               "header does not start with '{': not a safetensors file");
  }
  // Depth-limited (a header nests 3 deep), without exceptions; trailing spaces (the writer's
  // padding) are whitespace to JSON.
  auto parsed_json = base::parse_json(std::string_view(text, static_cast<std::size_t>(n)),
                                      file.string() + ": header", ErrorCode::FileUnrecognised);
  if (!parsed_json.ok()) {
    throw base::ErrorException(parsed_json.error());
  }
  const Json& header = parsed_json.value();
  if (!header.is_object()) {
    file_error(ErrorCode::FileUnrecognised, file, "header is not a JSON object");
  }

  ParsedHeader parsed;
  parsed.data_offset = kLengthBytes + n;
  const std::uint64_t data_size = size - kLengthBytes - n;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) {
        file_error(ErrorCode::FileCorrupted, file, "\"__metadata__\" is not an object");
      }
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          file_error(ErrorCode::FileCorrupted, file,
                     "\"__metadata__\" value of '" + mkey + "' is not a string");
        }
        parsed.metadata.emplace(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    parsed.tensors.emplace(key, parse_entry(file, key, value, data_size));
  }

  // ref: Metadata::validate: sorted by offsets, the tensors must tile the data section from 0
  // with no overlap and no hole, and read_metadata (MetadataIncompleteBuffer) requires the last
  // end to be the end of the file. Bytes that belong to no tensor could hide data.
  std::vector<const TensorInfo*> order;
  order.reserve(parsed.tensors.size());
  for (const auto& [name, info] : parsed.tensors) {
    order.push_back(&info);
  }
  std::stable_sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
  });
  std::uint64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo* info : order) {
    if (info->begin < covered) {
      tensor_error(file, info->name,
                   "bytes [" + std::to_string(info->begin) + ", " + std::to_string(info->end) +
                       ") overlap tensor '" + previous->name + "' [" +
                       std::to_string(previous->begin) + ", " + std::to_string(previous->end) +
                       ")");
    }
    if (info->begin > covered) {
      tensor_error(file, info->name,
                   "starts at byte " + std::to_string(info->begin) +
                       " but the tensors before it end at " + std::to_string(covered) +
                       ": a hole in the data section");
    }
    covered = info->end;
    previous = info;
  }
  if (covered != data_size) {
    file_error(ErrorCode::FileCorrupted, file,
               "data section has " + std::to_string(data_size) + " bytes but the tensors cover " +
                   std::to_string(covered) + ": trailing bytes belong to no tensor");
  }
  return parsed;
}

std::uint64_t tensor_bytes(const at::Tensor& t) {
  return static_cast<std::uint64_t>(t.numel()) * t.element_size();
}

/// Throws InvalidArgument unless every name is non-empty, unique and not "__metadata__", and
/// every tensor is defined with a dtype safetensors can store.
void check_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::set<std::string_view> seen;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) {
      raise(ErrorCode::InvalidArgument, "safetensors: tensor names must be non-empty");
    }
    if (name == kMetadataKey) {
      raise(ErrorCode::InvalidArgument,
            "safetensors: '__metadata__' is reserved and cannot name a tensor");
    }
    if (!seen.insert(name).second) {
      raise(ErrorCode::InvalidArgument, "safetensors: duplicate tensor name '" + name + "'");
    }
    if (!t.defined()) {
      raise(ErrorCode::InvalidArgument, "safetensors: tensor '" + name + "' is undefined");
    }
    try {
      (void)safetensors_dtype_name(t.scalar_type());
    } catch (const base::ErrorException& e) {
      raise(ErrorCode::InvalidArgument, "tensor '" + name + "': " + e.what());
    }
  }
}

void write_text_atomically(const fs::path& path, const std::string& text) {
  base::AtomicFile out(path);
  out.write(text.data(), text.size());
  out.commit();
}

std::string shard_file_name(std::size_t k, std::size_t n) {
  const auto pad = [](std::size_t v) {
    std::string s = std::to_string(v);
    return s.size() < 5 ? std::string(5 - s.size(), '0') + s : s;
  };
  return "model-" + pad(k) + "-of-" + pad(n) + ".safetensors";
}

}  // namespace

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr && owns_map_) {
    ::munmap(map_, map_size_);
  }
}

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  // A FIFO, device or directory is refused before open (which would wait for a FIFO's writer)
  // and mmap; O_NONBLOCK and the fstat below catch a path swapped in between.
  if (auto checked = base::check_input_file(path, "safetensors file"); !checked.ok()) {
    throw base::ErrorException(checked.error());
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    file_error(ErrorCode::FileNotFound, path, "cannot open: " + errno_text(err));
  }
  const FdCloser closer(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    file_error(ErrorCode::IoFailed, path, "cannot stat: " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    file_error(ErrorCode::FileUnrecognised, path, "not a regular file");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  // ref: read_metadata HeaderTooSmall.
  if (size < kLengthBytes) {
    file_error(ErrorCode::FileUnrecognised, path,
               "only " + std::to_string(size) + " bytes, too short for a safetensors file");
  }

  // make_shared cannot reach the private constructor.
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());  // NOLINT(modernize-make-shared)
  file->path_ = path;
  // The mapping outlives fd; pages come from the page cache, never a heap copy.
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) {
    const int err = errno;
    file_error(ErrorCode::IoFailed, path, "mmap failed: " + errno_text(err));
  }
  file->map_ = map;
  file->map_size_ = size;
  file->index();
  file->self_ = file;
  return file;
}

void SafetensorsFile::index() {
  ParsedHeader parsed = parse_file(path_, static_cast<const unsigned char*>(map_), map_size_);
  data_offset_ = parsed.data_offset;
  tensors_ = std::move(parsed.tensors);
  metadata_ = std::move(parsed.metadata);
}

std::shared_ptr<const SafetensorsFile> SafetensorsFile::from_memory(
    const std::filesystem::path& label, const void* bytes, std::size_t size) {
  if (size < kLengthBytes || bytes == nullptr) {
    file_error(ErrorCode::FileUnrecognised, label,
               "only " + std::to_string(size) + " bytes, too short for a safetensors file");
  }
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());  // NOLINT(modernize-make-shared)
  file->path_ = label;
  // Viewed read-only by contract, as the PROT_READ mapping of open().
  file->map_ = const_cast<void*>(bytes);  // NOLINT(cppcoreguidelines-pro-type-const-cast)
  file->map_size_ = size;
  file->owns_map_ = false;
  file->index();
  file->self_ = file;
  return file;
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    file_error(ErrorCode::InvalidArgument, path_, "no tensor named '" + name + "'");
  }
  const TensorInfo& info = it->second;
  const auto options = at::TensorOptions().dtype(info.dtype).device(at::kCPU);
  if (info.begin == info.end) {
    return at::empty(info.shape, options);  // zero-size: there are no bytes to view
  }
  // from_blob wants void*; the mapping is PROT_READ and the view read-only by contract.
  void* data = static_cast<char*>(map_) + data_offset_ + info.begin;
  if (reinterpret_cast<std::uintptr_t>(data) % c10::elementSize(info.dtype) != 0) {
    // Writers that do not pad the header to 8 bytes (ref: prepare() does) can leave data
    // misaligned for its type, which typed CPU kernels must not read in place: copy it.
    at::Tensor copy = at::empty(info.shape, options);
    std::memcpy(copy.data_ptr(), data, info.end - info.begin);
    return copy;
  }
  std::shared_ptr<const SafetensorsFile> keep = self_.lock();
  if (!keep) {
    raise(ErrorCode::Internal, path_.string() + ": SafetensorsFile not owned by open()");
  }
  // The deleter owns `keep`, so the mapping lives as long as any view of it.
  return at::from_blob(
      data, info.shape, [keep](void* /*data*/) {}, options);
}

void Checkpoint::add_single(std::shared_ptr<const SafetensorsFile> file) {
  for (const auto& [name, info] : file->tensors()) {
    index_.emplace(name, std::make_pair(std::size_t{0}, &info));
  }
  files_.push_back(std::move(file));
}

Checkpoint Checkpoint::from_memory(const std::filesystem::path& label, const void* bytes,
                                   std::size_t size) {
  Checkpoint ckpt;
  ckpt.path_ = label;
  ckpt.add_single(SafetensorsFile::from_memory(label, bytes, size));
  return ckpt;
}

Checkpoint Checkpoint::open(const std::filesystem::path& path) {
  Checkpoint ckpt;
  ckpt.path_ = path;
  const auto add_all = [&ckpt](std::shared_ptr<const SafetensorsFile> file) {
    ckpt.add_single(std::move(file));
  };

  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (!fs::exists(status)) {
    file_error(ErrorCode::FileNotFound, path, "no such file or directory");
  }
  if (!fs::is_directory(status)) {
    add_all(SafetensorsFile::open(path));
    return ckpt;
  }
  const fs::path index_path = path / kIndexFileName;
  if (!fs::exists(index_path, ec)) {
    const fs::path single = path / kSingleFileName;
    if (!fs::exists(single, ec)) {
      file_error(ErrorCode::FileNotFound, path,
                 "directory holds neither model.safetensors.index.json nor model.safetensors");
    }
    add_all(SafetensorsFile::open(single));
    return ckpt;
  }

  // Sharded: the index is small JSON, read whole (special files refused without blocking,
  // nesting limited); shards are mapped.
  auto index_text = base::read_input_file(index_path, "safetensors index", kMaxHeaderBytes);
  if (!index_text.ok()) {
    throw base::ErrorException(index_text.error());
  }
  auto index_json =
      base::parse_json(index_text.value(), index_path.string(), ErrorCode::FileCorrupted);
  if (!index_json.ok()) {
    throw base::ErrorException(index_json.error());
  }
  const Json& index = index_json.value();
  if (!index.is_object()) {
    file_error(ErrorCode::FileCorrupted, index_path, "not a JSON object");
  }
  const auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object() || map_it->empty()) {
    file_error(ErrorCode::FileCorrupted, index_path, "no \"weight_map\" object with entries");
  }
  std::set<std::string> shard_names;
  for (const auto& [name, shard] : map_it->items()) {
    if (!shard.is_string()) {
      file_error(ErrorCode::FileCorrupted, index_path,
                 "weight_map entry of '" + name + "' is not a file name");
    }
    const fs::path shard_path = fs::path(shard.get<std::string>()).lexically_normal();
    const bool escapes = std::any_of(shard_path.begin(), shard_path.end(),
                                     [](const fs::path& part) { return part == ".."; });
    if (shard_path.empty() || shard_path.is_absolute() || escapes) {
      file_error(ErrorCode::FileCorrupted, index_path,
                 "shard '" + shard_path.string() + "' is not a file inside the checkpoint");
    }
    shard_names.insert(shard_path.string());
  }

  // Each shard is opened once, in name order, so files_.front() is the first shard.
  std::map<std::string, std::size_t> shard_id;
  std::map<std::string, std::string> owner;  // tensor name -> shard that holds it
  for (const auto& shard : shard_names) {
    std::shared_ptr<const SafetensorsFile> file;
    try {
      file = SafetensorsFile::open(path / shard);
    } catch (const base::ErrorException& e) {
      if (e.error().code != ErrorCode::FileNotFound) {
        throw;
      }
      file_error(ErrorCode::FileCorrupted, index_path,
                 "names shard '" + shard + "' which cannot be opened (" + e.what() + ")");
    }
    for (const auto& [name, info] : file->tensors()) {
      const auto [it, inserted] = owner.emplace(name, shard);
      if (!inserted) {
        file_error(ErrorCode::FileCorrupted, index_path,
                   cat("tensor '", name, "' appears in both shard '", it->second, "' and shard '",
                       shard, "'"));
      }
    }
    shard_id.emplace(shard, ckpt.files_.size());
    ckpt.files_.push_back(std::move(file));
  }
  for (const auto& [name, shard] : map_it->items()) {
    const std::string shard_name = fs::path(shard.get<std::string>()).lexically_normal().string();
    const std::size_t id = shard_id.at(shard_name);
    const auto& tensors = ckpt.files_[id]->tensors();
    const auto found = tensors.find(name);
    if (found == tensors.end()) {
      file_error(ErrorCode::FileCorrupted, index_path,
                 cat("maps tensor '", name, "' to shard '", shard_name, "', which lacks it"));
    }
    ckpt.index_.emplace(name, std::make_pair(id, &found->second));
  }
  return ckpt;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& entry : index_) {
    out.push_back(entry.first);
  }
  return out;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) {
    file_error(ErrorCode::InvalidArgument, path_, "no tensor named '" + name + "'");
  }
  return *it->second.second;
}

at::Tensor Checkpoint::tensor(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) {
    file_error(ErrorCode::InvalidArgument, path_, "no tensor named '" + name + "'");
  }
  return files_[it->second.first]->tensor(name);
}

const std::map<std::string, std::string>& Checkpoint::metadata() const {
  if (files_.empty()) {
    raise(ErrorCode::InvalidArgument, "Checkpoint::metadata on a checkpoint that is not open");
  }
  return files_.front()->metadata();
}

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  check_tensors(tensors);

  // ref: prepare(): data ordered by descending dtype size, then name, so that with the header
  // padded to 8 bytes every tensor starts aligned for its type.
  std::vector<const std::pair<std::string, at::Tensor>*> order;
  order.reserve(tensors.size());
  for (const auto& entry : tensors) {
    order.push_back(&entry);
  }
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    const auto sa = a->second.element_size();
    const auto sb = b->second.element_size();
    return sa != sb ? sa > sb : a->first < b->first;
  });

  Json header = Json::object();
  if (!metadata.empty()) {
    header[std::string(kMetadataKey)] = metadata;
  }
  std::uint64_t offset = 0;
  for (const auto* entry : order) {
    const at::Tensor& t = entry->second;
    const std::uint64_t bytes = tensor_bytes(t);
    Json info = Json::object();
    info["dtype"] = safetensors_dtype_name(t.scalar_type());
    info["shape"] = t.sizes().vec();
    info["data_offsets"] = Json::array({offset, offset + bytes});
    header[entry->first] = std::move(info);
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();  // throws on a name that is not UTF-8: refused, never replaced
  } catch (const Json::type_error& e) {
    raise(ErrorCode::InvalidArgument,
          path.string() + ": tensor names and metadata must be UTF-8 (" + e.what() + ")");
  }
  // ref: prepare(): "Force alignment to 8 bytes" with trailing spaces.
  text.append((kLengthBytes - text.size() % kLengthBytes) % kLengthBytes, ' ');

  base::AtomicFile out(path);
  const auto length = encode_u64_le(text.size());
  out.write(length.data(), length.size());
  out.write(text.data(), text.size());
  for (const auto* entry : order) {
    const at::Tensor& t = entry->second;
    const std::uint64_t bytes = tensor_bytes(t);
    if (bytes == 0) {
      continue;
    }
    // One tensor at a time: host memory stays at the largest tensor, not the checkpoint.
    const at::Tensor cpu = t.to(at::kCPU).contiguous();  // same shape, row-major
    out.write(cpu.data_ptr(), bytes);
  }
  out.commit();
}

void write_checkpoint(const std::filesystem::path& dir,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      std::uint64_t max_shard_bytes,
                      const std::map<std::string, std::string>& metadata) {
  if (max_shard_bytes == 0) {
    raise(ErrorCode::InvalidArgument, dir.string() + ": max_shard_bytes must be positive");
  }
  // Whole-set checks first: a duplicate across shards must fail before anything is written.
  check_tensors(tensors);

  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards;
  std::uint64_t shard_bytes = 0;
  std::uint64_t total = 0;
  for (const auto& entry : tensors) {
    const std::uint64_t bytes = tensor_bytes(entry.second);
    if (shards.empty() || (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes)) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(entry);
    shard_bytes += bytes;
    total += bytes;
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    raise(ErrorCode::IoFailed, dir.string() + ": cannot create directory: " + ec.message());
  }

  if (shards.size() <= 1) {
    write_safetensors(dir / kSingleFileName, tensors, metadata);
    // A stale index from an earlier sharded write would shadow the new file on open.
    fs::remove(dir / kIndexFileName, ec);
    if (ec) {
      raise(ErrorCode::IoFailed,
            (dir / kIndexFileName).string() + ": cannot remove stale index: " + ec.message());
    }
    return;
  }

  Json weight_map = Json::object();
  for (std::size_t k = 0; k < shards.size(); ++k) {
    const std::string name = shard_file_name(k + 1, shards.size());
    write_safetensors(dir / name, shards[k], metadata);
    for (const auto& entry : shards[k]) {
      weight_map[entry.first] = name;
    }
  }
  Json index = Json::object();
  index["metadata"] = Json{{"total_size", total}};
  index["weight_map"] = std::move(weight_map);
  write_text_atomically(dir / kIndexFileName, base::dump_json_lossy(index, 2) + "\n");
}

std::string safetensors_dtype_name(c10::ScalarType dtype) {
  for (const auto& entry : kDtypes) {
    if (entry.type == dtype) {
      return std::string(entry.name);
    }
  }
  raise(ErrorCode::InvalidArgument,
        std::string("dtype ") + c10::toString(dtype) + " has no supported safetensors dtype");
}

}  // namespace batchlens::model
