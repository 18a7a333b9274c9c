#pragma once

// Helpers shared by the model tests: scratch folders, whole-file I/O, and byte patching of
// serialised GGUF files.

#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "gtest/gtest.h"

namespace kvstrata::model::testing {

// A fresh folder under the test temp dir, removed when the object goes away.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::path(::testing::TempDir()) / "kvmodel-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) != nullptr ? pattern : std::string();
    EXPECT_FALSE(path_.empty()) << "mkdtemp failed";
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(std::string_view name) const {
    return (std::filesystem::path(path_) / name).string();
  }

 private:
  std::string path_;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

inline void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void PutLe(std::string& bytes, size_t offset, T value) {
  ASSERT_LE(offset + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

template <typename T>
T GetLe(const std::string& bytes, size_t offset) {
  T value{};
  if (offset + sizeof(T) <= bytes.size()) std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

// Offset of the byte just after a GGUF string equal to `text` (its u64 length, then its bytes):
// for a tensor name, where n_dims starts. npos when absent.
inline size_t AfterGgufString(const std::string& bytes, std::string_view text) {
  std::string needle(8, '\0');
  const uint64_t length = text.size();
  std::memcpy(needle.data(), &length, 8);
  needle.append(text);
  const size_t at = bytes.find(needle);
  return at == std::string::npos ? at : at + needle.size();
}

// Where the parts of a GGUF tensor description start, found by its name.
struct TensorInfoOffsets {
  size_t n_dims = std::string::npos;
  size_t dims = std::string::npos;
  size_t type = std::string::npos;
  size_t offset = std::string::npos;
};

inline TensorInfoOffsets FindTensorInfo(const std::string& bytes, std::string_view name) {
  TensorInfoOffsets at;
  at.n_dims = AfterGgufString(bytes, name);
  if (at.n_dims == std::string::npos) return at;
  at.dims = at.n_dims + 4;
  at.type = at.dims + 8 * GetLe<uint32_t>(bytes, at.n_dims);
  at.offset = at.type + 4;
  return at;
}

}  // namespace kvstrata::model::testing
