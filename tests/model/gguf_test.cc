// The GGUF reader on files built here: every metadata type, tensors of every decoded type, and
// every way a file can be truncated or corrupt.

#include "model/gguf.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/dequant.h"
#include "model/gguf_writer.h"
#include "model/tiny_model.h"
#include "tests/model/model_test_util.h"

namespace kvstrata::model {
namespace {

using ::kvstrata::model::testing::FindTensorInfo;
using ::kvstrata::model::testing::GetLe;
using ::kvstrata::model::testing::PutLe;
using ::kvstrata::model::testing::ReadFile;
using ::kvstrata::model::testing::ScratchDir;
using ::kvstrata::model::testing::WriteFile;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Encoders for AddRaw: the format's layout of each value.
class Encoder {
 public:
  template <typename T>
  Encoder& Le(T value) {
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &value, sizeof(T));
    return *this;
  }
  Encoder& Str(std::string_view s) {
    Le<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  Encoder& ArrayHeader(GgufValueType type, uint64_t count) {
    return Le(static_cast<uint32_t>(type)).Le(count);
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

std::vector<uint8_t> Encode(GgmlType type, const std::vector<float>& values) {
  absl::StatusOr<std::vector<uint8_t>> bytes = Quantize(type, values);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : std::vector<uint8_t>();
}

std::vector<float> Ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
  return v;
}

// A small file exercising every metadata value type and one tensor per decoded type.
std::string EveryTypeFile(uint32_t alignment = 32) {
  GgufWriter w(alignment);
  w.AddRaw("u8", GgufValueType::kUint8, Encoder().Le<uint8_t>(200).bytes());
  w.AddRaw("i8", GgufValueType::kInt8, Encoder().Le<int8_t>(-100).bytes());
  w.AddRaw("u16", GgufValueType::kUint16, Encoder().Le<uint16_t>(60000).bytes());
  w.AddRaw("i16", GgufValueType::kInt16, Encoder().Le<int16_t>(-30000).bytes());
  w.AddUint32("u32", 4000000000u);
  w.AddInt32("i32", -2000000000);
  w.AddFloat32("f32", 0.25f);
  w.AddBool("flag", true);
  w.AddString("name", "tiny \xce\xbb");
  w.AddUint64("u64", uint64_t{1} << 63);
  w.AddRaw("i64", GgufValueType::kInt64, Encoder().Le<int64_t>(-(int64_t{1} << 40)).bytes());
  w.AddRaw("f64", GgufValueType::kFloat64, Encoder().Le<double>(-1.0e100).bytes());
  w.AddInt32Array("ints", std::vector<int32_t>{1, -2, 3});
  w.AddRaw("floats", GgufValueType::kArray,
           Encoder().ArrayHeader(GgufValueType::kFloat32, 2).Le(1.5f).Le(-2.5f).bytes());
  w.AddRaw("bools", GgufValueType::kArray,
           Encoder()
               .ArrayHeader(GgufValueType::kBool, 3)
               .Le<uint8_t>(1)
               .Le<uint8_t>(0)
               .Le<uint8_t>(1)
               .bytes());
  w.AddStringArray("strings", std::vector<std::string>{"a", "", "ccc"});
  w.AddRaw("nested", GgufValueType::kArray,
           Encoder()
               .ArrayHeader(GgufValueType::kArray, 2)
               .ArrayHeader(GgufValueType::kString, 2)
               .Str("x")
               .Str("yy")
               .ArrayHeader(GgufValueType::kString, 0)
               .bytes());
  w.AddRaw("empty", GgufValueType::kArray,
           Encoder().ArrayHeader(GgufValueType::kUint64, 0).bytes());
  EXPECT_TRUE(w.AddTensor("t.f32", GgmlType::kF32, {5, 3}, Encode(GgmlType::kF32, Ramp(15))).ok());
  EXPECT_TRUE(w.AddTensor("t.f16", GgmlType::kF16, {7}, Encode(GgmlType::kF16, Ramp(7))).ok());
  EXPECT_TRUE(w.AddTensor("t.bf16", GgmlType::kBF16, {3}, Encode(GgmlType::kBF16, Ramp(3))).ok());
  EXPECT_TRUE(
      w.AddTensor("t.q8", GgmlType::kQ8_0, {64, 2}, Encode(GgmlType::kQ8_0, Ramp(128))).ok());
  EXPECT_TRUE(w.AddTensor("t.q40", GgmlType::kQ4_0, {32}, Encode(GgmlType::kQ4_0, Ramp(32))).ok());
  EXPECT_TRUE(
      w.AddTensor("t.q41", GgmlType::kQ4_1, {32, 3}, Encode(GgmlType::kQ4_1, Ramp(96))).ok());
  return w.Serialize();
}

absl::StatusOr<GgufFile> Parse(std::string bytes) {
  return GgufFile::FromBytes(std::move(bytes), "test.gguf");
}

TEST(GgufReaderTest, ReadsEveryMetadataType) {
  absl::StatusOr<GgufFile> file = Parse(EveryTypeFile());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->version(), 3u);
  EXPECT_EQ(file->alignment(), 32u);
  EXPECT_EQ(*file->GetUint("u8"), 200u);
  EXPECT_EQ(*file->GetInt("i8"), -100);
  EXPECT_EQ(*file->GetUint("u16"), 60000u);
  EXPECT_EQ(*file->GetInt("i16"), -30000);
  EXPECT_EQ(*file->GetUint("u32"), 4000000000u);
  EXPECT_EQ(*file->GetInt("u32"), 4000000000);
  EXPECT_EQ(*file->GetInt("i32"), -2000000000);
  EXPECT_EQ(*file->GetFloat("f32"), 0.25);
  EXPECT_EQ(*file->GetFloat("u16"), 60000.0);  // integers read as numbers too
  EXPECT_TRUE(*file->GetBool("flag"));
  EXPECT_EQ(*file->GetString("name"), "tiny \xce\xbb");
  EXPECT_EQ(*file->GetUint("u64"), uint64_t{1} << 63);
  EXPECT_EQ(*file->GetInt("i64"), -(int64_t{1} << 40));
  EXPECT_EQ(*file->GetFloat("f64"), -1.0e100);
  EXPECT_THAT(*file->GetIntArray("ints"), ElementsAre(1, -2, 3));
  EXPECT_THAT(*file->GetFloatArray("floats"), ElementsAre(1.5, -2.5));
  EXPECT_THAT(*file->GetFloatArray("ints"), ElementsAre(1.0, -2.0, 3.0));
  EXPECT_THAT(*file->GetStringArray("strings"), ElementsAre("a", "", "ccc"));
  EXPECT_TRUE(file->GetIntArray("empty")->empty());

  const GgufValue* bools = file->FindValue("bools");
  ASSERT_NE(bools, nullptr);
  ASSERT_NE(bools->array, nullptr);
  EXPECT_EQ(bools->array->element_type, GgufValueType::kBool);
  EXPECT_THAT(bools->array->raw, ElementsAre(1, 0, 1));

  const GgufValue* nested = file->FindValue("nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_NE(nested->array, nullptr);
  ASSERT_EQ(nested->array->element_type, GgufValueType::kArray);
  ASSERT_EQ(nested->array->arrays.size(), 2u);
  EXPECT_THAT(nested->array->arrays[0].array->strings, ElementsAre("x", "yy"));
  EXPECT_TRUE(nested->array->arrays[1].array->strings.empty());

  ASSERT_EQ(file->metadata().size(), 18u);
  EXPECT_EQ(file->metadata().front().key, "u8");  // file order
  EXPECT_EQ(file->metadata().back().key, "empty");
}

TEST(GgufReaderTest, GettersNameTheKey) {
  absl::StatusOr<GgufFile> file = Parse(EveryTypeFile());
  ASSERT_TRUE(file.ok()) << file.status();
  absl::Status status = file->GetUint("absent.key").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("absent.key"), HasSubstr("test.gguf")));
  status = file->GetString("u32").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("'u32'"), HasSubstr("uint32"), HasSubstr("string")));
  EXPECT_THAT(file->GetUint("i8").status().message(), HasSubstr("non-negative"));
  EXPECT_THAT(file->GetInt("u64").status().message(), HasSubstr("int64"));
  EXPECT_THAT(file->GetStringArray("ints").status().message(), HasSubstr("array of int32"));
  EXPECT_FALSE(file->GetBool("u8").ok());
  EXPECT_FALSE(file->GetFloat("name").ok());
  EXPECT_FALSE(file->GetIntArray("strings").ok());
  EXPECT_FALSE(file->GetFloatArray("bools").ok());
}

