// The rotation file (docs/rotation-file.md): what calibration writes is what the engine reads,
// metadata included, and a corrupt, truncated, foreign or ill-shaped file is refused with an
// error that says what is wrong.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "calibration/rotation_fit.h"
#include "engine/rotations.h"
#include "tests/model/model_test_util.h"

namespace kvstrata::engine {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 2, kHeads = 3, kDim = 64;
constexpr char kFingerprint[] = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";

// Rotations fitted from random covariances (so orthogonal, and different per head) and clips.
RotationSet RandomRotations() {
  std::mt19937 rng(3);
  std::normal_distribution<double> normal;
  RotationSet r;
  r.num_layers = kLayers;
  r.num_kv_heads = kHeads;
  r.head_dim = kDim;
  r.identity = false;
  for (int m = 0; m < kLayers * kHeads; ++m) {
    for (std::vector<float>* out : {&r.k_rotation, &r.v_rotation}) {
      std::vector<float> x(16 * kDim);
      for (float& v : x) v = static_cast<float>(normal(rng));
      std::vector<double> cov;
      calibration::AccumulateCovariance(x.data(), 16, kDim, &cov);
      const calibration::FittedRotation f = calibration::FitRotation(cov, kDim);
      out->insert(out->end(), f.rotation.begin(), f.rotation.end());
    }
    r.k_clip.push_back(0.9f + 0.01f * m);
    r.v_clip.push_back(0.85f + 0.01f * m);
  }
  return r;
}

RotationFileInfo Info() {
  RotationFileInfo info;
  info.model_fingerprint = kFingerprint;
  info.model_name = "test-model";
  info.key_objective = "qqt";
  info.value_objective = "sst";
  info.grouping = "head";
  info.levels = "uniform";
  info.group_size = kDim;
  info.calibration_digest = "00ff";
  info.calibration_tokens = 32768;
  info.heldout_tokens = 2048;
  info.options = R"({"window_tokens":1024})";
  return info;
}

class RotationFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = scratch_.File("r.safetensors");
    ASSERT_TRUE(WriteRotationFile(path_, rotations_, Info()).ok());
  }
  absl::StatusOr<RotationSet> Read(const std::string& path,
                                   const std::string& fingerprint = kFingerprint) {
    return ReadRotationFile(path, kLayers, kHeads, kDim, fingerprint);
  }

  model::testing::ScratchDir scratch_;
  RotationSet rotations_ = RandomRotations();
  std::string path_;
};

TEST_F(RotationFileTest, RoundTripsTensorsAndMetadata) {
  absl::StatusOr<RotationSet> r = Read(path_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->identity);
  EXPECT_EQ(r->k_rotation, rotations_.k_rotation);
  EXPECT_EQ(r->v_rotation, rotations_.v_rotation);
  EXPECT_EQ(r->k_clip, rotations_.k_clip);
  EXPECT_EQ(r->v_clip, rotations_.v_clip);
  EXPECT_EQ(r->model_fingerprint, kFingerprint);
  EXPECT_EQ(r->digest.size(), 64u);
  const RotationFileInfo& info = r->info;
  EXPECT_EQ(info.model_name, "test-model");
  EXPECT_EQ(info.key_objective, "qqt");
  EXPECT_EQ(info.value_objective, "sst");
  EXPECT_EQ(info.grouping, "head");
  EXPECT_EQ(info.levels, "uniform");
  EXPECT_EQ(info.group_size, kDim);
  EXPECT_EQ(info.calibration_digest, "00ff");
  EXPECT_EQ(info.calibration_tokens, 32768);
  EXPECT_EQ(info.heldout_tokens, 2048);
  EXPECT_EQ(info.options, R"({"window_tokens":1024})");
  // The digest is of the bytes: writing the same set again gives the same file.
  const std::string again = scratch_.File("again.safetensors");
  ASSERT_TRUE(WriteRotationFile(again, rotations_, Info()).ok());
  EXPECT_EQ(model::testing::ReadFile(again), model::testing::ReadFile(path_));
}

// The optional history codec: absent from a file that has none (whose bytes are then those of
// a file written before the field existed), read back when set, and part of the file's bytes,
// so of its digest and of the radix-hash namespace.
TEST_F(RotationFileTest, CarriesAnOptionalHistoryCodec) {
  absl::StatusOr<RotationFileInfo> plain = ReadRotationFileInfo(path_);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->history_codec, "");
  EXPECT_EQ(model::testing::ReadFile(path_).find("history_codec"), std::string::npos);
  RotationFileInfo info = Info();
  info.history_codec = "4x16+3x16+2x32:eig:s8:pr|3x16+2x16+1x32:eig:s8:pr;3.7=4x64|2x64";
  info.history_codec_source = R"({"rank_by":"next-token-kl"})";
  const std::string with = scratch_.File("codec.safetensors");
  ASSERT_TRUE(WriteRotationFile(with, rotations_, info).ok());
  absl::StatusOr<RotationSet> r = Read(with);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->info.history_codec, info.history_codec);
  EXPECT_EQ(r->info.history_codec_source, info.history_codec_source);
  EXPECT_EQ(r->k_rotation, rotations_.k_rotation);
  absl::StatusOr<RotationSet> without = Read(path_);
  ASSERT_TRUE(without.ok());
  EXPECT_NE(r->digest, without->digest);
}

