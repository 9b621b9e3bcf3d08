// SPDX-License-Identifier: Apache-2.0
// Small HDF5 helpers that the experiment file's writer and reader share: the process-wide HDF5
// lock, HDF5's error text captured when a call fails, the HDF5 type of a C++ element type, and
// the digest over a group's attributes (schema 1.2). Internal to core/io.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <H5Cpp.h>

#include "core/base/error.h"

namespace batchlens::io {

/// Debian's HDF5 is built without thread safety: one HDF5 call at a time in this process. Hold
/// this lock around every HDF5 call (the public write and read functions take it).
std::mutex& hdf5_mutex();

/// Turns HDF5's automatic error report off (nothing on stderr; hdf5_error_text() reads the
/// reason), and keeps HDF5 from loading filter plugins that a file names. Call with hdf5_mutex()
/// held, before a write or a read.
void quiet_hdf5();

/// What HDF5 said about the call that just failed: the innermost message of its error stack, or
/// the system's reason, e.g. "errno = 28, error message = 'No space left on device'", when HDF5
/// gave one; "no reason given" for an empty stack. Call it right after the failed call, before
/// any other HDF5 call (a destructor's close too) clears the stack, with hdf5_mutex() held.
std::string hdf5_error_text();

/// Checks what an HDF5 C call returned; a failure raises IoFailed naming `what` and HDF5's
/// (system) reason.
void h5check(herr_t status, const std::string& what);

/// A whole HDF5 file built in memory and returned as its byte image, for the caller to write
/// through a base::AtomicFile: `fill` writes every object (and closes each) into the file id it is
/// given. HDF5 never touches the disk, so a full disk, a quota or an I/O error shows in one checked
/// write of the caller's (errno named) and never in an HDF5 close: HDF5 1.10.8 keeps a file whose
/// close failed half closed and crashes when it is closed again, at exit at the latest. The file
/// uses HDF5 1.10's newest file-format objects (superblock v3, v2 object headers, checksummed
/// metadata), so damaged metadata is detected instead of followed. Raises IoFailed. Call with
/// hdf5_mutex() held.
std::vector<char> in_memory_image(const std::string& name, const std::function<void(hid_t)>& fill);

/// How write_hdf5_atomic writes a file: `check` runs first (raise to refuse before anything is
/// written), `fill` writes the objects into the in-memory file (in_memory_image), `verify` reads
/// the written temporary back before it replaces anything at the path.
struct Hdf5Write {
  std::function<void()> check;
  std::function<void(hid_t)> fill;
  std::function<base::Result<void>(const std::filesystem::path&)> verify;
  int test_pause_ms = 0;  ///< hold the writer once its temporary exists (signal tests)
};

/// Writes an HDF5 file through a base::AtomicFile beside `path`: built in memory under
/// hdf5_mutex(), written in one checked write, verified, then renamed into place; a crash, an
/// error (ENOSPC named), SIGINT or SIGTERM never leaves a partial file at `path` nor replaces a
/// good one. Errors name the path: "cannot write PATH: ..." (IoFailed unless `check` raised
/// another code). Never throws.
base::Result<void> write_hdf5_atomic(const std::filesystem::path& path, const Hdf5Write& how);

/// check_input_file and HDF5's signature: the file's size in bytes. Errors: FileNotFound,
/// FileUnrecognised ("PATH is not an HDF5 file (`kind` are)"). Never throws.
base::Result<std::uint64_t> check_hdf5_file(const std::filesystem::path& path, const char* what,
                                            const char* kind);

/// Why `parent`/`name` must not be read: "" for a hard link; "is a link, not an object of this
/// file" for soft and external links (a file must not make the reader open other files or
/// follow paths of its choosing).
std::string link_problem(hid_t parent, const std::string& name);

/// Why dataset `ds` must not be read: "" when its layout is compact, contiguous or chunked with
/// only the filters BatchLens writes (shuffle, deflate, Fletcher-32); else the reason (external
/// raw-data files and virtual datasets read other files; another filter would load a plugin).
std::string storage_problem(hid_t ds);

/// Owns an HDF5 id of any kind (released with H5Idec_ref).
class Hid {
 public:
  explicit Hid(hid_t id) : id_(id) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  Hid(Hid&&) = delete;
  Hid& operator=(Hid&&) = delete;
  ~Hid() {
    if (id_ >= 0) {
      H5Idec_ref(id_);
    }
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
};

/// The native HDF5 type of an element type that experiment files store.
template <class T>
const H5::PredType& h5type();
template <>
const H5::PredType& h5type<std::int64_t>();
template <>
const H5::PredType& h5type<std::int32_t>();
template <>
const H5::PredType& h5type<std::uint8_t>();
template <>
const H5::PredType& h5type<float>();

/// The attribute that holds a group's AttrDigest (schema 1.2 on).
inline constexpr const char* kDigestAttr = "attrs_crc32";

/// A group's attributes, digested (schema 1.2): the sum of crc32(name, tag, value bytes) over the
/// group's attributes, stored as kDigestAttr, so that the digest does not depend on the order
/// attributes are written or read. HDF5's own v2 object headers are checksummed as well; this
/// also covers attributes kept in dense storage. Tags: 's' string (its bytes), 'i' int64 and 'f'
/// double (native bytes).
class AttrDigest {
 public:
  void add(const std::string& name, char tag, const void* data, std::size_t size);
  std::uint32_t value() const { return sum_; }

 private:
  std::uint32_t sum_ = 0;
};

}  // namespace batchlens::io
