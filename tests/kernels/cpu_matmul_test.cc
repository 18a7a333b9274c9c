// The CPU matrix kernels on every instruction set this machine runs, against the double
// reference (MatmulRowsRef) and, for dequantisation, against the loaders' own decoder
// (model::Dequantize), which the gguf package's reference checks on the real model.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/numeric.h"
#include "model/dequant.h"

namespace kvstrata::kernels::cpu {
namespace {

std::vector<CpuIsa> Isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (CpuSupports(isa)) out.push_back(isa);
  }
  return out;
}

model::GgmlType GgmlOf(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32:
      return model::GgmlType::kF32;
    case WeightFormat::kF16:
      return model::GgmlType::kF16;
    case WeightFormat::kBF16:
      return model::GgmlType::kBF16;
    case WeightFormat::kQ8_0:
      return model::GgmlType::kQ8_0;
    case WeightFormat::kQ4_0:
      return model::GgmlType::kQ4_0;
    case WeightFormat::kQ4_1:
      return model::GgmlType::kQ4_1;
  }
  return model::GgmlType::kF32;
}

// A random matrix in `format`: random bytes for the codes and random finite fp16 scales and
// minimums (the kernels must handle any block, not only those a quantiser makes).
std::vector<uint8_t> RandomMatrix(WeightFormat format, int64_t rows, int64_t cols,
                                  std::mt19937& rng) {
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * WeightRowBytes(format, cols)));
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto put16 = [&](size_t at, uint16_t v) { std::memcpy(bytes.data() + at, &v, 2); };
  switch (format) {
    case WeightFormat::kF32:
      for (size_t i = 0; i < bytes.size(); i += 4) {
        const float v = normal(rng);
        std::memcpy(bytes.data() + i, &v, 4);
      }
      break;
    case WeightFormat::kF16:
      for (size_t i = 0; i < bytes.size(); i += 2) put16(i, FloatToFp16(normal(rng)));
      break;
    case WeightFormat::kBF16:
      for (size_t i = 0; i < bytes.size(); i += 2) put16(i, FloatToBf16(normal(rng)));
      break;
    case WeightFormat::kQ8_0:
    case WeightFormat::kQ4_0:
    case WeightFormat::kQ4_1: {
      const size_t block = format == WeightFormat::kQ8_0   ? 34
                           : format == WeightFormat::kQ4_0 ? 18
                                                           : 20;
      for (auto& b : bytes) b = static_cast<uint8_t>(byte(rng));
      for (size_t at = 0; at < bytes.size(); at += block) {
        put16(at, FloatToFp16(0.05f * normal(rng)));
        if (format == WeightFormat::kQ4_1) put16(at + 2, FloatToFp16(0.3f * normal(rng)));
      }
      break;
    }
  }
  return bytes;
}

struct Shape {
  int64_t rows;
  int64_t cols;
};

std::vector<Shape> ShapesFor(WeightFormat f) {
  std::vector<Shape> s = {{1, 32}, {7, 64}, {33, 96}, {20, 576}, {3, 1536}};
  if (!IsBlockFormat(f)) s.push_back({5, 50});  // a tail past the last 32 columns
  return s;
}

class CpuMatmulTest : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(CpuMatmulTest, MatchesTheDoubleReferenceOnEveryPath) {
  const WeightFormat format = GetParam();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Shape& shape : ShapesFor(format)) {
    const std::vector<uint8_t> bytes = RandomMatrix(format, shape.rows, shape.cols, rng);
    const WeightView w{format, shape.rows, shape.cols, bytes.data()};
    for (const int m : {1, 2, 3, 5, 8, 9, 17}) {
      const int64_t xs = shape.cols + 3;  // strides wider than the data
      std::vector<float> x(static_cast<size_t>(m * xs));
      for (float& v : x) v = normal(rng);
      // A slice of the rows, written into a wider output.
      const int64_t r0 = shape.rows > 2 ? 1 : 0, r1 = shape.rows;
      const int64_t ys = (r1 - r0) + 2;
      std::vector<float> want(static_cast<size_t>(m * ys), -7.0f);
      MatmulRowsRef(w, x.data(), m, xs, r0, r1, want.data(), ys);
      // |x|·|w| per output, for the rounding bound of an fp32 sum of cols products.
      std::vector<float> row(static_cast<size_t>(shape.cols));
      std::vector<double> magnitude(static_cast<size_t>(m * ys), 0.0);
      for (int64_t r = r0; r < r1; ++r) {
        DequantizeRows(CpuIsa::kPortable, w, r, r + 1, row.data());
        for (int i = 0; i < m; ++i) {
          for (int64_t c = 0; c < shape.cols; ++c) {
            magnitude[i * ys + (r - r0)] += std::fabs(double{row[c]} * x[i * xs + c]);
          }
        }
      }
      for (const CpuIsa isa : Isas()) {
        SCOPED_TRACE(std::string(CpuIsaName(isa)) + " " + WeightFormatName(format) + " " +
                     std::to_string(shape.rows) + "x" + std::to_string(shape.cols) +
                     " m=" + std::to_string(m));
        std::vector<float> got(want.size(), -7.0f);
        MatmulRows(isa, w, x.data(), m, xs, r0, r1, got.data(), ys);
        for (int i = 0; i < m; ++i) {
          for (int64_t j = 0; j < ys; ++j) {
            const size_t at = static_cast<size_t>(i * ys + j);
            if (j >= r1 - r0) {
              ASSERT_EQ(got[at], -7.0f) << "wrote past the slice at row " << i << " col " << j;
              continue;
            }
            const double bound = 4e-7 * std::sqrt(double(shape.cols)) * magnitude[at] + 1e-30;
            ASSERT_NEAR(got[at], want[at], bound) << "y[" << i << "][" << j << "]";
          }
        }
      }
    }
  }
}

