#pragma once

// Sampling on the GPU from rows of logits, so a decode step copies back one token per sequence
// instead of a row of the vocabulary. Semantics are the host Sampler's (engine/sampler.h) when
// no top-k, top-p or min-p filter is set: penalties on the tokens generated so far, then greedy
// (the first maximum) or a draw from softmax(z / T) walking the vocabulary in token order with
// the request's own uniform number u: the token where the running sum passes u · Σ. Sums and
// exponentials are in double, as on the host. The logprob reported is log-softmax of the
// penalised logits (before temperature).
//
// A row is spread over CTAs of kSampleChunk tokens each (one wave for a batch-1 vocabulary of
// 152K), each reducing its chunk to its first maximum and its sums of exponentials relative to
// that maximum; the row's last CTA to finish combines them and, for a draw, walks the one chunk
// where the running sum passes u · Σ. One CTA walking the whole row took ~90 µs at 152K.

#include <cuda_runtime.h>

#include <cstdint>

namespace kvstrata::kernels {

struct SampleParams {
  float* logits = nullptr;  // [*][vocab]; the rows sampled get the penalties applied in place
  int vocab = 0;
  int num_rows = 0;              // rows to sample
  const int32_t* row = nullptr;  // [num_rows] which row of `logits`
  const float* temperature = nullptr;  // [num_rows]; 0 = greedy
  const double* uniform = nullptr;     // [num_rows] in [0, 1)
  const float* repetition_penalty = nullptr;  // [num_rows]; 1 = off
  const float* frequency_penalty = nullptr;   // [num_rows]
  const float* presence_penalty = nullptr;    // [num_rows]
  // Tokens generated so far by row r: count_token[count_indptr[r] .. count_indptr[r + 1]), each
  // with its number of occurrences count_n (distinct tokens).
  const int32_t* count_indptr = nullptr;  // [num_rows + 1]
  const int32_t* count_token = nullptr;
  const int32_t* count_n = nullptr;
  int32_t* out_token = nullptr;  // [num_rows]
  float* out_logprob = nullptr;  // [num_rows]
  // Scratch in device memory: the chunks' partial results (SampleChunkResultBytes), and a
  // count of finished chunks per row, zero before the first launch (each launch leaves them so).
  void* chunk_results = nullptr;
  unsigned* chunks_done = nullptr;  // [num_rows]
};

constexpr int kSampleChunk = 2048;  // tokens of a row per CTA

size_t SampleChunkResultBytes(int num_rows, int vocab);

// cudaErrorInvalidValue for a missing array or scratch, a vocabulary of 0, or over 65,535 rows.
cudaError_t LaunchSample(const SampleParams& params, cudaStream_t stream);

}  // namespace kvstrata::kernels
