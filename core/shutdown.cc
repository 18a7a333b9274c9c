#include "core/shutdown.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

namespace kvstrata {

namespace {

int shutdown_pipe[2] = {-1, -1};

void OnShutdownSignal(int signal) {
  const unsigned char byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] ssize_t n = write(shutdown_pipe[1], &byte, 1);
}

}  // namespace

absl::Status InstallShutdownHandler() {
  if (pipe(shutdown_pipe) != 0) return absl::InternalError("pipe() failed");
  struct sigaction action = {};
  action.sa_handler = OnShutdownSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (sigaction(SIGINT, &action, nullptr) != 0 || sigaction(SIGTERM, &action, nullptr) != 0) {
    return absl::InternalError("sigaction() failed");
  }
  return absl::OkStatus();
}

int WaitForShutdownSignal() {
  unsigned char signal = 0;
  while (read(shutdown_pipe[0], &signal, 1) < 0 && errno == EINTR) {
  }
  return signal;
}

}  // namespace kvstrata