TEST_F(RotationFileTest, RejectsAnotherModel) {
  const absl::StatusOr<RotationSet> r = Read(path_, std::string(64, 'e'));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("was fitted on model a1b2c3d4e5f60718"));
  EXPECT_THAT(r.status().message(), HasSubstr(path_));
}

TEST_F(RotationFileTest, RejectsAnotherShape) {
  const absl::StatusOr<RotationSet> r = ReadRotationFile(path_, kLayers + 1, kHeads, kDim, "");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("k_rotation: shape does not match the model"));
}

TEST_F(RotationFileTest, RejectsCorruptTensorBytes) {
  std::string bytes = model::testing::ReadFile(path_);
  bytes[bytes.size() - 5] ^= 0x10;  // inside v_clip
  const std::string bad = scratch_.File("bad.safetensors");
  model::testing::WriteFile(bad, bytes);
  const absl::StatusOr<RotationSet> r = Read(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("does not match its data_sha256"));
}

TEST_F(RotationFileTest, RejectsTruncatedFiles) {
  const std::string bytes = model::testing::ReadFile(path_);
  const std::string bad = scratch_.File("short.safetensors");
  for (size_t keep : {size_t{0}, size_t{5}, size_t{40}, bytes.size() / 2, bytes.size() - 4}) {
    model::testing::WriteFile(bad, bytes.substr(0, keep));
    const absl::StatusOr<RotationSet> r = Read(bad);
    ASSERT_FALSE(r.ok()) << keep;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << keep;
    EXPECT_THAT(r.status().message(), HasSubstr(bad)) << keep;
  }
}

TEST_F(RotationFileTest, RejectsWhatIsNotARotation) {
  // Written consistently (the checksum matches), but not orthogonal, or clips out of range.
  RotationSet scaled = rotations_;
  for (int i = 0; i < kDim; ++i) scaled.v_rotation[(kDim * kDim) * 4 + i] *= 1.01f;
  const std::string bad = scratch_.File("scaled.safetensors");
  ASSERT_TRUE(WriteRotationFile(bad, scaled, Info()).ok());
  absl::StatusOr<RotationSet> r = Read(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("v_rotation of layer 1 head 1 is not orthogonal"));

  RotationSet clipped = rotations_;
  clipped.k_clip[2] = 1.5f;
  ASSERT_TRUE(WriteRotationFile(bad, clipped, Info()).ok());
  r = Read(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("clip ratio 1.5 outside (0, 1]"));

  // A NaN in a rotation: every comparison with it is false, so it must be refused on its own.
  RotationSet nan = rotations_;
  nan.k_rotation[(kDim * kDim) * 1 + 1] = std::nanf("");
  ASSERT_TRUE(WriteRotationFile(bad, nan, Info()).ok());
  r = Read(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("k_rotation of layer 0 head 1 holds a value that is not finite"));
}

TEST_F(RotationFileTest, RejectsOtherFiles) {
  const std::string bad = scratch_.File("other.safetensors");
  std::string header = R"({"__metadata__":{"format":"pt"}})";
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(header.size());
  model::testing::WriteFile(bad, bytes + header);
  const absl::StatusOr<RotationSet> r = Read(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("not a kvstrata rotation file"));
  EXPECT_EQ(Read(scratch_.File("missing.safetensors")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(RotationFileTest, FindsTheFileFittedOnTheModel) {
  // path_ (per head, uniform) plus a shared one and one for another model.
  RotationFileInfo shared = Info();
  shared.grouping = "layer";
  ASSERT_TRUE(WriteRotationFile(scratch_.File("a-shared.safetensors"), rotations_, shared).ok());
  RotationFileInfo other = Info();
  other.model_fingerprint = std::string(64, 'e');
  ASSERT_TRUE(WriteRotationFile(scratch_.File("b-other.safetensors"), rotations_, other).ok());
  const std::string dir = path_.substr(0, path_.find_last_of('/'));
  absl::StatusOr<std::string> found = FindRotationFile(dir, kFingerprint, "uniform");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, path_);
  EXPECT_EQ(*FindRotationFile(dir, std::string(64, 'e'), "uniform"),
            scratch_.File("b-other.safetensors"));
  const absl::StatusOr<std::string> none = FindRotationFile(dir, kFingerprint, "lloyd-max");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("no rotation file in " + dir));
  // A file carrying a history codec is found only when one is asked for, and then whatever
  // levels its clips were searched for; the INT2 formats keep the file without one.
  EXPECT_EQ(FindRotationFile(dir, kFingerprint, "", /*with_codec=*/true).status().code(),
            absl::StatusCode::kNotFound);
  RotationFileInfo with_codec = Info();
  with_codec.history_codec = "3x32+2x32:eig:s8:pr|2x32+1x32:eig:s8:pr";
  ASSERT_TRUE(WriteRotationFile(scratch_.File("0-codec.safetensors"), rotations_, with_codec).ok());
  EXPECT_EQ(*FindRotationFile(dir, kFingerprint, "", /*with_codec=*/true),
            scratch_.File("0-codec.safetensors"));
  EXPECT_EQ(*FindRotationFile(dir, kFingerprint, "uniform"), path_);
}

}  // namespace
}  // namespace kvstrata::engine
