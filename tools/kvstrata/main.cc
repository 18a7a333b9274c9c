// kvstrata: the command-line tool. `kvstrata help` lists the subcommands.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "tools/kvstrata/commands.h"

namespace kvstrata::cli {

std::map<std::string, Command>& Commands() {
  static auto* commands = new std::map<std::string, Command>();
  return *commands;
}

}  // namespace kvstrata::cli

namespace {

std::string Usage() {
  std::string text =
      "kvstrata: a 2-bit KV cache for long-context LLM serving.\n\n"
      "usage: kvstrata <command> [flags]\n\ncommands:\n";
  size_t width = 4;  // "help"
  for (const auto& [name, command] : kvstrata::cli::Commands()) width = std::max(width, name.size());
  const auto line = [&](const std::string& name, const std::string& summary) {
    text += "  " + name + std::string(width + 2 - name.size(), ' ') + summary + "\n";
  };
  for (const auto& [name, command] : kvstrata::cli::Commands()) line(name, command.summary);
  line("help", "this text; `kvstrata <command> --help` lists a command's flags");
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = Usage();
  // absl prints the program's name before this message itself.
  absl::SetProgramUsageMessage(absl::StripPrefix(usage, "kvstrata: "));
  if (argc < 2 || !std::strcmp(argv[1], "help") || !std::strcmp(argv[1], "--help") ||
      !std::strcmp(argv[1], "-h")) {
    std::fputs(usage.c_str(), argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  const auto it = kvstrata::cli::Commands().find(name);
  if (it == kvstrata::cli::Commands().end()) {
    std::fprintf(stderr, "kvstrata: unknown command '%s'\n\n%s", name.c_str(), usage.c_str());
    return 2;
  }
  // `kvstrata <command> --help` lists the flags of that command's file and of the flag files
  // it shares with others.
  absl::FlagsUsageConfig help;
  help.contains_help_flags = [name](absl::string_view file) {
    std::string own = name;
    std::replace(own.begin(), own.end(), '-', '_');
    const auto from = [&](const char* stem) {
      return absl::EndsWith(file, absl::StrCat("tools/kvstrata/", stem, ".cc"));
    };
    const bool engine = name == "generate" || name == "bench-engine" || name == "eval" ||
                        name == "calibrate" || name == "calibrate-codec";
    const bool fidelity = name == "eval" || name == "calibrate" || name == "calibrate-codec";
    const bool client = name == "demo-chat" || name == "health" || name == "request";
    return from(own.c_str()) || (engine && from("engine_flags")) ||
           (fidelity && from("fidelity_flags")) || (client && from("generation_client"));
  };
  help.contains_helpshort_flags = help.contains_help_flags;
  absl::SetFlagsUsageConfig(help);
  // Drop the command name so absl sees only flags; accept --max-tokens as --max_tokens.
  std::vector<std::string> storage{argv[0]};
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) == 0) {
      const size_t end = std::min(arg.find('='), arg.size());
      for (size_t j = 2; j < end; ++j) {
        if (arg[j] == '-') arg[j] = '_';
      }
    }
    storage.push_back(std::move(arg));
  }
  std::vector<char*> args;
  for (std::string& s : storage) args.push_back(s.data());
  const std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (positional.size() > 1) {
    std::fprintf(stderr, "kvstrata %s: unexpected argument '%s'\n", name.c_str(), positional[1]);
    return 2;
  }
  return it->second.run();
}
