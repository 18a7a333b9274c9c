// A Hugging Face model folder whose config.json is the input (beside a tiny model's real
// safetensors and tokenizer files): any JSON must load or be refused with an error naming the
// field, never crash or throw (nlohmann::json throws on some misuse).

#include <filesystem>
#include <fstream>

#include "model/safetensors.h"
#include "model/tiny_model.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvstrata {
namespace {

std::string& Folder() {
  static std::string dir;
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char tmpl[] = "/tmp/kvstrata-fuzz-hf-XXXXXX";
  const char* dir = mkdtemp(tmpl);
  FUZZ_CHECK(dir != nullptr);
  Folder() = dir;
  FUZZ_CHECK(model::WriteTinyHfModel(Folder(), {.arch = model::Architecture::kQwen3}).ok());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream config(Folder() + "/config.json", std::ios::binary | std::ios::trunc);
    config.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  absl::StatusOr<model::LoadedModel> m = model::LoadHfModel(Folder());
  if (m.ok()) FUZZ_CHECK(m->config.num_layers > 0 && m->config.vocab_size > 0);
  return 0;
}

}  // namespace kvstrata