TEST(GgufReaderTest, ReadsTensorsOfEveryDecodedType) {
  absl::StatusOr<GgufFile> file = Parse(EveryTypeFile());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors().size(), 6u);
  EXPECT_EQ(file->data_offset() % 32, 0u);
  const struct {
    const char* name;
    GgmlType type;
    std::vector<int64_t> dims;
  } cases[] = {
      {"t.f32", GgmlType::kF32, {5, 3}}, {"t.f16", GgmlType::kF16, {7}},
      {"t.bf16", GgmlType::kBF16, {3}},  {"t.q8", GgmlType::kQ8_0, {64, 2}},
      {"t.q40", GgmlType::kQ4_0, {32}},  {"t.q41", GgmlType::kQ4_1, {32, 3}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<const GgufTensor*> tensor = file->GetTensor(c.name);
    ASSERT_TRUE(tensor.ok()) << tensor.status();
    EXPECT_EQ((*tensor)->type, c.type);
    EXPECT_EQ((*tensor)->dims, c.dims);
    EXPECT_EQ((*tensor)->offset % 32, 0u);
    const size_t n = static_cast<size_t>((*tensor)->num_elements);
    std::vector<float> out(n);
    ASSERT_TRUE(DequantizeTensor(**tensor, out).ok());
    // The file holds Quantize(Ramp(n)); the reader must hand back exactly its decoding.
    std::vector<float> expected(n);
    ASSERT_TRUE(Dequantize(c.type, Encode(c.type, Ramp(n)), expected, c.name).ok());
    EXPECT_EQ(out, expected);
    std::vector<float> wrong_size(n + 1);
    EXPECT_FALSE(DequantizeTensor(**tensor, wrong_size).ok());
  }
  EXPECT_EQ(file->FindTensor("nope"), nullptr);
  const absl::Status missing = file->GetTensor("nope").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("'nope'"));
}

