#include "engine/cuda/device_sampler.h"

#include <algorithm>

#include "kernels/cuda/sample.h"

namespace kvstrata::engine {
namespace {

// Where each array of the draws sits, in bytes, for a capacity of `rows` and `counts`.
struct Layout {
  int64_t row, temperature, uniform, repetition, frequency, presence, indptr, token, n;
  int64_t out_token, out_logprob, end;

  Layout(int64_t rows, int64_t counts) {
    int64_t at = 0;
    auto take = [&](int64_t bytes) {
      const int64_t here = at;
      at = (at + bytes + 15) / 16 * 16;
      return here;
    };
    row = take(rows * 4);
    temperature = take(rows * 4);
    uniform = take(rows * 8);
    repetition = take(rows * 4);
    frequency = take(rows * 4);
    presence = take(rows * 4);
    indptr = take((rows + 1) * 4);
    token = take(counts * 4);
    n = take(counts * 4);
    out_token = take(rows * 4);
    out_logprob = take(rows * 4);
    end = at;
  }
};

// Bytes of the kernel's per-row counts, kept 16-byte aligned for the chunk results after them.
size_t DoneBytes(int rows) { return (static_cast<size_t>(rows) * 4 + 15) / 16 * 16; }

}  // namespace

absl::Status DeviceSampler::Reserve(int rows, int64_t counts, int vocab, cudaStream_t stream) {
  if (rows <= row_capacity_ && counts <= count_capacity_ && vocab == workspace_vocab_) {
    return absl::OkStatus();
  }
  // The previous pass may still read the old buffers.
  KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "cudaStreamSynchronize (sampling)");
  row_capacity_ = std::max({rows, row_capacity_, 32});
  count_capacity_ = std::max<int64_t>({counts, count_capacity_ * 2, 4096});
  const Layout layout(row_capacity_, count_capacity_);
  KV_CUDA_RETURN_IF_ERROR(staging_.Allocate(layout.end), "cudaMallocHost (sampling)");
  KV_CUDA_RETURN_IF_ERROR(arrays_.Allocate(layout.end), "cudaMalloc (sampling)");
  // The kernel's scratch: a count per row (zero), then the chunks' results.
  const size_t bytes =
      DoneBytes(row_capacity_) + kernels::SampleChunkResultBytes(row_capacity_, vocab);
  KV_CUDA_RETURN_IF_ERROR(workspace_.Allocate(bytes), "cudaMalloc (sampling workspace)");
  KV_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(workspace_.as<void>(), 0, DoneBytes(row_capacity_), stream),
      "cudaMemsetAsync (sampling workspace)");
  workspace_vocab_ = vocab;
  return absl::OkStatus();
}

absl::Status DeviceSampler::Enqueue(float* logits, int vocab, const std::vector<int32_t>& rows,
                                    const std::vector<const DeviceDraw*>& draws,
                                    cudaStream_t stream) {
  int n = 0;
  int64_t counts = 0;
  for (const DeviceDraw* d : draws) {
    if (d == nullptr) continue;
    ++n;
    counts += static_cast<int64_t>(d->counts.size());
  }
  num_rows_ = n;
  if (n == 0) return absl::OkStatus();
  if (absl::Status s = Reserve(n, counts, vocab, stream); !s.ok()) return s;
  const Layout layout(row_capacity_, count_capacity_);
  uint8_t* h = staging_.as<uint8_t>();
  auto at = [&](int64_t offset) { return h + offset; };
  int r = 0;
  int32_t count_at = 0;
  for (size_t i = 0; i < draws.size(); ++i) {
    const DeviceDraw* d = draws[i];
    if (d == nullptr) continue;
    reinterpret_cast<int32_t*>(at(layout.row))[r] = rows[i];
    reinterpret_cast<float*>(at(layout.temperature))[r] = d->temperature;
    reinterpret_cast<double*>(at(layout.uniform))[r] = d->uniform;
    reinterpret_cast<float*>(at(layout.repetition))[r] = d->repetition_penalty;
    reinterpret_cast<float*>(at(layout.frequency))[r] = d->frequency_penalty;
    reinterpret_cast<float*>(at(layout.presence))[r] = d->presence_penalty;
    reinterpret_cast<int32_t*>(at(layout.indptr))[r] = count_at;
    for (const auto& [token, occurrences] : d->counts) {
      reinterpret_cast<int32_t*>(at(layout.token))[count_at] = token;
      reinterpret_cast<int32_t*>(at(layout.n))[count_at] = occurrences;
      ++count_at;
    }
    ++r;
  }
  reinterpret_cast<int32_t*>(at(layout.indptr))[r] = count_at;
  // The arrays up to the results, in one copy.
  KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(arrays_.as<uint8_t>(), h, layout.out_token,
                                          cudaMemcpyHostToDevice, stream),
                          "cudaMemcpyAsync (sampling draws)");
  const uint8_t* dv = arrays_.as<uint8_t>();
  kernels::SampleParams p;
  p.logits = logits;
  p.vocab = vocab;
  p.num_rows = n;
  p.row = reinterpret_cast<const int32_t*>(dv + layout.row);
  p.temperature = reinterpret_cast<const float*>(dv + layout.temperature);
  p.uniform = reinterpret_cast<const double*>(dv + layout.uniform);
  p.repetition_penalty = reinterpret_cast<const float*>(dv + layout.repetition);
  p.frequency_penalty = reinterpret_cast<const float*>(dv + layout.frequency);
  p.presence_penalty = reinterpret_cast<const float*>(dv + layout.presence);
  p.count_indptr = reinterpret_cast<const int32_t*>(dv + layout.indptr);
  p.count_token = reinterpret_cast<const int32_t*>(dv + layout.token);
  p.count_n = reinterpret_cast<const int32_t*>(dv + layout.n);
  p.out_token = reinterpret_cast<int32_t*>(arrays_.as<uint8_t>() + layout.out_token);
  p.out_logprob = reinterpret_cast<float*>(arrays_.as<uint8_t>() + layout.out_logprob);
  p.chunks_done = workspace_.as<unsigned>();
  p.chunk_results = workspace_.as<uint8_t>() + DoneBytes(row_capacity_);
  KV_CUDA_RETURN_IF_ERROR(kernels::LaunchSample(p, stream), "Sample");
  KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h + layout.out_token, dv + layout.out_token,
                                          layout.end - layout.out_token, cudaMemcpyDeviceToHost,
                                          stream),
                          "cudaMemcpyAsync (sampled tokens)");
  return absl::OkStatus();
}

void DeviceSampler::Collect(const std::vector<const DeviceDraw*>& draws,
                            std::vector<DeviceSampled>* out) const {
  out->assign(draws.size(), DeviceSampled{});
  if (num_rows_ == 0) return;
  const Layout layout(row_capacity_, count_capacity_);
  const uint8_t* h = staging_.as<uint8_t>();
  int r = 0;
  for (size_t i = 0; i < draws.size(); ++i) {
    if (draws[i] == nullptr) continue;
    (*out)[i].token = reinterpret_cast<const int32_t*>(h + layout.out_token)[r];
    (*out)[i].logprob = reinterpret_cast<const float*>(h + layout.out_logprob)[r];
    ++r;
  }
}

}  // namespace kvstrata::engine
