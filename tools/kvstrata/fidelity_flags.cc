#include "tools/kvstrata/fidelity_flags.h"

#include <cstdlib>
#include <filesystem>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "tools/kvstrata/engine_flags.h"

ABSL_FLAG(std::string, out, "",
          "calibrate, calibrate-codec: the rotation file to write (required)");
ABSL_FLAG(std::string, text_dir, "",
          "folder of .txt documents (default: the calibration or evaluation set of "
          "scripts/fetch-text.sh under ${KVSTRATA_CACHE:-~/.cache/kvstrata}/text)");

namespace kvstrata::cli {

std::string TextDirFromFlag(const std::string& set) {
  const std::string flag = absl::GetFlag(FLAGS_text_dir);
  if (!flag.empty()) return flag;
  return absl::StrCat(CacheDir(), "/text/", set);
}

absl::StatusOr<std::shared_ptr<const model::LoadedModel>> LoadModelFromFlag() {
  std::string path = absl::GetFlag(FLAGS_model);
  const bool given = !path.empty();
  if (!given) path = DefaultModelPath();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return given ? absl::InvalidArgumentError(absl::StrCat("--model ", path, ": no such file"))
                 : absl::NotFoundError(
                       absl::StrCat("no --model given and the default model is not at ", path,
                                    "; run scripts/fetch-model.sh"));
  }
  absl::StatusOr<model::LoadedModel> m = std::filesystem::is_directory(path, ec)
                                             ? model::LoadHfModel(path)
                                             : model::LoadGgufModel(path);
  if (!m.ok()) {
    return absl::Status(m.status().code(),
                        absl::StrCat("--model ", path, ": ", m.status().message()));
  }
  return std::make_shared<const model::LoadedModel>(std::move(*m));
}

}  // namespace kvstrata::cli
