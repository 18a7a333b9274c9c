#include "model/load_util.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvstrata::model {
namespace {

// As in core/radix_hash.cc: a failing SHA-256 means OpenSSL is broken or memory is exhausted,
// and a made-up fingerprint could let two models share KV pages.

// Closes a file descriptor on every return path.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ByteSource>> ByteSource::MapFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string message = absl::StrCat("cannot open '", path, "': ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::PermissionDeniedError(message);
  }
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("cannot stat '", path, "': ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  std::unique_ptr<ByteSource> source(new ByteSource());
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) return source;  // mmap rejects empty mappings; an empty span is the answer
  void* map = ::mmap(/*addr=*/nullptr, size, PROT_READ, MAP_PRIVATE, fd, /*offset=*/0);
  if (map == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map '", path, "' (", size, " bytes): ", std::strerror(errno)));
  }
  // No access hint: weight matrices are read through the mapping for the model's whole life.
  source->map_ = map;
  source->map_size_ = size;
  source->bytes_ = std::span<const uint8_t>(static_cast<const uint8_t*>(map), size);
  return source;
}

std::unique_ptr<ByteSource> ByteSource::FromString(std::string bytes) {
  std::unique_ptr<ByteSource> source(new ByteSource());
  source->owned_ = std::move(bytes);
  source->bytes_ = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(source->owned_.data()),
                                            source->owned_.size());
  return source;
}

ByteSource::~ByteSource() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

std::string FormatShape(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::vector<int32_t> EndOfGenerationIds(const tokenizer::TokenizerSpec& spec) {
  static constexpr std::string_view kTurnEnders[] = {
      "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|end|>", "<end_of_turn>",
  };
  constexpr int32_t kControl = 3;
  std::vector<int32_t> ids;
  if (spec.eos_id >= 0) ids.push_back(spec.eos_id);
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    if (id >= spec.token_types.size() || spec.token_types[id] != kControl) continue;
    const std::string& text = spec.tokens[id];
    const bool ends_turn =
        std::find(std::begin(kTurnEnders), std::end(kTurnEnders), text) != std::end(kTurnEnders);
    if (ends_turn && static_cast<int32_t>(id) != spec.eos_id) {
      ids.push_back(static_cast<int32_t>(id));
    }
  }
  return ids;
}

void ArenaPlan::Add(const WeightSlot& slot, Decoder decode) {
  const int64_t rows = slot.is_matrix() ? slot.shape[0] : 1;
  const int64_t cols = slot.shape.back();
  entries_.push_back(Entry{slot.vector, slot.matrix, rows, cols, std::move(decode)});
}

absl::Status ArenaPlan::Fill(ModelWeights& weights) {
  size_t total = 0;
  for (const Entry& entry : entries_) total += static_cast<size_t>(entry.rows * entry.cols);
  weights.arena.clear();
  weights.arena.resize(total);
  size_t offset = 0;
  for (const Entry& entry : entries_) {
    const size_t n = static_cast<size_t>(entry.rows * entry.cols);
    std::span<float> out(weights.arena.data() + offset, n);
    if (entry.matrix != nullptr) {
      *entry.matrix = WeightMatrix::F32(out.data(), entry.rows, entry.cols);
    } else {
      *entry.vector = out.data();
    }
    if (absl::Status status = entry.decode(out); !status.ok()) return status;
    offset += n;
  }
  return absl::OkStatus();
}

std::vector<WeightSlot> PlanWeights(const ModelConfig& c, ModelWeights& weights) {
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t inter = c.intermediate_size;
  const int64_t vocab = c.vocab_size;
  weights.layers.assign(static_cast<size_t>(c.num_layers), LayerWeights{});
  std::vector<WeightSlot> slots;
  slots.push_back({WeightRole::kTokenEmbedding,
                   -1,
                   {vocab, hidden},
                   /*vector=*/nullptr,
                   &weights.token_embedding});
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& w = weights.layers[static_cast<size_t>(l)];
    slots.push_back({WeightRole::kAttnNorm, l, {hidden}, &w.attn_norm});
    slots.push_back({WeightRole::kWq, l, {q_dim, hidden}, /*vector=*/nullptr, &w.wq});
    slots.push_back({WeightRole::kWk, l, {kv_dim, hidden}, /*vector=*/nullptr, &w.wk});
    slots.push_back({WeightRole::kWv, l, {kv_dim, hidden}, /*vector=*/nullptr, &w.wv});
    if (c.qkv_bias) {
      slots.push_back({WeightRole::kBq, l, {q_dim}, &w.bq});
      slots.push_back({WeightRole::kBk, l, {kv_dim}, &w.bk});
      slots.push_back({WeightRole::kBv, l, {kv_dim}, &w.bv});
    }
    if (c.qk_norm) {
      slots.push_back({WeightRole::kQNorm, l, {c.head_dim}, &w.q_norm});
      slots.push_back({WeightRole::kKNorm, l, {c.head_dim}, &w.k_norm});
    }
    slots.push_back({WeightRole::kWo, l, {hidden, q_dim}, /*vector=*/nullptr, &w.wo});
    slots.push_back({WeightRole::kFfnNorm, l, {hidden}, &w.ffn_norm});
    slots.push_back({WeightRole::kWGate, l, {inter, hidden}, /*vector=*/nullptr, &w.w_gate});
    slots.push_back({WeightRole::kWUp, l, {inter, hidden}, /*vector=*/nullptr, &w.w_up});
    slots.push_back({WeightRole::kWDown, l, {hidden, inter}, /*vector=*/nullptr, &w.w_down});
  }
  slots.push_back({WeightRole::kOutputNorm, -1, {hidden}, &weights.output_norm});
  if (!c.tied_embeddings) {
    slots.push_back(
        {WeightRole::kLmHead, -1, {vocab, hidden}, /*vector=*/nullptr, &weights.lm_head});
  }
  return slots;
}

