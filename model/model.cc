#include "model/model.h"

#include <span>

#include "absl/status/status.h"
#include "core/check.h"

namespace kvstrata::model {

WeightMatrix WeightMatrix::F32(const float* values, int64_t rows, int64_t cols) {
  return WeightMatrix{GgmlType::kF32, rows, cols, reinterpret_cast<const uint8_t*>(values)};
}

int64_t WeightMatrix::row_bytes() const {
  const GgmlTypeInfo info = GetGgmlTypeInfo(type);
  return cols / info.block_elements * info.block_bytes;
}

const float* WeightMatrix::f32() const {
  return type == GgmlType::kF32 ? reinterpret_cast<const float*>(data) : nullptr;
}

void WeightMatrix::DequantizeRows(int64_t begin, int64_t end, float* out) const {
  KV_CHECK(begin >= 0 && begin <= end && end <= rows)
      << "rows [" << begin << ", " << end << ") of a matrix of " << rows;
  const int64_t n = end - begin;
  const absl::Status status =
      Dequantize(type, std::span<const uint8_t>(data + begin * row_bytes(), n * row_bytes()),
                 std::span<float>(out, n * cols), "weight matrix");
  KV_CHECK(status.ok()) << status;
}

std::vector<float> WeightMatrix::Dequantized() const {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  DequantizeRows(0, rows, out.data());
  return out;
}

}  // namespace kvstrata::model