TEST(GgufReaderTest, HonoursGeneralAlignment) {
  absl::StatusOr<GgufFile> file = Parse(EveryTypeFile(/*alignment=*/128));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->alignment(), 128u);
  EXPECT_EQ(file->data_offset() % 128, 0u);
  for (const GgufTensor& t : file->tensors()) EXPECT_EQ(t.offset % 128, 0u) << t.name;
  std::vector<float> out(15);
  ASSERT_TRUE(DequantizeTensor(*file->FindTensor("t.f32"), out).ok());
  EXPECT_EQ(out, Ramp(15));
}

TEST(GgufReaderTest, AcceptsVersion2) {
  std::string bytes = EveryTypeFile();
  PutLe<uint32_t>(bytes, 4, 2);
  absl::StatusOr<GgufFile> file = Parse(bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->version(), 2u);
}

TEST(GgufReaderTest, OpensFilesAndReportsMissingOnes) {
  ScratchDir dir;
  WriteFile(dir.File("a.gguf"), EveryTypeFile());
  absl::StatusOr<GgufFile> file = GgufFile::Open(dir.File("a.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->path(), dir.File("a.gguf"));
  EXPECT_EQ(file->bytes().size(), EveryTypeFile().size());
  GgufFile moved = std::move(*file);  // views into the mapping survive a move
  EXPECT_EQ(*moved.GetString("name"), "tiny \xce\xbb");

  absl::Status status = GgufFile::Open(dir.File("missing.gguf")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("missing.gguf"));
  EXPECT_FALSE(GgufFile::Open(dir.path()).ok());  // a folder
  WriteFile(dir.File("empty.gguf"), "");
  status = GgufFile::Open(dir.File("empty.gguf")).status();
  EXPECT_THAT(status.message(), HasSubstr("not a GGUF file"));
}

// ---- Corrupt and hostile files --------------------------------------------------------------

void ExpectInvalid(const std::string& bytes, const std::vector<std::string>& needles) {
  const absl::Status status = Parse(bytes).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  for (const std::string& needle : needles) EXPECT_THAT(status.message(), HasSubstr(needle));
}

TEST(GgufHostileTest, EveryTruncationIsAClearError) {
  const std::string full = EveryTypeFile();
  absl::StatusOr<GgufFile> whole = Parse(full);
  ASSERT_TRUE(whole.ok());
  // The writer pads after the last tensor; cutting only padding leaves a valid file.
  size_t data_end = 0;
  for (const GgufTensor& t : whole->tensors()) {
    data_end = std::max<size_t>(data_end, whole->data_offset() + t.offset + t.data.size());
  }
  for (size_t cut = 0; cut < full.size(); ++cut) {
    const absl::StatusOr<GgufFile> file = Parse(full.substr(0, cut));
    if (cut >= data_end) {
      EXPECT_TRUE(file.ok()) << "cut at " << cut << ": " << file.status();
      continue;
    }
    ASSERT_FALSE(file.ok()) << "cut at " << cut;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
    EXPECT_THAT(file.status().message(), HasSubstr("test.gguf"));
    if (cut >= 4) {
      EXPECT_THAT(file.status().message(), HasSubstr("truncated or corrupt")) << "cut " << cut;
    }
  }
}

TEST(GgufHostileTest, TruncatedTinyModelNamesWhatIsCut) {
  ScratchDir dir;
  TinyModelOptions options;
  options.gguf_matrix_type = GgmlType::kQ4_1;
  ASSERT_TRUE(WriteTinyGguf(dir.File("tiny.gguf"), options).ok());
  const std::string full = ReadFile(dir.File("tiny.gguf"));
  // Every byte of the first 8 KB (header, metadata), then a stride through the rest.
  for (size_t cut = 0; cut < full.size() - 32; cut += (cut < 8192 ? 1 : 331)) {
    const absl::StatusOr<GgufFile> file = Parse(full.substr(0, cut));
    ASSERT_FALSE(file.ok()) << "cut at " << cut;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
  }
  // A cut inside the tokens array names the key; one in the data names the last tensor.
  const size_t in_tokens = full.find("<|im_start|>");
  ASSERT_NE(in_tokens, std::string::npos);
  ExpectInvalid(full.substr(0, in_tokens + 3), {"tokenizer.ggml.tokens", "string element 267"});
  ExpectInvalid(full.substr(0, full.size() - 40), {"output.weight", "past the end"});
}

// Seeded random corruption: whatever the bytes, the reader answers (a file or an error) and
// never reads outside the buffer (the sanitizer build checks that part).
TEST(GgufHostileTest, RandomCorruptionNeverCrashes) {
  const std::string full = EveryTypeFile();
  std::mt19937 rng(20240601);
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bytes = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 3) {
        case 0:
          bytes[at] = static_cast<char>(rng());
          break;
        case 1:
          bytes[at] ^= static_cast<char>(1u << (rng() % 8));
          break;
        default:  // an extreme 64-bit value, as a hostile length or count would be
          if (at + 8 <= bytes.size()) PutLe<uint64_t>(bytes, at, ~uint64_t{0} >> (rng() % 40));
          break;
      }
    }
    const absl::StatusOr<GgufFile> file = Parse(bytes);
    if (!file.ok()) {
      ++rejected;
      EXPECT_FALSE(file.status().message().empty());
      continue;
    }
    for (const GgufTensor& t : file->tensors()) {  // whatever was accepted must be readable
      if (!CanDequantize(t.type) || t.num_elements > (1 << 20)) continue;
      std::vector<float> out(static_cast<size_t>(t.num_elements));
      EXPECT_TRUE(DequantizeTensor(t, out).ok()) << t.name;
    }
  }
  EXPECT_GT(rejected, 1000);
}

