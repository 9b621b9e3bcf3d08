// SPDX-License-Identifier: Apache-2.0
#include "app/cli/preflight.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string_view>

#include "core/base/atomic_file.h"
#include "core/base/input.h"
#include "core/model/config.h"
#include "core/probe/tap_names.h"
#include "core/setup/front_door.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

namespace batchlens::cli {

namespace fs = std::filesystem;

namespace {

fs::path folder_of(const fs::path& out) {
  return out.has_parent_path() ? out.parent_path() : fs::path(".");
}

base::Error bad_out(const fs::path& out, const std::string& why) {
  return {base::ErrorCode::InvalidArgument, "--out " + out.string() + ": " + why};
}

// Saturating arithmetic: a spec with absurd sizes must not wrap the estimate to a small number.
std::uint64_t mul(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > UINT64_MAX / a) {
    return UINT64_MAX;
  }
  return a * b;
}

std::uint64_t add(std::uint64_t a, std::uint64_t b) {
  return b > UINT64_MAX - a ? UINT64_MAX : a + b;
}

std::uint64_t positive(std::int64_t v) {
  return v > 0 ? static_cast<std::uint64_t>(v) : 0;
}

}  // namespace

base::Result<void> check_spec_text(const experiment::ExperimentSpec& spec) {
  const std::pair<std::string_view, const std::string*> texts[] = {
      {"--prompt", &spec.prompt},        {"--preset", &spec.model.preset},
      {"--device", &spec.load.device},   {"--dtype", &spec.load.dtype},
      {"--experts", &spec.load.experts},
  };
  for (const auto& [what, text] : texts) {
    if (auto ok = base::check_utf8(*text, what); !ok.ok()) {
      return ok;
    }
  }
  for (const auto& tap : spec.taps) {
    if (auto ok = base::check_utf8(tap, "--taps"); !ok.ok()) {
      return ok;
    }
  }
  // The spec, with its checkpoint path, is stored as JSON text in the file.
  return base::check_utf8(spec.model.checkpoint_dir.native(), "--checkpoint");
}

base::Result<void> check_output_path(const fs::path& out) {
  if (out.empty()) {
    return bad_out(out, "empty path");
  }
  if (!out.has_filename()) {
    return bad_out(out, "names a folder, not a file");
  }
  const fs::path folder = folder_of(out);
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) {
    return bad_out(out, "folder " + folder.string() + ": " + base::errno_text(errno));
  }
  if (!S_ISDIR(st.st_mode)) {
    return bad_out(out, folder.string() + " is " + base::file_kind(st.st_mode));
  }
  // AT_EACCESS: the rights of the effective user, who creates the file. A read-only file system
  // answers EROFS even to root.
  if (::faccessat(AT_FDCWD, folder.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
    return bad_out(out,
                   "cannot create files in " + folder.string() + ": " + base::errno_text(errno));
  }
  if (::stat(out.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      return bad_out(out, std::string("is ") + base::file_kind(st.st_mode) + ", not a file");
    }
  } else if (errno != ENOENT) {
    return bad_out(out, base::errno_text(errno));
  }
  return {};
}

std::optional<std::uint64_t> free_bytes_for(const fs::path& out) {
  struct statvfs vfs {};
  if (::statvfs(folder_of(out).c_str(), &vfs) != 0) {
    return std::nullopt;
  }
  return mul(vfs.f_bavail, vfs.f_frsize);
}

