#include "rpc/parse.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/message.h>
#include <google/protobuf/stubs/common.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <cstdint>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvstrata::rpc {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;
using google::protobuf::io::CodedInputStream;
using google::protobuf::internal::WireFormatLite;

constexpr int kMaxDepth = 100;  // the parser's default recursion limit

// Walks the wire format against a descriptor and stops at the first thing the parser would
// refuse: a malformed tag, varint, length or group, a string field of a proto3 message that is
// not UTF-8, or nesting beyond kMaxDepth. Fields with a wire type their declaration does not
// have are unknown fields to the parser, and are only skipped here too.
class Walker {
 public:
  // Returns the problem, or "" when there is none.
  std::string Run(std::string_view bytes, const Descriptor& type) {
    problem_.clear();
    Walk(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int>(bytes.size()), 0, type,
         "", 0);
    return problem_;
  }

 private:
  bool Fail(int offset, const std::string& path, absl::string_view what) {
    problem_ = path.empty() ? absl::StrCat("byte ", offset, ": ", what)
                            : absl::StrCat(path, " (byte ", offset, "): ", what);
    return false;
  }

  static std::string Join(const std::string& path, absl::string_view name) {
    return path.empty() ? std::string(name) : absl::StrCat(path, ".", name);
  }

  // A varint of at most 5 bytes whose fifth byte is below `fifth_limit`, as the parser reads
  // tags (limit 0x10: 32 bits) and lengths (0x08: under 2 GiB); CodedInputStream's own readers
  // accept longer ones and drop the high bits. False when it is not; `in` is advanced past it.
  static bool ReadShortVarint(const uint8_t* p, int available, uint32_t fifth_limit,
                              CodedInputStream& in, uint32_t* value) {
    uint32_t v = 0;
    for (int i = 0; i < 5 && i < available; ++i) {
      const uint32_t byte = p[i];
      if (i == 4 && byte >= fifth_limit) return false;
      v |= (byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) {
        in.Skip(i + 1);
        *value = v;
        return true;
      }
    }
    return false;
  }

  // A tag as the parser reads one; 0 when it is not.
  static uint32_t ReadTag(const uint8_t* p, int available, CodedInputStream& in) {
    uint32_t tag = 0;
    return ReadShortVarint(p, available, 0x10, in, &tag) ? tag : 0;
  }

  // A length as the parser reads one: it also refuses lengths within its 16 slop bytes of
  // INT32_MAX.
  static bool ReadLength(const uint8_t* p, int available, CodedInputStream& in,
                         uint32_t* length) {
    return ReadShortVarint(p, available, 0x08, in, length) &&
           *length <= static_cast<uint32_t>(INT32_MAX - 16);
  }

  static bool IsLengthDelimited(const FieldDescriptor& f) {
    return f.type() == FieldDescriptor::TYPE_STRING || f.type() == FieldDescriptor::TYPE_BYTES ||
           f.type() == FieldDescriptor::TYPE_MESSAGE;
  }

  // A packed repeated scalar's payload: whole varints or whole fixed-size values.
  bool WalkPacked(const uint8_t* data, int size, int base, const FieldDescriptor& f,
                  const std::string& path) {
    const WireFormatLite::WireType element =
        WireFormatLite::WireTypeForFieldType(static_cast<WireFormatLite::FieldType>(f.type()));
    if (element == WireFormatLite::WIRETYPE_FIXED32 && size % 4 != 0) {
      return Fail(base, path, "packed 32-bit values do not fill the length");
    }
    if (element == WireFormatLite::WIRETYPE_FIXED64 && size % 8 != 0) {
      return Fail(base, path, "packed 64-bit values do not fill the length");
    }
    if (element != WireFormatLite::WIRETYPE_VARINT) return true;
    CodedInputStream in(data, size);
    while (in.CurrentPosition() < size) {
      const int at = base + in.CurrentPosition();
      uint64_t v;
      if (!in.ReadVarint64(&v)) return Fail(at, path, "truncated or overlong varint");
    }
    return true;
  }

