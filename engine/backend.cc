#include "engine/backend.h"

#include "absl/strings/str_cat.h"

namespace kvstrata::engine {

absl::Status CheckForwardBatch(const std::vector<ForwardItem>& batch, int vocab_size,
                               std::vector<int>* offset, int* tokens) {
  int T = 0;
  offset->resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardItem& it = batch[i];
    if (it.n <= 0) return absl::InvalidArgumentError("forward item with no tokens");
    if (it.pos0 != it.seq->num_tokens ||
        static_cast<int64_t>(it.seq->tokens.size()) < it.pos0 + it.n) {
      return absl::InternalError(
          absl::StrCat("forward item ", i, " does not continue its sequence"));
    }
    for (int t = 0; t < it.n; ++t) {
      const int32_t token = it.seq->tokens[it.pos0 + t];
      if (token < 0 || token >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", token, " at position ",
                                                       it.pos0 + t, " is outside the vocabulary"));
      }
    }
    (*offset)[i] = T;
    T += it.n;
  }
  *tokens = T;
  return absl::OkStatus();
}

}  // namespace kvstrata::engine
