#include "model/gguf.h"

#include <bit>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "model/load_util.h"

namespace kvstrata::model {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader copies little-endian fields straight into host integers");

constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;  // ggml tensors have at most four dimensions
// Nesting of arrays inside arrays (an array of arrays of strings is depth 2). Deeper nesting
// has no use and would let a small file drive deep recursion.
constexpr int kMaxArrayDepth = 4;
// Far above any real model (hundreds to tens of thousands) yet small enough that the index
// structures stay modest; the file-size bound below is usually the tighter one.
constexpr uint64_t kMaxCount = uint64_t{1} << 24;
// The fewest bytes a metadata entry and a tensor description can occupy: they bound counts by
// the file size before anything is reserved.
constexpr uint64_t kMinKeyValueBytes = 8 + 1 + 4 + 1;  // key length, 1-byte key, type, u8
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 4 + 8;
constexpr uint64_t kMinStringBytes = 8;
constexpr uint64_t kMinArrayBytes = 4 + 8;

std::optional<GgufValueType> ValueTypeFromId(uint32_t id) {
  const GgufValueType type = static_cast<GgufValueType>(id);
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
    case GgufValueType::kBool:
    case GgufValueType::kString:
    case GgufValueType::kArray:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return type;
  }
  return std::nullopt;
}

