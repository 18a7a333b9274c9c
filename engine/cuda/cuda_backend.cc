// The CUDA backend: start-up (device, cuBLAS, weights, buffers) and Run, the steps of each
// forward pass; the pass's plan is built in cuda_backend_plan.cc and launched in
// cuda_backend_layers.cc.

#include "engine/cuda/cuda_backend.h"

#include "absl/strings/str_format.h"
#include "core/check.h"
#include "core/status_macros.h"
#include "engine/cuda/cuda_backend_internal.h"
#include "kernels/codec_fragment.h"
#include "kernels/codec_page.h"
#include "kernels/numeric.h"

namespace kvstrata::engine {
namespace cuda_internal {

absl::Status CudaBackend::Init() {
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
  KV_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_),
                          "cudaDeviceGetAttribute");
  decode_ctas_per_sm_ = kernels::SplitDecodeCtasPerSm(
      cfg_.head_dim, cache_->split() ? cache_->int2_encoding() : kernels::PageEncoding::kBf16,
      AttentionVariant());
  KV_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream_), "cudaStreamCreate");
  page_access_ = std::make_unique<CudaDevicePageAccess>(device_, stream_, cache_);
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start_), "cudaEventCreate");
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop_), "cudaEventCreate");
  KV_ASSIGN_OR_RETURN(blas_lib_, OpenCublas());
  KV_CUBLAS_RETURN_IF_ERROR(blas_lib_->create(&blas_), "cublasCreate");
  KV_CUBLAS_RETURN_IF_ERROR(blas_lib_->set_stream(blas_, stream_), "cublasSetStream");
  // A fixed workspace, so cuBLAS allocates nothing per call (and graph capture works).
  KV_CUDA_RETURN_IF_ERROR(blas_workspace_.Allocate(size_t{32} << 20), "cudaMalloc (cuBLAS)");
  KV_CUBLAS_RETURN_IF_ERROR(
      blas_lib_->set_workspace(blas_, blas_workspace_.as<void>(), blas_workspace_.bytes()),
      "cublasSetWorkspace");
  KV_RETURN_IF_ERROR(UploadWeights());
  KV_RETURN_IF_ERROR(AllocateActivations());
  return absl::OkStatus();
}

