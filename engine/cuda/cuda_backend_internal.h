#pragma once

// The CUDA backend's class, shared by its three source files: cuda_backend.cc (start-up,
// weights, buffers, and Run: the steps of a pass), cuda_backend_plan.cc (each pass's plan on the
// host: page tables, segments, metadata staging, launch parameters) and cuda_backend_layers.cc
// (the launches of a pass: embedding, layers, logits, the decode graphs). Include only from
// those three.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cublas_library.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_util.h"
#include "engine/cuda/device_page_copy.h"
#include "engine/cuda/device_sampler.h"
#include "kernels/cuda/chunk_attention.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/split_decode.h"

namespace kvstrata::engine::cuda_internal {

using kernels::GemmType;

#define KV_CUBLAS_RETURN_IF_ERROR(call, what)                                           \
  do {                                                                                  \
    if (cublasStatus_t kv_blas_s = (call); kv_blas_s != CUBLAS_STATUS_SUCCESS)          \
      return absl::InternalError(absl::StrCat(what, " failed on cuda:", device_, ": ", \
                                              blas_lib_->status_string(kv_blas_s)));      \
  } while (0)

// Host arrays of one forward pass, packed into one staging buffer and copied to the device in
// one transfer; each array is then addressed on the device by its offset.
class Metadata {
 public:
  // Appends the values, in room for `capacity` of them (at least their number), and returns
  // their offset in bytes (16-byte aligned). With capacities fixed, every array of a pass has
  // the same offset each time: what a replayed CUDA graph needs.
  int64_t Add(std::span<const int32_t> values, size_t capacity = 0) {
    const int64_t at = (static_cast<int64_t>(bytes_.size()) + 15) / 16 * 16;
    bytes_.resize(at + std::max(values.size(), capacity) * sizeof(int32_t));
    if (!values.empty()) std::memcpy(bytes_.data() + at, values.data(), values.size() * 4);
    return at;
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  void Clear() { bytes_.clear(); }

 private:
  std::vector<uint8_t> bytes_;
};

struct LayerDeviceWeights {
  const void* wq = nullptr;  // matrices in the backend's GemmType
  const void* wk = nullptr;
  const void* wv = nullptr;
  const void* wo = nullptr;
  const void* w_gate = nullptr;
  const void* w_up = nullptr;
  const void* w_down = nullptr;
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float* bq = nullptr;
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
};

// The parameters in the model's matrices (embeddings once when tied).
inline int64_t MatrixParameters(const model::ModelConfig& c) {
  const int64_t H = c.hidden_size, q = int64_t{c.num_heads} * c.head_dim,
                kv = int64_t{c.num_kv_heads} * c.head_dim, I = c.intermediate_size;
  return int64_t{c.vocab_size} * H * (c.tied_embeddings ? 1 : 2) +
         c.num_layers * (q * H + 2 * kv * H + H * q + 3 * I * H);
}

inline GemmType ResolveWeights(GpuWeights w, const model::ModelConfig& c) {
  switch (w) {
    case GpuWeights::kBf16:
      return GemmType::kBf16;
    case GpuWeights::kFp16:
      return GemmType::kFp16;
    case GpuWeights::kFp32:
      return GemmType::kFp32;
    case GpuWeights::kAuto:
      break;
  }
  return MatrixParameters(c) * 4 <= (int64_t{2} << 30) ? GemmType::kFp32 : GemmType::kBf16;
}

inline const char* GemmTypeName(GemmType t) {
  switch (t) {
    case GemmType::kBf16:
      return "bf16";
    case GemmType::kFp16:
      return "fp16";
    case GemmType::kFp32:
      break;
  }
  return "fp32";
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const model::LoadedModel& model, const RotationSet& rotations, KvCache* cache,
              const CudaBackendOptions& options)
      : model_(model),
        cfg_(model.config),
        rot_(rotations),
        cache_(cache),
        options_(options),
        device_(options.device),
        type_(ResolveWeights(options.weights, model.config)),
        sampler_(options.device) {}
  ~CudaBackend() override {
    cudaSetDevice(device_);
    for (auto& [b, exec] : decode_graphs_) cudaGraphExecDestroy(exec);
    if (start_) cudaEventDestroy(start_);
    if (stop_) cudaEventDestroy(stop_);
    if (blas_) blas_lib_->destroy(blas_);
    if (stream_) cudaStreamDestroy(stream_);
    if (pinned_) cudaFreeHost(pinned_);
  }

