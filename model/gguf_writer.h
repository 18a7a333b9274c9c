#pragma once

// Builds a GGUF v3 file (little-endian) in memory: the writer behind the tiny test models, and
// a way for tests to craft files the reader must accept or reject. Keys and tensors are written
// in the order added; no key is checked for duplicates (the reader rejects them).

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "model/dequant.h"
#include "model/gguf.h"

namespace kvstrata::model {

class GgufWriter {
 public:
  // An alignment other than 32 (the format's default) is recorded as general.alignment.
  explicit GgufWriter(uint32_t alignment = 32);

  void AddUint32(std::string_view key, uint32_t value);
  void AddUint64(std::string_view key, uint64_t value);
  void AddInt32(std::string_view key, int32_t value);
  void AddFloat32(std::string_view key, float value);
  void AddBool(std::string_view key, bool value);
  void AddString(std::string_view key, std::string_view value);
  void AddStringArray(std::string_view key, std::span<const std::string> values);
  void AddInt32Array(std::string_view key, std::span<const int32_t> values);
  // Any value: `encoded` is written verbatim after the key and `type`, as the format lays that
  // type out (for an array: element type, count, elements).
  void AddRaw(std::string_view key, GgufValueType type, std::span<const uint8_t> encoded);

  // `dims` in ggml order (dims[0] contiguous: {in, out} for a matrix [out][in]). InvalidArgument
  // unless `data` is exactly the bytes of that many elements of `type` in whole-block rows.
  absl::Status AddTensor(std::string_view name, GgmlType type, std::vector<int64_t> dims,
                         std::span<const uint8_t> data);

  // The whole file.
  std::string Serialize() const;
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    std::vector<uint8_t> data;
  };

  uint32_t alignment_;
  uint64_t num_kv_ = 0;
  std::string kv_bytes_;  // the encoded metadata entries
  std::vector<Tensor> tensors_;
};

}  // namespace kvstrata::model