absl::Status CudaBackend::UploadWeights() {
  const int H = cfg_.hidden_size, d = cfg_.head_dim;
  const int64_t qdim = int64_t{cfg_.num_heads} * d, kvdim = int64_t{cfg_.num_kv_heads} * d;
  const int64_t inter = cfg_.intermediate_size, V = cfg_.vocab_size;
  // Sizes first, so each arena is one allocation.
  const int64_t matrix_elements = MatrixParameters(cfg_);
  const int elem = kernels::GemmTypeBytes(type_);
  int64_t floats = H;  // output norm
  for (const model::LayerWeights& w : model_.weights.layers) {
    floats += 2 * H;
    if (w.bq) floats += qdim + 2 * kvdim;
    if (w.q_norm) floats += 2 * d;
  }
  if (cudaError_t e = matrices_.Allocate(static_cast<size_t>(matrix_elements) * elem);
      e != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cuda:", device_, ": cannot allocate ", (matrix_elements * elem) >> 20, " MiB for the "
        "model's weights in ", GemmTypeName(type_), ": ", cudaGetErrorString(e)));
  }
  KV_CUDA_RETURN_IF_ERROR(float_weights_.Allocate(static_cast<size_t>(floats) * 4),
                          "cudaMalloc (weights)");
  uint8_t* mnext = matrices_.as<uint8_t>();
  float* fnext = float_weights_.as<float>();
  std::vector<float> values;
  std::vector<uint16_t> staging;
  auto put_matrix = [&](const model::WeightMatrix& m, int64_t n) -> absl::StatusOr<const void*> {
    KV_CHECK(m.rows * m.cols == n) << "a matrix of " << m.rows << "x" << m.cols << ", expected "
                                   << n << " elements";
    // The matrix's exact fp32 values (what the loaders once kept in memory), then as before.
    const float* src = m.f32();
    if (src == nullptr) {
      values.resize(static_cast<size_t>(n));
      m.DequantizeRows(0, m.rows, values.data());
      src = values.data();
    }
    const void* host = src;
    if (type_ != GemmType::kFp32) {
      staging.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        staging[i] = type_ == GemmType::kBf16 ? kernels::FloatToBf16(src[i])
                                              : kernels::FloatToFp16(src[i]);
      }
      host = staging.data();
    }
    uint8_t* dst = mnext;
    mnext += n * elem;
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, host, n * elem, cudaMemcpyHostToDevice),
                            "cudaMemcpy (weights)");
    return dst;
  };
  auto put_float = [&](const float* src, int64_t n) -> absl::StatusOr<const float*> {
    if (src == nullptr) return nullptr;
    float* dst = fnext;
    fnext += n;
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, n * 4, cudaMemcpyHostToDevice),
                            "cudaMemcpy (weights)");
    return dst;
  };
  const model::ModelWeights& mw = model_.weights;
  KV_ASSIGN_OR_RETURN(embedding_, put_matrix(mw.token_embedding, V * H));
  if (cfg_.tied_embeddings || mw.lm_head.data == mw.token_embedding.data) {
    lm_head_ = embedding_;
  } else {
    KV_ASSIGN_OR_RETURN(lm_head_, put_matrix(mw.lm_head, V * H));
  }
  KV_ASSIGN_OR_RETURN(output_norm_, put_float(mw.output_norm, H));
  for (const model::LayerWeights& w : mw.layers) {
    LayerDeviceWeights l;
    KV_ASSIGN_OR_RETURN(l.wq, put_matrix(w.wq, qdim * H));
    KV_ASSIGN_OR_RETURN(l.wk, put_matrix(w.wk, kvdim * H));
    KV_ASSIGN_OR_RETURN(l.wv, put_matrix(w.wv, kvdim * H));
    // The fused passes multiply [wq; wk; wv] and [w_gate; w_up] as one matrix each.
    KV_CHECK(static_cast<const uint8_t*>(l.wk) == static_cast<const uint8_t*>(l.wq) + qdim * H * elem &&
             static_cast<const uint8_t*>(l.wv) == static_cast<const uint8_t*>(l.wk) + kvdim * H * elem);
    KV_ASSIGN_OR_RETURN(l.wo, put_matrix(w.wo, H * qdim));
    KV_ASSIGN_OR_RETURN(l.w_gate, put_matrix(w.w_gate, inter * H));
    KV_ASSIGN_OR_RETURN(l.w_up, put_matrix(w.w_up, inter * H));
    KV_CHECK(static_cast<const uint8_t*>(l.w_up) ==
             static_cast<const uint8_t*>(l.w_gate) + inter * H * elem);
    KV_ASSIGN_OR_RETURN(l.w_down, put_matrix(w.w_down, H * inter));
    KV_ASSIGN_OR_RETURN(l.attn_norm, put_float(w.attn_norm, H));
    KV_ASSIGN_OR_RETURN(l.ffn_norm, put_float(w.ffn_norm, H));
    KV_ASSIGN_OR_RETURN(l.bq, put_float(w.bq, qdim));
    KV_ASSIGN_OR_RETURN(l.bk, put_float(w.bk, kvdim));
    KV_ASSIGN_OR_RETURN(l.bv, put_float(w.bv, kvdim));
    KV_ASSIGN_OR_RETURN(l.q_norm, put_float(w.q_norm, d));
    KV_ASSIGN_OR_RETURN(l.k_norm, put_float(w.k_norm, d));
    layers_.push_back(l);
  }
  const int64_t per = int64_t{cfg_.num_layers} * cfg_.num_kv_heads * d * d;
  if (!rot_.identity) {
    KV_CUDA_RETURN_IF_ERROR(rotations_.Allocate(static_cast<size_t>(per) * 2 * 4),
                            "cudaMalloc (rotations)");
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpy(rotations_.as<float>(), rot_.k_rotation.data(), per * 4,
                                       cudaMemcpyHostToDevice),
                            "cudaMemcpy (rotations)");
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpy(rotations_.as<float>() + per, rot_.v_rotation.data(),
                                       per * 4, cudaMemcpyHostToDevice),
                            "cudaMemcpy (rotations)");
  }
  // Clips as DemotePages wants them: [layers][2][kv_heads].
  std::vector<float> clips(static_cast<size_t>(cfg_.num_layers) * 2 * cfg_.num_kv_heads, 1.0f);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    for (int h = 0; h < cfg_.num_kv_heads; ++h) {
      clips[(l * 2 + 0) * cfg_.num_kv_heads + h] = rot_.key_clip(l, h);
      clips[(l * 2 + 1) * cfg_.num_kv_heads + h] = rot_.value_clip(l, h);
    }
  }
  if (cache_->options().format == KvCacheFormat::kCodec) {
    const kernels::HistoryCodec& codec = *cache_->options().codec;
    // Recipes on uniform levels are stored as codec fragment blocks (KvCache::Create checks
    // that a codec's recipes agree), the others as codec blocks.
    codec_fragment_ = cache_->int2_encoding() == kernels::PageEncoding::kCodecFragment;
    if (codec_fragment_) kernels::CodecFragmentLevelTable(fragment_levels_);
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const int64_t k0 = cache_->HistoryBlockOffset(l, 0, 0), v0 = cache_->HistoryBlockOffset(l, 1, 0);
      if (codec_fragment_) {
        codec_layouts_.push_back(
            kernels::CodecFragmentLayerLayoutFor(codec.Side(l, 0), codec.Side(l, 1), k0, v0));
        if (!kernels::SplitDecodeTakesCodecFragment(codec_layouts_.back(), cfg_.head_dim)) {
          return absl::UnimplementedError(absl::StrCat(
              "the CUDA backend's codec fragment kernels need head_dim 64 or 128 and every "
              "region of layer ", l, "'s recipes in whole steps of 16 channels"));
        }
        continue;
      }
      codec_layouts_.push_back(kernels::CodecLayerLayoutFor(
          codec.Side(l, 0), codec.Side(l, 1), cache_->geometry().page_tokens, k0, v0));
      if (!kernels::SplitDecodeTakesCodec(codec_layouts_.back(), cfg_.head_dim)) {
        return absl::UnimplementedError(absl::StrCat(
            "the CUDA backend's codec kernels need every region of layer ", l,
            "'s recipes to span a multiple of 8 channels"));
      }
    }
  }
  KV_CUDA_RETURN_IF_ERROR(clips_.Allocate(clips.size() * 4), "cudaMalloc (clips)");
  KV_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(clips_.as<float>(), clips.data(), clips.size() * 4, cudaMemcpyHostToDevice),
      "cudaMemcpy (clips)");
  return absl::OkStatus();
}

