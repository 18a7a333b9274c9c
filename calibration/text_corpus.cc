#include "calibration/text_corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/sha256.h"

namespace kvstrata::calibration {

absl::StatusOr<std::vector<TextDocument>> LoadTextDocuments(const std::string& dir,
                                                            const tokenizer::Tokenizer& tokenizer) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(
        "text folder ", dir, " does not exist (scripts/fetch-text.sh fetches the corpus)"));
  }
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ".txt") {
      files.push_back(entry.path());
    }
  }
  if (ec) return absl::UnavailableError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat("text folder ", dir, " holds no .txt file"));
  }
  std::sort(files.begin(), files.end());
  std::vector<TextDocument> docs;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::UnavailableError(absl::StrCat("cannot read ", path.string()));
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    TextDocument doc;
    doc.name = path.stem().string();
    doc.tokens = tokenizer.Encode(text, /*parse_special=*/false);
    docs.push_back(std::move(doc));
  }
  return docs;
}

std::vector<TokenWindow> MakeWindows(const std::vector<TextDocument>& documents, int length,
                                     int64_t skip, int64_t count) {
  std::vector<TokenWindow> out;
  if (length <= 0) return out;
  int64_t index = 0;
  for (int64_t round = 0;; ++round) {
    bool any = false;
    for (size_t d = 0; d < documents.size(); ++d) {
      const std::vector<int32_t>& tokens = documents[d].tokens;
      const int64_t offset = round * length;
      if (offset + length > static_cast<int64_t>(tokens.size())) continue;
      any = true;
      if (index++ < skip) continue;
      if (count >= 0 && static_cast<int64_t>(out.size()) >= count) return out;
      TokenWindow w;
      w.document = static_cast<int>(d);
      w.offset = offset;
      w.tokens.assign(tokens.begin() + offset, tokens.begin() + offset + length);
      out.push_back(std::move(w));
    }
    if (!any) break;
  }
  return out;
}

std::string TokenDigest(const std::vector<TokenWindow>& windows) {
  std::string bytes;  // token ids as u32 little-endian
  for (const TokenWindow& w : windows) {
    for (int32_t t : w.tokens) {
      const uint32_t u = static_cast<uint32_t>(t);
      for (int shift = 0; shift < 32; shift += 8) bytes += static_cast<char>((u >> shift) & 0xff);
    }
  }
  return Sha256Hex(bytes);
}

}  // namespace kvstrata::calibration
