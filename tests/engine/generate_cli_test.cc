// `kvstrata generate` end to end on the default model (label "model"): the binary is run as a
// child process. Greedy chat "What is the capital of France?" must answer with Paris, with the
// BF16 and the INT2 cache; bad flags must fail with exit status 2 and name the flag.

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#ifndef KVSTRATA_BINARY
#error "KVSTRATA_BINARY must name the kvstrata executable"
#endif

namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

struct ChildRun {
  int status = -1;
  std::string stdout_text;
  std::string stderr_text;
};

// Runs `[env] kvstrata <args>` (args already shell-quoted as needed).
ChildRun Kvstrata(const std::string& args, const std::string& env = "") {
  const std::string err = absl::StrCat(::testing::TempDir(), "/generate_cli_stderr.txt");
  const std::string command = absl::StrCat(env, KVSTRATA_BINARY, " ", args, " 2>", err);
  ChildRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.stdout_text.append(buffer, n);
  const int rc = ::pclose(pipe);
  run.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  if (FILE* f = std::fopen(err.c_str(), "r")) {
    while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) run.stderr_text.append(buffer, n);
    std::fclose(f);
  }
  return run;
}

class GenerateCliTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const char* model = std::getenv("KVSTRATA_MODEL");
    ASSERT_TRUE(model != nullptr && std::filesystem::is_regular_file(model))
        << "the default model is missing (KVSTRATA_MODEL=" << (model ? model : "<unset>")
        << "); run scripts/fetch-model.sh";
    model_ = model;
  }
  std::string model_;
};

TEST_P(GenerateCliTest, GreedyChatKnowsTheCapitalOfFrance) {
  const ChildRun run =
      Kvstrata(absl::StrCat("generate --model '", model_, "' --kv-format ", GetParam(),
                            " --chat --prompt 'What is the capital of France?'"
                            " --max-tokens 32"));
  std::printf("stdout: %sstderr: %s", run.stdout_text.c_str(), run.stderr_text.c_str());
  ASSERT_EQ(run.status, 0) << run.stderr_text;
  EXPECT_THAT(run.stdout_text, HasSubstr("Paris"));
  // The figures line: prompt and generated tokens, finish reason, speeds, the KV it held.
  EXPECT_THAT(run.stderr_text,
              MatchesRegex("prompt_tokens=[0-9]+ generated_tokens=[0-9]+ finish=eos "
                           "prefill=[0-9.]+ tok/s decode=[0-9.]+ tok/s kv_format=" +
                           std::string(GetParam()) +
                           "-[a-z0-9-]+ kv_tokens=[0-9]+ kv_bytes=[0-9]+ "
                           "kv_pages=[0-9]+\\+[0-9]+ kv_bits_per_element=[0-9.]+\n"));
  // No control token leaks into the text.
  EXPECT_THAT(run.stdout_text, ::testing::Not(HasSubstr("<|im_")));
}

INSTANTIATE_TEST_SUITE_P(KvFormats, GenerateCliTest, ::testing::Values("bf16", "int2"));

TEST(GenerateCliFlags, BadFlagsExitTwoAndNameTheFlag) {
  const struct {
    const char* args;
    const char* message;
  } cases[] = {
      {"generate", "--prompt is required"},
      {"generate --prompt hi --max-tokens 0", "--max-tokens=0"},
      {"generate --prompt hi --temperature -1", "--temperature=-1"},
      {"generate --prompt hi --top-p 1.5", "--top-p=1.5"},
      {"generate --prompt hi --kv-format int3", "--kv-format: unknown KV format \"int3\""},
      {"generate --prompt hi --kv-cache-mb 0", "--kv-cache-mb=0"},
      {"generate --prompt hi --model /nonexistent.gguf", "--model /nonexistent.gguf"},
      {"generate --prompt hi --system be-brief", "--system needs --chat"},
  };
  for (const auto& c : cases) {
    const ChildRun run = Kvstrata(c.args);
    EXPECT_EQ(run.status, 2) << c.args;
    EXPECT_THAT(run.stderr_text, HasSubstr(c.message)) << c.args;
  }
}

TEST(GenerateCliFlags, MissingDefaultModelPointsAtTheFetchScript) {
  const std::string cache = absl::StrCat(::testing::TempDir(), "/empty-kvstrata-cache");
  const ChildRun run =
      Kvstrata("generate --prompt hi", absl::StrCat("env KVSTRATA_CACHE='", cache, "' "));
  EXPECT_EQ(run.status, 1);
  EXPECT_THAT(run.stderr_text, HasSubstr(cache + "/models/SmolLM2-135M-Instruct.Q4_1.gguf"));
  EXPECT_THAT(run.stderr_text, HasSubstr("run scripts/fetch-model.sh"));
}

}  // namespace