absl::Status CudaBackend::AllocateActivations() {
  const int64_t T = options_.max_step_tokens, H = cfg_.hidden_size, d = cfg_.head_dim;
  // Logits for every item, or every position of passes of up to 512 tokens (evaluation).
  max_logit_rows_ = static_cast<int>(std::max<int64_t>(options_.max_items, std::min<int64_t>(T, 512)));
  const int64_t qdim = int64_t{cfg_.num_heads} * d, kvdim = int64_t{cfg_.num_kv_heads} * d;
  const int64_t inter = cfg_.intermediate_size;
  struct {
    DeviceBuffer* b;
    int64_t bytes;
  } buffers[] = {{&x_, T * H * 4},          {&hn_, T * H * 4},         {&q_, T * qdim * 4},
                 {&qkv_, T * (qdim + 2 * kvdim) * 4},
                 {&k_, T * kvdim * 4},      {&v_, T * kvdim * 4},      {&qr_, T * qdim * 4},
                 {&attn_, T * qdim * 4},    {&o_, T * qdim * 4},       {&o_half_, T * qdim * 4},
                 {&gate_, T * 2 * inter * 4},   {&up_, T * inter * 4},     {&act_, T * inter * 4},
                 {&cos_, T * d / 2 * 4},    {&sin_, T * d / 2 * 4},    {&decode_q_, T * qdim * 4},
                 {&decode_q_half_, T * qdim * 2}, {&decode_out_, T * qdim * 4},
                 {&final_rows_, T * H * 4}, {&final_half_, T * H * 4},
                 {&logits_, int64_t{max_logit_rows_} * cfg_.vocab_size * 4}};
  for (auto& [b, bytes] : buffers) {
    if (cudaError_t e = b->Allocate(static_cast<size_t>(bytes)); e != cudaSuccess) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cuda:", device_, ": cannot allocate the activations for ", T,
          " tokens per step (scheduler.max_step_tokens): ", cudaGetErrorString(e)));
    }
  }
  // The split decode workspace for the largest plan: every item a decode, every page history.
  const kernels::KvGeometry& g = cache_->geometry();
  const int64_t max_pages = (cfg_.max_context + g.page_tokens - 1) / g.page_tokens;
  const int64_t window = cache_->options().layout.sink_tokens / g.page_tokens +
                         (cache_->options().layout.recent_tokens + g.page_tokens - 1) /
                             g.page_tokens +
                         2;
  const int64_t rows = int64_t{options_.max_items} * cfg_.num_kv_heads *
                       (window + std::min<int64_t>(max_pages, 512)) * 8;
  max_split_workspace_ = rows * d * 4 + rows * 4;
  KV_CUDA_RETURN_IF_ERROR(split_workspace_.Allocate(static_cast<size_t>(max_split_workspace_)),
                          "cudaMalloc (split decode workspace)");
  // Metadata: per token 4 ints, per item and page a few more; sized generously.
  pinned_bytes_ = static_cast<size_t>(
      (T * 8 + int64_t{options_.max_items} * (max_pages * 6 + 64)) * 4 + 4096);
  KV_CUDA_RETURN_IF_ERROR(metadata_.Allocate(pinned_bytes_), "cudaMalloc (metadata)");
  KV_CUDA_RETURN_IF_ERROR(cudaMallocHost(&pinned_, pinned_bytes_), "cudaMallocHost");
  return absl::OkStatus();
}

