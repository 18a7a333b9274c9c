// safetensors files: a header of any JSON and any offsets must be refused or describe tensors
// inside the file, and those tensors must convert.

#include <vector>

#include "model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvstrata {

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<model::SafetensorsFile> file = model::SafetensorsFile::FromBytes(
      std::string(reinterpret_cast<const char*>(data), size), "fuzz.safetensors");
  if (!file.ok()) return 0;
  for (const model::SafetensorsTensor& t : file->tensors()) {
    FUZZ_CHECK(t.data.data() >= file->bytes().data() &&
               t.data.data() + t.data.size() <= file->bytes().data() + file->bytes().size());
    FUZZ_CHECK(file->FindTensor(t.name) != nullptr);
    if (t.num_elements < 0 || t.num_elements > (int64_t{1} << 20)) continue;
    std::vector<float> out(static_cast<size_t>(t.num_elements));
    model::ConvertSafetensor(t, out).IgnoreError();
  }
  return 0;
}

}  // namespace kvstrata
