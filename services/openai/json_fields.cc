#include "services/openai/json_fields.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace kvstrata::openai {

absl::Status Invalid(absl::string_view param, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(param, ": ", what));
}

const json* Field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status GetNumber(const json& o, const char* name, std::optional<double>* out) {
  const json* v = Field(o, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return Invalid(name, "must be a number");
  *out = v->get<double>();
  return absl::OkStatus();
}

absl::Status GetInt(const json& o, const char* name, int64_t lo, int64_t hi,
                    std::optional<int64_t>* out) {
  const json* v = Field(o, name);
  if (v == nullptr) return absl::OkStatus();
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Invalid(name, absl::StrCat("must be at most ", hi));
  }
  if (!v->is_number_integer()) return Invalid(name, "must be an integer");
  const int64_t i = v->get<int64_t>();
  if (i < lo || i > hi) return Invalid(name, absl::StrCat("must be in [", lo, ", ", hi, "]"));
  *out = i;
  return absl::OkStatus();
}

absl::Status GetBool(const json& o, const char* name, bool* out) {
  const json* v = Field(o, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) return Invalid(name, "must be a boolean");
  *out = v->get<bool>();
  return absl::OkStatus();
}

absl::Status GetString(const json& o, const char* name, std::optional<std::string>* out) {
  const json* v = Field(o, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string()) return Invalid(name, "must be a string");
  *out = v->get<std::string>();
  return absl::OkStatus();
}

absl::Status GetTokenIds(const json& v, const std::string& param, v1::TokenIds* out) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer() || v[i].get<int64_t>() < 0 ||
        v[i].get<int64_t>() > std::numeric_limits<uint32_t>::max()) {
      return Invalid(absl::StrCat(param, "[", i, "]"), "must be a token id (an integer >= 0)");
    }
    out->add_ids(v[i].get<uint32_t>());
  }
  return absl::OkStatus();
}

}  // namespace kvstrata::openai
