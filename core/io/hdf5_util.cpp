// SPDX-License-Identifier: Apache-2.0
#include "core/io/hdf5_util.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "core/base/atomic_file.h"
#include "core/base/error.h"
#include "core/base/input.h"

#include <zlib.h>

namespace batchlens::io {

namespace {

// Collects an error stack's messages, outermost first (H5E_WALK_DOWNWARD).
herr_t collect_hdf5_error(unsigned /*n*/, const H5E_error2_t* e, void* out) {
  auto& v = *static_cast<std::vector<std::string>*>(out);
  if (e->desc != nullptr && v.size() < 32) {
    v.emplace_back(std::string(e->func_name != nullptr ? e->func_name : "") + ": " + e->desc);
  }
  return 0;
}

// HDF5's metadata checksum (H5_checksum_lookup3 in H5checksum.c: Bob Jenkins' lookup3
// hashlittle, byte by byte), for the superblock fix below.
std::uint32_t rot(std::uint32_t x, unsigned k) {
  return (x << k) ^ (x >> (32U - k));
}

std::uint32_t lookup3(const unsigned char* k, std::size_t length, std::uint32_t initval) {
  std::uint32_t a = 0xdeadbeefU + static_cast<std::uint32_t>(length) + initval;
  std::uint32_t b = a;
  std::uint32_t c = a;
  const auto word = [](const unsigned char* p) {
    return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8U) |
           (static_cast<std::uint32_t>(p[2]) << 16U) | (static_cast<std::uint32_t>(p[3]) << 24U);
  };
  while (length > 12) {
    a += word(k);
    b += word(k + 4);
    c += word(k + 8);
    a -= c;
    a ^= rot(c, 4);
    c += b;  // NOLINT(readability-isolate-declaration)
    b -= a;
    b ^= rot(a, 6);
    a += c;
    c -= b;
    c ^= rot(b, 8);
    b += a;
    a -= c;
    a ^= rot(c, 16);
    c += b;
    b -= a;
    b ^= rot(a, 19);
    a += c;
    c -= b;
    c ^= rot(b, 4);
    b += a;
    length -= 12;
    k += 12;
  }
  if (length == 0) {
    return c;
  }
  std::array<unsigned char, 12> tail{};
  std::memcpy(tail.data(), k, length);
  a += word(tail.data());
  b += word(tail.data() + 4);
  c += word(tail.data() + 8);
  c ^= b;
  c -= rot(b, 14);
  a ^= c;
  a -= rot(c, 11);
  b ^= a;
  b -= rot(a, 25);
  c ^= b;
  c -= rot(b, 16);
  a ^= c;
  a -= rot(c, 4);
  b ^= a;
  b -= rot(a, 14);
  c ^= b;
  c -= rot(b, 24);
  return c;
}

// H5Fget_file_image of HDF5 1.10 clears the superblock's status flags in the image (the file is
// open for writing when the image is taken) without updating the superblock's checksum, so the
// image would not open. Superblocks of version 2 and 3 end with a lookup3 checksum of the bytes
// before it: 12 fixed bytes and four addresses.
void fix_superblock_checksum(std::vector<char>& image) {
  auto* b = reinterpret_cast<unsigned char*>(image.data());
  if (image.size() < 12 || std::memcmp(b, "\x89HDF\r\n\x1a\n", 8) != 0 || b[8] < 2) {
    return;
  }
  const std::size_t n = 12 + 4 * std::size_t{b[9]};
  if (image.size() < n + 4) {
    return;
  }
  const std::uint32_t sum = lookup3(b, n, 0);
  for (unsigned k = 0; k < 4; ++k) {
    b[n + k] = static_cast<unsigned char>(sum >> (8U * k));
  }
}

// An empty HDF5 file in memory (HDF5's core driver, no backing store) with the newest
// file-format objects of HDF5 1.10: superblock v3, v2 object headers, chunk indexes and heaps
// with checksums, so that damaged metadata is detected instead of followed.
hid_t create_in_memory(const std::string& name) {
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  const bool props = fapl >= 0 &&
                     H5Pset_fapl_core(fapl, std::size_t{16} << 20U, /*backing_store=*/false) >= 0 &&
                     H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110) >= 0 &&
                     H5Pset_fclose_degree(fapl, H5F_CLOSE_SEMI) >= 0;
  const hid_t fid = props ? H5Fcreate(name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl) : -1;
  const std::string why = fid < 0 ? hdf5_error_text() : std::string();  // before the close below
  if (fapl >= 0) {
    H5Pclose(fapl);
  }
  if (fid < 0) {
    base::raise(base::ErrorCode::IoFailed, "cannot create the file in memory: " + why);
  }
  return fid;
}

}  // namespace

void h5check(herr_t status, const std::string& what) {
  if (status < 0) {
    base::raise(base::ErrorCode::IoFailed, what + ": " + hdf5_error_text());
  }
}

