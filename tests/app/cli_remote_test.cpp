// SPDX-License-Identifier: Apache-2.0
// Runs on a GPU server from the laptop (issue #36), against a real OpenSSH server on 127.0.0.1
// (tests/app/sshd_server.sh: Debian's sshd with a generated host key and user key, nothing
// faked): the file comes back checked, prompts travel as data (a canary file that must not
// appear), progress arrives, Ctrl-C ends the remote run, a dropped connection and a wrong host
// key are clear errors, and nothing is half-written here.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/slurm.h"
#include "tests/support/sshd.h"

#include <unistd.h>

namespace batchlens {
namespace {

namespace fs = std::filesystem;
using testing::run_process;

class CliRemote : public ::testing::Test {
 protected:
  void SetUp() override { start_server(); }
  // The test's folder and its sshd (with `session_env` set in its sessions).
  void start_server(const std::string& session_env = {}) {
    dir_ = fs::temp_directory_path() / ("bl_remote_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    bool skip = false;
    const std::string why = testing::start_sshd(server(), skip, session_env);
    if (skip) {
      GTEST_SKIP() << why;
    }
    ASSERT_EQ(why, "");
    up_ = true;
  }
  void TearDown() override {
    if (up_) {
      testing::stop_sshd(server(), work());
    }
    fs::remove_all(dir_);
  }

  std::string server() const { return (dir_ / "sshd").string(); }
  std::string work() const { return (dir_ / "work").string(); }

  // batchlens-cli remote bltest (this test's sshd) ... with `args` after it.
  std::vector<std::string> remote(const std::vector<std::string>& args) const {
    std::vector<std::string> argv{
        BL_CLI_PATH, "remote",    "bltest",    "--ssh-option", "-F " + server() + "/ssh_config",
        "--cli",     BL_CLI_PATH, "--workdir", work()};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  // A remote run long enough to be interrupted (tiny, 2048 tokens of 48 steps), progress as
  // JSON, its output files in dir_/LOGS.
  std::unique_ptr<testing::Child> long_run(const fs::path& out, const std::string& logs) const {
    fs::create_directories(dir_ / logs);
    return std::make_unique<testing::Child>(
        remote({"run", "--preset", "tiny", "--steps", "48", "--max-new-tokens", "2048",
                "--batch-sizes", "2", "--progress", "json", "--out", out.string()}),
        std::vector<std::string>{}, dir_ / logs);
  }

  // The files under the remote work folder.
  std::vector<fs::path> remote_files() const {
    std::vector<fs::path> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(work(), ec)) {
      out.push_back(e.path());
    }
    return out;
  }

  fs::path dir_;
  bool up_ = false;
};

TEST_F(CliRemote, RunComesBackCheckedAndPromptsTravelAsData) {
  const fs::path canary = dir_ / "CANARY";
  const std::string prompt = "It's \"quoted\"; $(touch " + canary.string() + ") `touch " +
                             canary.string() + "` a\nnew line and  spaces";
  const fs::path out = dir_ / "local folder" / "it's here.h5";
  const auto probe = run_process(remote({"probe"}));
  ASSERT_EQ(probe.exit_code, 0) << probe.err;
  EXPECT_NE(probe.out.find("bltest: cpu"), std::string::npos) << probe.out;
  const auto r =
      run_process(remote({"run", "--preset", "tiny", "--steps", "2", "--max-new-tokens", "16",
                          "--batch-sizes", "2", "--policy", "emulated_split_k", "--prompt", prompt,
                          "--progress", "json", "--out", out.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_FALSE(fs::exists(canary)) << "a prompt ran as a command";
  EXPECT_NE(r.err.find("\"event\":\"progress\""), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\"stage\":\"bltest: "), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("SHA-256"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(out));
  // The same bytes as the file the target keeps, and the prompt as given.
  const std::vector<fs::path> there = remote_files();
  ASSERT_EQ(there.size(), 1U);
  EXPECT_EQ(testing::slurp(there[0]), testing::slurp(out));
  const auto summary = run_process({BL_CLI_PATH, "summary", "--json", out.string()});
  ASSERT_EQ(summary.exit_code, 0) << summary.err;
  const auto spec = run_process({BL_CLI_PATH, "summary", out.string()});
  EXPECT_NE(spec.out.find("ref__b2"), std::string::npos);
  // fetch: again, and refused against another checksum (nothing written).
  const fs::path again = dir_ / "again.h5";
  ASSERT_EQ(run_process(remote({"fetch", there[0].string(), "--out", again.string()})).exit_code,
            0);
  EXPECT_EQ(testing::slurp(again), testing::slurp(out));
  const fs::path wrong = dir_ / "wrong.h5";
  const auto refused = run_process(remote(
      {"fetch", there[0].string(), "--sha256", std::string(64, '0'), "--out", wrong.string()}));
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("does not match its SHA-256"), std::string::npos) << refused.err;
  EXPECT_FALSE(fs::exists(wrong));
  // A target that looks like an ssh option is refused before ssh runs.
  const auto option =
      run_process({BL_CLI_PATH, "remote", "-oProxyCommand=touch " + canary.string(), "probe"});
  EXPECT_NE(option.exit_code, 0);
  EXPECT_FALSE(fs::exists(canary));
}

// The culprit finder runs there too: its experiment file (the fix as its workaround, the
// trials) comes back checked.
TEST_F(CliRemote, CulpritRunsThereAndItsFileComesBack) {
  const fs::path out = dir_ / "culprit.h5";
  const auto r = run_process(
      remote({"culprit", "--preset", "tiny", "--steps", "2", "--max-new-tokens", "16",
              "--batch-sizes", "2", "--policy", "emulated_h200", "--strategy", "batch_invariant",
              "--cost-repeats", "0", "--progress", "json", "--out", out.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Culprit: {selfcond_matmul} batch_invariant"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find(R"("stage":"bltest: )"), std::string::npos) << r.err;
  ASSERT_TRUE(fs::exists(out));
  const std::vector<fs::path> there = remote_files();
  ASSERT_EQ(there.size(), 1U);
  EXPECT_EQ(testing::slurp(there[0]), testing::slurp(out));
  const auto summary = run_process({BL_CLI_PATH, "summary", out.string()});
  ASSERT_EQ(summary.exit_code, 0) << summary.err;
  EXPECT_NE(summary.out.find("culprit finder (batch_invariant)"), std::string::npos) << summary.out;
  // A strategy the finder does not know is refused here, before ssh runs.
  const auto bad = run_process(remote({"culprit", "--preset", "tiny", "--strategy", "fastest",
                                       "--out", (dir_ / "bad.h5").string()}));
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_EQ(remote_files().size(), 1U);
}

// A sweep runs there in a folder named by its id (prompts read here, the whole sweep as JSON on
// stdin), its sweep file comes back checked, and the same command resumes it there.
TEST_F(CliRemote, SweepRunsThereAndTheSameCommandResumesIt) {
  {
    std::ofstream p(dir_ / "prompts.txt");
    p << "Tides?\nWhy is the sky \"blue\"? $(touch " << (dir_ / "CANARY").string() << ")\n";
  }
  const std::vector<std::string> args{"sweep",
                                      "--preset",
                                      "tiny",
                                      "--batch-sizes",
                                      "2",
                                      "--steps",
                                      "2",
                                      "--max-new-tokens",
                                      "16",
                                      "--prompts",
                                      (dir_ / "prompts.txt").string(),
                                      "--seeds",
                                      "0",
                                      "--policy",
                                      "emulated_h200"};
  std::vector<std::string> first = args;
  first.insert(first.end(), {"--progress", "json", "--out", (dir_ / "here" / "sweep.h5").string()});
  const auto r = run_process(remote(first));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("2 item(s) run, 0 finished before"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find(R"("stage":"bltest: item 2/2)"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "CANARY")) << "a prompt ran as a command";
  const std::vector<fs::path> there = remote_files();
  ASSERT_EQ(there.size(), 1U);
  EXPECT_EQ(there[0].filename().string().rfind("sweep-", 0), 0U) << there[0];
  EXPECT_EQ(testing::slurp(there[0] / "sweep.h5"), testing::slurp(dir_ / "here" / "sweep.h5"));
  const auto summary = run_process({BL_CLI_PATH, "summary", (dir_ / "here" / "sweep.h5").string()});
  ASSERT_EQ(summary.exit_code, 0) << summary.err;
  EXPECT_NE(summary.out.find("items finished: 2 of 2"), std::string::npos) << summary.out;
  // Again: nothing run again there, the same rows here.
  std::vector<std::string> again = args;
  again.insert(again.end(), {"--out", (dir_ / "here" / "again.h5").string()});
  const auto r2 = run_process(remote(again));
  ASSERT_EQ(r2.exit_code, 0) << r2.out << r2.err;
  EXPECT_NE(r2.out.find("0 item(s) run, 2 finished before and skipped"), std::string::npos)
      << r2.out;
  // --sweep-json holds the whole sweep: an option beside it that would change it is refused.
  const auto refused =
      run_process({BL_CLI_PATH, "sweep", "--sweep-json", (there[0] / "sweep.json").string(),
                   "--seeds", "1", "--out", (dir_ / "local").string()});
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_NE(refused.err.find("--seeds cannot change it"), std::string::npos) << refused.err;
}

// The server out of memory (its batchlens-cli under `ulimit -v`: the `mid` model cannot be
// built) and its work folder full (a 64 KiB tmpfs): each a clear message naming the host,
// nothing written here, nothing half-written there.
TEST_F(CliRemote, OutOfMemoryAndAFullDiskThereAreClearErrors) {
  const fs::path low = dir_ / "lowmem.sh";
  {
    std::ofstream w(low);
    w << "#!/bin/sh\nulimit -v 1200000\nexec " << BL_CLI_PATH << " \"$@\"\n";
  }
  fs::permissions(low, fs::perms::owner_all);
  const fs::path out = dir_ / "here" / "never.h5";
  std::vector<std::string> argv{
      BL_CLI_PATH, "remote",     "bltest",    "--ssh-option", "-F " + server() + "/ssh_config",
      "--cli",     low.string(), "--workdir", work()};
  for (const char* a :
       {"run", "--preset", "mid", "--batch-sizes", "2", "--steps", "2", "--max-new-tokens", "16"}) {
    argv.emplace_back(a);
  }
  argv.insert(argv.end(), {"--out", out.string()});
  const auto oom = run_process(argv);
  EXPECT_EQ(oom.exit_code, 1) << oom.err;
  EXPECT_NE(oom.err.find("on bltest: out of host memory"), std::string::npos) << oom.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(remote_files().empty());

  // A full disk there: a 64 KiB tmpfs as the work folder (refused before the run: not enough
  // space), or, where this test may not mount (not root), a 32 KiB file-size limit on the CLI
  // there (the write fails part-way). Either way nothing is skipped.
  const fs::path full = dir_ / "full";
  fs::create_directories(full);
  const bool mounted =
      run_process({"/bin/mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", full.string()})
          .exit_code == 0;
  const fs::path small = dir_ / "smallfiles.sh";
  {
    std::ofstream w(small);
    w << "#!/bin/sh\ntrap '' XFSZ\nulimit -f 64\nexec " << BL_CLI_PATH << " \"$@\"\n";
  }
  fs::permissions(small, fs::perms::owner_all);
  std::vector<std::string> disk_argv{BL_CLI_PATH,
                                     "remote",
                                     "bltest",
                                     "--ssh-option",
                                     "-F " + server() + "/ssh_config",
                                     "--cli",
                                     mounted ? std::string(BL_CLI_PATH) : small.string(),
                                     "--workdir",
                                     full.string()};
  for (const char* a : {"run", "--preset", "tiny", "--batch-sizes", "2", "--steps", "2",
                        "--max-new-tokens", "16"}) {
    disk_argv.emplace_back(a);
  }
  disk_argv.insert(disk_argv.end(), {"--out", out.string()});
  const auto disk = run_process(disk_argv);
  std::error_code ec;
  const bool empty_there = fs::is_empty(full, ec);
  if (mounted) {
    run_process({"/bin/umount", full.string()});
  }
  EXPECT_EQ(disk.exit_code, 1) << disk.err;
  EXPECT_NE(disk.err.find("bltest"), std::string::npos) << disk.err;
  EXPECT_NE(disk.err.find(mounted ? "not enough space" : "could not be saved"), std::string::npos)
      << disk.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(empty_there) << "a half-written file was left there";
}

// A minimal repro exported there: the experiment file travels over the connection (once: a
// second export finds it there), the folder comes back into a path with spaces; a damaged file
// is refused here before anything travels.
TEST_F(CliRemote, ReproIsExportedThereAndItsFolderComesBack) {
  const fs::path file = dir_ / "exp.h5";
  const auto made =
      run_process({BL_CLI_PATH, "run", "--preset", "tiny", "--batch-sizes", "2", "--steps", "2",
                   "--max-new-tokens", "16", "--policy", "emulated_h200", "--out", file.string()});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const fs::path out = dir_ / "here" / "my repro";
  const auto r = run_process(remote({"repro", file.string(), "--out", out.string()}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* name : {"repro.py", "inputs.safetensors", "op.json", "README.md"}) {
    EXPECT_TRUE(fs::is_regular_file(out / name)) << name;
  }
  EXPECT_NE(testing::slurp(out / "op.json").find("selfcond_matmul"), std::string::npos);
  // Again, another op: the upload is found there (one file), the folder here replaced.
  const auto again =
      run_process(remote({"repro", file.string(), "--op", "lm_head", "--out", out.string()}));
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_NE(testing::slurp(out / "op.json").find("lm_head"), std::string::npos);
  int uploads = 0;
  for (const fs::path& p : remote_files()) {
    uploads += p.filename().string().rfind("upload-", 0) == 0 ? 1 : 0;
  }
  EXPECT_EQ(uploads, 1);
  for (const auto& e : fs::directory_iterator(dir_ / "here")) {
    EXPECT_EQ(e.path().filename().string().find(".part-"), std::string::npos) << e.path();
  }
  // A damaged file: refused here, nothing sent.
  const fs::path bad = dir_ / "bad.h5";
  {
    std::ofstream b(bad, std::ios::binary);
    b << "not an experiment";
  }
  const std::size_t before = remote_files().size();
  const auto refused =
      run_process(remote({"repro", bad.string(), "--out", (dir_ / "never").string()}));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_FALSE(fs::exists(dir_ / "never"));
  EXPECT_EQ(remote_files().size(), before);
}

// Ctrl-C here ends the run there (its process group), and nothing is left on either side.
TEST_F(CliRemote, CtrlCEndsTheRemoteRun) {
  const fs::path out = dir_ / "long.h5";
  const std::unique_ptr<testing::Child> running = long_run(out, "logs-cancel");
  testing::Child& child = *running;
  ASSERT_TRUE(child.wait_for_err("\"event\":\"progress\"")) << child.err();
  child.signal(SIGINT);
  EXPECT_EQ(child.wait(std::chrono::seconds(120)), 130) << child.err();
  EXPECT_NE(child.err().find("cancelled"), std::string::npos) << child.err();
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(remote_files().empty()) << remote_files().front();
  const auto left = run_process({"/usr/bin/pgrep", "-f", "--progress json --out long-"});
  EXPECT_NE(left.exit_code, 0) << "still running there: " << left.out;
}

// The connection dropped mid-run (the server's session processes killed): a clear error, nothing
// written here.
TEST_F(CliRemote, ADroppedConnectionIsAClearErrorAndWritesNothing) {
  const fs::path out = dir_ / "dropped.h5";
  const std::unique_ptr<testing::Child> running = long_run(out, "logs-drop");
  testing::Child& child = *running;
  ASSERT_TRUE(child.wait_for_err("\"event\":\"progress\"")) << child.err();
  // The per-connection sshd processes of this test's server (the listener stays).
  const std::string pid = testing::slurp(server() + "/sshd.pid");
  run_process({"/bin/sh", "-c",
               "for m in $(pgrep -P " + pid.substr(0, pid.find('\n')) +
                   R"(); do pkill -KILL -P "$m"; kill -KILL "$m"; done)"});
  const int code = child.wait(std::chrono::seconds(120));
  EXPECT_EQ(code, 1) << child.err();
  EXPECT_NE(child.err().find("bltest"), std::string::npos) << child.err();
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".part-"), std::string::npos) << e.path();
  }
  run_process({"/usr/bin/pkill", "-f", "--progress json --out dropped-"});
}

// Another host key than known_hosts holds: refused (never accepted by BatchLens), with what to do.
TEST_F(CliRemote, AnotherHostKeyIsRefused) {
  const auto keygen = run_process({"/usr/bin/ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                                   (dir_ / "other_key").string()});
  ASSERT_EQ(keygen.exit_code, 0) << keygen.err;
  const std::string config = testing::slurp(server() + "/ssh_config");
  const std::size_t at = config.find("Port ");
  const std::string port = config.substr(at + 5, config.find('\n', at) - at - 5);
  const std::string pub = testing::slurp(dir_ / "other_key.pub");
  {
    std::ofstream k(server() + "/known_hosts", std::ios::trunc);
    k << "[127.0.0.1]:" << port << " " << pub.substr(0, pub.find(' ', pub.find(' ') + 1)) << "\n";
  }
  const fs::path out = dir_ / "never.h5";
  const auto r = run_process(remote({"run", "--preset", "tiny", "--steps", "2", "--max-new-tokens",
                                     "16", "--batch-sizes", "2", "--out", out.string()}));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("host key of bltest is unknown or has changed"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(remote_files().empty());
}

// A GPU cluster's login node: this test's sshd in front of a real single-node Slurm cluster
// (tests/app/slurm_cluster.sh; its SLURM_CONF set in the server's sessions).
class CliRemoteSlurm : public CliRemote {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<testing::SlurmCluster>(
        fs::temp_directory_path() / ("bl_remote_slurm_" + std::to_string(::getpid())));
    if (const std::string why = cluster_->unavailable(); !why.empty()) {
      GTEST_SKIP() << why;
    }
    ASSERT_EQ(cluster_->start(), "");
    ::setenv("SLURM_CONF", cluster_->conf().c_str(), 1);  // this test's own squeue
    start_server("SLURM_CONF=" + cluster_->conf().string());
  }
  void TearDown() override {
    CliRemote::TearDown();
    ::unsetenv("SLURM_CONF");
  }

  // `remote bltest sweep --slurm` of the tiny sweep over prompts.txt and `seeds`, in 2 tasks.
  std::vector<std::string> slurm_sweep(const std::string& seeds, const fs::path& out,
                                       const std::string& steps = "3") const {
    return remote({"sweep",
                   "--slurm",
                   "--shards",
                   "2",
                   "--gpus-per-task",
                   "0",
                   "--poll-s",
                   "0.5",
                   "--preset",
                   "tiny",
                   "--batch-sizes",
                   "2",
                   "--steps",
                   steps,
                   "--max-new-tokens",
                   "16",
                   "--prompts",
                   (dir_ / "prompts.txt").string(),
                   "--seeds",
                   seeds,
                   "--policy",
                   "emulated_h200",
                   "--progress",
                   "json",
                   "--out",
                   out.string()});
  }

  // The job ids the sweep folder `there` recorded (slurm/jobs.json): "ARRAY MERGE".
  static std::string jobs_of(const fs::path& there) {
    const auto j = nlohmann::json::parse(testing::slurp(there / "slurm" / "jobs.json"));
    return j.at("array_job").get<std::string>() + " " + j.at("merge_job").get<std::string>();
  }

  // The remote sweep folders (sweep-<id>).
  std::vector<fs::path> sweep_folders() const {
    std::vector<fs::path> out;
    for (const fs::path& p : remote_files()) {
      if (p.filename().string().rfind("sweep-", 0) == 0) {
        out.push_back(p);
      }
    }
    return out;
  }

  std::unique_ptr<testing::SlurmCluster> cluster_;
};

// Submitted there as a job array and a merge job, followed from here (the tasks' states in the
// progress), the merged file back checked; the same command again follows the same jobs rather
// than submitting twice; prompts travel as data.
TEST_F(CliRemoteSlurm, SweepIsSubmittedOnTheLoginNodeFollowedAndComesBack) {
  {
    std::ofstream p(dir_ / "prompts.txt");
    p << "Tides?\nWhy is the sky \"blue\"? $(touch " << (dir_ / "CANARY").string() << ")\n";
  }
  const fs::path out = dir_ / "here" / "sweep.h5";
  const auto r = run_process(slurm_sweep("0-1", out));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "CANARY")) << "a prompt ran as a command";
  EXPECT_NE(r.out.find("submitted: job array"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find(R"("stage":"bltest: Slurm job )"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("SHA-256"), std::string::npos) << r.out;
  const std::vector<fs::path> there = sweep_folders();
  ASSERT_EQ(there.size(), 1U);
  EXPECT_EQ(testing::slurp(there[0] / "sweep.h5"), testing::slurp(out));
  const auto summary = run_process({BL_CLI_PATH, "summary", out.string()});
  ASSERT_EQ(summary.exit_code, 0) << summary.err;
  EXPECT_NE(summary.out.find("items finished: 4 of 4"), std::string::npos) << summary.out;
  EXPECT_NE(summary.out.find("shards: 1 of 2"), std::string::npos) << summary.out;
  const std::string jobs = jobs_of(there[0]);
  // Again: the jobs of the first command are followed (their merged file), none submitted.
  const fs::path again = dir_ / "here" / "again.h5";
  const auto r2 = run_process(slurm_sweep("0-1", again));
  ASSERT_EQ(r2.exit_code, 0) << r2.out << r2.err;
  EXPECT_NE(r2.out.find("following job array " + jobs.substr(0, jobs.find(' '))), std::string::npos)
      << r2.out;
  EXPECT_EQ(r2.out.find("submitted:"), std::string::npos) << r2.out;
  EXPECT_EQ(jobs_of(there[0]), jobs);
  EXPECT_EQ(testing::slurp(again), testing::slurp(out));
}

// Ctrl-C here cancels the jobs there (scancel); a dropped connection leaves them running and
// the same command follows them to the file.
TEST_F(CliRemoteSlurm, CtrlCCancelsTheJobsAndADroppedConnectionLeavesThemRunning) {
  std::ofstream(dir_ / "prompts.txt") << "Tides?\nExplain the moon.\n";
  // Long enough items (48 steps) that both happen while tasks run.
  const fs::path cancelled = dir_ / "cancelled.h5";
  fs::create_directories(dir_ / "logs-cancel");
  {
    testing::Child child(slurm_sweep("0-5", cancelled, "48"), {}, dir_ / "logs-cancel");
    ASSERT_TRUE(child.wait_for_err(" running, ")) << child.err();
    child.signal(SIGINT);
    EXPECT_EQ(child.wait(std::chrono::seconds(120)), 130) << child.err();
    EXPECT_NE(child.err().find("scancel ended job array"), std::string::npos) << child.err();
  }
  EXPECT_FALSE(fs::exists(cancelled));
  std::vector<fs::path> there = sweep_folders();
  ASSERT_EQ(there.size(), 1U);
  const std::string jobs = jobs_of(there[0]);
  const std::string array = jobs.substr(0, jobs.find(' '));
  const auto alive = [](const std::string& job) {
    return run_process({"/usr/bin/squeue", "-h", "-r", "-t",
                        "PENDING,CONFIGURING,RUNNING,COMPLETING", "-j", job, "-o", "%T"})
        .out;
  };
  // scancel has ended them (COMPLETING ends within seconds).
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!alive(array).empty() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  EXPECT_EQ(alive(array), "") << "the job array still runs after Ctrl-C";

  // Another sweep, its connection dropped while the tasks run: a clear error, the jobs go on.
  const fs::path dropped = dir_ / "dropped.h5";
  fs::create_directories(dir_ / "logs-drop");
  {
    testing::Child child(slurm_sweep("6-9", dropped, "48"), {}, dir_ / "logs-drop");
    ASSERT_TRUE(child.wait_for_err(" running, ")) << child.err();
    const std::string pid = testing::slurp(server() + "/sshd.pid");
    run_process({"/bin/sh", "-c",
                 "for m in $(pgrep -P " + pid.substr(0, pid.find('\n')) +
                     R"(); do pkill -KILL -P "$m"; kill -KILL "$m"; done)"});
    EXPECT_EQ(child.wait(std::chrono::seconds(120)), 1) << child.err();
    EXPECT_NE(child.err().find("the Slurm jobs go on there"), std::string::npos) << child.err();
  }
  EXPECT_FALSE(fs::exists(dropped));
  there = sweep_folders();
  ASSERT_EQ(there.size(), 2U);
  const fs::path second = jobs_of(there[0]) == jobs ? there[1] : there[0];
  const std::string second_jobs = jobs_of(second);
  EXPECT_NE(alive(second_jobs.substr(0, second_jobs.find(' '))), "")
      << "the dropped connection ended the jobs: "
      << run_process({"/usr/bin/squeue", "-r", "-t", "all", "-o", "%i %T %r"}).out;
  // The same command follows them to the merged file.
  const auto r = run_process(slurm_sweep("6-9", dropped, "48"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("following job array " + second_jobs.substr(0, second_jobs.find(' '))),
            std::string::npos)
      << r.out;
  EXPECT_EQ(jobs_of(second), second_jobs);
  ASSERT_TRUE(fs::exists(dropped));
  EXPECT_EQ(testing::slurp(second / "sweep.h5"), testing::slurp(dropped));
}

}  // namespace
}  // namespace batchlens