TEST(GgufHostileTest, BadMagicAndVersions) {
  std::string bytes = EveryTypeFile();
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  ExpectInvalid(bad_magic, {"not a GGUF file", "XGUF"});
  ExpectInvalid("GGU", {"not a GGUF file"});

  for (const uint32_t version : {0u, 1u, 4u, 0xffffffffu}) {
    std::string v = bytes;
    PutLe<uint32_t>(v, 4, version);
    const absl::Status status = Parse(v).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << version;
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("version ", version)));
  }
  std::string big_endian = bytes;
  PutLe<uint32_t>(big_endian, 4, 0x03000000u);
  EXPECT_THAT(Parse(big_endian).status().message(), HasSubstr("big-endian"));
}

TEST(GgufHostileTest, AbsurdCountsFailBeforeAllocating) {
  const std::string bytes = EveryTypeFile();
  std::string tensors = bytes;
  PutLe<uint64_t>(tensors, 8, uint64_t{1} << 60);
  ExpectInvalid(tensors, {"1152921504606846976 tensors"});
  std::string kvs = bytes;
  PutLe<uint64_t>(kvs, 16, uint64_t{1} << 60);
  ExpectInvalid(kvs, {"1152921504606846976 metadata entries"});
  std::string key_length = bytes;
  PutLe<uint64_t>(key_length, 24, uint64_t{1} << 60);
  ExpectInvalid(key_length, {"metadata entry #0", "1152921504606846976 bytes"});

  GgufWriter w;
  w.AddRaw("huge.array", GgufValueType::kArray,
           Encoder().ArrayHeader(GgufValueType::kString, uint64_t{1} << 60).bytes());
  ExpectInvalid(w.Serialize(), {"huge.array", "1152921504606846976 elements"});
  GgufWriter w2;
  w2.AddRaw("huge.ints", GgufValueType::kArray,
            Encoder().ArrayHeader(GgufValueType::kUint64, uint64_t{1} << 61).bytes());
  ExpectInvalid(w2.Serialize(), {"huge.ints"});
  GgufWriter w3;
  w3.AddRaw("huge.nested", GgufValueType::kArray,
            Encoder().ArrayHeader(GgufValueType::kArray, ~uint64_t{0}).bytes());
  ExpectInvalid(w3.Serialize(), {"huge.nested"});

  // A tensor whose dims multiply past 2^63.
  std::string dims = bytes;
  const auto at = FindTensorInfo(dims, "t.f32");
  ASSERT_NE(at.dims, std::string::npos);
  PutLe<uint64_t>(dims, at.dims, uint64_t{1} << 40);
  PutLe<uint64_t>(dims, at.dims + 8, uint64_t{1} << 40);
  ExpectInvalid(dims, {"t.f32", "overflow"});
  // Merely huge (2^60 floats): fits in int64 but not in the file.
  PutLe<uint64_t>(dims, at.dims, uint64_t{1} << 30);
  PutLe<uint64_t>(dims, at.dims + 8, uint64_t{1} << 30);
  ExpectInvalid(dims, {"t.f32", "past the end"});
}

