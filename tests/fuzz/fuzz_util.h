#pragma once

// What the libFuzzer targets share: a file that holds the current input (for parsers that take a
// path), and the tokenizer to fuzz with (the default model's when KVSTRATA_MODEL names it, else
// the tiny test model's). A target aborts only on a broken invariant, never on a bad input: an
// error Status is the right answer to most of what the fuzzer sends.

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "model/loader.h"
#include "model/tiny_model.h"
#include "tokenizer/tokenizer.h"

namespace kvstrata::fuzz {

// An in-memory file (memfd) rewritten with each input; path() opens it like any file.
class InputFile {
 public:
  explicit InputFile(const char* name) : fd_(memfd_create(name, 0)) {
    if (fd_ < 0) {
      perror("memfd_create");
      abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const std::string& Write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0 || pwrite(fd_, data, size, 0) != static_cast<ssize_t>(size)) {
      perror("memfd write");
      abort();
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

inline tokenizer::TokenizerSpec FuzzTokenizerSpec() {
  if (const char* model = std::getenv("KVSTRATA_MODEL"); model != nullptr && *model != '\0') {
    absl::StatusOr<tokenizer::TokenizerSpec> spec = model::LoadTokenizerSpec(model);
    if (spec.ok()) return *std::move(spec);
    fprintf(stderr, "fuzz: KVSTRATA_MODEL=%s: %s; using the tiny tokenizer\n", model,
            spec.status().ToString().c_str());
  }
  absl::StatusOr<model::LoadedModel> tiny = model::MakeTinyModel({});
  if (!tiny.ok()) abort();
  return tiny->tokenizer;
}

#define FUZZ_CHECK(cond)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                               \
    }                                                                        \
  } while (0)

}  // namespace kvstrata::fuzz
