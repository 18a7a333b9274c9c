#pragma once

// SIGINT/SIGTERM for service binaries: a handler writes the signal number to a pipe that one
// thread waits on. (A handler rather than sigwait with the signals blocked: threads started
// before main, such as a runtime's worker pool, do not inherit main's mask, and one of them
// could take the default action and kill the process.)

#include "absl/status/status.h"

namespace kvstrata {

// Installs the handlers. Call once, early in main.
absl::Status InstallShutdownHandler();

// Blocks until SIGINT or SIGTERM arrives; returns the signal number.
int WaitForShutdownSignal();

}  // namespace kvstrata
