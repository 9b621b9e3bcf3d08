// SPDX-License-Identifier: Apache-2.0
// SSH targets (issue #36): what is a target, and the ssh command line that reaches it (the real
// runs over a real sshd are tests/app/cli_remote_test.cpp).
#include "core/remote/ssh_run.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace batchlens::remote {
namespace {

TEST(SshTarget, ParsesAliasesUsersAndPortsAndRefusesOptions) {
  EXPECT_EQ(parse_target("gpu-server").value().host, "gpu-server");
  const SshTarget t = parse_target("ana@h200.example.org:2222").value();
  EXPECT_EQ(t.host, "ana@h200.example.org");
  EXPECT_EQ(t.port, 2222);
  EXPECT_EQ(t.describe(), "ana@h200.example.org:2222");
  for (const char* bad : {"", "-oProxyCommand=touch x", "host name", "h;rm", "h:0", "h:70000",
                          "h:x", "h$(x)", "a\nb"}) {
    EXPECT_FALSE(parse_target(bad).ok()) << bad;
  }
}

TEST(SshTarget, TheCommandLineIsBatchModeAndEndsOptionsBeforeTheHost) {
  SshTarget t = parse_target("gpu:2200").value();
  t.ssh_options = {"-F", "/tmp/cfg"};
  const std::vector<std::string> argv = ssh_argv(t, "exec batchlens-cli info --json");
  const std::vector<std::string> want{"ssh",
                                      "-o",
                                      "BatchMode=yes",
                                      "-o",
                                      "ServerAliveInterval=15",
                                      "-o",
                                      "ServerAliveCountMax=4",
                                      "-p",
                                      "2200",
                                      "-F",
                                      "/tmp/cfg",
                                      "--",
                                      "gpu",
                                      "exec batchlens-cli info --json"};
  EXPECT_EQ(argv, want);
}

}  // namespace
}  // namespace batchlens::remote
