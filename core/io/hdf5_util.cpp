// SPDX-License-Identifier: Apache-2.0
#include "core/io/hdf5_util.h"

#include <algorithm>
#include <vector>

#include <zlib.h>

namespace batchlens::io {

namespace {

std::string& last_hdf5_error() {
  static std::string text;  // HDF5 calls are serialised by hdf5_mutex()
  return text;
}

herr_t record_hdf5_error(hid_t stack, void* /*data*/) {
  std::vector<std::string> lines;
  H5Ewalk2(
      stack, H5E_WALK_DOWNWARD,
      [](unsigned /*n*/, const H5E_error2_t* e, void* out) -> herr_t {
        auto& v = *static_cast<std::vector<std::string>*>(out);
        if (e->desc != nullptr && v.size() < 32) {
          v.emplace_back(std::string(e->func_name != nullptr ? e->func_name : "") + ": " + e->desc);
        }
        return 0;
      },
      &lines);
  std::string text = lines.empty() ? std::string() : lines.back();  // the innermost
  for (const auto& l : lines) {
    if (l.find("errno") != std::string::npos) {
      text = l;
    }
  }
  last_hdf5_error() = text;
  return 0;
}

}  // namespace

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

void quiet_hdf5() {
  H5::Exception::dontPrint();
  H5PLset_loading_state(0);  // files never make this process load filter plugins
  H5Eset_auto2(H5E_DEFAULT, record_hdf5_error, nullptr);
  last_hdf5_error().clear();
}

std::string hdf5_error_text() {
  return last_hdf5_error().empty() ? std::string("no reason given") : last_hdf5_error();
}

template <>
const H5::PredType& h5type<std::int64_t>() {
  return H5::PredType::NATIVE_INT64;
}
template <>
const H5::PredType& h5type<std::int32_t>() {
  return H5::PredType::NATIVE_INT32;
}
template <>
const H5::PredType& h5type<std::uint8_t>() {
  return H5::PredType::NATIVE_UINT8;
}
template <>
const H5::PredType& h5type<float>() {
  return H5::PredType::NATIVE_FLOAT;
}

void AttrDigest::add(const std::string& name, char tag, const void* data, std::size_t size) {
  uLong c = crc32(0L, Z_NULL, 0);
  c = crc32(c, reinterpret_cast<const Bytef*>(name.data()), static_cast<uInt>(name.size()));
  c = crc32(c, reinterpret_cast<const Bytef*>(&tag), 1);
  // Values over 4 GiB cannot occur (attributes are bounded on read); feed in pieces anyway.
  const auto* p = static_cast<const Bytef*>(data);
  while (size > 0) {
    const auto n = static_cast<uInt>(std::min<std::size_t>(size, 1U << 30U));
    c = crc32(c, p, n);
    p += n;
    size -= n;
  }
  sum_ += static_cast<std::uint32_t>(c);
}

}  // namespace batchlens::io