// Bytes of one scalar element; 0 for strings and arrays, whose size is in the data.
uint64_t ScalarWidth(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

bool IsUnsigned(GgufValueType t) {
  return t == GgufValueType::kUint8 || t == GgufValueType::kUint16 || t == GgufValueType::kUint32 ||
         t == GgufValueType::kUint64;
}
bool IsSigned(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 || t == GgufValueType::kInt32 ||
         t == GgufValueType::kInt64;
}
bool IsFloat(GgufValueType t) {
  return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
}

template <typename T>
T LoadLe(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

// One scalar of `type` (not string or array) at `p`, widened into the variant's alternative.
void DecodeScalar(GgufValueType type, const uint8_t* p, GgufValue* out) {
  out->type = type;
  switch (type) {
    case GgufValueType::kUint8:
      out->scalar = uint64_t{LoadLe<uint8_t>(p)};
      return;
    case GgufValueType::kInt8:
      out->scalar = int64_t{LoadLe<int8_t>(p)};
      return;
    case GgufValueType::kUint16:
      out->scalar = uint64_t{LoadLe<uint16_t>(p)};
      return;
    case GgufValueType::kInt16:
      out->scalar = int64_t{LoadLe<int16_t>(p)};
      return;
    case GgufValueType::kUint32:
      out->scalar = uint64_t{LoadLe<uint32_t>(p)};
      return;
    case GgufValueType::kInt32:
      out->scalar = int64_t{LoadLe<int32_t>(p)};
      return;
    case GgufValueType::kFloat32:
      out->scalar = double{LoadLe<float>(p)};
      return;
    case GgufValueType::kBool:
      out->scalar = LoadLe<uint8_t>(p) != 0;
      return;
    case GgufValueType::kUint64:
      out->scalar = LoadLe<uint64_t>(p);
      return;
    case GgufValueType::kInt64:
      out->scalar = LoadLe<int64_t>(p);
      return;
    case GgufValueType::kFloat64:
      out->scalar = LoadLe<double>(p);
      return;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return;
  }
}

std::string Printable(std::string_view s) {
  constexpr size_t kMax = 64;
  std::string escaped = absl::CHexEscape(AsAbsl(s.substr(0, kMax)));
  if (s.size() > kMax) absl::StrAppend(&escaped, "...");
  return escaped;
}

}  // namespace

std::string_view GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

// Walks the file front to back. Every read is bounds-checked first; errors say what was being
// read and where.
class GgufFile::Parser {
 public:
  Parser(std::span<const uint8_t> bytes, const std::string& path) : bytes_(bytes), path_(path) {}

  absl::Status Run(GgufFile& file) {
    KV_RETURN_IF_ERROR(ParseHeader(file));
    KV_RETURN_IF_ERROR(ParseMetadata(file));
    KV_RETURN_IF_ERROR(ParseTensorInfos(file));
    return PlaceTensorData(file);
  }

 private:
  uint64_t remaining() const { return bytes_.size() - pos_; }

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("GGUF file '", path_, "': ", what));
  }

  absl::Status Truncated(absl::string_view what, uint64_t need) const {
    return Error(absl::StrCat(what, " needs ", need, " bytes at offset ", pos_, " but only ",
                              remaining(), " remain (", bytes_.size(),
                              " bytes in all): truncated or corrupt"));
  }

  // `describe` builds the error's subject only on failure, keeping the happy path cheap.
  template <typename T, typename Describe>
  absl::Status Read(T* out, const Describe& describe) {
    if (remaining() < sizeof(T)) return Truncated(describe(), sizeof(T));
    *out = LoadLe<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  template <typename Describe>
  absl::Status ReadString(std::string_view* out, const Describe& describe) {
    uint64_t length = 0;
    KV_RETURN_IF_ERROR(Read(&length, [&] { return absl::StrCat("the length of ", describe()); }));
    if (length > remaining()) {
      return Error(absl::StrCat(describe(), " claims ", length, " bytes at offset ", pos_,
                                " but only ", remaining(), " remain: truncated or corrupt"));
    }
    *out = std::string_view(reinterpret_cast<const char*>(bytes_.data() + pos_), length);
    pos_ += length;
    return absl::OkStatus();
  }

  absl::Status ParseHeader(GgufFile& file) {
    if (bytes_.size() < 4 || std::memcmp(bytes_.data(), "GGUF", 4) != 0) {
      const std::string_view head(reinterpret_cast<const char*>(bytes_.data()),
                                  std::min<size_t>(4, bytes_.size()));
      return Error(absl::StrCat("not a GGUF file: it starts with \"", Printable(head),
                                "\", expected \"GGUF\""));
    }
    pos_ = 4;
    uint32_t version = 0;
    KV_RETURN_IF_ERROR(Read(&version, [] { return std::string("the version"); }));
    if (version != 2 && version != 3) {
      const uint32_t swapped = __builtin_bswap32(version);
      if (swapped == 2 || swapped == 3) {
        return absl::UnimplementedError(absl::StrCat("GGUF file '", path_,
                                                     "' is big-endian (version ", swapped,
                                                     "); only little-endian "
                                                     "files are supported"));
      }
      return absl::UnimplementedError(absl::StrCat("GGUF file '", path_, "' has version ", version,
                                                   "; this reader supports 2 and 3"));
    }
    file.version_ = version;
    KV_RETURN_IF_ERROR(Read(&tensor_count_, [] { return std::string("the tensor count"); }));
    KV_RETURN_IF_ERROR(Read(&kv_count_, [] { return std::string("the metadata count"); }));
    KV_RETURN_IF_ERROR(CheckCount(kv_count_, kMinKeyValueBytes, "metadata entries"));
    // Checked before the metadata too, so an absurd header fails before any parsing.
    return CheckCount(tensor_count_, kMinTensorInfoBytes, "tensors");
  }

  absl::Status CheckCount(uint64_t count, uint64_t min_bytes, absl::string_view what) const {
    if (count > kMaxCount || count > remaining() / min_bytes) {
      return Error(absl::StrCat("the header declares ", count, " ", what, ", which cannot fit in ",
                                "the ", remaining(), " bytes left at offset ", pos_,
                                ": truncated or corrupt"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseMetadata(GgufFile& file) {
    file.metadata_.reserve(kv_count_);
    for (uint64_t i = 0; i < kv_count_; ++i) {
      std::string_view key;
      KV_RETURN_IF_ERROR(
          ReadString(&key, [&] { return absl::StrCat("the key of metadata entry #", i); }));
      if (key.empty()) return Error(absl::StrCat("metadata entry #", i, " has an empty key"));
      const auto describe = [&] { return absl::StrCat("metadata key '", Printable(key), "'"); };
      if (file.metadata_index_.contains(key)) {
        return Error(absl::StrCat(describe(), " appears twice"));
      }
      uint32_t type_id = 0;
      KV_RETURN_IF_ERROR(Read(&type_id, [&] { return absl::StrCat("the type of ", describe()); }));
      const std::optional<GgufValueType> type = ValueTypeFromId(type_id);
      if (!type.has_value()) {
        return Error(absl::StrCat(describe(), " has unknown value type id ", type_id));
      }
      GgufKeyValue kv;
      kv.key = std::string(key);
      KV_RETURN_IF_ERROR(ParseValue(*type, /*depth=*/0, describe, &kv.value));
      file.metadata_index_.emplace(kv.key, file.metadata_.size());
      file.metadata_.push_back(std::move(kv));
    }
    return absl::OkStatus();
  }

  // `describe` is type-erased here: the recursion through nested arrays would otherwise
  // instantiate a new template per level.
  using DescribeFn = std::function<std::string()>;

  absl::Status ParseValue(GgufValueType type, int depth, const DescribeFn& describe,
                          GgufValue* out) {
    out->type = type;
    if (type == GgufValueType::kString) {
      std::string_view s;
      KV_RETURN_IF_ERROR(ReadString(&s, describe));
      out->scalar = s;
      return absl::OkStatus();
    }
    if (type == GgufValueType::kArray) return ParseArray(depth, describe, out);
    const uint64_t width = ScalarWidth(type);
    if (remaining() < width) return Truncated(describe(), width);
    if (type == GgufValueType::kBool && bytes_[pos_] > 1) {
      return Error(absl::StrCat(describe(), " is a bool stored as ", int{bytes_[pos_]},
                                ", expected 0 or 1"));
    }
    DecodeScalar(type, bytes_.data() + pos_, out);
    pos_ += width;
    return absl::OkStatus();
  }

  absl::Status ParseArray(int depth, const DescribeFn& describe, GgufValue* out) {
    if (depth >= kMaxArrayDepth) {
      return Error(absl::StrCat(describe(), " nests arrays deeper than ", kMaxArrayDepth));
    }
    uint32_t element_id = 0;
    KV_RETURN_IF_ERROR(
        Read(&element_id, [&] { return absl::StrCat("the element type of ", describe()); }));
    const std::optional<GgufValueType> element_type = ValueTypeFromId(element_id);
    if (!element_type.has_value()) {
      return Error(absl::StrCat(describe(), " is an array of unknown value type id ", element_id));
    }
    uint64_t count = 0;
    KV_RETURN_IF_ERROR(
        Read(&count, [&] { return absl::StrCat("the element count of ", describe()); }));
    GgufArray array;
    array.element_type = *element_type;
    array.size = count;
    const uint64_t width = ScalarWidth(*element_type);
    const uint64_t min_bytes = width > 0                                 ? width
                               : *element_type == GgufValueType::kString ? kMinStringBytes
                                                                         : kMinArrayBytes;
    if (count > remaining() / min_bytes) {
      return Error(absl::StrCat(describe(), " declares ", count, " elements of ",
                                AsAbsl(GgufValueTypeName(*element_type)), ", which cannot fit in ",
                                "the ", remaining(), " bytes left at offset ", pos_,
                                ": truncated or corrupt"));
    }
    if (width > 0) {
      array.raw = bytes_.subspan(pos_, count * width);
      if (*element_type == GgufValueType::kBool) {
        for (uint64_t i = 0; i < count; ++i) {
          if (array.raw[i] > 1) {
            return Error(absl::StrCat("element ", i, " of ", describe(), " is a bool stored as ",
                                      int{array.raw[i]}, ", expected 0 or 1"));
          }
        }
      }
      pos_ += count * width;
    } else if (*element_type == GgufValueType::kString) {
      array.strings.resize(count);
      for (uint64_t i = 0; i < count; ++i) {
        KV_RETURN_IF_ERROR(ReadString(&array.strings[i], [&] {
          return absl::StrCat("string element ", i, " of ", describe());
        }));
      }
    } else {
      array.arrays.resize(count);
      for (uint64_t i = 0; i < count; ++i) {
        array.arrays[i].type = GgufValueType::kArray;
        KV_RETURN_IF_ERROR(ParseArray(
            depth + 1, [&] { return absl::StrCat("array element ", i, " of ", describe()); },
            &array.arrays[i]));
      }
    }
    out->type = GgufValueType::kArray;
    out->array = std::make_unique<GgufArray>(std::move(array));
    return absl::OkStatus();
  }

  absl::Status ParseTensorInfos(GgufFile& file) {
    KV_RETURN_IF_ERROR(CheckCount(tensor_count_, kMinTensorInfoBytes, "tensors"));
    file.tensors_.reserve(tensor_count_);
    for (uint64_t i = 0; i < tensor_count_; ++i) {
      std::string_view name;
      KV_RETURN_IF_ERROR(
          ReadString(&name, [&] { return absl::StrCat("the name of tensor #", i); }));
      const auto describe = [&] { return absl::StrCat("tensor '", Printable(name), "'"); };
      if (file.tensor_index_.contains(name))
        return Error(absl::StrCat(describe(), " appears twice"));
      GgufTensor tensor;
      tensor.name = std::string(name);
      uint32_t n_dims = 0;
      KV_RETURN_IF_ERROR(
          Read(&n_dims, [&] { return absl::StrCat("the dimension count of ", describe()); }));
      if (n_dims > kMaxDims) {
        return Error(absl::StrCat(describe(), " has ", n_dims, " dimensions; at most ", kMaxDims,
                                  " are allowed"));
      }
      uint64_t num_elements = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        uint64_t dim = 0;
        KV_RETURN_IF_ERROR(
            Read(&dim, [&] { return absl::StrCat("dimension ", d, " of ", describe()); }));
        if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
            __builtin_mul_overflow(num_elements, dim, &num_elements) ||
            num_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return Error(absl::StrCat(describe(), " has dimension ", d, " = ", dim,
                                    ", making its element count overflow"));
        }
        tensor.dims.push_back(static_cast<int64_t>(dim));
      }
      tensor.num_elements = static_cast<int64_t>(num_elements);
      uint32_t type_id = 0;
      KV_RETURN_IF_ERROR(Read(&type_id, [&] { return absl::StrCat("the type of ", describe()); }));
      const std::optional<GgmlType> type = GgmlTypeFromId(type_id);
      if (!type.has_value()) {
        return Error(absl::StrCat(describe(), " has unknown ggml type id ", type_id));
      }
      tensor.type = *type;
      const GgmlTypeInfo info = GetGgmlTypeInfo(*type);
      const int64_t row = tensor.dims.empty() ? 1 : tensor.dims[0];
      if (row % info.block_elements != 0) {
        return Error(absl::StrCat(describe(), " of type ", AsAbsl(info.name), " has rows of ", row,
                                  " elements, not whole blocks of ", info.block_elements));
      }
      KV_RETURN_IF_ERROR(
          Read(&tensor.offset, [&] { return absl::StrCat("the data offset of ", describe()); }));
      file.tensor_index_.emplace(tensor.name, file.tensors_.size());
      file.tensors_.push_back(std::move(tensor));
    }
    return absl::OkStatus();
  }

  absl::Status PlaceTensorData(GgufFile& file) {
    uint64_t alignment = kDefaultAlignment;
    if (file.HasKey("general.alignment")) {
      KV_ASSIGN_OR_RETURN(alignment, file.GetUint("general.alignment"));
      if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
        return Error(absl::StrCat("general.alignment ", alignment, " is not a power of two"));
      }
    }
    file.alignment_ = alignment;
    const uint64_t size = bytes_.size();
    uint64_t data_offset = 0;
    if (__builtin_add_overflow(pos_, alignment - 1, &data_offset)) {
      return Error(absl::StrCat("general.alignment ", alignment, " overflows the data offset"));
    }
    data_offset -= data_offset % alignment;
    if (data_offset > size) {
      // A file without tensors may end without padding; one with tensors may not.
      if (file.tensors_.empty()) {
        data_offset = size;
      } else {
        return Error(absl::StrCat("the tensor data would start at byte ", data_offset,
                                  ", past the end of the file (", size,
                                  " bytes): truncated or corrupt"));
      }
    }
    file.data_offset_ = data_offset;
    for (GgufTensor& tensor : file.tensors_) {
      const GgmlTypeInfo info = GetGgmlTypeInfo(tensor.type);
      if (tensor.offset % alignment != 0) {
        return Error(absl::StrCat("tensor '", Printable(tensor.name), "' has data offset ",
                                  tensor.offset, ", not a multiple of the alignment ", alignment));
      }
      absl::StatusOr<uint64_t> nbytes =
          GgmlTypeBytes(tensor.type, static_cast<uint64_t>(tensor.num_elements));
      if (!nbytes.ok()) {
        return Error(
            absl::StrCat("tensor '", Printable(tensor.name), "': ", nbytes.status().message()));
      }
      uint64_t begin = 0;
      uint64_t end = 0;
      if (__builtin_add_overflow(data_offset, tensor.offset, &begin) ||
          __builtin_add_overflow(begin, *nbytes, &end) || end > size) {
        return Error(absl::StrCat("tensor '", Printable(tensor.name), "' (", AsAbsl(info.name), " ",
                                  FormatShape(tensor.dims), ", ", *nbytes, " bytes at data offset ",
                                  tensor.offset, ") runs past the end of the file (", size,
                                  " bytes): truncated or corrupt"));
      }
      tensor.data = bytes_.subspan(begin, *nbytes);
    }
    return absl::OkStatus();
  }

  std::span<const uint8_t> bytes_;
  const std::string& path_;
  uint64_t pos_ = 0;
  uint64_t tensor_count_ = 0;
  uint64_t kv_count_ = 0;
};

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

absl::StatusOr<GgufFile> GgufFile::Open(const std::string& path) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> source, ByteSource::MapFile(path));
  return Parse(std::move(source), path);
}

