#pragma once

// Subcommands of the kvstrata tool. Each lives in its own file and registers itself:
//
//   KVSTRATA_COMMAND(format_demo, "format-demo", "one-line summary", RunFormatDemo);
//
// The function runs after main has parsed the flags (ABSL_FLAG definitions live beside the
// command that uses them) and returns the process exit code.

#include <functional>
#include <map>
#include <string>

namespace kvstrata::cli {

struct Command {
  std::string summary;
  std::function<int()> run;
};

// Name -> command, in name order (for `kvstrata help`).
std::map<std::string, Command>& Commands();

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* summary, int (*run)()) {
    Commands()[name] = Command{summary, run};
  }
};

#define KVSTRATA_COMMAND(id, name, summary, fn) \
  static ::kvstrata::cli::CommandRegistrar kvstrata_command_##id(name, summary, fn)

}  // namespace kvstrata::cli
