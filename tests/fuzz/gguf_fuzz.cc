// GGUF files: the parser must refuse anything malformed with an error (never read outside the
// file, whatever the offsets, counts and lengths say), tensors it accepts must dequantise, and
// the model loader must turn any file into a model or an error.

#include <vector>

#include "model/gguf.h"
#include "model/loader.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvstrata {

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<model::GgufFile> file = model::GgufFile::FromBytes(
      std::string(reinterpret_cast<const char*>(data), size), "fuzz.gguf");
  if (!file.ok()) return 0;
  for (const model::GgufTensor& t : file->tensors()) {
    FUZZ_CHECK(t.data.data() >= file->bytes().data() &&
               t.data.data() + t.data.size() <= file->bytes().data() + file->bytes().size());
    if (t.num_elements < 0 || t.num_elements > (int64_t{1} << 20)) continue;
    std::vector<float> out(static_cast<size_t>(t.num_elements));
    model::DequantizeTensor(t, out).IgnoreError();
  }
  static fuzz::InputFile input("fuzz.gguf");
  const std::string& path = input.Write(data, size);
  model::LoadTokenizerSpec(path).IgnoreError();
  model::LoadGgufModel(path).IgnoreError();
  return 0;
}

}  // namespace kvstrata
