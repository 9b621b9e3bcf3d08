// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/kernel_provenance.h"

#include <algorithm>
#include <cctype>
#include <regex>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

namespace batchlens::experiment {

namespace {

constexpr std::size_t kMaxEngines = 4096;
constexpr std::size_t kMaxOps = 100000;
constexpr std::size_t kMaxKernels = 4096;
constexpr std::size_t kMaxText = 4096;

std::string dims_text(const std::array<std::int64_t, 3>& d) {
  return "[" + std::to_string(d[0]) + "," + std::to_string(d[1]) + "," + std::to_string(d[2]) + "]";
}

std::string text_of(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) {
    return {};
  }
  std::string s = j.at(key).get<std::string>();
  if (s.size() > kMaxText) {
    throw std::length_error(key);
  }
  return s;
}

std::array<std::int64_t, 3> dims_of(const nlohmann::json& j, const char* key) {
  std::array<std::int64_t, 3> d{0, 0, 0};
  if (!j.contains(key)) {
    return d;
  }
  const nlohmann::json& v = j.at(key);
  if (!v.is_array() || v.size() != 3) {
    throw std::length_error(key);
  }
  for (std::size_t i = 0; i < 3; ++i) {
    d[i] = v[i].get<std::int64_t>();
  }
  return d;
}

// The tile of a GEMM kernel's name ("..._128x128x64_...") or "".
std::string tile_of(const std::string& name) {
  static const std::regex tile(R"((\d+)x(\d+)(x\d+)?)");
  std::smatch m;
  return std::regex_search(name, m, tile) ? m.str(0) : std::string();
}

// A kernel's name without its argument list ("void f<...>(args)" -> "f<...>"), at most 160
// characters: what a reader needs to tell kernels apart.
std::string short_name(const std::string& name) {
  std::string n = name;
  if (n.rfind("void ", 0) == 0) {
    n = n.substr(5);
  }
  int depth = 0;
  for (std::size_t i = 0; i < n.size(); ++i) {
    depth += n[i] == '<' ? 1 : (n[i] == '>' ? -1 : 0);
    if (n[i] == '(' && depth == 0) {
      n = n.substr(0, i);
      break;
    }
  }
  return n.size() > 160 ? n.substr(0, 157) + "..." : n;
}

bool is_split_k(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return lower.find("splitk") != std::string::npos || lower.find("split_k") != std::string::npos ||
         lower.find("reduce") != std::string::npos;
}

}  // namespace

const EngineKernels* KernelProvenance::engine(const std::string& run,
                                              bool self_conditioning) const {
  for (const EngineKernels& e : engines) {
    if (e.run == run && e.self_conditioning == self_conditioning) {
      return &e;
    }
  }
  return nullptr;
}

nlohmann::json to_json(const KernelProvenance& k) {
  nlohmann::json engines = nlohmann::json::array();
  for (const EngineKernels& e : k.engines) {
    nlohmann::json ops = nlohmann::json::array();
    for (const OpKernels& o : e.ops) {
      nlohmann::json kernels = nlohmann::json::array();
      for (const KernelLaunch& l : o.kernels) {
        kernels.push_back({{"name", l.name},
                           {"grid", l.grid},
                           {"block", l.block},
                           {"calls", l.calls},
                           {"total_us", l.total_us}});
      }
      ops.push_back({{"family", o.family},
                     {"layer", o.layer},
                     {"op", o.op},
                     {"strategy", o.strategy},
                     {"m", o.m},
                     {"n", o.n},
                     {"k", o.k},
                     {"calls", o.calls},
                     {"dtype", o.dtype},
                     {"path", o.path},
                     {"kernels", kernels}});
    }
    engines.push_back({{"run", e.run},
                       {"batch_size", e.batch_size},
                       {"policy", e.policy},
                       {"self_conditioning", e.self_conditioning},
                       {"device", e.device},
                       {"seconds", e.seconds},
                       {"ops", ops}});
  }
  return {{"source", k.source}, {"wall_s", k.wall_s}, {"engines", engines}};
}

