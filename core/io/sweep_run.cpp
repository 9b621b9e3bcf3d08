// SPDX-License-Identifier: Apache-2.0
#include "core/io/sweep_run.h"

#include <system_error>
#include <utility>

#include "core/analysis/sweep_merge.h"
#include "core/analysis/sweep_slurm.h"
#include "core/io/sweep_file.h"

namespace batchlens::io {

base::Result<SweepFileRun> run_sweep_to_file(const analysis::SweepSpec& sweep,
                                             const analysis::SweepRunOptions& options,
                                             bool shard_file,
                                             const experiment::RunControl& control) {
  return base::guarded([&] {
    SweepFileRun out;
    {
      const auto items = analysis::sweep_items(sweep);
      const setup::Session session = base::take(
          experiment::open_session_for(analysis::item_spec(sweep, items.front()), control));
      out.outcome = base::take(analysis::run_sweep(session, sweep, options, control));
    }  // the model is freed before the file is built
    const analysis::SweepRecords all = base::take(analysis::read_sweep_dir(options.dir));
    out.records = analysis::shard_records(all, options.shard, out.outcome.provenance);
    out.file = shard_file
                   ? analysis::shard_file(options.dir, options.shard.index, options.shard.count)
                   : options.dir / "sweep.h5";
    std::error_code ec;
    std::filesystem::create_directories(out.file.parent_path(), ec);
    base::take(write_sweep_file(out.file, out.records));
    return out;
  });
}

}  // namespace batchlens::io