absl::Status CudaBackend::Forward(const std::vector<ForwardItem>& batch,
                                  std::vector<float>* logits, ForwardObserver* observer) {
  if (observer != nullptr) {
    return absl::UnimplementedError(
        "the CUDA backend does not observe the forward pass; calibrate and evaluate on the CPU");
  }
  return Run(batch, nullptr, /*host_logits=*/true, logits, nullptr);
}

absl::Status CudaBackend::Run(const std::vector<ForwardItem>& batch,
                              const std::vector<const DeviceDraw*>* draws, bool host_logits,
                              std::vector<float>* logits, std::vector<DeviceSampled>* sampled) {
  if (host_plan_ == nullptr) host_plan_ = std::make_unique<HostPlan>();
  HostPlan& host = *host_plan_;
  host.Reset();
  KV_RETURN_IF_ERROR(CheckBatch(batch, &host));
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
  for (const ForwardItem& it : batch) {
    KV_RETURN_IF_ERROR(cache_->BeginAppend(*it.seq, it.pos0 + it.n));
  }
  // The plan, on the host (it reads the pages BeginAppend gave each sequence), then on the device.
  BuildHostArrays(batch, &host);
  Plan plan;
  KV_RETURN_IF_ERROR(StageMetadata(host, &plan));
  PlanChunkAttention(host, &plan);
  KV_RETURN_IF_ERROR(PlanDecodeAttention(host, &plan));
  KV_RETURN_IF_ERROR(PlanLogits(host, &plan));

  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(start_, stream_), "cudaEventRecord");
  if (host.graph) {
    KV_RETURN_IF_ERROR(LaunchDecodeGraph(plan, host.items, host.history_bucket));
  } else {
    KV_RETURN_IF_ERROR(RunPass(plan));
  }
  if (draws != nullptr) {
    KV_RETURN_IF_ERROR(sampler_.Enqueue(logits_.as<float>(), cfg_.vocab_size, host.last_logit_row,
                                        *draws, stream_));
  }
  if (host_logits) {
    logits->resize(static_cast<size_t>(plan.logit_rows) * cfg_.vocab_size);
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits->data(), logits_.as<float>(),
                                            logits->size() * sizeof(float),
                                            cudaMemcpyDeviceToHost, stream_),
                            "cudaMemcpyAsync (logits)");
  } else {
    logits->clear();
  }
  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop_, stream_), "cudaEventRecord");
  KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "the forward pass");
  float ms = 0.0f;
  KV_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
  timing_.device_seconds = ms * 1e-3;
  if (draws != nullptr) sampler_.Collect(*draws, sampled);
  for (const ForwardItem& it : batch) {
    KV_RETURN_IF_ERROR(cache_->EndAppend(*it.seq, it.pos0 + it.n));
  }
  return absl::OkStatus();
}

}  // namespace cuda_internal