absl::StatusOr<GgufFile> GgufFile::FromBytes(std::string bytes, std::string name) {
  return Parse(ByteSource::FromString(std::move(bytes)), std::move(name));
}

absl::StatusOr<GgufFile> GgufFile::Parse(std::unique_ptr<ByteSource> source, std::string path) {
  GgufFile file;
  file.path_ = std::move(path);
  file.source_ = std::move(source);
  Parser parser(file.source_->bytes(), file.path_);
  KV_RETURN_IF_ERROR(parser.Run(file));
  return file;
}

std::span<const uint8_t> GgufFile::bytes() const { return source_->bytes(); }

const GgufValue* GgufFile::FindValue(std::string_view key) const {
  const auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].value;
}

absl::Status GgufFile::KeyError(std::string_view key, std::string_view expected,
                                const GgufValue& value) const {
  std::string actual(GgufValueTypeName(value.type));
  if (const GgufArray* array = value.array.get()) {
    absl::StrAppend(&actual, " of ", AsAbsl(GgufValueTypeName(array->element_type)));
  }
  return absl::InvalidArgumentError(absl::StrCat("GGUF file '", path_, "': metadata key '",
                                                 AsAbsl(key), "' is ", actual, ", expected ",
                                                 AsAbsl(expected)));
}