TEST(GgufHostileTest, BadTensorDescriptions) {
  const std::string bytes = EveryTypeFile();
  const auto at = FindTensorInfo(bytes, "t.q41");
  ASSERT_NE(at.type, std::string::npos);
  ASSERT_EQ(GetLe<uint32_t>(bytes, at.type), 3u);  // Q4_1

  std::string unknown = bytes;
  PutLe<uint32_t>(unknown, at.type, 31);
  ExpectInvalid(unknown, {"t.q41", "unknown ggml type id 31"});
  PutLe<uint32_t>(unknown, at.type, 0xdeadbeef);
  ExpectInvalid(unknown, {"t.q41", "unknown ggml type id 3735928559"});

  std::string partial_block = bytes;
  PutLe<uint64_t>(partial_block, at.dims, 16);  // rows of 16 are not Q4_1 blocks of 32
  ExpectInvalid(partial_block, {"t.q41", "whole blocks"});

  std::string dims5 = bytes;
  PutLe<uint32_t>(dims5, at.n_dims, 5);
  ExpectInvalid(dims5, {"t.q41", "5 dimensions"});

  std::string misaligned = bytes;
  PutLe<uint64_t>(misaligned, at.offset, GetLe<uint64_t>(bytes, at.offset) + 4);
  ExpectInvalid(misaligned, {"t.q41", "not a multiple of the alignment 32"});

  std::string past_end = bytes;
  PutLe<uint64_t>(past_end, at.offset, uint64_t{1} << 62);
  ExpectInvalid(past_end, {"t.q41", "past the end"});
  PutLe<uint64_t>(past_end, at.offset, ~uint64_t{0} - 31);  // overflows data_offset + offset
  ExpectInvalid(past_end, {"t.q41"});

  std::string duplicate = bytes;
  const size_t name_at = FindTensorInfo(duplicate, "t.q40").n_dims - 5;
  duplicate.replace(name_at, 5, "t.q41");
  ExpectInvalid(duplicate, {"tensor 't.q41' appears twice"});
}

