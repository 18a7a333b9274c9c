#pragma once

// Reading the fields of an OpenAI request body: each getter leaves `out` alone when the field is
// absent or JSON null (OpenAI treats both as "not given") and fails with InvalidArgument naming
// the field ("temperature: must be a number") when it has the wrong type or range.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kvstrata/v1/generate.pb.h"

namespace kvstrata::openai {

using json = nlohmann::json;

// InvalidArgument "param: what".
absl::Status Invalid(absl::string_view param, absl::string_view what);

// The field, or null when it is absent or JSON null.
const json* Field(const json& object, const char* name);

absl::Status GetNumber(const json& o, const char* name, std::optional<double>* out);
// An integer in [lo, hi].
absl::Status GetInt(const json& o, const char* name, int64_t lo, int64_t hi,
                    std::optional<int64_t>* out);
absl::Status GetBool(const json& o, const char* name, bool* out);
absl::Status GetString(const json& o, const char* name, std::optional<std::string>* out);
// The array `v` of token ids appended to `out`; errors name `param[i]`.
absl::Status GetTokenIds(const json& v, const std::string& param, v1::TokenIds* out);

}  // namespace kvstrata::openai