namespace {

absl::Status MissingKey(const std::string& path, std::string_view key) {
  return absl::NotFoundError(
      absl::StrCat("GGUF file '", path, "': metadata key '", AsAbsl(key), "' is missing"));
}

}  // namespace

absl::StatusOr<uint64_t> GgufFile::GetUint(std::string_view key) const {
  const GgufValue* value = FindValue(key);
  if (value == nullptr) return MissingKey(path_, key);
  if (IsUnsigned(value->type)) return std::get<uint64_t>(value->scalar);
  if (IsSigned(value->type) && std::get<int64_t>(value->scalar) >= 0) {
    return static_cast<uint64_t>(std::get<int64_t>(value->scalar));
  }
  return KeyError(key, "a non-negative integer", *value);
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* value = FindValue(key);
  if (value == nullptr) return MissingKey(path_, key);
  if (IsSigned(value->type)) return std::get<int64_t>(value->scalar);
  if (IsUnsigned(value->type) &&
      std::get<uint64_t>(value->scalar) <= static_cast<uint64_t>(INT64_MAX)) {
    return static_cast<int64_t>(std::get<uint64_t>(value->scalar));
  }
  return KeyError(key, "an integer that fits in int64", *value);
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* value = FindValue(key);
  if (value == nullptr) return MissingKey(path_, key);
  if (IsFloat(value->type)) return std::get<double>(value->scalar);
  if (IsUnsigned(value->type)) return static_cast<double>(std::get<uint64_t>(value->scalar));
  if (IsSigned(value->type)) return static_cast<double>(std::get<int64_t>(value->scalar));
  return KeyError(key, "a number", *value);
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* value = FindValue(key);
  if (value == nullptr) return MissingKey(path_, key);
  if (value->type == GgufValueType::kBool) return std::get<bool>(value->scalar);
  return KeyError(key, "bool", *value);
}