  absl::Status Init();
  int vocab_size() const override { return cfg_.vocab_size; }
  ForwardTiming last_timing() const override { return timing_; }
  DevicePageAccess* device_page_access() override { return page_access_.get(); }
  std::string Describe() const override {
    absl::StatusOr<std::string> d = DescribeCudaDevice(device_);
    return absl::StrCat(d.ok() ? *d : absl::StrCat("cuda:", device_), ", ", GemmTypeName(type_),
                        " weights");
  }
  absl::Status Forward(const std::vector<ForwardItem>& batch, std::vector<float>* logits,
                       ForwardObserver* observer) override;
  bool samples_on_device() const override { return options_.device_sampling; }
  absl::Status ForwardAndSample(const std::vector<ForwardItem>& batch,
                                const std::vector<const DeviceDraw*>& draws, bool host_logits,
                                std::vector<float>* logits,
                                std::vector<DeviceSampled>* sampled) override {
    if (draws.size() != batch.size()) {
      return absl::InternalError("ForwardAndSample: one draw (or none) per item");
    }
    return Run(batch, &draws, host_logits, logits, sampled);
  }

 private:
  struct Plan;      // one forward pass's device arrays
  struct HostPlan;  // the same pass's arrays on the host, before staging
  // A pass; then the draws (one per item, or null: no device sampling) and the logits' copy.
  absl::Status Run(const std::vector<ForwardItem>& batch,
                   const std::vector<const DeviceDraw*>* draws, bool host_logits,
                   std::vector<float>* logits, std::vector<DeviceSampled>* sampled);
  // The plan of a pass, in the order Run takes its steps (cuda_backend_plan.cc).
  // Checks each item continues its sequence in the vocabulary, and the batch fits the buffers.
  absl::Status CheckBatch(const std::vector<ForwardItem>& batch, HostPlan* host) const;
  // The host arrays of a batch whose appends have begun, and its history bucket.
  void BuildHostArrays(const std::vector<ForwardItem>& batch, HostPlan* host) const;
  // A decode item's pages as the split decode's segments: sink, history, recent window.
  void AddDecodeSegments(const SequenceKv& seq, int64_t end, int row, HostPlan* host) const;
  // Where page `page`'s history copy lies, as the attention kernels' page tables say it: in
  // kHistoryUnitBytes units from the history pool's start (its own slots and pages read in
  // place alike, so a captured graph serves both), -1 when it has none.
  int32_t HistoryIndex(const SequenceKv& seq, int64_t page) const;
  // Packs the host arrays into one metadata copy, enqueues it, and points the plan at them.
  absl::Status StageMetadata(const HostPlan& host, Plan* plan);
  // The chunk attention's counts, pools and layout (its arrays are staged already).
  void PlanChunkAttention(const HostPlan& host, Plan* plan) const;
  // The split decode's parameters and grid; checks its workspace fits.
  absl::Status PlanDecodeAttention(const HostPlan& host, Plan* plan) const;
  // The split decode kernels' variant the options ask for (CudaBackendOptions).
  kernels::SplitDecodeVariant AttentionVariant() const;
  // The number of logit rows; checks they fit the logits buffer.
  absl::Status PlanLogits(const HostPlan& host, Plan* plan) const;
  absl::Status UploadWeights();
  absl::Status AllocateActivations();
  // y fp32 [rows][out] (+)= x [rows][in] · Wᵀ, W [out][in], x and W in type_.
  absl::Status Gemm(const void* x, int rows, int in, const void* w, int out, float* y,
                    bool accumulate);
  absl::Status Layer(int layer, const Plan& plan);
  // Whether a pass of T tokens runs each layer's RMS norms inside the GEMVs after them
  // (CudaBackendOptions::gemv_fused_norm): then hn_ is never written, the GEMVs read x_.
  bool NormInGemv(int T, const LayerDeviceWeights& w) const;
  // The launch of those GEMVs for a pass of `rows` tokens (CudaBackendOptions::
  // gemv_normed_one_wave, gemv_normed_paired_rows: at 2 tokens only, where it was measured to
  // pay; at 1 it cost 1 %).
  kernels::GemvVariant NormedGemv(int rows) const {
    kernels::GemvVariant v;
    v.one_wave = options_.gemv_normed_one_wave;
    v.paired_rows = options_.gemv_normed_paired_rows && rows >= 2;
    return v;
  }
  // A decode pass of the INT2 format whose pages to demote are demoted for every layer in one
  // launch at its start (CudaBackendOptions::fused_kv_writes): the pages leaving the window
  // were written by earlier steps, so no launch of this pass comes before them.
  bool DemoteAtPassStart(const Plan& plan) const;
  // The plan's pages that left the recent window, into the history's format: layer `layer`'s
  // blocks, or with layer -1 every layer's in one launch (the INT2 formats only).
  absl::Status Demote(const Plan& plan, int layer, bool early);
  // Layer `layer`'s blocks in the BF16 pool: its base, offset as a launch that sees one layer
  // takes it.
  uint8_t* Bf16PoolAt(int layer) const;
  // Whether the layers' per-head launches write K/V into the pages and the split decode's
  // queries themselves (CudaBackendOptions::fused_kv_writes): a decode pass with identity
  // rotations whose demotion, if any, came at its start.
  bool HeadsWriteCache(const Plan& plan) const;
  // Whether the per-head launch (when it writes the cache), attention's INT2 history and its
  // merge let the launch after them begin at their start (CudaBackendOptions::
  // launch_ahead_at_batch_1): a decode pass of one sequence, with early launches.
  bool LaunchAhead(const Plan& plan) const;
  // q_, k_, v_ from hn_ (or RMSNorm(x_) when norm_in_gemv): the projections, their biases,
  // q/k norms and RoPE; with write_cache (HeadsWriteCache), K/V into the layer's pages and q
  // into decode_q_half_ instead.
  absl::Status AttentionInputs(const LayerDeviceWeights& w, int T, bool norm_in_gemv,
                               const Plan& plan, int layer, bool write_cache);
  // x_ += the MLP of hn_ (or of RMSNorm(x_) when norm_in_gemv).
  absl::Status Mlp(const LayerDeviceWeights& w, int T, bool norm_in_gemv);
  // Every launch of a pass, from the embedding to the logits GEMM (what a graph captures).
  absl::Status RunPass(const Plan& plan);
  // Replays the decode graph of (items, history_bucket), capturing it first if there is none.
  absl::Status LaunchDecodeGraph(const Plan& plan, int items, int history_bucket);

