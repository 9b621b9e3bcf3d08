// SPDX-License-Identifier: Apache-2.0
#include "core/remote/ssh_run.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/base/input.h"
#include "core/base/sha256.h"
#include "core/base/subprocess.h"
#include "core/experiment/command_line.h"
#include "core/io/experiment_file.h"

#include <unistd.h>

namespace batchlens::remote {

namespace {

using base::Error;
using base::ErrorCode;
using experiment::shell_quote;
namespace fs = std::filesystem;

// The plain-words reason of a failed ssh (exit 255), from what it printed.
std::string ssh_failure(const SshTarget& t, const std::string& err) {
  const std::string host = t.describe();
  const auto has = [&err](const char* s) {
    return err.find(s) != std::string::npos;
  };
  if (has("Host key verification failed") || has("REMOTE HOST IDENTIFICATION HAS CHANGED")) {
    return "the host key of " + host +
           " is unknown or has changed, and BatchLens never accepts one by itself: check it, "
           "then connect once with ssh " +
           t.host + " so that it is in known_hosts";
  }
  if (has("Permission denied")) {
    return host +
           " refused the login: BatchLens logs in with keys only (no password prompt): "
           "set up a key (ssh-copy-id " +
           t.host + ") or an agent";
  }
  if (has("Could not resolve hostname") || has("Connection refused") || has("timed out") ||
      has("No route to host")) {
    return "cannot reach " + host + ": " + err.substr(0, err.find('\n'));
  }
  if (has("closed by remote host") || has("Broken pipe") || has("Connection reset") ||
      has("Timeout, server")) {
    return "the connection to " + host + " dropped";
  }
  std::string last = err;
  while (!last.empty() && (last.back() == '\n' || last.back() == '\r')) {
    last.pop_back();
  }
  last = last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1);
  return "ssh to " + host + " failed" + (last.empty() ? std::string() : ": " + last);
}

// The outcome of a remote command that did not succeed, as an error.
Error failure(const SshTarget& t, const base::ChildOutcome& o, const std::string& what) {
  if (o.exit_code == 255) {
    return {ErrorCode::IoFailed, ssh_failure(t, o.err)};
  }
  if (o.exit_code == 127) {
    return {ErrorCode::IoFailed, "no batchlens-cli at '" + t.cli + "' on " + t.describe() +
                                     " (give its path with --cli)"};
  }
  std::string last = o.err;
  while (!last.empty() && last.back() == '\n') {
    last.pop_back();
  }
  last = last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1);
  return {ErrorCode::IoFailed, what + " on " + t.describe() + " failed (exit " +
                                   std::to_string(o.exit_code) + ")" +
                                   (last.empty() ? std::string() : ": " + last)};
}

base::Result<base::ChildOutcome> ssh(const SshTarget& t, const std::string& command,
                                     const std::string& input = {},
                                     const fs::path& stdout_file = {}) {
  base::ChildSpec spec;
  spec.argv = ssh_argv(t, command);
  spec.stdin_data = input;
  spec.stdout_file = stdout_file;
  return base::run_child(spec);
}

// A name for the remote file: the local file's stem (safe characters only), the time and this
// process, so that runs never overwrite each other there.
std::string remote_name(const fs::path& local_out) {
  std::string stem;
  for (const char c : local_out.stem().string()) {
    stem += (std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_') ? c : '_';
  }
  stem = stem.substr(0, 64);
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  return (stem.empty() ? std::string("experiment") : stem) + "-" + std::to_string(now) + "-" +
         std::to_string(::getpid()) + ".h5";
}

}  // namespace

std::string SshTarget::describe() const {
  return host + (port > 0 ? ":" + std::to_string(port) : std::string());
}

base::Result<SshTarget> parse_target(const std::string& text) {
  if (text.empty() || text.front() == '-' || text.size() > 255 ||
      std::any_of(text.begin(), text.end(), [](char c) {
        return std::isspace(static_cast<unsigned char>(c)) != 0 ||
               static_cast<unsigned char>(c) < 0x20 || c == '\'' || c == '"' || c == '`' ||
               c == '$' || c == ';';
      })) {
    return Error{ErrorCode::InvalidArgument,
                 "an SSH target is an alias from ~/.ssh/config, host, user@host or "
                 "user@host:port"};
  }
  SshTarget t;
  t.host = text;
  const std::size_t colon = text.rfind(':');
  if (colon != std::string::npos && text.find(':') == colon) {  // not an IPv6 address
    const std::string port = text.substr(colon + 1);
    if (port.empty() || port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        std::stoi(port) < 1 || std::stoi(port) > 65535) {
      return Error{ErrorCode::InvalidArgument, "the port of '" + text + "' is not 1..65535"};
    }
    t.host = text.substr(0, colon);
    t.port = std::stoi(port);
  }
  return t;
}

