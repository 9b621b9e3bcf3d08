// SPDX-License-Identifier: Apache-2.0
// Small HDF5 helpers that the experiment file's writer and reader share: the process-wide HDF5
// lock, HDF5's error text captured when a call fails, the HDF5 type of a C++ element type, and
// the digest over a group's attributes (schema 1.2). Internal to core/io.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>

#include <H5Cpp.h>

namespace batchlens::io {

/// Debian's HDF5 is built without thread safety: one HDF5 call at a time in this process. Hold
/// this lock around every HDF5 call (the public write and read functions take it).
std::mutex& hdf5_mutex();

/// Routes HDF5's errors to a recorder instead of stderr, and keeps HDF5 from loading filter
/// plugins that a file names. Call with hdf5_mutex() held, before a write or a read.
void quiet_hdf5();

/// What HDF5 said when its last call failed, recorded at the moment of the failure (any later
/// HDF5 call, e.g. a destructor's close, clears HDF5's error stack); the system's reason, e.g.
/// "errno = 28, error message = 'No space left on device'", when HDF5 gave one. "no reason
/// given" when nothing was recorded. Call with hdf5_mutex() held.
std::string hdf5_error_text();

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