  const model::LoadedModel& model_;
  const model::ModelConfig& cfg_;
  const RotationSet& rot_;
  KvCache* cache_;
  const CudaBackendOptions options_;
  const int device_;
  const GemmType type_;
  int num_sms_ = 0;
  int decode_ctas_per_sm_ = 1;

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaDevicePageAccess> page_access_;
  const CublasLibrary* blas_lib_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  DeviceBuffer blas_workspace_;

  DeviceBuffer matrices_;       // every matrix, in type_
  DeviceBuffer float_weights_;  // norms and biases, fp32
  const void* embedding_ = nullptr;
  const void* lm_head_ = nullptr;
  const float* output_norm_ = nullptr;
  std::vector<LayerDeviceWeights> layers_;
  DeviceBuffer rotations_;  // k then v: [layers][kv_heads][d][d] each; empty for identity
  DeviceBuffer clips_;      // [layers][2][kv_heads]
  // The codec format: each layer's K and V blocks in a history page (CodecLayerLayoutFor).
  std::vector<kernels::CodecLayerLayout> codec_layouts_;
  // Codec fragment blocks (a codec on uniform levels): their levels [bits][code], as the CPU's.
  bool codec_fragment_ = false;
  float fragment_levels_[5][16] = {};

  // Activations for max_step_tokens tokens.
  DeviceBuffer x_, hn_, qkv_, q_, k_, v_, qr_, attn_, o_, o_half_, gate_, up_, act_, cos_, sin_;
  DeviceBuffer decode_q_, decode_q_half_, decode_out_, split_workspace_;
  DeviceBuffer final_rows_, final_half_, logits_;
  DeviceBuffer metadata_;
  uint8_t* pinned_ = nullptr;  // staging for the metadata copy
  size_t pinned_bytes_ = 0;
  Metadata meta_;
  std::unique_ptr<HostPlan> host_plan_;  // every pass's host arrays, reused (Run)
  int64_t max_split_workspace_ = 0;
  int max_logit_rows_ = 0;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  ForwardTiming timing_;
  // Decode steps of B sequences, captured once per history bucket and replayed:
  // (B, history pages planned for) -> graph.
  std::map<std::pair<int, int>, cudaGraphExec_t> decode_graphs_;
  DeviceSampler sampler_;
};

// Where one forward pass's arrays are on the device, and the counts the launches need.
struct CudaBackend::Plan {
  int tokens = 0;
  const int32_t* ids = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* append_slot = nullptr;
  const int32_t* append_row = nullptr;
  int demote_pages = 0;                     // pages to demote, or the most (graph steps)
  const int32_t* demote_count = nullptr;    // graph steps: the number to demote, on the device
  const int32_t* demote_src = nullptr;
  const int32_t* demote_dst = nullptr;
  // Chunk attention: every item of the BF16 format, prefill items of the split formats.
  kernels::ChunkAttentionParams chunk;
  // Split decode: single-token items of the split formats.
  int decode_items = 0;
  const int32_t* decode_rows = nullptr;  // their rows in the batch
  kernels::SplitDecodeCudaParams decode;
  kernels::SplitDecodePlan decode_plan;
  int logit_rows = 0;
  const int32_t* logit_row_ids = nullptr;