base::Result<KernelProvenance> kernels_from_json(const nlohmann::json& doc) {
  const auto bad = [](const std::string& what) {
    return base::Error{base::ErrorCode::FileCorrupted, "kernel provenance: " + what};
  };
  try {
    if (!doc.is_object() || !doc.contains("engines") || !doc["engines"].is_array()) {
      return bad(R"(expected an object with an "engines" array)");
    }
    if (doc["engines"].size() > kMaxEngines) {
      return bad("too many engines");
    }
    KernelProvenance k;
    k.source = text_of(doc, "source");
    k.wall_s = doc.value("wall_s", 0.0);
    for (const nlohmann::json& e : doc["engines"]) {
      if (!e.is_object() || !e.contains("ops") || !e["ops"].is_array()) {
        return bad("an engine is not an object with an \"ops\" array");
      }
      if (e["ops"].size() > kMaxOps) {
        return bad("an engine has too many ops");
      }
      EngineKernels x;
      x.run = text_of(e, "run");
      x.batch_size = e.value("batch_size", 0);
      if (x.batch_size < 1 || x.batch_size > 4096) {
        return bad("batch size out of range");
      }
      x.policy = text_of(e, "policy");
      x.self_conditioning = e.value("self_conditioning", false);
      x.device = text_of(e, "device");
      x.seconds = e.value("seconds", 0.0);
      for (const nlohmann::json& o : e["ops"]) {
        if (!o.is_object()) {
          return bad("an op is not an object");
        }
        OpKernels op;
        op.family = text_of(o, "family");
        op.layer = o.value("layer", -1);
        op.op = text_of(o, "op");
        op.strategy = text_of(o, "strategy");
        op.m = o.value("m", std::int64_t{0});
        op.n = o.value("n", std::int64_t{0});
        op.k = o.value("k", std::int64_t{0});
        op.calls = o.value("calls", std::int64_t{0});
        op.dtype = text_of(o, "dtype");
        op.path = text_of(o, "path");
        if (o.contains("kernels")) {
          const nlohmann::json& ks = o["kernels"];
          if (!ks.is_array() || ks.size() > kMaxKernels) {
            return bad("an op's kernels are not a short array");
          }
          for (const nlohmann::json& l : ks) {
            if (!l.is_object()) {
              return bad("a kernel is not an object");
            }
            op.kernels.push_back(KernelLaunch{text_of(l, "name"), dims_of(l, "grid"),
                                              dims_of(l, "block"), l.value("calls", 0),
                                              l.value("total_us", 0.0)});
          }
        }
        x.ops.push_back(std::move(op));
      }
      k.engines.push_back(std::move(x));
    }
    return k;
  } catch (const nlohmann::json::exception&) {
    return bad("a field has the wrong type");
  } catch (const std::length_error& e) {
    return bad(std::string("field ") + e.what() + " is too long or misshapen");
  }
}

const OpKernels* find_op(const EngineKernels& engine, const std::string& family, int layer) {
  for (const OpKernels& o : engine.ops) {
    if (o.family == family && o.layer == layer) {
      return &o;
    }
  }
  return nullptr;
}

std::string describe(const OpKernels& op) {
  std::string out = op.path;
  if (op.calls > 1) {
    out += " (" + std::to_string(op.calls) + " calls)";
  }
  for (std::size_t i = 0; i < op.kernels.size(); ++i) {
    const KernelLaunch& l = op.kernels[i];
    out += (i == 0 ? ": " : "; ") + short_name(l.name) + " grid " + dims_text(l.grid) + " block " +
           dims_text(l.block);
    if (l.calls > 1) {
      out += " ×" + std::to_string(l.calls);
    }
  }
  return out;
}

std::vector<std::string> kernel_differences(const OpKernels& a, const OpKernels& b) {
  std::vector<std::string> out;
  if (a.path != b.path) {
    out.push_back("path: " + a.path + " → " + b.path);
  }
  const auto names = [](const OpKernels& o) {
    std::vector<std::string> n;
    n.reserve(o.kernels.size());
    for (const KernelLaunch& l : o.kernels) {
      n.push_back(l.name);
    }
    return n;
  };
  const std::vector<std::string> na = names(a);
  const std::vector<std::string> nb = names(b);
  const auto any_split = [](const std::vector<std::string>& n) {
    return std::any_of(n.begin(), n.end(), is_split_k);
  };
  if (na != nb) {
    const std::string ka = na.empty() ? std::string("-") : na.front();
    const std::string kb = nb.empty() ? std::string("-") : nb.front();
    if (ka != kb) {
      out.push_back("kernel: " + short_name(ka) + " → " + short_name(kb));
    }
    if (na.size() != nb.size()) {
      out.push_back("kernels per op: " + std::to_string(na.size()) + " → " +
                    std::to_string(nb.size()));
    }
    const std::string ta = tile_of(ka);
    const std::string tb = tile_of(kb);
    if (ta != tb) {
      out.push_back("tile " + (ta.empty() ? std::string("?") : ta) + " → " +
                    (tb.empty() ? std::string("?") : tb));
    }
  }
  if (any_split(na) != any_split(nb)) {
    out.push_back(std::string("split-K: ") + (any_split(na) ? "yes" : "no") + " → " +
                  (any_split(nb) ? "yes" : "no"));
  }
  // A kernel both ran, launched with another shape (a split-K reduction's grid counts the
  // splits, for one).
  for (const KernelLaunch& x : a.kernels) {
    for (const KernelLaunch& y : b.kernels) {
      if (x.name == y.name && (x.grid != y.grid || x.block != y.block)) {
        out.push_back("launch of " + short_name(x.name) + ": grid " + dims_text(x.grid) + " → " +
                      dims_text(y.grid) + ", block " + dims_text(x.block) + " → " +
                      dims_text(y.block));
        break;
      }
    }
  }
  return out;
}

}  // namespace batchlens::experiment
