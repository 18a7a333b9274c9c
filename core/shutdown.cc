#include "core/shutdown.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

namespace kvstrata {

namespace {

int shutdown_pipe[2] = {-1, -1};

void OnShutdownSignal(int signal) {
  const unsigned char byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] ssize_t n = write(shutdown_pipe[1], &byte, 1);
}

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
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
  // This thread and the threads it starts from now on (gRPC's, the engine's) keep both signals
  // blocked; WaitForShutdownSignal unblocks them while it waits, so the kernel hands them to
  // the waiting thread. Under ThreadSanitizer that matters: a handler for a signal that lands
  // on a thread inside uninstrumented code (gRPC's pollers) runs only once that thread comes
  // back to instrumented code, and the services sat out SIGTERM until they were killed.
  const sigset_t signals = ShutdownSignals();
  if (pthread_sigmask(SIG_BLOCK, &signals, nullptr) != 0) {
    return absl::InternalError("pthread_sigmask() failed");
  }
  return absl::OkStatus();
}

int WaitForShutdownSignal() {
  // Wait with the caller's mask minus the two signals: they can arrive only during the wait.
  sigset_t waiting;
  pthread_sigmask(SIG_SETMASK, nullptr, &waiting);
  sigdelset(&waiting, SIGINT);
  sigdelset(&waiting, SIGTERM);
  pollfd readable = {shutdown_pipe[0], POLLIN, 0};
  unsigned char signal = 0;
  while (true) {
    const int ready = ppoll(&readable, 1, nullptr, &waiting);
    if (ready > 0 && read(shutdown_pipe[0], &signal, 1) == 1) return signal;
    if (ready < 0 && errno != EINTR) break;
  }
  // ppoll failing otherwise: block on the pipe itself (a thread started before the handler,
  // which never blocked the signals, can still take them).
  while (read(shutdown_pipe[0], &signal, 1) < 0 && errno == EINTR) {
  }
  return signal;
}

}  // namespace kvstrata
