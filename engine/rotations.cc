#include "engine/rotations.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/sha256.h"
#include "core/status_macros.h"

namespace kvstrata::engine {

namespace {

constexpr char kFormat[] = "kvstrata-rotations";
constexpr char kVersion[] = "1";

struct TensorSpec {
  const char* name;
  std::vector<int64_t> shape;
  const std::vector<float>* data;
};

// A string field of a JSON object; "" when it is absent or not a string (json::value throws on
// a field of another type, and a file's bytes are untrusted).
std::string StringField(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

RotationFileInfo InfoFromMetadata(const nlohmann::json& meta) {
  // Metadata values are strings (safetensors); absent fields stay empty.
  auto str = [&](const char* key) { return StringField(meta, key); };
  auto num = [&](const char* key) -> int64_t {
    const std::string v = str(key);
    return v.empty() ? 0 : std::strtoll(v.c_str(), nullptr, 10);
  };
  RotationFileInfo info;
  info.model_fingerprint = str("model_fingerprint");
  info.model_name = str("model_name");
  info.key_objective = str("key_objective");
  info.value_objective = str("value_objective");
  info.grouping = str("grouping");
  info.levels = str("levels");
  info.group_size = static_cast<int>(num("group_size"));
  info.calibration_digest = str("calibration_digest");
  info.calibration_tokens = num("calibration_tokens");
  info.heldout_tokens = num("heldout_tokens");
  info.options = str("options");
  info.history_codec = str("history_codec");
  info.history_codec_source = str("history_codec_source");
  return info;
}

}  // namespace

RotationSet IdentityRotations(int num_layers, int num_kv_heads, int head_dim) {
  RotationSet r;
  r.num_layers = num_layers;
  r.num_kv_heads = num_kv_heads;
  r.head_dim = head_dim;
  r.identity = true;
  r.k_clip.assign(static_cast<size_t>(num_layers) * num_kv_heads, 1.0f);
  r.v_clip = r.k_clip;
  r.digest = "identity";
  return r;
}

absl::Status FoldCodecBasis(const kernels::HistoryCodec& codec, RotationSet* rotations) {
  const int L = rotations->num_layers, H = rotations->num_kv_heads, d = rotations->head_dim;
  for (const auto& [layers, recipe] : codec.overrides) {
    for (int layer : layers) {
      if (layer < 0 || layer >= L) {
        return absl::InvalidArgumentError(
            absl::StrCat("history codec: layer ", layer, " is outside the model's 0..", L - 1));
      }
    }
  }
  if (rotations->identity) {
    // The identity spelled out, so a basis can be folded into it.
    std::vector<float> eye(static_cast<size_t>(L) * H * d * d, 0.0f);
    for (int64_t m = 0; m < int64_t{L} * H; ++m) {
      for (int i = 0; i < d; ++i) eye[(m * d + i) * d + i] = 1.0f;
    }
    rotations->k_rotation = eye;
    rotations->v_rotation = std::move(eye);
    rotations->identity = false;
  }
  std::vector<float> folded(static_cast<size_t>(d) * d);
  for (int layer = 0; layer < L; ++layer) {
    for (int kind = 0; kind < 2; ++kind) {
      const kernels::SideRecipe& r = codec.Side(layer, kind);
      if (r.kind != kernels::SideRecipe::Kind::kRegions || !r.eigenbasis) continue;
      const std::vector<float> t = kernels::CodecEigenbasis(d, r.regions);
      std::vector<float>& all = kind == 0 ? rotations->k_rotation : rotations->v_rotation;
      for (int h = 0; h < H; ++h) {
        float* rot = all.data() + (int64_t{layer} * H + h) * d * d;
        for (int i = 0; i < d; ++i) {
          for (int j = 0; j < d; ++j) {
            double acc = 0.0;
            for (int k = 0; k < d; ++k) acc += double{rot[i * d + k]} * t[k * d + j];
            folded[i * d + j] = static_cast<float>(acc);
          }
        }
        std::copy(folded.begin(), folded.end(), rot);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WriteRotationFile(const std::string& path, const RotationSet& rotations,
                               const RotationFileInfo& info) {
  const int64_t L = rotations.num_layers, H = rotations.num_kv_heads, d = rotations.head_dim;
  std::vector<float> eye;
  const std::vector<float>* k = &rotations.k_rotation;
  const std::vector<float>* v = &rotations.v_rotation;
  if (rotations.identity) {
    eye.assign(L * H * d * d, 0.0f);
    for (int64_t m = 0; m < L * H; ++m)
      for (int64_t i = 0; i < d; ++i) eye[m * d * d + i * d + i] = 1.0f;
    k = v = &eye;
  }
  const TensorSpec tensors[] = {{"k_rotation", {L, H, d, d}, k},
                                {"v_rotation", {L, H, d, d}, v},
                                {"k_clip", {L, H}, &rotations.k_clip},
                                {"v_clip", {L, H}, &rotations.v_clip}};
  std::string data;
  for (const TensorSpec& t : tensors) {
    data.append(reinterpret_cast<const char*>(t.data->data()), t.data->size() * 4);
  }
  nlohmann::json header;
  header["__metadata__"] = {{"format", kFormat},
                            {"version", kVersion},
                            {"model_fingerprint", info.model_fingerprint},
                            {"model_name", info.model_name},
                            {"key_objective", info.key_objective},
                            {"value_objective", info.value_objective},
                            {"grouping", info.grouping},
                            {"levels", info.levels},
                            {"group_size", std::to_string(info.group_size)},
                            {"calibration_digest", info.calibration_digest},
                            {"calibration_tokens", std::to_string(info.calibration_tokens)},
                            {"heldout_tokens", std::to_string(info.heldout_tokens)},
                            {"options", info.options},
                            {"data_sha256", Sha256Hex(data)}};
  if (!info.history_codec.empty()) {
    header["__metadata__"]["history_codec"] = info.history_codec;
    header["__metadata__"]["history_codec_source"] = info.history_codec_source;
  }
  int64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    int64_t count = 1;
    for (int64_t s : t.shape) count *= s;
    if (static_cast<int64_t>(t.data->size()) != count) {
      return absl::InvalidArgumentError(absl::StrCat("rotation set: ", t.name, " has ",
                                                     t.data->size(), " values, expected ", count));
    }
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + count * 4}}};
    offset += count * 4;
  }
  std::string json = header.dump();
  while (json.size() % 8 != 0) json += ' ';
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write rotation file ", tmp));
  const uint64_t header_len = json.size();
  out.write(reinterpret_cast<const char*>(&header_len), 8);
  out.write(json.data(), static_cast<std::streamsize>(json.size()));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("error writing rotation file ", tmp));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<RotationFileInfo> ReadRotationFileInfo(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("rotation file ", path, ": cannot open"));
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  if (!in || header_len > (uint64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat("rotation file ", path, ": bad header length"));
  }
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  const nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  const auto meta = j.is_object() ? j.find("__metadata__") : j.end();
  if (!in || j.is_discarded() || meta == j.end() || !meta->is_object() ||
      StringField(*meta, "format") != kFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat("rotation file ", path, ": not a kvstrata rotation file"));
  }
  return InfoFromMetadata(*meta);
}