std::optional<SizeEstimate> estimate_file_size(const experiment::ExperimentSpec& spec) {
  const bool checkpoint = !spec.model.checkpoint_dir.empty();
  const auto config = checkpoint
                          ? model::load_config_file(spec.model.checkpoint_dir / "config.json")
                          : model::load_preset(spec.model.preset);
  if (!config.ok()) {
    return std::nullopt;
  }
  const auto generation = setup::generation_config_for(spec.model, spec.overrides);
  if (!generation.ok()) {
    return std::nullopt;
  }
  const std::uint64_t canvas = std::max<std::uint64_t>(positive(config.value().canvas_length), 1);
  const std::uint64_t layers = positive(config.value().text.num_hidden_layers);
  const std::uint64_t new_tokens = positive(generation.value().max_new_tokens);
  const std::uint64_t canvases = std::max<std::uint64_t>((new_tokens + canvas - 1) / canvas, 1);
  // Ticks: every canvas at its step limit.
  const std::uint64_t ticks =
      mul(canvases, positive(generation.value().sampler.max_denoising_steps));
  std::uint64_t taps = spec.taps.empty() ? probe::kTapCount : spec.taps.size();
  if (spec.taps.size() == 1 && spec.taps.front() == "none") {
    taps = 0;
  }
  const std::uint64_t groups = spec.workaround ? 2 : 1;
  const std::uint64_t repeats = positive(spec.repeats);
  const std::uint64_t batches = spec.batch_sizes.size();
  const std::uint64_t runs = mul(groups, 1 + repeats + batches);
  // Row 0 against the reference for each repeat and batch size, and a batched run's rows
  // against its own row 0: counted at the larger row-0 size.
  const std::uint64_t comparisons = mul(groups, repeats + 2 * batches);

  const std::uint64_t tick_pos = mul(ticks, canvas);
  // Bytes per element of each group of arrays.
  constexpr std::uint64_t kTokenArrays = std::uint64_t{3} * 8;  // canvas_in, argmax, sampled: int64
  constexpr std::uint64_t kOtherArrays = 1 + 4;                 // accepted uint8, entropy float
  constexpr std::uint64_t kMetrics = std::uint64_t{3} * 4;      // frac, max |d|, max ULP: float
  constexpr std::uint64_t kRouting = 1 + 4;                     // flips uint8, margin float
  // Token diff: op, ref_pos and run_pos per edit, up to two edits per token.
  constexpr std::uint64_t kTokenEdit = std::uint64_t{2} * 3 * 8;
  const std::uint64_t run_tokens = add(mul(tick_pos, kTokenArrays), mul(new_tokens, 8));
  const std::uint64_t run_bytes =
      add(add(run_tokens, mul(tick_pos, kOtherArrays)), mul(ticks, 2 * sizeof(std::int32_t)));
  const std::uint64_t cells = mul(mul(ticks, layers + 1), taps);
  std::uint64_t comparison_bytes = mul(cells, kMetrics);
  comparison_bytes = add(comparison_bytes, mul(mul(cells, canvas), kMetrics));  // per position
  comparison_bytes = add(comparison_bytes, mul(mul(mul(ticks, layers), canvas), kRouting));
  comparison_bytes = add(comparison_bytes, add(tick_pos, ticks));  // sampler diff, compared
  comparison_bytes = add(comparison_bytes, mul(new_tokens, kTokenEdit));

  // HDF5's own structure: headers and chunk indexes of about 10 datasets per run and 13 per
  // comparison (measured: ~2 KiB each; half of that is counted), configs and attributes.
  constexpr std::uint64_t kKiB = 1024;
  constexpr std::uint64_t kFileOverhead = 32 * kKiB;
  constexpr std::uint64_t kRunOverhead = 8 * kKiB;
  constexpr std::uint64_t kComparisonOverhead = 12 * kKiB;
  const std::uint64_t overhead =
      add(kFileOverhead, add(mul(runs, kRunOverhead), mul(comparisons, kComparisonOverhead)));
  SizeEstimate e;
  e.high = add(add(mul(runs, run_bytes), mul(comparisons, comparison_bytes)), overhead);
  // Deflate never compresses better than about 1:1032, and the structure does not compress.
  e.low = add(e.high / 1000, overhead);
  return e;
}

std::vector<fs::path> rescue_paths() {
  std::vector<fs::path> folders;
  const auto add_folder = [&folders](const char* dir) {
    if (dir == nullptr || *dir == 0) {
      return;
    }
    std::error_code ec;
    fs::path p = fs::weakly_canonical(fs::path(dir), ec);
    if (ec) {
      p = dir;
    }
    if (std::find(folders.begin(), folders.end(), p) == folders.end()) {
      folders.push_back(p);
    }
  };
  add_folder(std::getenv("TMPDIR"));  // NOLINT(concurrency-mt-unsafe): before any thread reads env
  add_folder("/tmp");
  add_folder(std::getenv("HOME"));  // NOLINT(concurrency-mt-unsafe)

  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &utc);
  const std::string name = "batchlens-rescued-" + std::to_string(::getpid()) + "-" + stamp + ".h5";
  std::vector<fs::path> paths;
  paths.reserve(folders.size());
  for (const auto& folder : folders) {
    paths.push_back(folder / name);
  }
  return paths;
}

std::string format_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  auto v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof(text), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return text;
}

}  // namespace batchlens::cli
