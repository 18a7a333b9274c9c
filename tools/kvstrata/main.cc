// kvstrata: the command-line tool. `kvstrata help` lists the subcommands.

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "tools/kvstrata/commands.h"

namespace {

constexpr char kUsage[] = R"(kvstrata: a 2-bit KV cache for long-context LLM serving.

usage: kvstrata <command> [flags]

commands:
  format-demo   quantise synthetic K/V with outlier channels in every KV format kvstrata
                supports or compares against, and print bits per element and errors
  help          this text; `kvstrata <command> --help` shows a command's flags
)";

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  if (argc < 2 || std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0 ||
      std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  // Drop the subcommand so absl sees only the flags.
  std::vector<char*> args{argv[0]};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  const std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (positional.size() > 1) {
    std::fprintf(stderr, "kvstrata %s: unexpected argument '%s'\n", command.c_str(), positional[1]);
    return 2;
  }
  if (command == "format-demo") return kvstrata::cli::RunFormatDemo();
  std::fprintf(stderr, "kvstrata: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