// Every object is closed before the file (H5F_CLOSE_SEMI refuses to close a file with open
// objects); each call's return is checked.
std::vector<char> in_memory_image(const std::string& name, const std::function<void(hid_t)>& fill) {
  const hid_t fid = create_in_memory(name);
  struct Close {  // on an error; in memory a close has nothing that can fail
    hid_t id;
    bool done = false;
    Close(const Close&) = delete;
    Close& operator=(const Close&) = delete;
    Close(Close&&) = delete;
    Close& operator=(Close&&) = delete;
    ~Close() {
      if (!done) {
        H5Fclose(id);
      }
    }
  } guard{fid};
  fill(fid);
  h5check(H5Fflush(fid, H5F_SCOPE_GLOBAL), "cannot flush the file");
  const ssize_t size = H5Fget_file_image(fid, nullptr, 0);
  if (size <= 0) {
    base::raise(base::ErrorCode::IoFailed, "cannot size the file image: " + hdf5_error_text());
  }
  std::vector<char> image(static_cast<std::size_t>(size));
  if (H5Fget_file_image(fid, image.data(), image.size()) != size) {
    base::raise(base::ErrorCode::IoFailed, "cannot copy the file image: " + hdf5_error_text());
  }
  guard.done = true;
  h5check(H5Fclose(fid), "cannot close the file");
  fix_superblock_checksum(image);
  return image;
}

base::Result<void> write_hdf5_atomic(const std::filesystem::path& path, const Hdf5Write& how) {
  auto result = base::guarded([&] {
    if (how.check) {
      how.check();
    }
    base::AtomicFile out(path);
    std::vector<char> image;
    {
      const std::lock_guard<std::mutex> lock(hdf5_mutex());
      quiet_hdf5();
      try {
        image = in_memory_image(out.temp_path().string(), how.fill);
      } catch (const H5::Exception& e) {
        base::raise(base::ErrorCode::IoFailed,
                    "HDF5: " + e.getDetailMsg() + " (" + hdf5_error_text() + ")");
      }
    }
    if (how.test_pause_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(how.test_pause_ms));
    }
    out.write(image.data(), image.size());
    image = {};
    // Verified before it replaces anything: the file reads back whole, checksums included.
    if (auto back = how.verify(out.temp_path()); !back.ok()) {
      base::raise(base::ErrorCode::IoFailed,
                  "the written file does not read back: " + back.error().message);
    }
    out.commit();
  });
  if (!result.ok()) {
    const base::ErrorCode code = result.error().code == base::ErrorCode::Internal
                                     ? base::ErrorCode::IoFailed
                                     : result.error().code;
    return base::Error{code, "cannot write " + path.string() + ": " + result.error().message};
  }
  return result;
}

base::Result<std::uint64_t> check_hdf5_file(const std::filesystem::path& path, const char* what,
                                            const char* kind) {
  auto size = base::check_input_file(path, what);
  if (!size.ok()) {
    return size.error();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return base::Error{base::ErrorCode::FileNotFound, "cannot open " + path.string()};
  }
  std::array<char, 8> sig{};
  in.read(sig.data(), sig.size());
  if (in.gcount() != 8 || std::memcmp(sig.data(), "\x89HDF\r\n\x1a\n", 8) != 0) {
    return base::Error{base::ErrorCode::FileUnrecognised,
                       path.string() + " is not an HDF5 file (" + kind + " are)"};
  }
  return size;
}

std::string link_problem(hid_t parent, const std::string& name) {
  H5L_info_t info{};
  if (H5Lget_info(parent, name.c_str(), &info, H5P_DEFAULT) < 0 || info.type != H5L_TYPE_HARD) {
    return "is a link, not an object of this file";
  }
  return {};
}

std::string storage_problem(hid_t ds) {
  const hid_t dcpl = H5Dget_create_plist(ds);
  const H5D_layout_t layout = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
  std::string problem;
  if (layout != H5D_COMPACT && layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED) {
    problem = "has a storage layout BatchLens does not write";
  } else if (H5Pget_external_count(dcpl) != 0) {
    problem = "keeps its data in external files";
  } else {
    const int filters = H5Pget_nfilters(dcpl);
    for (int i = 0; i < filters && problem.empty(); ++i) {
      unsigned flags = 0;
      std::size_t n = 0;
      unsigned config = 0;
      const H5Z_filter_t id =
          H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &n, nullptr, 0, nullptr, &config);
      if (id != H5Z_FILTER_SHUFFLE && id != H5Z_FILTER_DEFLATE && id != H5Z_FILTER_FLETCHER32) {
        problem = "uses HDF5 filter " + std::to_string(id) + ", which BatchLens does not write";
      }
    }
  }
  if (dcpl >= 0) {
    H5Pclose(dcpl);
  }
  return problem;
}

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

void quiet_hdf5() {
  H5::Exception::dontPrint();
  H5PLset_loading_state(0);  // files never make this process load filter plugins
  // No automatic report at all: with any report function set (HDF5's printer, or one that does
  // nothing), HDF5 1.10.8 leaves part of a damaged file open after a failed checksum
  // ("incorrect metadata checksum after all read attempts") and prints "HDF5: infinite loop
  // closing library" at exit. The reason is read from the error stack when asked for.
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

std::string hdf5_error_text() {
  std::vector<std::string> lines;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_hdf5_error, &lines);  // clears nothing
  std::string text = lines.empty() ? std::string() : lines.back();       // the innermost
  for (const auto& l : lines) {
    if (l.find("errno") != std::string::npos) {
      text = l;
    }
  }
  return text.empty() ? std::string("no reason given") : text;
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
