// SPDX-License-Identifier: Apache-2.0
// Reading and writing safetensors files: a memory-mapped, fully validated reader (untrusted
// input), shards of a checkpoint, and an atomic writer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace batchlens::model {

/// One tensor's entry in a safetensors header.
struct TensorInfo {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  ///< byte offset into the data section
  std::uint64_t end = 0;    ///< one past the last byte
  std::filesystem::path file;
};

/// A memory-mapped .safetensors file (https://github.com/huggingface/safetensors format).
/// Opening validates the header completely: 8-byte length within the file, JSON, known dtypes
/// (BF16, F16, F32, F64, I64, I32, I16, I8, U8, BOOL), shape x dtype size == end - begin,
/// offsets within the data section, no two tensors overlapping, no gaps that would hide data.
/// Thread-safe for concurrent reads after open.
class SafetensorsFile {
 public:
  /// Opens and validates `path`. Throws base::ErrorException: FileNotFound, FileUnrecognised
  /// (not safetensors at all), FileCorrupted (truncated, lying header length, overlapping or
  /// out-of-range offsets, size mismatch, unknown dtype), each naming the file and the tensor.
  static std::shared_ptr<const SafetensorsFile> open(const std::filesystem::path& path);
  /// The same over bytes that outlive every tensor viewed from it (a model bundled in the
  /// binary); `label` stands for the path in messages. Validated as open() validates a file.
  static std::shared_ptr<const SafetensorsFile> from_memory(const std::filesystem::path& label,
                                                            const void* bytes, std::size_t size);

  const std::filesystem::path& path() const { return path_; }
  /// Tensor entries by name.
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  /// The optional "__metadata__" string map.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// A CPU tensor viewing the mapped bytes (zero-copy, read-only by contract; it keeps the
  /// mapping alive). Throws ErrorException(InvalidArgument) for an unknown name.
  at::Tensor tensor(const std::string& name) const;

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  SafetensorsFile(SafetensorsFile&&) = delete;
  SafetensorsFile& operator=(SafetensorsFile&&) = delete;
  ~SafetensorsFile();

 private:
  SafetensorsFile() = default;
  /// Parses and validates the header of the bytes at map_ (throws as open() documents).
  void index();
  std::filesystem::path path_;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  bool owns_map_ = true;         ///< false for from_memory: nothing to unmap
  std::size_t data_offset_ = 0;  ///< 8 + header length
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::weak_ptr<const SafetensorsFile> self_;
};

/// A checkpoint: one .safetensors file, or a directory holding model.safetensors or a sharded
/// model.safetensors.index.json ("weight_map": name -> shard file). Thread-safe after open.
class Checkpoint {
 public:
  /// Opens a file or directory. Throws base::ErrorException: FileNotFound, FileCorrupted (bad
  /// index JSON, a shard missing, a name mapped to a shard that lacks it, a name in two shards).
  static Checkpoint open(const std::filesystem::path& path);
  /// A checkpoint of one in-memory .safetensors (SafetensorsFile::from_memory).
  static Checkpoint from_memory(const std::filesystem::path& label, const void* bytes,
                                std::size_t size);

  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  /// All tensor names, sorted.
  std::vector<std::string> names() const;
  /// Header entry of one tensor. Throws ErrorException(InvalidArgument) for an unknown name.
  const TensorInfo& info(const std::string& name) const;
  /// Zero-copy CPU view of one tensor (see SafetensorsFile::tensor).
  at::Tensor tensor(const std::string& name) const;
  /// Metadata of the first shard.
  const std::map<std::string, std::string>& metadata() const;
  const std::filesystem::path& path() const { return path_; }

 private:
  void add_single(std::shared_ptr<const SafetensorsFile> file);
  std::filesystem::path path_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, std::pair<std::size_t, const TensorInfo*>> index_;
};

/// Writes tensors (any device; copied to CPU, made contiguous) to a .safetensors file, with
/// optional metadata. Names must be unique and non-empty. The file is written to a temporary
/// name beside `path` and renamed into place, so a failure never leaves a partial file.
/// Throws base::ErrorException (InvalidArgument, IoFailed).
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Writes a sharded checkpoint into directory `dir`: shards of at most `max_shard_bytes`
/// named model-0000K-of-0000N.safetensors plus model.safetensors.index.json, or a single
/// model.safetensors when everything fits in one shard. Each file atomically as above.
void write_checkpoint(const std::filesystem::path& dir,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      std::uint64_t max_shard_bytes,
                      const std::map<std::string, std::string>& metadata = {});

/// "BF16", "F32", ... for a dtype; throws InvalidArgument for dtypes safetensors lacks.
std::string safetensors_dtype_name(c10::ScalarType dtype);

}  // namespace batchlens::model
