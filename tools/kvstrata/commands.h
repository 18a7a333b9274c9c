#pragma once

// Subcommands of the kvstrata tool. Each returns the process exit code; flags are parsed by
// main before the subcommand runs.

namespace kvstrata::cli {

int RunFormatDemo();

}  // namespace kvstrata::cli