absl::StatusOr<std::string_view> GgufFile::GetString(std::string_view key) const {
  const GgufValue* value = FindValue(key);
  if (value == nullptr) return MissingKey(path_, key);
  if (value->type == GgufValueType::kString) return std::get<std::string_view>(value->scalar);
  return KeyError(key, "string", *value);
}

absl::StatusOr<std::span<const std::string_view>> GgufFile::GetStringArray(
    std::string_view key) const {
  const GgufValue* value = FindValue(key);
  if (value == nullptr) return MissingKey(path_, key);
  const GgufArray* array = value->array.get();
  if (array == nullptr || array->element_type != GgufValueType::kString) {
    return KeyError(key, "array of string", *value);
  }
  return std::span<const std::string_view>(array->strings);
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* value = FindValue(key);
  if (value == nullptr) return MissingKey(path_, key);
  const GgufArray* array = value->array.get();
  if (array == nullptr || !(IsSigned(array->element_type) || IsUnsigned(array->element_type))) {
    return KeyError(key, "array of integers", *value);
  }
  const uint64_t width = ScalarWidth(array->element_type);
  std::vector<int64_t> out(array->size);
  GgufValue element;
  for (uint64_t i = 0; i < array->size; ++i) {
    DecodeScalar(array->element_type, array->raw.data() + i * width, &element);
    if (const uint64_t* u = std::get_if<uint64_t>(&element.scalar)) {
      if (*u > static_cast<uint64_t>(INT64_MAX)) {
        return absl::InvalidArgumentError(absl::StrCat("GGUF file '", path_, "': element ", i,
                                                       " of metadata key '", AsAbsl(key), "' (", *u,
                                                       ") does not fit in int64"));
      }
      out[i] = static_cast<int64_t>(*u);
    } else {
      out[i] = std::get<int64_t>(element.scalar);
    }
  }
  return out;
}