std::string GgufTensorName(const WeightSlot& slot) {
  const auto layer = [&](absl::string_view name) {
    return absl::StrCat("blk.", slot.layer, ".", name);
  };
  switch (slot.role) {
    case WeightRole::kTokenEmbedding:
      return "token_embd.weight";
    case WeightRole::kOutputNorm:
      return "output_norm.weight";
    case WeightRole::kLmHead:
      return "output.weight";
    case WeightRole::kAttnNorm:
      return layer("attn_norm.weight");
    case WeightRole::kWq:
      return layer("attn_q.weight");
    case WeightRole::kWk:
      return layer("attn_k.weight");
    case WeightRole::kWv:
      return layer("attn_v.weight");
    case WeightRole::kBq:
      return layer("attn_q.bias");
    case WeightRole::kBk:
      return layer("attn_k.bias");
    case WeightRole::kBv:
      return layer("attn_v.bias");
    case WeightRole::kQNorm:
      return layer("attn_q_norm.weight");
    case WeightRole::kKNorm:
      return layer("attn_k_norm.weight");
    case WeightRole::kWo:
      return layer("attn_output.weight");
    case WeightRole::kFfnNorm:
      return layer("ffn_norm.weight");
    case WeightRole::kWGate:
      return layer("ffn_gate.weight");
    case WeightRole::kWUp:
      return layer("ffn_up.weight");
    case WeightRole::kWDown:
      return layer("ffn_down.weight");
  }
  return "";
}

std::string HfTensorName(const WeightSlot& slot) {
  const auto layer = [&](absl::string_view name) {
    return absl::StrCat("model.layers.", slot.layer, ".", name);
  };
  switch (slot.role) {
    case WeightRole::kTokenEmbedding:
      return "model.embed_tokens.weight";
    case WeightRole::kOutputNorm:
      return "model.norm.weight";
    case WeightRole::kLmHead:
      return "lm_head.weight";
    case WeightRole::kAttnNorm:
      return layer("input_layernorm.weight");
    case WeightRole::kWq:
      return layer("self_attn.q_proj.weight");
    case WeightRole::kWk:
      return layer("self_attn.k_proj.weight");
    case WeightRole::kWv:
      return layer("self_attn.v_proj.weight");
    case WeightRole::kBq:
      return layer("self_attn.q_proj.bias");
    case WeightRole::kBk:
      return layer("self_attn.k_proj.bias");
    case WeightRole::kBv:
      return layer("self_attn.v_proj.bias");
    case WeightRole::kQNorm:
      return layer("self_attn.q_norm.weight");
    case WeightRole::kKNorm:
      return layer("self_attn.k_norm.weight");
    case WeightRole::kWo:
      return layer("self_attn.o_proj.weight");
    case WeightRole::kFfnNorm:
      return layer("post_attention_layernorm.weight");
    case WeightRole::kWGate:
      return layer("mlp.gate_proj.weight");
    case WeightRole::kWUp:
      return layer("mlp.up_proj.weight");
    case WeightRole::kWDown:
      return layer("mlp.down_proj.weight");
  }
  return "";
}

