// SPDX-License-Identifier: Apache-2.0
// Fuzz target: a sweep folder (issue #32) as batchlens-cli sweep --resume and sweep-merge read
// it. The first input byte picks the file the rest becomes: even, DIR/sweep.json (the folder's
// description); odd, DIR/items/item-000000.json (an item's record) beside a valid sweep.json
// for a one-item sweep. Then analysis::read_sweep_dir, and what the report makes of the records.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "core/analysis/sweep_records.h"
#include "core/analysis/sweep_report.h"
#include "core/analysis/sweep_spec.h"
#include "core/base/input.h"
#include "tests/fuzz/fuzz_support.h"

#include <unistd.h>

namespace {

namespace fs = std::filesystem;

void put(const fs::path& p, const std::uint8_t* data, std::size_t size) {
  std::FILE* f = std::fopen(p.c_str(), "wb");
  if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(p.c_str());
    std::abort();
  }
}

// The folder of this process, with a valid one-item sweep.json (written once) kept aside.
struct Folder {
  fs::path dir;
  std::string good_head;
  Folder() {
    dir = fs::temp_directory_path() / ("batchlens-fuzz-sweep-" + std::to_string(::getpid()));
    fs::create_directories(dir / "items");
    batchlens::analysis::SweepSpec spec;
    spec.base.model.preset = "tiny";
    spec.base.batch_sizes = {2};
    spec.prompts = {{"Write about Lisbon.", true, {}}};
    spec.seeds = {0};
    const nlohmann::json head{{"format", "batchlens-sweep/1"},
                              {"id", batchlens::analysis::sweep_id(spec)},
                              {"spec", batchlens::analysis::to_json(spec)}};
    good_head = head.dump(1);
  }
  Folder(const Folder&) = delete;
  Folder& operator=(const Folder&) = delete;
  Folder(Folder&&) = delete;
  Folder& operator=(Folder&&) = delete;
  ~Folder() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace batchlens;
  static const Folder folder;
  if (size == 0) {
    return 0;
  }
  const fs::path head = folder.dir / "sweep.json";
  const fs::path record = folder.dir / "items" / "item-000000.json";
  std::error_code ec;
  fs::remove(record, ec);
  if (data[0] % 2 == 0) {
    put(head, data + 1, size - 1);
  } else {
    put(head, reinterpret_cast<const std::uint8_t*>(folder.good_head.data()),
        folder.good_head.size());
    put(record, data + 1, size - 1);
  }
  const auto records = analysis::read_sweep_dir(folder.dir);
  if (records.ok()) {
    (void)analysis::sweep_text(records.value());
    (void)base::dump_json_lossy(analysis::sweep_json(records.value()));
  }
  return 0;
}