std::vector<std::string> ssh_argv(const SshTarget& t, const std::string& remote_command) {
  std::vector<std::string> argv{
      "ssh", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"};
  if (t.port > 0) {
    argv.insert(argv.end(), {"-p", std::to_string(t.port)});
  }
  argv.insert(argv.end(), t.ssh_options.begin(), t.ssh_options.end());
  argv.insert(argv.end(), {"--", t.host, remote_command});
  return argv;
}

base::Result<TargetInfo> probe(const SshTarget& t) {
  return base::guarded([&]() -> TargetInfo {
    const base::ChildOutcome o = base::take(ssh(t, "exec " + shell_quote(t.cli) + " info --json"));
    if (o.exit_code != 0) {
      throw base::ErrorException(failure(t, o, "batchlens-cli info"));
    }
    const nlohmann::json j = base::take(base::parse_json(
        o.out, "batchlens-cli info --json on " + t.describe(), ErrorCode::IoFailed));
    TargetInfo info;
    const auto text = [](const nlohmann::json& x, const char* key) {
      return x.is_object() && x.contains(key) && x.at(key).is_string()
                 ? x.at(key).get<std::string>()
                 : std::string();
    };
    if (j.contains("batchlens")) {
      info.version = text(j.at("batchlens"), "version");
    }
    info.libtorch = text(j, "libtorch");
    info.hostname = text(j, "host");
    if (j.contains("file_schema") && j.at("file_schema").is_array() &&
        j.at("file_schema").size() == 2 && j.at("file_schema")[0].is_number_integer() &&
        j.at("file_schema")[1].is_number_integer()) {
      info.schema_major = j.at("file_schema")[0].get<int>();
      info.schema_minor = j.at("file_schema")[1].get<int>();
    }
    if (j.contains("cuda") && j.at("cuda").is_object() && j.at("cuda").contains("gpus") &&
        j.at("cuda").at("gpus").is_array()) {
      for (const nlohmann::json& g : j.at("cuda").at("gpus")) {
        if (g.is_object() && g.contains("index") && g.at("index").is_number_integer()) {
          info.devices.push_back("cuda:" + std::to_string(g.at("index").get<int>()) + " (" +
                                 text(g, "name") + ")");
        }
      }
    }
    info.devices.emplace_back("cpu");
    if (info.schema_major != io::kSchemaMajor ||
        (info.schema_major == io::kSchemaMajor && info.schema_minor > io::kSchemaMinor)) {
      base::raise(ErrorCode::InvalidArgument,
                  "batchlens-cli " + info.version + " on " + t.describe() +
                      " writes experiment files of schema " + std::to_string(info.schema_major) +
                      "." + std::to_string(info.schema_minor) + "; this build reads " +
                      std::to_string(io::kSchemaMajor) + "." + std::to_string(io::kSchemaMinor) +
                      " and older: update BatchLens here or use the same version there");
    }
    return info;
  });
}

base::Result<void> fetch(const SshTarget& t, const std::string& remote_path,
                         const std::string& sha256, const fs::path& local_out) {
  return base::guarded([&] {
    std::error_code ec;
    const fs::path dir = fs::absolute(local_out, ec).parent_path();
    fs::create_directories(dir, ec);
    const fs::path part =
        dir / ("." + local_out.filename().string() + ".part-" + std::to_string(::getpid()));
    const base::ChildOutcome o =
        base::take(ssh(t, "exec cat -- " + shell_quote(remote_path), {}, part));
    if (o.exit_code != 0) {
      fs::remove(part, ec);
      Error e = failure(t, o, "reading " + remote_path);
      e.message += "; the file stays there: batchlens-cli remote " + t.describe() + " fetch " +
                   shell_quote(remote_path) + " --out ...";
      throw base::ErrorException(e);
    }
    if (!sha256.empty()) {
      const std::string got = base::take(base::sha256_file(part));
      if (got != sha256) {
        fs::remove(part, ec);
        base::raise(ErrorCode::IoFailed,
                    "the file brought back from " + t.describe() + " does not match its SHA-256 (" +
                        got.substr(0, 12) + "… instead of " + sha256.substr(0, 12) +
                        "…): nothing was written; it stays there as " + remote_path);
      }
    }
    // As any file BatchLens writes (the part was made 0600 while it was incomplete).
    fs::permissions(part,
                    fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                        fs::perms::others_read,
                    ec);
    fs::rename(part, local_out, ec);
    if (ec) {
      fs::remove(part, ec);
      base::raise(ErrorCode::IoFailed, "cannot put " + local_out.string() + " in place");
    }
  });
}

base::Result<RemoteOutcome> run_remote(const SshTarget& t, const std::string& command,
                                       const experiment::ExperimentSpec& spec,
                                       const std::vector<std::string>& extra_args,
                                       const fs::path& local_out,
                                       const experiment::RunControl& control) {
  if (command != "run" && command != "culprit") {
    return Error{ErrorCode::InvalidArgument,
                 "remote runs 'run' or 'culprit' with a spec, not '" + command + "'"};
  }
  RemoteJob job;
  job.command = command;
  job.input_option = "--spec-json";
  job.input_json = experiment::to_json(spec).dump();
  job.extra_args = extra_args;
  return run_remote_job(t, job, local_out, control);
}

RemoteJob sweep_job(const analysis::SweepSpec& sweep, const std::optional<SlurmSubmit>& slurm) {
  RemoteJob job;
  job.command = "sweep";
  job.input_option = "--sweep-json";
  job.input_json = analysis::to_json(sweep).dump();
  job.out = "sweep-" + analysis::sweep_id(sweep);
  if (slurm) {
    // `--wait` submits, or follows the jobs an earlier command submitted, and ends with the
    // merged file's "written" event.
    job.extra_args = {"--slurm",
                      job.out + "/slurm",
                      "--wait",
                      "--poll-s",
                      std::to_string(slurm->poll_s),
                      "--gpus-per-task",
                      std::to_string(slurm->gpus_per_task)};
    if (slurm->shards > 0) {
      job.extra_args.insert(job.extra_args.end(), {"--shards", std::to_string(slurm->shards)});
    }
    if (slurm->array_parallel > 0) {
      job.extra_args.insert(job.extra_args.end(),
                            {"--array-parallel", std::to_string(slurm->array_parallel)});
    }
    for (const std::string& opt : slurm->sbatch_options) {
      job.extra_args.insert(job.extra_args.end(), {"--sbatch-option", opt});
    }
  }
  return job;
}

base::Result<RemoteOutcome> run_remote_job(const SshTarget& t, const RemoteJob& job,
                                           const fs::path& local_out,
                                           const experiment::RunControl& control) {
  return base::guarded([&]() -> RemoteOutcome {
    const std::string& command = job.command;
    if ((command != "run" && command != "culprit" && command != "sweep") ||
        (job.input_option != "--spec-json" && job.input_option != "--sweep-json")) {
      base::raise(ErrorCode::InvalidArgument,
                  "remote runs 'run', 'culprit' or 'sweep', not '" + command + "'");
    }
    const std::string name = job.out.empty() ? remote_name(local_out) : job.out;
    // Only tool-chosen or quoted text in the command: the spec (prompts and all) is on stdin.
    std::string remote_command = "mkdir -p -- " + shell_quote(t.workdir) + " && cd -- " +
                                 shell_quote(t.workdir) + " && exec " + shell_quote(t.cli) + " " +
                                 command + " " + job.input_option + " - --progress json --out " +
                                 shell_quote(name);
    for (const std::string& a : job.extra_args) {
      remote_command += " " + shell_quote(a);
    }
    RemoteOutcome out;
    std::int64_t pid = -1;
    Error remote_error{ErrorCode::Internal, ""};
    bool have_error = false;
    const auto on_line = [&](const std::string& line) {
      if (line.empty() || line.front() != '{') {
        return;  // a plain message; kept in the stderr tail
      }
      auto parsed = base::parse_json(line, "progress line");
      if (!parsed.ok() || !parsed.value().is_object()) {
        return;
      }
      const nlohmann::json& j = parsed.value();
      const std::string event = j.value("event", std::string());
      if (event == "start") {
        pid = j.value("pid", std::int64_t{-1});
      } else if (event == "progress" && control.progress) {
        base::Progress p;
        p.done = j.value("done", std::int64_t{0});
        p.total = j.value("total", std::int64_t{0});
        p.stage = t.host + ": " + j.value("stage", std::string());
        p.elapsed_s = j.value("elapsed_s", 0.0);
        p.eta_s = j.value("eta_s", -1.0);
        control.progress(p);
      } else if (event == "written") {
        out.remote_path = j.value("path", std::string());
        out.sha256 = j.value("sha256", std::string());
        out.bytes = j.value("bytes", std::uint64_t{0});
      } else if (event == "error") {
        have_error = true;
        const std::string code = j.value("code", std::string());
        remote_error.code = ErrorCode::IoFailed;
        for (const ErrorCode c :
             {ErrorCode::InvalidArgument, ErrorCode::FileNotFound, ErrorCode::FileUnrecognised,
              ErrorCode::FileIncompatibleVersion, ErrorCode::FileCorrupted, ErrorCode::IoFailed,
              ErrorCode::OutOfMemory, ErrorCode::DeviceUnavailable, ErrorCode::Cancelled}) {
          if (code == base::to_string(c)) {
            remote_error.code = c;
          }
        }
        remote_error.message = "on " + t.describe() + ": " + j.value("message", std::string());
      }
    };
    std::atomic<bool> cancelled{false};
    const auto stop = [&] {
      return control.cancel != nullptr && control.cancel->cancelled();
    };
    const auto on_stop = [&] {
      cancelled = true;
      if (pid > 0) {  // the remote process leads its session's group (sshd's setsid)
        (void)ssh(t, "kill -INT -- -" + std::to_string(pid) + " 2>/dev/null || kill -INT " +
                         std::to_string(pid));
      }
    };
    base::ChildSpec child;
    child.argv = ssh_argv(t, remote_command);
    child.stdin_data = job.input_json;
    const base::ChildOutcome o =
        base::take(base::run_child(child, on_line, stop, on_stop, /*grace_s=*/30.0));
    out.summary = o.out;
    if (cancelled || o.exit_code == 130) {
      if (have_error && remote_error.code == ErrorCode::Cancelled) {
        throw base::ErrorException(remote_error);  // what the cancel did there (scancel, ...)
      }
      base::raise(ErrorCode::Cancelled, "remote run on " + t.describe() + " cancelled");
    }
    if (have_error) {
      throw base::ErrorException(remote_error);
    }
    if (o.exit_code != 0 || out.remote_path.empty()) {
      Error e = failure(t, o, "batchlens-cli " + command);
      if (o.exit_code == 255) {
        const bool slurm = std::find(job.extra_args.begin(), job.extra_args.end(), "--slurm") !=
                           job.extra_args.end();
        e.message += slurm ? " (the Slurm jobs go on there, into " + t.workdir + "/" + name +
                                 ": the same command follows them again and brings the file back)"
                     : command == "sweep"
                         ? " (the items the sweep finished stay in " + t.workdir + "/" + name +
                               ": the same command resumes it there)"
                         : " (a run cut off there leaves no file; one that finished stays in " +
                               t.workdir + "/" + name + ")";
      }
      throw base::ErrorException(e);
    }
    base::take(fetch(t, out.remote_path, out.sha256, local_out));
    return out;
  });
}

base::Result<RemoteOutcome> run_remote_repro(const SshTarget& t, const fs::path& local_file,
                                             const std::vector<std::string>& repro_args,
                                             const fs::path& local_dir,
                                             const experiment::RunControl& control) {
  return base::guarded([&]() -> RemoteOutcome {
    const std::string digest = base::take(base::sha256_file(local_file));
    const std::string name = "upload-" + digest.substr(0, 16) + ".h5";
    const std::string folder = "repro-" + digest.substr(0, 16);
    const std::string w = shell_quote(t.workdir);
    // 1. The file, unless a file of its digest is there already (it came from there).
    std::string bytes;
    {
      std::ifstream in(local_file, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (!in.good() && !in.eof()) {
        base::raise(ErrorCode::IoFailed, "cannot read " + local_file.string());
      }
    }
    const std::string upload = "mkdir -p -- " + w + " && cd -- " + w + " && if [ -f " + name +
                               " ] && sha256sum " + name + " | grep -q '^" + digest +
                               " '; then cat >/dev/null; else cat > ." + name + ".part && mv -f ." +
                               name + ".part " + name + "; fi";
    const base::ChildOutcome up = base::take(ssh(t, upload, bytes));
    if (up.exit_code != 0) {
      throw base::ErrorException(failure(t, up, "sending " + local_file.filename().string()));
    }
    if (control.cancel != nullptr && control.cancel->cancelled()) {
      base::raise(ErrorCode::Cancelled, "remote repro on " + t.describe() + " cancelled");
    }
    // 2. The repro there, in its own process group (sshd's session), ended by Cancel.
    std::string command =
        "cd -- " + w + " && exec " + shell_quote(t.cli) + " repro " + name + " --out " + folder;
    for (const std::string& a : repro_args) {
      command += " " + shell_quote(a);
    }
    if (control.progress) {
      base::Progress p;
      p.stage = t.host + ": exporting the repro (the model is loaded there)";
      control.progress(p);
    }
    std::atomic<bool> cancelled{false};
    base::ChildSpec child;
    // `exec` keeps the remote shell's pid: `echo $$` first names the process group to end.
    child.argv = ssh_argv(t, "echo $$ >&2; " + command);
    std::int64_t pid = -1;
    const auto on_line = [&](const std::string& line) {
      if (pid < 0 && !line.empty() && line.find_first_not_of("0123456789") == std::string::npos) {
        pid = std::stoll(line);
      }
    };
    const auto stop = [&] {
      return control.cancel != nullptr && control.cancel->cancelled();
    };
    const auto on_stop = [&] {
      cancelled = true;
      if (pid > 0) {
        (void)ssh(t, "kill -INT -- -" + std::to_string(pid) + " 2>/dev/null || kill -INT " +
                         std::to_string(pid));
      }
    };
    const base::ChildOutcome o =
        base::take(base::run_child(child, on_line, stop, on_stop, /*grace_s=*/30.0));
    if (cancelled || o.exit_code == 130) {
      base::raise(ErrorCode::Cancelled, "remote repro on " + t.describe() + " cancelled");
    }
    if (o.exit_code != 0) {
      Error e = failure(t, o, "batchlens-cli repro");
      if (o.exit_code == 1 && o.err.find("out of") != std::string::npos) {
        e.code = ErrorCode::OutOfMemory;
      }
      throw base::ErrorException(e);
    }
    // 3. The folder back: a tar stream into a folder beside local_dir, renamed into place.
    std::error_code ec;
    const fs::path target_dir = fs::absolute(local_dir, ec);
    fs::create_directories(target_dir.parent_path(), ec);
    const fs::path stage = target_dir.parent_path() / ("." + target_dir.filename().string() +
                                                       ".part-" + std::to_string(::getpid()));
    fs::remove_all(stage, ec);
    fs::create_directories(stage, ec);
    const fs::path tarball = stage / "repro.tar";
    const base::ChildOutcome got =
        base::take(ssh(t, "cd -- " + w + " && exec tar cf - -- " + folder, {}, tarball));
    const auto clean = [&] {
      fs::remove_all(stage, ec);
    };
    if (got.exit_code != 0) {
      clean();
      Error e = failure(t, got, "reading " + folder);
      e.message += "; the folder stays there: " + t.workdir + "/" + folder;
      throw base::ErrorException(e);
    }
    base::ChildSpec untar;
    untar.argv = {"tar",
                  "xf",
                  tarball.string(),
                  "-C",
                  stage.string(),
                  "--no-same-owner",
                  "--no-same-permissions",
                  "--",
                  folder};
    const base::ChildOutcome x = base::take(base::run_child(untar));
    if (x.exit_code != 0 || !fs::is_directory(stage / folder)) {
      clean();
      base::raise(ErrorCode::IoFailed, "the repro folder from " + t.describe() +
                                           " could not be unpacked: " + x.err.substr(0, 200));
    }
    fs::remove_all(target_dir, ec);
    fs::rename(stage / folder, target_dir, ec);
    clean();
    if (ec) {
      base::raise(ErrorCode::IoFailed, "cannot put " + target_dir.string() + " in place");
    }
    RemoteOutcome out;
    out.remote_path = t.workdir + "/" + folder;
    out.summary = o.out;
    return out;
  });
}

}  // namespace batchlens::remote
