#pragma once

// A small Llama-shaped model with seeded random weights, built in memory, for engine tests
// that need a model but not a real one (the real model has its own tests).

#include <memory>
#include <random>
#include <string>

#include "kernels/history_codec.h"
#include "model/model.h"

namespace kvstrata::engine::testing {

struct RandomModelOptions {
  int layers = 2;
  int hidden = 64;
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 64;
  int intermediate = 128;
  int vocab = 300;
  model::Architecture arch = model::Architecture::kLlama;
  uint32_t seed = 1;
};

inline model::LoadedModel RandomModel(const RandomModelOptions& o) {
  model::LoadedModel m;
  model::ModelConfig& c = m.config;
  c.arch = o.arch;
  c.name = "random-test-model";
  c.vocab_size = o.vocab;
  c.hidden_size = o.hidden;
  c.intermediate_size = o.intermediate;
  c.num_layers = o.layers;
  c.num_heads = o.heads;
  c.num_kv_heads = o.kv_heads;
  c.head_dim = o.head_dim;
  c.rope_theta = 10000.0f;
  c.rope_layout = model::RopeLayout::kHalfSplit;
  c.max_context = 4096;
  c.tied_embeddings = true;
  c.qkv_bias = o.arch == model::Architecture::kQwen2;
  c.qk_norm = o.arch == model::Architecture::kQwen3;
  const int64_t q = int64_t{o.heads} * o.head_dim, kv = int64_t{o.kv_heads} * o.head_dim;
  const int64_t per_layer = 2 * o.hidden + q * o.hidden * 2 + kv * o.hidden * 2 + q + 2 * kv +
                            2 * o.head_dim + 3 * int64_t{o.intermediate} * o.hidden;
  m.weights.arena.resize(int64_t{o.vocab} * o.hidden + o.hidden + per_layer * o.layers);
  std::mt19937 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  float* next = m.weights.arena.data();
  auto take = [&](int64_t count, float scale, float mean = 0.0f) {
    float* p = next;
    for (int64_t i = 0; i < count; ++i) p[i] = mean + scale * normal(rng);
    next += count;
    return p;
  };
  const float w = 1.0f / std::sqrt(static_cast<float>(o.hidden));
  m.weights.token_embedding =
      model::WeightMatrix::F32(take(int64_t{o.vocab} * o.hidden, 1.0f), o.vocab, o.hidden);
  m.weights.lm_head = m.weights.token_embedding;
  m.weights.output_norm = take(o.hidden, 0.05f, 1.0f);
  for (int l = 0; l < o.layers; ++l) {
    model::LayerWeights lw;
    lw.attn_norm = take(o.hidden, 0.05f, 1.0f);
    lw.wq = model::WeightMatrix::F32(take(q * o.hidden, 2.0f * w), q, o.hidden);
    lw.wk = model::WeightMatrix::F32(take(kv * o.hidden, 2.0f * w), kv, o.hidden);
    lw.wv = model::WeightMatrix::F32(take(kv * o.hidden, w), kv, o.hidden);
    if (c.qkv_bias) {
      lw.bq = take(q, 0.1f);
      lw.bk = take(kv, 0.1f);
      lw.bv = take(kv, 0.1f);
    }
    if (c.qk_norm) {
      lw.q_norm = take(o.head_dim, 0.05f, 1.0f);
      lw.k_norm = take(o.head_dim, 0.05f, 1.0f);
    }
    lw.wo = model::WeightMatrix::F32(take(o.hidden * q, w), o.hidden, q);
    lw.ffn_norm = take(o.hidden, 0.05f, 1.0f);
    lw.w_gate = model::WeightMatrix::F32(take(int64_t{o.intermediate} * o.hidden, w),
                                         o.intermediate, o.hidden);
    lw.w_up = model::WeightMatrix::F32(take(int64_t{o.intermediate} * o.hidden, w), o.intermediate,
                                       o.hidden);
    lw.w_down = model::WeightMatrix::F32(take(int64_t{o.hidden} * o.intermediate,
                                              1.0f / std::sqrt(static_cast<float>(o.intermediate))),
                                         o.hidden, o.intermediate);
    m.weights.layers.push_back(lw);
  }
  m.fingerprint = "random-" + std::to_string(o.seed);
  return m;
}

// A history codec for the random model's two layers (head_dim 64) for tests of the codec KV
// format: blocks of different sizes per layer and side, 4/3/2/1-bit regions. With
// uniform_levels every recipe codes uniform levels (u): the codec fragment blocks.
inline std::shared_ptr<const kernels::HistoryCodec> TestCodec(bool uniform_levels = false) {
  const std::string u = uniform_levels ? ":u" : "";
  auto c = std::make_shared<kernels::HistoryCodec>();
  std::string error;
  kernels::ParseHistoryCodec("4x16+3x16+2x32:eig:s8:pr" + u + "|2x32+1x32:eig:s8:pr" + u +
                                 ";1=3x32+2x16+1x16:s8:pr" + u + "|3x16+2x16+1x32:s8:pr" + u,
                             64, c.get(), &error);
  return c;
}

}  // namespace kvstrata::engine::testing
