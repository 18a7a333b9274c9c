#pragma once

// SIGINT/SIGTERM for service binaries: a handler writes the signal number to a pipe that one
// thread waits on. (A handler rather than sigwait alone: threads started before main, such as a
// runtime's worker pool, do not inherit main's mask, and one of them could take the default
// action and kill the process.) The threads started after InstallShutdownHandler keep both
// signals blocked, and the waiting thread unblocks them while it waits, so the signal reaches
// it directly; a process the service starts would inherit the blocked mask (none does).

#include "absl/status/status.h"

namespace kvstrata {

// Installs the handlers and blocks both signals in the calling thread (and so in the threads it
// starts). Call once, early in main, before starting threads.
absl::Status InstallShutdownHandler();

// Blocks until SIGINT or SIGTERM arrives; returns the signal number. Call from a thread started
// after InstallShutdownHandler (or the thread that called it).
int WaitForShutdownSignal();

}  // namespace kvstrata