TEST(GgufHostileTest, BadMetadata) {
  {
    GgufWriter w;
    w.AddUint32("k", 1);
    w.AddUint32("k", 2);
    ExpectInvalid(w.Serialize(), {"'k' appears twice"});
  }
  {
    GgufWriter w;
    w.AddRaw("weird", static_cast<GgufValueType>(13), {});
    ExpectInvalid(w.Serialize(), {"'weird'", "unknown value type id 13"});
  }
  {
    GgufWriter w;
    w.AddRaw("weird.array", GgufValueType::kArray,
             Encoder().ArrayHeader(static_cast<GgufValueType>(99), 1).bytes());
    ExpectInvalid(w.Serialize(), {"'weird.array'", "unknown value type id 99"});
  }
  {
    GgufWriter w;
    w.AddRaw("b", GgufValueType::kBool, Encoder().Le<uint8_t>(2).bytes());
    ExpectInvalid(w.Serialize(), {"'b'", "expected 0 or 1"});
  }
  {
    GgufWriter w;
    w.AddUint32("", 1);
    ExpectInvalid(w.Serialize(), {"empty key"});
  }
  {
    Encoder deep;
    for (int i = 0; i < 6; ++i) deep.ArrayHeader(GgufValueType::kArray, 1);
    deep.ArrayHeader(GgufValueType::kUint8, 0);
    GgufWriter w;
    w.AddRaw("deep", GgufValueType::kArray, deep.bytes());
    ExpectInvalid(w.Serialize(), {"'deep'", "nests arrays deeper"});
  }
  for (const uint32_t alignment : {0u, 3u, 48u}) {
    GgufWriter w;
    w.AddUint32("general.alignment", alignment);
    ExpectInvalid(w.Serialize(), {"general.alignment", "power of two"});
  }
  {
    GgufWriter w;
    w.AddString("general.alignment", "32");
    ExpectInvalid(w.Serialize(), {"general.alignment", "string"});
  }
}

TEST(GgufHostileTest, FileWithoutTensorsNeedsNoPadding) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  const std::string bytes = w.Serialize();
  const size_t unpadded = 24 + (8 + 20) + 4 + (8 + 5);
  ASSERT_EQ(bytes.size(), 96u);
  for (const size_t keep : {unpadded, unpadded + 1, bytes.size()}) {
    absl::StatusOr<GgufFile> file = Parse(bytes.substr(0, keep));
    ASSERT_TRUE(file.ok()) << keep << ": " << file.status();
    EXPECT_EQ(*file->GetString("general.architecture"), "llama");
  }
  ExpectInvalid(bytes.substr(0, unpadded - 1), {"general.architecture", "truncated"});
}

}  // namespace
}  // namespace kvstrata::model