const float* WeightOf(const ModelWeights& w, const WeightSlot& slot) {
  const LayerWeights* layer = slot.layer >= 0 && static_cast<size_t>(slot.layer) < w.layers.size()
                                  ? &w.layers[slot.layer]
                                  : nullptr;
  switch (slot.role) {
    case WeightRole::kTokenEmbedding:
      return w.token_embedding.f32();
    case WeightRole::kOutputNorm:
      return w.output_norm;
    case WeightRole::kLmHead:
      return w.lm_head.f32();
    case WeightRole::kAttnNorm:
      return layer ? layer->attn_norm : nullptr;
    case WeightRole::kWq:
      return layer ? layer->wq.f32() : nullptr;
    case WeightRole::kWk:
      return layer ? layer->wk.f32() : nullptr;
    case WeightRole::kWv:
      return layer ? layer->wv.f32() : nullptr;
    case WeightRole::kBq:
      return layer ? layer->bq : nullptr;
    case WeightRole::kBk:
      return layer ? layer->bk : nullptr;
    case WeightRole::kBv:
      return layer ? layer->bv : nullptr;
    case WeightRole::kQNorm:
      return layer ? layer->q_norm : nullptr;
    case WeightRole::kKNorm:
      return layer ? layer->k_norm : nullptr;
    case WeightRole::kWo:
      return layer ? layer->wo.f32() : nullptr;
    case WeightRole::kFfnNorm:
      return layer ? layer->ffn_norm : nullptr;
    case WeightRole::kWGate:
      return layer ? layer->w_gate.f32() : nullptr;
    case WeightRole::kWUp:
      return layer ? layer->w_up.f32() : nullptr;
    case WeightRole::kWDown:
      return layer ? layer->w_down.f32() : nullptr;
  }
  return nullptr;
}

std::vector<float> ValuesOf(const ModelWeights& w, const WeightSlot& slot) {
  if (!slot.is_matrix()) {
    const float* v = WeightOf(w, slot);
    return v == nullptr ? std::vector<float>() : std::vector<float>(v, v + slot.shape[0]);
  }
  const LayerWeights* layer = slot.layer >= 0 && static_cast<size_t>(slot.layer) < w.layers.size()
                                  ? &w.layers[slot.layer]
                                  : nullptr;
  const WeightMatrix* m = nullptr;
  switch (slot.role) {
    case WeightRole::kTokenEmbedding:
      m = &w.token_embedding;
      break;
    case WeightRole::kLmHead:
      m = &w.lm_head;
      break;
    case WeightRole::kWq:
    case WeightRole::kWk:
    case WeightRole::kWv:
    case WeightRole::kWo:
    case WeightRole::kWGate:
    case WeightRole::kWUp:
    case WeightRole::kWDown:
      if (layer == nullptr) break;
      m = slot.role == WeightRole::kWq      ? &layer->wq
          : slot.role == WeightRole::kWk    ? &layer->wk
          : slot.role == WeightRole::kWv    ? &layer->wv
          : slot.role == WeightRole::kWo    ? &layer->wo
          : slot.role == WeightRole::kWGate ? &layer->w_gate
          : slot.role == WeightRole::kWUp   ? &layer->w_up
                                            : &layer->w_down;
      break;
    case WeightRole::kOutputNorm:
    case WeightRole::kAttnNorm:
    case WeightRole::kBq:
    case WeightRole::kBk:
    case WeightRole::kBv:
    case WeightRole::kQNorm:
    case WeightRole::kKNorm:
    case WeightRole::kFfnNorm:
      break;  // vectors
  }
  return m == nullptr || !m->present() ? std::vector<float>() : m->Dequantized();
}

absl::Status ValidateConfig(const ModelConfig& c, std::string_view source) {
  const auto positive = [&](const char* field, int value) -> absl::Status {
    if (value > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(AsAbsl(source), ": ", field, " must be positive, got ", value));
  };
  for (const auto& [field, value] : {std::pair{"vocab_size", c.vocab_size},
                                     {"hidden_size", c.hidden_size},
                                     {"intermediate_size", c.intermediate_size},
                                     {"num_layers", c.num_layers},
                                     {"num_heads", c.num_heads},
                                     {"num_kv_heads", c.num_kv_heads},
                                     {"head_dim", c.head_dim},
                                     {"max_context", c.max_context}}) {
    if (absl::Status status = positive(field, value); !status.ok()) return status;
  }
  // The layer table is allocated before any tensor is matched against the file; real models
  // have at most a few hundred layers.
  constexpr int kMaxLayers = 4096;
  if (c.num_layers > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat(AsAbsl(source), ": num_layers ", c.num_layers, " is more than ", kMaxLayers));
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(AsAbsl(source), ": num_heads ", c.num_heads,
                                                   " is not a multiple of num_kv_heads ",
                                                   c.num_kv_heads));
  }
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(AsAbsl(source), ": head_dim ", c.head_dim, " is odd; RoPE needs pairs"));
  }
  if (!(c.rope_theta > 0.0f) || !(c.rms_norm_eps > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(AsAbsl(source), ": rope_theta ", c.rope_theta,
                                                   " and rms_norm_eps ", c.rms_norm_eps,
                                                   " must be positive"));
  }
  return absl::OkStatus();
}

}  // namespace kvstrata::model