  bool Walk(const uint8_t* data, int size, int base, const Descriptor& type,
            const std::string& path, int depth) {
    if (depth > kMaxDepth) {
      return Fail(base, path, absl::StrCat("messages nested more than ", kMaxDepth, " deep"));
    }
    const bool check_utf8 = type.file()->syntax() == FileDescriptor::SYNTAX_PROTO3;
    CodedInputStream in(data, size);
    std::map<int, int> occurrences;  // of each repeated field so far, for "[i]" in paths
    while (in.CurrentPosition() < size) {
      const int at = base + in.CurrentPosition();
      const uint32_t tag = ReadTag(data + in.CurrentPosition(), size - in.CurrentPosition(), in);
      if (tag == 0) return Fail(at, path, "invalid field tag");
      const int number = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
      if (number == 0) return Fail(at, path, "field number 0");
      const WireFormatLite::WireType wire = WireFormatLite::GetTagWireType(tag);
      const FieldDescriptor* field = type.FindFieldByNumber(number);
      std::string name = field != nullptr ? Join(path, field->name())
                                          : Join(path, absl::StrCat("field ", number));
      if (field != nullptr && field->is_repeated() && wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED &&
          IsLengthDelimited(*field)) {
        absl::StrAppend(&name, "[", occurrences[number]++, "]");
      }
      switch (wire) {
        case WireFormatLite::WIRETYPE_VARINT: {
          uint64_t v;
          if (!in.ReadVarint64(&v)) return Fail(at, name, "truncated or overlong varint");
          break;
        }
        case WireFormatLite::WIRETYPE_FIXED64: {
          uint64_t v;
          if (!in.ReadLittleEndian64(&v)) return Fail(at, name, "truncated 64-bit value");
          break;
        }
        case WireFormatLite::WIRETYPE_FIXED32: {
          uint32_t v;
          if (!in.ReadLittleEndian32(&v)) return Fail(at, name, "truncated 32-bit value");
          break;
        }
        case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
          uint32_t length;
          if (!ReadLength(data + in.CurrentPosition(), size - in.CurrentPosition(), in,
                          &length)) {
            return Fail(at, name, "truncated, overlong or 2 GiB length");
          }
          const int start = in.CurrentPosition();
          if (length > static_cast<uint32_t>(size - start)) {
            return Fail(at, name, absl::StrCat("length ", length, " runs past the end (",
                                               size - start, " bytes left)"));
          }
          const uint8_t* payload = data + start;
          const int n = static_cast<int>(length);
          if (field != nullptr) {
            if (field->type() == FieldDescriptor::TYPE_STRING && check_utf8 &&
                !google::protobuf::internal::IsStructurallyValidUTF8(
                    reinterpret_cast<const char*>(payload), n)) {
              return Fail(at, name, "invalid UTF-8 in a string field");
            }
            if (field->type() == FieldDescriptor::TYPE_MESSAGE &&
                !Walk(payload, n, base + start, *field->message_type(), name, depth + 1)) {
              return false;
            }
            if (field->is_packable() && !WalkPacked(payload, n, base + start, *field, name)) {
              return false;
            }
          }
          in.Skip(n);
          break;
        }
        case WireFormatLite::WIRETYPE_START_GROUP:
          if (depth + 1 > kMaxDepth) {
            return Fail(at, name, absl::StrCat("groups nested more than ", kMaxDepth, " deep"));
          }
          in.SetRecursionLimit(kMaxDepth - depth);
          if (!WireFormatLite::SkipField(&in, tag)) {
            return Fail(at, name, "malformed group, or groups nested too deep");
          }
          break;
        case WireFormatLite::WIRETYPE_END_GROUP:
          return Fail(at, name, "end-group tag without a group");
        default:
          return Fail(at, name, absl::StrCat("invalid wire type ", static_cast<int>(wire)));
      }
    }
    return true;
  }

  std::string problem_;
};

absl::Status ParseFailure(std::string_view bytes, const google::protobuf::Message& message) {
  const Descriptor& type = *message.GetDescriptor();
  std::string why = DescribeParseFailure(bytes, type);
  if (why.empty()) why = "the bytes do not parse";
  return absl::InvalidArgumentError(
      absl::StrCat("request is not a valid ", type.full_name(), ": ", why));
}

}  // namespace

std::string DescribeParseFailure(std::string_view bytes, const Descriptor& type) {
  if (bytes.size() > static_cast<size_t>(INT32_MAX)) return "larger than 2 GiB";
  return Walker().Run(bytes, type);
}

absl::Status ParseRequest(std::string_view bytes, google::protobuf::Message* message) {
  message->Clear();
  if (bytes.size() <= static_cast<size_t>(INT32_MAX) &&
      message->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::OkStatus();
  }
  return ParseFailure(bytes, *message);
}

absl::Status ParseRequest(const grpc::ByteBuffer& bytes, google::protobuf::Message* message) {
  message->Clear();
  {
    // A copy of the buffer is only taken to explain a failure.
    grpc::ByteBuffer view(bytes);
    grpc::ProtoBufferReader reader(&view);
    if (message->ParseFromZeroCopyStream(&reader)) return absl::OkStatus();
  }
  std::vector<grpc::Slice> slices;
  std::string flat;
  if (bytes.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      flat.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return ParseFailure(flat, *message);
}

}  // namespace kvstrata::rpc
