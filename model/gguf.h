#pragma once

// A reader of GGUF files (versions 2 and 3, little-endian), written from the public format
// description in ggml's docs/gguf.md:
//
//   "GGUF" | u32 version | u64 tensor_count | u64 metadata_kv_count
//   metadata_kv_count x { string key | u32 value_type | value }
//   tensor_count x { string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset }
//   padding to `alignment` (metadata general.alignment, default 32) | tensor data
//
// where a string is { u64 length | bytes }, an array is { u32 element_type | u64 count |
// elements }, and a tensor's offset counts from the start of the data section.
//
// Every length, count and offset is checked against the file size before it is used, so a
// truncated or hostile file yields an error naming what was wrong (the key, the tensor), never
// a crash or an allocation the file's size cannot justify.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/dequant.h"

namespace kvstrata::model {

class ByteSource;

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint32", "string", ...
std::string_view GgufValueTypeName(GgufValueType type);

struct GgufArray;

// One metadata value. Views point into the file's bytes: they live as long as the GgufFile.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  // For a scalar, the alternative `type` implies: uint64_t for unsigned integers, int64_t for
  // signed ones, double for floats, bool, std::string_view for a string.
  std::variant<std::monostate, uint64_t, int64_t, double, bool, std::string_view> scalar;
  std::unique_ptr<GgufArray> array;  // set exactly when type == kArray
};

// An array value, its elements held in the cheapest form: numbers and bools as the file's raw
// little-endian bytes, strings as views into the file, nested arrays as values.
struct GgufArray {
  GgufValueType element_type = GgufValueType::kUint8;
  uint64_t size = 0;
  std::span<const uint8_t> raw;           // numeric and bool elements
  std::vector<std::string_view> strings;  // element_type == kString
  std::vector<GgufValue> arrays;          // element_type == kArray
};

struct GgufKeyValue {
  std::string key;
  GgufValue value;
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  // ggml order: dims[0] (ne0) is the contiguous dimension, so a row-major matrix [out][in] has
  // dims {in, out}.
  std::vector<int64_t> dims;
  int64_t num_elements = 0;
  uint64_t offset = 0;            // from the start of the data section
  std::span<const uint8_t> data;  // the tensor's bytes, inside the file
};

// A parsed GGUF file: metadata and tensor descriptions, with the file's bytes kept mapped so
// tensor data can be read without copying. Move-only; immutable after Open, so safe to read
// from several threads.
class GgufFile {
 public:
  // Maps and parses the file. NotFound if it does not exist; InvalidArgument if it is not valid
  // GGUF; Unimplemented for a version other than 2 and 3 or a big-endian file.
  static absl::StatusOr<GgufFile> Open(const std::string& path);
  // Parses an in-memory image; `name` stands for the path in errors.
  static absl::StatusOr<GgufFile> FromBytes(std::string bytes, std::string name);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  std::span<const uint8_t> bytes() const;  // the whole file

  // In file order.
  const std::vector<GgufKeyValue>& metadata() const { return metadata_; }
  const GgufValue* FindValue(std::string_view key) const;  // nullptr when absent
  bool HasKey(std::string_view key) const { return FindValue(key) != nullptr; }

  // Typed getters: NotFound naming the key when absent, InvalidArgument naming the key and
  // both types when the stored type does not fit.
  // Any integer type holding a non-negative value.
  absl::StatusOr<uint64_t> GetUint(std::string_view key) const;
  // Any integer type holding a value that fits in int64.
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  // float32, float64, or any integer type (converted).
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string_view> GetString(std::string_view key) const;
  absl::StatusOr<std::span<const std::string_view>> GetStringArray(std::string_view key) const;
  // Arrays of any integer type whose values fit in int64.
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  // Arrays of floats or integers.
  absl::StatusOr<std::vector<double>> GetFloatArray(std::string_view key) const;

  // In file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* FindTensor(std::string_view name) const;  // nullptr when absent
  // NotFound naming the tensor and the file when absent.
  absl::StatusOr<const GgufTensor*> GetTensor(std::string_view name) const;

 private:
  class Parser;
  // Heterogeneous lookup, so a std::string_view finds a std::string key without a copy.
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Index = std::unordered_map<std::string, size_t, StringHash, std::equal_to<>>;

  GgufFile() = default;
  static absl::StatusOr<GgufFile> Parse(std::unique_ptr<ByteSource> source, std::string path);
  absl::Status KeyError(std::string_view key, std::string_view expected,
                        const GgufValue& value) const;

  std::unique_ptr<ByteSource> source_;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKeyValue> metadata_;
  Index metadata_index_;
  std::vector<GgufTensor> tensors_;
  Index tensor_index_;
};

// Dequantises the tensor into `out`, which must hold exactly tensor.num_elements floats (in
// ggml order: ne0 fastest). Errors name the tensor; Unimplemented names an unsupported type.
absl::Status DequantizeTensor(const GgufTensor& tensor, std::span<float> out);

}  // namespace kvstrata::model