  // A pass of decode rows only (one token per sequence, no chunk attention): its rows are the
  // split decode's, in order.
  bool DecodeOnly() const { return chunk.num_items == 0 && decode_items == tokens; }
};

// One forward pass's arrays on the host, as BuildHostArrays lays them out for StageMetadata.
// Rows number the batch's tokens; page lists are CSR (an indptr from 0, then the slots).
struct CudaBackend::HostPlan {
  int tokens = 0;
  int items = 0;
  std::vector<int> offset;  // each item's first row
  bool graph = false;       // a decode step, run as the CUDA graph of its bucket
  int max_pages = 0;        // of a sequence of the model's whole context
  // Per token: the token, its position, and where its K/V row is appended.
  std::vector<int32_t> ids, positions, append_slot, append_row;
  std::vector<int32_t> demote_src, demote_dst;  // pages to demote: BF16 slot -> INT2 slot
  // Chunk attention items: first row, length, first position; BF16 and INT2 slots per page.
  std::vector<int32_t> c_offset, c_len, c_pos0, c_indptr = {0}, c_bf16, c_int2;
  // Split decode items: their rows; per segment (sink, history, window) CSR pages, last length.
  std::vector<int32_t> d_rows, seg_indptr[3] = {{0}, {0}, {0}}, seg_indices[3], seg_last[3];
  std::vector<int32_t> logit_rows;      // the batch rows logits are computed for
  std::vector<int32_t> last_logit_row;  // per item, its last row among logit_rows

  int max_len = 0;           // the longest chunk item (graph steps: 0)
  int max_history = 0;       // history pages the split decode plans for (its bucket)
  int max_window_pages = 0;  // sink and recent-window pages it plans for
  int history_bucket = 0;    // with items, the key of the decode graph

  // Empty for the next pass, keeping every array's capacity: a warm decode step allocates
  // nothing on the host.
  void Reset() {
    tokens = items = max_pages = max_len = max_history = max_window_pages = history_bucket = 0;
    graph = false;
    for (std::vector<int32_t>* v : {&ids, &positions, &append_slot, &append_row, &demote_src,
                                    &demote_dst, &c_offset, &c_len, &c_pos0, &c_bf16, &c_int2,
                                    &d_rows, &logit_rows, &last_logit_row}) {
      v->clear();
    }
    offset.clear();
    c_indptr.assign(1, 0);
    for (int s = 0; s < 3; ++s) {
      seg_indptr[s].assign(1, 0);
      seg_indices[s].clear();
      seg_last[s].clear();
    }
  }
};

}  // namespace kvstrata::engine::cuda_internal
