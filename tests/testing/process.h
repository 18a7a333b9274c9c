#pragma once

// Services as child processes on loopback, for end-to-end tests: start one with its output in a
// log file, stop it with a signal (or kill it), restart it, and wait until it reports SERVING
// through the standard health API.

#include <fcntl.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace kvstrata::test_util {

// A child process with its output in a log file.
class Child {
 public:
  Child(std::string name, std::string binary, std::vector<std::string> args)
      : name_(std::move(name)),
        binary_(std::move(binary)),
        args_(std::move(args)),
        log_(absl::StrCat(::testing::TempDir(), "e2e_", getpid(), "_", name_, ".log")) {
    Start(/*append=*/false);
  }
  ~Child() { Stop(SIGTERM); }

  // False once the process has exited; how it ended is then in exit_description().
  bool Running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      Reaped(status);
      return false;
    }
    return true;
  }

  // Signals the process and waits up to 20 s for it to exit, then kills it.
  void Stop(int signal) {
    if (pid_ <= 0) return;
    kill(pid_, signal);
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (absl::Now() > give_up) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    Reaped(status);
  }

  // Starts the same command again, its output appended to the same log.
  void Restart() {
    Stop(SIGKILL);
    Start(/*append=*/true);
  }

  // "exit 0", "signal 6", ... for the last exit reaped; "" while it has not exited.
  const std::string& exit_description() const { return exit_description_; }

  std::string LogTail(size_t bytes = 3000) const {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    const std::string all = s.str();
    return all.size() > bytes ? all.substr(all.size() - bytes) : all;
  }
  const std::string& name() const { return name_; }

 private:
  void Start(bool append) {
    exit_description_.clear();
    std::vector<std::string> args = args_;
    args.insert(args.begin(), binary_);
    pid_ = fork();
    if (pid_ == 0) {
      // Dies with the test, even one that aborts (a sanitizer halting it) without stopping it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
      if (fd >= 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
      }
      setenv("OPENBLAS_NUM_THREADS", "1", 1);  // two workers share this machine's cores
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(binary_.c_str(), argv.data());
      _exit(127);
    }
  }

  void Reaped(int status) {
    pid_ = -1;
    exit_description_ = WIFSIGNALED(status) ? absl::StrCat("signal ", WTERMSIG(status))
                                            : absl::StrCat("exit ", WEXITSTATUS(status));
  }

  std::string name_;
  std::string binary_;
  std::vector<std::string> args_;
  std::string log_;
  pid_t pid_ = -1;
  std::string exit_description_;
};

inline std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

inline bool WaitServing(const std::string& address, const std::string& service, Child& child,
                 absl::Duration timeout) {
  auto health = grpc::health::v1::Health::NewStub(Channel(address));
  const absl::Time give_up = absl::Now() + timeout;
  while (absl::Now() < give_up && child.Running()) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    context.set_wait_for_ready(true);
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    if (health->Check(&context, request, &response).ok() &&
        response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return true;
    }
  }
  return false;
}

}  // namespace kvstrata::test_util
