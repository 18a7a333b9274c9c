#pragma once

// The text the calibration and evaluation commands read: every *.txt file of a folder (as
// scripts/fetch-text.sh lays them out, one document per file), tokenised as plain text, and cut
// into windows of a fixed number of tokens.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/tokenizer.h"

namespace kvstrata::calibration {

struct TextDocument {
  std::string name;  // file name without .txt
  std::vector<int32_t> tokens;
};

// Reads every regular *.txt file of `dir` in file-name order and tokenises it as plain text
// (control-token text stays text, no BOS). Errors name `dir` (NotFound when it does not exist
// or holds no .txt file, as when scripts/fetch-text.sh has not been run).
absl::StatusOr<std::vector<TextDocument>> LoadTextDocuments(const std::string& dir,
                                                            const tokenizer::Tokenizer& tokenizer);

struct TokenWindow {
  int document = 0;    // index into the documents
  int64_t offset = 0;  // first token's position in the document
  std::vector<int32_t> tokens;
};

// Non-overlapping windows of exactly `length` tokens, each inside one document, taken
// round-robin over the documents (window 0 of every document long enough, then window 1, ...),
// so that the first few windows already sample every long document. Skips the first `skip`
// windows of that order and returns at most `count` (count < 0: all).
std::vector<TokenWindow> MakeWindows(const std::vector<TextDocument>& documents, int length,
                                     int64_t skip = 0, int64_t count = -1);

// Hex SHA-256 of the windows' token ids, in order, as little-endian int32: the digest of the
// data a calibration or evaluation used.
std::string TokenDigest(const std::vector<TokenWindow>& windows);

}  // namespace kvstrata::calibration
