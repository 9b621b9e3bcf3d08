// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/sweep_merge.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/base/json_field.h"

namespace batchlens::analysis {

using experiment::Provenance;

namespace {

using base::ErrorCode;
using nlohmann::json;

// A row's outcome, without where and how long it ran: what two computations of an item must
// agree on.
json outcome_json(const SweepRow& r) {
  json j = to_json(r);
  j.erase("wall_s");
  return j;
}

}  // namespace

base::Result<void> validate(const SweepRecords& s) {
  return base::guarded([&] {
    base::take(validate(s.spec));
    if (sweep_id(s.spec) != s.id) {
      base::corrupt("the sweep id " + s.id.substr(0, 32) + " is not its spec's");
    }
    const std::vector<SweepItem> items = sweep_items(s.spec);
    if (s.items_total != static_cast<int>(items.size())) {
      base::corrupt("items_total " + std::to_string(s.items_total) + " is not the spec's " +
                    std::to_string(items.size()));
    }
    // Every item with rows has one per group and batch size of the spec, no other.
    std::set<std::pair<experiment::RunGroup, int>> expected;
    for (const std::int64_t b : s.spec.base.batch_sizes) {
      expected.insert({experiment::RunGroup::Main, static_cast<int>(b)});
      if (s.spec.base.workaround) {
        expected.insert({experiment::RunGroup::Workaround, static_cast<int>(b)});
      }
    }
    std::map<int, std::set<std::pair<experiment::RunGroup, int>>> seen;
    const auto n_prov = static_cast<int>(s.provenances.size());
    constexpr int kMaxIndex = 1 << 24;
    for (const SweepRow& r : s.rows) {
      const std::string at = "row of item " + std::to_string(r.item);
      if (r.item < 0 || r.item >= s.items_total) {
        base::corrupt(at + ": no such item");
      }
      const SweepItem& item = items[static_cast<std::size_t>(r.item)];
      if (r.prompt != item.prompt || r.seed != item.seed) {
        base::corrupt(at + ": its prompt or seed is not the item's");
      }
      if (expected.count({r.group, r.batch_size}) == 0) {
        base::corrupt(at + ": batch size " + std::to_string(r.batch_size) + " (" +
                      experiment::name(r.group) + ") is not one of the spec's");
      }
      if (!seen[r.item].insert({r.group, r.batch_size}).second) {
        base::corrupt(at + ": batch size " + std::to_string(r.batch_size) + " (" +
                      experiment::name(r.group) + ") comes twice");
      }
      const bool none = r.first_step == -1;
      if (r.provenance < 0 || r.provenance >= n_prov) {
        base::corrupt(at + ": provenance " + std::to_string(r.provenance) + " out of range");
      }
      if (none ? (r.first_canvas != -1 || r.first_layer != -1)
               : (r.first_step < 1 || r.first_step > kMaxIndex || r.first_canvas < 0 ||
                  r.first_canvas > kMaxIndex || r.first_layer < -1 || r.first_layer > kMaxIndex)) {
        base::corrupt(at + ": its first divergence is out of range");
      }
    }
    for (const auto& [item, groups] : seen) {
      if (groups != expected) {
        base::corrupt("item " + std::to_string(item) + " has " + std::to_string(groups.size()) +
                      " of its " + std::to_string(expected.size()) + " rows");
      }
    }
    std::set<int> done;
    for (const auto& entry : seen) {
      done.insert(entry.first);
    }
    if (static_cast<int>(done.size()) != s.items_done) {
      base::corrupt("items_done " + std::to_string(s.items_done) + " but rows of " +
                    std::to_string(done.size()) + " items");
    }
    for (const SweepShard& sh : s.shards) {
      if (sh.count < 1 || sh.index < 0 || sh.index >= sh.count || sh.provenance < 0 ||
          sh.provenance >= n_prov || sh.items < 0 || sh.items > s.items_total) {
        base::corrupt("shard " + std::to_string(sh.index) + "/" + std::to_string(sh.count) +
                      ": out of range");
      }
    }
  });
}

SweepRecords shard_records(const SweepRecords& all, const Shard& shard, const Provenance& process) {
  SweepRecords out;
  out.spec = all.spec;
  out.id = all.id;
  out.items_total = all.items_total;
  std::map<int, int> remap;  // provenance index in `all` -> in `out`
  std::set<int> items;
  for (const SweepRow& r : all.rows) {
    if (r.item % shard.count != shard.index) {
      continue;
    }
    SweepRow row = r;
    const auto it = remap.find(r.provenance);
    row.provenance = it != remap.end() ? it->second
                                       : (remap[r.provenance] = provenance_index(
                                              out.provenances, all.provenances.at(r.provenance)));
    items.insert(r.item);
    out.rows.push_back(std::move(row));
  }
  out.items_done = static_cast<int>(items.size());
  out.shards.push_back(
      {shard.index, shard.count, provenance_index(out.provenances, process), out.items_done});
  return out;
}

base::Result<SweepRecords> merge_sweeps(const std::vector<SweepRecords>& parts,
                                        const std::vector<std::string>& names) {
  return base::guarded([&] {
    if (parts.empty() || names.size() != parts.size()) {
      base::raise(ErrorCode::InvalidArgument, "nothing to merge");
    }
    SweepRecords out;
    out.spec = parts.front().spec;
    out.id = parts.front().id;
    out.items_total = parts.front().items_total;
    const json spec = to_json(out.spec);
    std::map<int, std::pair<std::size_t, std::vector<const SweepRow*>>> by_item;  // part, rows
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const SweepRecords& part = parts[p];
      if (part.id != out.id || to_json(part.spec) != spec) {
        base::raise(ErrorCode::InvalidArgument,
                    names[p] + " holds sweep " + part.id + ", not " + out.id + " of " +
                        names.front() + " (another spec, prompts or seeds): not merged");
      }
      for (const SweepShard& sh : part.shards) {
        for (const SweepShard& have : out.shards) {
          if (have.index == sh.index && have.count == sh.count) {
            base::raise(ErrorCode::InvalidArgument,
                        names[p] + ": shard " + std::to_string(sh.index) + "/" +
                            std::to_string(sh.count) + " comes twice among the files");
          }
        }
        SweepShard copy = sh;
        copy.provenance = provenance_index(out.provenances, part.provenances.at(sh.provenance));
        out.shards.push_back(copy);
      }
      std::map<int, std::vector<const SweepRow*>> rows;
      for (const SweepRow& r : part.rows) {
        rows[r.item].push_back(&r);
      }
      for (auto& [item, list] : rows) {
        std::sort(list.begin(), list.end(),
                  [](const SweepRow* a, const SweepRow* b) { return row_before(*a, *b); });
        const auto have = by_item.find(item);
        if (have == by_item.end()) {
          by_item[item] = {p, list};
          continue;
        }
        const auto& old = have->second.second;
        bool same = old.size() == list.size();
        for (std::size_t k = 0; same && k < list.size(); ++k) {
          same = outcome_json(*old[k]) == outcome_json(*list[k]);
        }
        if (!same) {
          base::raise(ErrorCode::InvalidArgument,
                      "item " + std::to_string(item) + " differs between " +
                          names[have->second.first] + " and " + names[p] + ": not merged");
        }
      }
    }
    for (const auto& [item, entry] : by_item) {
      const SweepRecords& part = parts[entry.first];
      for (const SweepRow* r : entry.second) {
        SweepRow row = *r;
        row.provenance = provenance_index(out.provenances, part.provenances.at(r->provenance));
        out.rows.push_back(std::move(row));
      }
    }
    std::sort(out.rows.begin(), out.rows.end(), row_before);
    out.items_done = static_cast<int>(by_item.size());
    return out;
  });
}

std::vector<int> missing_items(const SweepRecords& s) {
  std::set<int> done;
  for (const SweepRow& r : s.rows) {
    done.insert(r.item);
  }
  std::vector<int> out;
  for (int i = 0; i < s.items_total; ++i) {
    if (done.count(i) == 0) {
      out.push_back(i);
    }
  }
  return out;
}

}  // namespace batchlens::analysis
