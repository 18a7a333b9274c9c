#pragma once

// The description of a byte-level BPE tokenizer, as found in GGUF metadata or a Hugging Face
// tokenizer.json. Plain data: loaders fill it, tokenizer::Tokenizer compiles it.

#include <cstdint>
#include <string>
#include <vector>

namespace kvstrata::tokenizer {

// Everything a byte-level BPE tokenizer needs, from GGUF metadata or tokenizer.json.
struct TokenizerSpec {
  std::string model;                 // "gpt2" (byte-level BPE) is the one supported
  std::string pre;                   // pre-tokenizer rule: "smollm", "gpt2", "llama-bpe", "qwen2"
  std::vector<std::string> tokens;   // id -> token string (byte-level alphabet, e.g. "Ġthe")
  std::vector<int32_t> token_types;  // id -> 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
  std::vector<std::string> merges;   // "a b", in priority order
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unknown_id = -1;
  int32_t padding_id = -1;
  std::vector<int32_t> end_of_generation_ids;  // eos plus e.g. <|im_end|>, <|eot_id|>
  bool add_bos = false;
  std::string chat_template;  // the Jinja source as shipped (used to pick a template)
};

}  // namespace kvstrata::tokenizer
