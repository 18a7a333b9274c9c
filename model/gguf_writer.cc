#include "model/gguf_writer.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "model/load_util.h"

namespace kvstrata::model {
namespace {

template <typename T>
void Append(T value, std::string& out) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // GGUF is little-endian, as is every supported host
  out.append(bytes, sizeof(T));
}

void AppendString(std::string_view s, std::string& out) {
  Append<uint64_t>(s.size(), out);
  out.append(s.data(), s.size());
}

void Pad(uint64_t alignment, std::string& out) {
  out.append((alignment - out.size() % alignment) % alignment, '\0');
}

}  // namespace

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  if (alignment != 32) AddUint32("general.alignment", alignment);
}

void GgufWriter::AddRaw(std::string_view key, GgufValueType type,
                        std::span<const uint8_t> encoded) {
  AppendString(key, kv_bytes_);
  Append(static_cast<uint32_t>(type), kv_bytes_);
  kv_bytes_.append(reinterpret_cast<const char*>(encoded.data()), encoded.size());
  ++num_kv_;
}

void GgufWriter::AddUint32(std::string_view key, uint32_t value) {
  AppendString(key, kv_bytes_);
  Append(static_cast<uint32_t>(GgufValueType::kUint32), kv_bytes_);
  Append(value, kv_bytes_);
  ++num_kv_;
}

void GgufWriter::AddUint64(std::string_view key, uint64_t value) {
  AppendString(key, kv_bytes_);
  Append(static_cast<uint32_t>(GgufValueType::kUint64), kv_bytes_);
  Append(value, kv_bytes_);
  ++num_kv_;
}

void GgufWriter::AddInt32(std::string_view key, int32_t value) {
  AppendString(key, kv_bytes_);
  Append(static_cast<uint32_t>(GgufValueType::kInt32), kv_bytes_);
  Append(value, kv_bytes_);
  ++num_kv_;
}

void GgufWriter::AddFloat32(std::string_view key, float value) {
  AppendString(key, kv_bytes_);
  Append(static_cast<uint32_t>(GgufValueType::kFloat32), kv_bytes_);
  Append(value, kv_bytes_);
  ++num_kv_;
}

void GgufWriter::AddBool(std::string_view key, bool value) {
  AppendString(key, kv_bytes_);
  Append(static_cast<uint32_t>(GgufValueType::kBool), kv_bytes_);
  Append<uint8_t>(value ? 1 : 0, kv_bytes_);
  ++num_kv_;
}

void GgufWriter::AddString(std::string_view key, std::string_view value) {
  AppendString(key, kv_bytes_);
  Append(static_cast<uint32_t>(GgufValueType::kString), kv_bytes_);
  AppendString(value, kv_bytes_);
  ++num_kv_;
}

void GgufWriter::AddStringArray(std::string_view key, std::span<const std::string> values) {
  AppendString(key, kv_bytes_);
  Append(static_cast<uint32_t>(GgufValueType::kArray), kv_bytes_);
  Append(static_cast<uint32_t>(GgufValueType::kString), kv_bytes_);
  Append<uint64_t>(values.size(), kv_bytes_);
  for (const std::string& value : values) AppendString(value, kv_bytes_);
  ++num_kv_;
}

void GgufWriter::AddInt32Array(std::string_view key, std::span<const int32_t> values) {
  AppendString(key, kv_bytes_);
  Append(static_cast<uint32_t>(GgufValueType::kArray), kv_bytes_);
  Append(static_cast<uint32_t>(GgufValueType::kInt32), kv_bytes_);
  Append<uint64_t>(values.size(), kv_bytes_);
  for (const int32_t value : values) Append(value, kv_bytes_);
  ++num_kv_;
}

absl::Status GgufWriter::AddTensor(std::string_view name, GgmlType type, std::vector<int64_t> dims,
                                   std::span<const uint8_t> data) {
  uint64_t num_elements = 1;
  for (const int64_t dim : dims) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", AsAbsl(name), "': negative dimension in ", FormatShape(dims)));
    }
    num_elements *= static_cast<uint64_t>(dim);
  }
  const GgmlTypeInfo info = GetGgmlTypeInfo(type);
  if (!dims.empty() && dims[0] % info.block_elements != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", AsAbsl(name), "': rows of ", dims[0],
                                                   " are not whole ", AsAbsl(info.name),
                                                   " blocks"));
  }
  KV_ASSIGN_OR_RETURN(const uint64_t expected, GgmlTypeBytes(type, num_elements));
  if (expected != data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", AsAbsl(name), "': ", AsAbsl(info.name), " ", FormatShape(dims),
                     " takes ", expected, " bytes, got ", data.size()));
  }
  tensors_.push_back(Tensor{std::string(name), type, std::move(dims), {data.begin(), data.end()}});
  return absl::OkStatus();
}

std::string GgufWriter::Serialize() const {
  std::string out = "GGUF";
  Append<uint32_t>(3, out);
  Append<uint64_t>(tensors_.size(), out);
  Append<uint64_t>(num_kv_, out);
  out += kv_bytes_;
  uint64_t offset = 0;
  for (const Tensor& tensor : tensors_) {
    AppendString(tensor.name, out);
    Append<uint32_t>(static_cast<uint32_t>(tensor.dims.size()), out);
    for (const int64_t dim : tensor.dims) Append<uint64_t>(static_cast<uint64_t>(dim), out);
    Append(static_cast<uint32_t>(tensor.type), out);
    Append<uint64_t>(offset, out);
    offset += tensor.data.size();
    offset += (alignment_ - offset % alignment_) % alignment_;
  }
  Pad(alignment_, out);
  for (const Tensor& tensor : tensors_) {
    out.append(reinterpret_cast<const char*>(tensor.data.data()), tensor.data.size());
    Pad(alignment_, out);
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  const std::string bytes = Serialize();
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) {
    return absl::InternalError(
        absl::StrCat("cannot write GGUF file '", path, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace kvstrata::model
