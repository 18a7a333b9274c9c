#include "engine/defaults.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace kvstrata::engine {

namespace {
const char* NonEmptyEnv(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}
}  // namespace

std::string CacheDir() {
  if (const char* env = NonEmptyEnv("KVSTRATA_CACHE")) return env;
  const char* home = std::getenv("HOME");
  return absl::StrCat(home ? home : "", "/.cache/kvstrata");
}

std::string DefaultModelPath() {
  return absl::StrCat(CacheDir(), "/models/SmolLM2-135M-Instruct.Q4_1.gguf");
}

std::string DefaultRotationsDir() {
  if (const char* env = NonEmptyEnv("KVSTRATA_ROTATIONS")) return env;
  return KVSTRATA_SOURCE_DIR "/rotations";
}

}  // namespace kvstrata::engine