absl::StatusOr<std::string> DescribeCudaDevice(int device) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA device is usable here (", cudaGetErrorString(e), ")"));
  }
  if (device < 0 || device >= count) {
    return absl::UnavailableError(
        absl::StrCat("cuda:", device, " does not exist (this machine has ", count,
                     count == 1 ? " CUDA device)" : " CUDA devices)"));
  }
  cudaDeviceProp prop;
  if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("cuda:", device, ": cudaGetDeviceProperties: ", cudaGetErrorString(e)));
  }
  return absl::StrFormat("cuda:%d (%s, %.0f GiB, compute %d.%d)", device, prop.name,
                         static_cast<double>(prop.totalGlobalMem) / (1 << 30), prop.major,
                         prop.minor);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const model::LoadedModel& model,
                                                           const RotationSet& rotations,
                                                           KvCache* cache,
                                                           const CudaBackendOptions& options) {
  KV_RETURN_IF_ERROR(DescribeCudaDevice(options.device).status());
  if (cache->host_memory()) {
    return absl::InvalidArgumentError(
        "the CUDA backend needs the KV cache in device page memory (DevicePageMemoryAllocator)");
  }
  const KvCacheFormat format = cache->options().format;
  if (format != KvCacheFormat::kBf16 && format != KvCacheFormat::kInt2 &&
      format != KvCacheFormat::kCodec) {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA backend serves the bf16, int2 and codec KV formats, not ",
        KvCacheFormatName(format)));
  }
  const kernels::KvGeometry& g = cache->geometry();
  if (format == KvCacheFormat::kInt2 && g.group_size != g.head_dim) {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA backend's INT2 kernels need kv_cache.group_size = head_dim (", g.head_dim,
        "), not ", g.group_size));
  }
  if (const PagePool* history = cache->int2_pool();
      history != nullptr && history->slot_bytes() % kHistoryUnitBytes != 0) {
    // The attention kernels' page tables count history pages in 64-byte units.
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA backend needs history pages of a multiple of ", kHistoryUnitBytes,
        " bytes; this KV format's are ", history->slot_bytes()));
  }
  if (const PagePool* history = cache->int2_pool();
      history != nullptr && history->num_slots() * history->slot_bytes() > kHistoryReachBytes) {
    // The attention kernels' page tables count history pages in 64-byte units (int32).
    return absl::InvalidArgumentError(absl::StrCat(
        "the KV cache's history pool (", history->num_slots(), " pages of ", history->slot_bytes(),
        " bytes) exceeds the CUDA backend's reach of ", kHistoryReachBytes >> 30,
        " GiB: lower kv_cache.capacity_bytes (--kv-cache-mb)"));
  }
  if (g.head_dim != 64 && g.head_dim != 128) {
    return absl::UnimplementedError(
        absl::StrCat("unsupported head_dim=", g.head_dim, " on CUDA (64 or 128)"));
  }
  if (model.config.num_heads / model.config.num_kv_heads > 8) {
    return absl::UnimplementedError("the CUDA decode kernel supports GQA groups of up to 8");
  }
  auto backend = std::make_unique<cuda_internal::CudaBackend>(model, rotations, cache, options);
  KV_RETURN_IF_ERROR(backend->Init());
  return backend;
}

}  // namespace kvstrata::engine