absl::StatusOr<std::string> FindRotationFile(const std::string& dir,
                                             const std::string& model_fingerprint,
                                             const std::string& levels, bool with_codec) {
  std::error_code ec;
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") {
      paths.push_back(entry.path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  std::string best;
  for (const std::string& path : paths) {
    absl::StatusOr<RotationFileInfo> info = ReadRotationFileInfo(path);
    if (!info.ok() || info->model_fingerprint != model_fingerprint ||
        (!levels.empty() && info->levels != levels) || info->history_codec.empty() == with_codec) {
      continue;
    }
    if (info->grouping == "head") return path;
    if (best.empty()) best = path;
  }
  if (!best.empty()) return best;
  if (with_codec) {
    return absl::NotFoundError(absl::StrCat(
        "no rotation file in ", dir, " fitted on model ", model_fingerprint.substr(0, 16),
        "… carries a history codec (kvstrata eval --allocate-bits --rotations-out writes one)"));
  }
  return absl::NotFoundError(absl::StrCat("no rotation file in ", dir, " was fitted on model ",
                                          model_fingerprint.substr(0, 16), "… for ", levels,
                                          " INT2 levels (kvstrata calibrate makes one)"));
}

absl::StatusOr<RotationSet> ReadRotationFile(const std::string& path, int num_layers,
                                             int num_kv_heads, int head_dim,
                                             const std::string& expected_fingerprint) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("rotation file ", path, ": cannot open"));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto fail = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("rotation file ", path, ": ", what));
  };
  if (bytes.size() < 8) return fail("shorter than its 8-byte header length");
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  if (header_len > bytes.size() - 8) return fail("header length runs past the end of the file");
  const nlohmann::json header =
      nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(header_len),
                            nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return fail("header is not a JSON object");
  const auto meta = header.find("__metadata__");
  if (meta == header.end() || !meta->is_object() || StringField(*meta, "format") != kFormat) {
    return fail("not a kvstrata rotation file (metadata format is not \"kvstrata-rotations\")");
  }
  if (StringField(*meta, "version") != kVersion) {
    return fail(absl::StrCat("unsupported version \"", StringField(*meta, "version"), "\""));
  }
  RotationSet r;
  r.num_layers = num_layers;
  r.num_kv_heads = num_kv_heads;
  r.head_dim = head_dim;
  r.identity = false;
  r.digest = Sha256Hex(bytes);
  r.model_fingerprint = StringField(*meta, "model_fingerprint");
  r.info = InfoFromMetadata(*meta);
  r.info.model_fingerprint = r.model_fingerprint;
  if (!expected_fingerprint.empty() && r.model_fingerprint != expected_fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rotation file ", path, " was fitted on model ", r.model_fingerprint.substr(0, 16),
        "… but the loaded model is ", expected_fingerprint.substr(0, 16), "…"));
  }
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_len = bytes.size() - data_start;
  if (const auto it = meta->find("data_sha256"); it != meta->end()) {
    if (!it->is_string() || Sha256Hex(bytes.substr(data_start)) != it->get<std::string>()) {
      return fail("tensor data does not match its data_sha256 (the file is corrupt or truncated)");
    }
  }
  auto read_tensor = [&](const char* name, std::vector<int64_t> shape,
                         std::vector<float>* out) -> absl::Status {
    const auto it = header.find(name);
    if (it == header.end() || !it->is_object()) return fail(absl::StrCat("missing tensor ", name));
    if (StringField(*it, "dtype") != "F32") return fail(absl::StrCat(name, ": dtype must be F32"));
    const auto s = it->find("shape");
    if (s == it->end() || !s->is_array() || s->size() != shape.size()) {
      return fail(absl::StrCat(name, ": wrong rank"));
    }
    int64_t count = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (!(*s)[i].is_number_integer() || (*s)[i].get<int64_t>() != shape[i]) {
        return fail(absl::StrCat(name, ": shape does not match the model (expected [",
                                 absl::StrJoin(shape, ", "), "])"));
      }
      count *= shape[i];
    }
    const auto off = it->find("data_offsets");
    if (off == it->end() || !off->is_array() || off->size() != 2 ||
        !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
      return fail(absl::StrCat(name, ": bad data_offsets"));
    }
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (end < begin || end > data_len || end - begin != static_cast<uint64_t>(count) * 4) {
      return fail(absl::StrCat(name, ": data_offsets out of range"));
    }
    out->resize(count);
    std::memcpy(out->data(), bytes.data() + data_start + begin, count * 4);
    return absl::OkStatus();
  };
  const int64_t L = num_layers, H = num_kv_heads, d = head_dim;
  KV_RETURN_IF_ERROR(read_tensor("k_rotation", {L, H, d, d}, &r.k_rotation));
  KV_RETURN_IF_ERROR(read_tensor("v_rotation", {L, H, d, d}, &r.v_rotation));
  KV_RETURN_IF_ERROR(read_tensor("k_clip", {L, H}, &r.k_clip));
  KV_RETURN_IF_ERROR(read_tensor("v_clip", {L, H}, &r.v_clip));
  for (const std::vector<float>* clips : {&r.k_clip, &r.v_clip}) {
    for (float c : *clips) {
      if (!(c > 0.0f && c <= 1.0f)) return fail(absl::StrCat("clip ratio ", c, " outside (0, 1]"));
    }
  }
  for (const std::vector<float>* rot : {&r.k_rotation, &r.v_rotation}) {
    for (int64_t m = 0; m < L * H; ++m) {
      const float* R = rot->data() + m * d * d;
      const char* which = rot == &r.k_rotation ? "k_rotation" : "v_rotation";
      // A NaN would pass the orthogonality test below (every comparison with it is false).
      for (int64_t i = 0; i < d * d; ++i) {
        if (!std::isfinite(R[i])) {
          return fail(absl::StrCat(which, " of layer ", m / H, " head ", m % H,
                                   " holds a value that is not finite (", R[i], ")"));
        }
      }
      double worst = 0;
      for (int64_t i = 0; i < d; ++i) {
        for (int64_t j = i; j < d; ++j) {
          double dot = 0;
          for (int64_t k = 0; k < d; ++k) dot += double{R[i * d + k]} * R[j * d + k];
          worst = std::max(worst, std::fabs(dot - (i == j ? 1.0 : 0.0)));
        }
      }
      if (!(worst <= 1e-3)) {
        return fail(absl::StrCat(which, " of layer ", m / H, " head ", m % H,
                                 " is not orthogonal (error ", worst, ")"));
      }
    }
  }
  return r;
}

}  // namespace kvstrata::engine
