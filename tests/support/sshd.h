// SPDX-License-Identifier: Apache-2.0
// A real OpenSSH server on 127.0.0.1 for the remote tests (issue #36): tests/app/sshd_server.sh
// (Debian's sshd, a generated host key and user key under a temporary folder), started and
// stopped by the test; the client then uses `ssh -F STATE/ssh_config bltest`.
#pragma once

#include <filesystem>
#include <string>

namespace batchlens::testing {

/// Why the test sshd could not start under `state`: "" when it runs. `skip` is set when this
/// machine has no sshd and CI is not asking for it (then the test skips with the reason).
/// `session_env` ("NAME=VALUE", optional) is set in every session the server starts.
std::string start_sshd(const std::filesystem::path& state, bool& skip,
                       const std::string& session_env = {});

/// Ends what a test left running against the server under `state` (its ssh clients, the runs
/// whose working folder is `work`), then stops the server.
void stop_sshd(const std::filesystem::path& state, const std::filesystem::path& work);

}  // namespace batchlens::testing
