// Rotation files (safetensors with kvstrata metadata): any bytes must be read or refused with an
// error naming the file and the field; a file that is accepted holds orthogonal rotations.

#include <cmath>

#include "engine/rotations.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvstrata {

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::InputFile input("rotations.safetensors");
  const std::string& path = input.Write(data, size);
  engine::ReadRotationFileInfo(path).IgnoreError();
  // The seeds' geometry (scripts/fuzz.sh writes them), and the default model's.
  for (const auto& [layers, heads, dim] : {std::tuple{2, 2, 64}, std::tuple{30, 3, 64}}) {
    absl::StatusOr<engine::RotationSet> set =
        engine::ReadRotationFile(path, layers, heads, dim, /*expected_fingerprint=*/"");
    if (!set.ok()) continue;
    FUZZ_CHECK(set->num_layers == layers && set->num_kv_heads == heads && set->head_dim == dim);
    // Accepted rotations are orthogonal: row 0 has unit norm.
    const float* k = set->k(0, 0);
    double norm = 0;
    for (int i = 0; i < dim; ++i) norm += double{k[i]} * k[i];
    FUZZ_CHECK(std::fabs(norm - 1.0) < 1e-2);
  }
  return 0;
}

}  // namespace kvstrata
