// SPDX-License-Identifier: Apache-2.0
// batchlens-cli: the headless front end. Wires subcommands to core; holds no logic of its own.
#include <iostream>

#include "app/cli/command.h"
#include "core/base/atomic_file.h"
#include "core/base/system_info.h"

namespace {

int run(int argc, char** argv) {
  using namespace batchlens;
  // First: a SIGINT or SIGTERM at any later point removes the temporary of a file being written
  // and exits 130 / 143; commands that can cancel (SigintCancel) turn SIGINT into a cancel.
  base::install_signal_cleanup();
  base::configure_threads(0);

  CLI::App app{
      "BatchLens: why does DiffusionGemma's output change with the batch size?\n"
      "Runs and inspects paired batch-size experiments without a GUI.",
      "batchlens-cli"};
  app.set_version_flag(
      "--version", [] { return cli::version_text(); },
      "Print the version, LibTorch and the devices found, then exit");
  app.require_subcommand(0, 1);
  app.footer(std::string(cli::kExitCodesHelp) + "\n\n" + cli::kEnvironmentHelp);

  int exit_code = cli::kExitOk;
  cli::register_info(app, exit_code);
  cli::register_forward(app, exit_code);
  cli::register_cost(app, exit_code);
  cli::register_generate(app, exit_code);
  cli::register_save_model(app, exit_code);
  cli::register_tokenize(app, exit_code);
  cli::register_run(app, exit_code);
  cli::register_summary(app, exit_code);
  cli::register_repro(app, exit_code);
  cli::register_sweep(app, exit_code);
  cli::register_sweep_merge(app, exit_code);
  cli::register_culprit(app, exit_code);
  cli::register_remote(app, exit_code);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    // CLI11 returns 0 for --help/--version and its own error codes otherwise; the
    // documented contract is 2 for every usage error.
    return rc == 0 ? cli::kExitOk : cli::kExitUsage;
  }
  if (app.get_subcommands().empty()) {
    std::cout << app.help();
  }
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "batchlens-cli: internal error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "batchlens-cli: internal error\n";
  }
  return batchlens::cli::kExitFailure;
}