// Prefill multiplies many rows of x at once, decode one or two: a row of x must get the same
// bits either way (the engine's pages may not depend on how a prompt was chunked), across the
// paths a kernel picks by the number of rows and across tiles of W's rows.
TEST_P(CpuMatmulTest, ARowGetsTheSameBitsWhateverTheBatch) {
  const WeightFormat format = GetParam();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<Shape> shapes = ShapesFor(format);
  shapes.push_back({300, 576});   // several tiles of rows
  shapes.push_back({90, 1536});
  shapes.push_back({3, 66048});   // a row wider than a tile's budget: a tile of its own
  for (const Shape& shape : shapes) {
    const std::vector<uint8_t> bytes = RandomMatrix(format, shape.rows, shape.cols, rng);
    const WeightView w{format, shape.rows, shape.cols, bytes.data()};
    const int64_t r0 = shape.rows > 2 ? 1 : 0, r1 = shape.rows, n = r1 - r0;
    const int m = 41;
    const int64_t xs = shape.cols + 5;
    std::vector<float> x(static_cast<size_t>(m * xs));
    for (float& v : x) v = normal(rng);
    for (const CpuIsa isa : Isas()) {
      std::vector<float> alone(static_cast<size_t>(m * n));
      for (int i = 0; i < m; ++i) {
        MatmulRows(isa, w, x.data() + i * xs, 1, xs, r0, r1, alone.data() + i * n, n);
      }
      for (const int batch : {2, 3, 4, 5, 7, 16, 41}) {
        SCOPED_TRACE(std::string(CpuIsaName(isa)) + " " + WeightFormatName(format) + " " +
                     std::to_string(shape.rows) + "x" + std::to_string(shape.cols) +
                     " batch=" + std::to_string(batch));
        std::vector<float> together(alone.size(), -7.0f);
        for (int i0 = 0; i0 < m; i0 += batch) {
          MatmulRows(isa, w, x.data() + i0 * xs, std::min(batch, m - i0), xs, r0, r1,
                     together.data() + i0 * n, n);
        }
        for (size_t at = 0; at < alone.size(); ++at) {
          ASSERT_EQ(0, std::memcmp(&alone[at], &together[at], sizeof(float)))
              << "y[" << at / n << "][" << at % n << "]: " << together[at] << " batched, "
              << alone[at] << " alone";
        }
      }
    }
  }
}

TEST_P(CpuMatmulTest, DequantizeRowsIsTheLoadersDecodingBitForBit) {
  const WeightFormat format = GetParam();
  std::mt19937 rng(11);
  for (const Shape& shape : ShapesFor(format)) {
    const std::vector<uint8_t> bytes = RandomMatrix(format, shape.rows, shape.cols, rng);
    const WeightView w{format, shape.rows, shape.cols, bytes.data()};
    std::vector<float> want(static_cast<size_t>(shape.rows * shape.cols));
    ASSERT_TRUE(model::Dequantize(GgmlOf(format), bytes, want, "test").ok());
    const int64_t r0 = shape.rows / 3;
    for (const CpuIsa isa : Isas()) {
      SCOPED_TRACE(std::string(CpuIsaName(isa)) + " " + WeightFormatName(format) + " " +
                   std::to_string(shape.rows) + "x" + std::to_string(shape.cols));
      std::vector<float> got(static_cast<size_t>((shape.rows - r0) * shape.cols));
      DequantizeRows(isa, w, r0, shape.rows, got.data());
      ASSERT_EQ(0, std::memcmp(got.data(), want.data() + r0 * shape.cols, got.size() * 4));
    }
  }
}

TEST(CpuMatmulTest, RowBytesFollowTheBlockSizes) {
  EXPECT_EQ(WeightRowBytes(WeightFormat::kQ4_1, 576), 18 * 20);
  EXPECT_EQ(WeightRowBytes(WeightFormat::kQ4_0, 64), 2 * 18);
  EXPECT_EQ(WeightRowBytes(WeightFormat::kQ8_0, 96), 3 * 34);
  EXPECT_EQ(WeightRowBytes(WeightFormat::kBF16, 50), 100);
  EXPECT_EQ(WeightRowBytes(WeightFormat::kF32, 50), 200);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, CpuMatmulTest,
                         ::testing::Values(WeightFormat::kF32, WeightFormat::kF16,
                                           WeightFormat::kBF16, WeightFormat::kQ8_0,
                                           WeightFormat::kQ4_0, WeightFormat::kQ4_1),
                         [](const auto& info) {
                           return std::string(WeightFormatName(info.param));
                         });

}  // namespace
}  // namespace kvstrata::kernels::cpu