absl::StatusOr<std::vector<double>> GgufFile::GetFloatArray(std::string_view key) const {
  const GgufValue* value = FindValue(key);
  if (value == nullptr) return MissingKey(path_, key);
  const GgufArray* array = value->array.get();
  const GgufValueType t = array == nullptr ? GgufValueType::kString : array->element_type;
  if (!(IsFloat(t) || IsSigned(t) || IsUnsigned(t)))
    return KeyError(key, "array of numbers", *value);
  const uint64_t width = ScalarWidth(t);
  std::vector<double> out(array->size);
  GgufValue element;
  for (uint64_t i = 0; i < array->size; ++i) {
    DecodeScalar(t, array->raw.data() + i * width, &element);
    if (const double* f = std::get_if<double>(&element.scalar)) {
      out[i] = *f;
    } else if (const uint64_t* u = std::get_if<uint64_t>(&element.scalar)) {
      out[i] = static_cast<double>(*u);
    } else {
      out[i] = static_cast<double>(std::get<int64_t>(element.scalar));
    }
  }
  return out;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<const GgufTensor*> GgufFile::GetTensor(std::string_view name) const {
  const GgufTensor* tensor = FindTensor(name);
  if (tensor == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("GGUF file '", path_, "' has no tensor '", AsAbsl(name), "'"));
  }
  return tensor;
}

absl::Status DequantizeTensor(const GgufTensor& tensor, std::span<float> out) {
  if (out.size() != static_cast<uint64_t>(tensor.num_elements)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor.name, "' has ",
                                                   tensor.num_elements, " elements, output holds ",
                                                   out.size()));
  }
  return Dequantize(tensor.type, tensor.data, out, tensor.name);
}

}  // namespace kvstrata::model
