#include "tools/kvstrata/engine_flags.h"

#include <cstdlib>
#include <filesystem>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "engine/defaults.h"

ABSL_FLAG(std::string, model, "",
          "the model: a .gguf file or a Hugging Face folder (default: SmolLM2-135M-Instruct from "
          "scripts/fetch-model.sh)");
ABSL_FLAG(std::string, kv_format, "int2",
          "KV cache format: bf16, int2, int2-lloyd-max or codec (the history codec a rotation "
          "file carries: per-layer 4/3/2/1-bit regions, about 2.5 bits; a codec of uniform levels, "
          "from calibrate-codec --uniform-levels, is stored as codec fragment blocks, served on "
          "the CPU only)");
ABSL_FLAG(std::string, rotations, "",
          "rotation file fitted by kvstrata calibrate; default for INT2 formats (codec: the one "
          "carrying a history codec): the file in "
          "$KVSTRATA_ROTATIONS (else the repository's rotations/) fitted on this model; "
          "'identity' for none");
ABSL_FLAG(int, kv_cache_mb, 256, "KV cache capacity in MiB (both page pools)");
ABSL_FLAG(std::string, device, "cpu",
          "where the model runs: cpu, or cuda / cuda:N (the KV cache then lives on that GPU)");
ABSL_FLAG(bool, cuda_graphs, true,
          "with --device cuda, replay decode steps as CUDA graphs (false: launch every kernel)");
ABSL_FLAG(bool, gpu_sampling, true,
          "with --device cuda, draw tokens on the GPU for requests without top-k, top-p, min-p "
          "and top_logprobs (false: copy every row of logits to the host and sample there)");
ABSL_FLAG(bool, gpu_gemv, true,
          "with --device cuda and bf16 or fp16 weights, passes of 1-4 tokens (decode of a small "
          "batch) multiply the weights with kvstrata's matrix-vector kernel (false: cuBLAS)");
ABSL_FLAG(bool, gpu_fused_layer_ops, true,
          "with --device cuda, one GEMM for q/k/v and one for gate/up per layer, and the biases, "
          "q/k norms and RoPE in one launch (false: a launch per step, for comparison)");
ABSL_FLAG(std::string, gpu_weights, "auto",
          "with --device cuda, the weights' type: auto (fp32 for models up to 2 GiB of fp32 "
          "weights, as the CPU computes; bf16 above), bf16, fp16 or fp32");
ABSL_FLAG(int, cpu_threads, 0,
          "threads of the CPU engine's math (0: $OPENBLAS_NUM_THREADS if set, else every CPU "
          "this process may use)");

namespace kvstrata::cli {

absl::StatusOr<engine::EngineOptions> EngineOptionsFromFlags() {
  engine::EngineOptions o;
  // Flag values first, the file system last: a bad value is reported even without a model.
  absl::StatusOr<engine::KvCacheFormat> format =
      engine::ParseKvCacheFormat(absl::GetFlag(FLAGS_kv_format));
  if (!format.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-format: ", format.status().message()));
  }
  o.kv_cache.format = *format;
  const int mb = absl::GetFlag(FLAGS_kv_cache_mb);
  if (mb < 1 || mb > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-mb=", mb, " must be in [1, 1048576]"));
  }
  o.kv_cache.capacity_bytes = int64_t{mb} << 20;
  absl::StatusOr<engine::Device> device = engine::ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--device: ", device.status().message()));
  }
  o.device = *device;
  absl::StatusOr<engine::GpuWeights> weights =
      engine::ParseGpuWeights(absl::GetFlag(FLAGS_gpu_weights));
  if (!weights.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu-weights: ", weights.status().message()));
  }
  o.gpu_weights = *weights;
  o.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  o.gpu_sampling = absl::GetFlag(FLAGS_gpu_sampling);
  o.gpu_gemv = absl::GetFlag(FLAGS_gpu_gemv);
  o.gpu_fused_layer_ops = absl::GetFlag(FLAGS_gpu_fused_layer_ops);
  o.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  if (o.cpu_threads < 0 || o.cpu_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cpu-threads=", o.cpu_threads, " must be in [0, 1024]"));
  }
  std::error_code ec;
  o.rotations_path = absl::GetFlag(FLAGS_rotations);
  if (o.rotations_path == "identity") {
    o.rotations_path.clear();
  } else if (o.rotations_path.empty()) {
    o.default_rotations_dir = engine::DefaultRotationsDir();
  }
  if (!o.rotations_path.empty() && !std::filesystem::exists(o.rotations_path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rotations ", o.rotations_path, ": no such file"));
  }
  o.model_path = absl::GetFlag(FLAGS_model);
  if (o.model_path.empty()) {
    o.model_path = DefaultModelPath();
    if (!std::filesystem::exists(o.model_path, ec)) {
      return absl::NotFoundError(absl::StrCat("no --model given and the default model is not at ",
                                              o.model_path,
                                              "; run scripts/fetch-model.sh to fetch it"));
    }
  } else if (!std::filesystem::exists(o.model_path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model ", o.model_path, ": no such file or folder"));
  }
  return o;
}

}  // namespace kvstrata::cli
