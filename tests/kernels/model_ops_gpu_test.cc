// GPU test: the forward pass's small kernels (kernels/cuda/model_ops.h) against plain CPU loops
// written here the way engine/cpu_backend.cc computes them. Skips itself without a CUDA device.

#include "kernels/cuda/model_ops.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/append.h"
#include "kernels/numeric.h"
#include "tests/kernels/gpu_test_util.h"

namespace kvstrata::kernels {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng) * scale;
  return v;
}

template <typename T>
std::vector<T> FromDevice(const T* d, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// An array of `type` read back as floats.
std::vector<float> ReadBack(const void* d, size_t n, GemmType type) {
  std::vector<float> out(n);
  if (type == GemmType::kFp32) {
    EXPECT_EQ(cudaMemcpy(out.data(), d, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  std::vector<uint16_t> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < n; ++i) out[i] = type == GemmType::kBf16 ? Bf16ToFloat(h[i]) : Fp16ToFloat(h[i]);
  return out;
}

// One rounding to the type: 2^-8 relative for BF16, 2^-11 for FP16; fp32 to summation order.
float Tolerance(GemmType type) {
  return type == GemmType::kBf16 ? 4e-3f : type == GemmType::kFp16 ? 6e-4f : 1e-5f;
}

// |a - b| <= tol · max(1, |b|), elementwise.
void ExpectNear(const std::vector<float>& a, const std::vector<float>& b, float tol,
                const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(std::fabs(a[i] - b[i]) <= tol * std::max(1.0f, std::fabs(b[i])))) {
      if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(ModelOpsGpu, RmsNormEmbeddingSwiGluAndConversions) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (GemmType type : {GemmType::kBf16, GemmType::kFp16, GemmType::kFp32}) {
    const int rows = 7, dim = 576;
    const std::vector<float> x = Random(rows * dim, 1, 3.0f), w = Random(dim, 2);
    std::vector<float> ref(rows * dim);
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += double{x[r * dim + i]} * x[r * dim + i];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + 1e-5));
      for (int i = 0; i < dim; ++i) ref[r * dim + i] = x[r * dim + i] * inv * w[i];
    }
    float* dx = ToDevice(x);
    float* dw = ToDevice(w);
    void* dy = nullptr;
    ASSERT_EQ(cudaMalloc(&dy, rows * dim * 4), cudaSuccess);
    ASSERT_EQ(RmsNormTo(dx, dim, rows, dim, dw, 1e-5f, dy, type, nullptr), cudaSuccess);
    ExpectNear(ReadBack(dy, rows * dim, type), ref, Tolerance(type), "RmsNormTo");

    // In place per head, with fp32 output.
    ASSERT_EQ(RmsNormInPlace(dx, rows * 9, 64, dw, 1e-5f, nullptr), cudaSuccess);
    std::vector<float> ref2 = x;
    for (int r = 0; r < rows * 9; ++r) {
      double ss = 0;
      for (int i = 0; i < 64; ++i) ss += double{x[r * 64 + i]} * x[r * 64 + i];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / 64 + 1e-5));
      for (int i = 0; i < 64; ++i) ref2[r * 64 + i] = x[r * 64 + i] * inv * w[i];
    }
    ExpectNear(FromDevice(dx, x.size()), ref2, 1e-5f, "RmsNormInPlace");

    // Embedding rows, including an id outside the table (zeros).
    const int vocab = 50, hidden = 96;
    const std::vector<float> table = Random(vocab * hidden, 3);
    std::vector<float> table_rounded;  // what the typed table holds
    void* dtable = nullptr;
    if (type == GemmType::kFp32) {
      table_rounded = table;
      dtable = ToDevice(table);
    } else {
      std::vector<uint16_t> h;
      for (float f : table) h.push_back(type == GemmType::kBf16 ? FloatToBf16(f) : FloatToFp16(f));
      for (uint16_t x : h) table_rounded.push_back(type == GemmType::kBf16 ? Bf16ToFloat(x) : Fp16ToFloat(x));
      dtable = ToDevice(h);
    }
    const std::vector<int32_t> ids = {0, 49, 7, 7, 50};
    int32_t* dids = ToDevice(ids);
    float* demb = nullptr;
    ASSERT_EQ(cudaMalloc(&demb, ids.size() * hidden * 4), cudaSuccess);
    ASSERT_EQ(EmbeddingGather(dtable, type, vocab, hidden, dids, 5, demb, nullptr), cudaSuccess);
    std::vector<float> ref3;
    for (int32_t id : ids) {
      for (int i = 0; i < hidden; ++i) ref3.push_back(id < vocab ? table_rounded[id * hidden + i] : 0.0f);
    }
    ExpectNear(FromDevice(demb, ref3.size()), ref3, 0.0f, "EmbeddingGather");

    // SwiGLU into half.
    const std::vector<float> gate = Random(rows * 100, 4, 2.0f), up = Random(rows * 100, 5);
    float* dg = ToDevice(gate);
    float* du = ToDevice(up);
    void* dact = nullptr;
    ASSERT_EQ(cudaMalloc(&dact, gate.size() * 4), cudaSuccess);
    ASSERT_EQ(SwiGluTo(dg, du, rows, 100, 100, dact, type, nullptr), cudaSuccess);
    std::vector<float> ref4;
    for (size_t i = 0; i < gate.size(); ++i) ref4.push_back(gate[i] / (1 + std::exp(-gate[i])) * up[i]);
    ExpectNear(ReadBack(dact, gate.size(), type), ref4, Tolerance(type), "SwiGluTo");
    // The same from one GEMM's [gate | up] rows: 40 of each per row, rows 80 apart.
    std::vector<float> ref5;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < 40; ++c) {
        const float g = gate[r * 80 + c], u = gate[r * 80 + 40 + c];
        ref5.push_back(g / (1 + std::exp(-g)) * u);
      }
    }
    ASSERT_EQ(SwiGluTo(dg, dg + 40, rows, 40, 80, dact, type, nullptr), cudaSuccess);
    ExpectNear(ReadBack(dact, ref5.size(), type), ref5, Tolerance(type), "SwiGluTo (strided)");
    EXPECT_EQ(SwiGluTo(dg, dg + 40, rows, 40, 39, dact, type, nullptr), cudaErrorInvalidValue);
    for (void* p : {static_cast<void*>(dx), static_cast<void*>(dw), dy, dtable,
                    static_cast<void*>(dids), static_cast<void*>(demb), static_cast<void*>(dg),
                    static_cast<void*>(du), dact}) {
      cudaFree(p);
    }
  }
}

// RmsNormTo and the typed row movers take a vectorised path for rows of a multiple of 4 values
// (the 8B model's 4,096, the default model's 576) and the element loop otherwise (570, or a row
// stride that breaks the 16-byte alignment): both against the CPU.
TEST(ModelOpsGpu, RmsNormAndRowMovesOnWideNarrowAndUnalignedRows) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    int rows, dim, stride;
  };
  for (const Shape& sh : {Shape{1, 4096, 4096}, Shape{3, 4096, 4100}, Shape{2, 576, 576},
                          Shape{2, 570, 570}, Shape{2, 576, 577}, Shape{1, 16384, 16384}}) {
    for (GemmType type : {GemmType::kBf16, GemmType::kFp16, GemmType::kFp32}) {
      const std::string what = std::to_string(sh.rows) + "x" + std::to_string(sh.dim) + " stride " +
                               std::to_string(sh.stride) + " type " +
                               std::to_string(static_cast<int>(type));
      const std::vector<float> x = Random(sh.rows * sh.stride, 21, 3.0f), w = Random(sh.dim, 22);
      std::vector<float> ref(sh.rows * sh.dim);
      for (int r = 0; r < sh.rows; ++r) {
        double ss = 0;
        for (int i = 0; i < sh.dim; ++i) ss += double{x[r * sh.stride + i]} * x[r * sh.stride + i];
        const float inv = static_cast<float>(1.0 / std::sqrt(ss / sh.dim + 1e-5));
        for (int i = 0; i < sh.dim; ++i) ref[r * sh.dim + i] = x[r * sh.stride + i] * inv * w[i];
      }
      float* dx = ToDevice(x);
      float* dw = ToDevice(w);
      void* dy = nullptr;
      ASSERT_EQ(cudaMalloc(&dy, sh.rows * sh.dim * 4), cudaSuccess);
      ASSERT_EQ(RmsNormTo(dx, sh.stride, sh.rows, sh.dim, dw, 1e-5f, dy, type, nullptr),
                cudaSuccess);
      ExpectNear(ReadBack(dy, sh.rows * sh.dim, type), ref, Tolerance(type), "RmsNormTo " + what);

      // Rows 2, 0 (and 1) of a (rows + 2) x dim matrix gathered, rounded once, and put back.
      const int all = sh.rows + 2;
      const std::vector<float> m = Random(all * sh.dim, 23, 5.0f);
      std::vector<int32_t> ids = {2, 0, 1};
      ids.resize(sh.rows);
      float* dm = ToDevice(m);
      int32_t* dids = ToDevice(ids);
      void* dg = nullptr;
      void* ds = nullptr;
      ASSERT_EQ(cudaMalloc(&dg, sh.rows * sh.dim * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&ds, all * sh.dim * 4), cudaSuccess);
      ASSERT_EQ(cudaMemset(ds, 0, all * sh.dim * 4), cudaSuccess);
      ASSERT_EQ(GatherRowsTo(dm, sh.dim, dids, sh.rows, dg, type, nullptr), cudaSuccess);
      std::vector<float> gathered_ref;
      for (int r = 0; r < sh.rows; ++r) {
        for (int i = 0; i < sh.dim; ++i) gathered_ref.push_back(m[ids[r] * sh.dim + i]);
      }
      ExpectNear(ReadBack(dg, gathered_ref.size(), type), gathered_ref, Tolerance(type),
                 "GatherRowsTo " + what);
      // Scatter the fp32 rows of m's first `rows` rows to rows ids of a zeroed matrix.
      ASSERT_EQ(ScatterRowsTo(dm, sh.dim, dids, sh.rows, ds, type, nullptr), cudaSuccess);
      std::vector<float> scattered_ref(all * sh.dim, 0.0f);
      for (int r = 0; r < sh.rows; ++r) {
        for (int i = 0; i < sh.dim; ++i) scattered_ref[ids[r] * sh.dim + i] = m[r * sh.dim + i];
      }
      ExpectNear(ReadBack(ds, scattered_ref.size(), type), scattered_ref, Tolerance(type),
                 "ScatterRowsTo " + what);
      for (void* p : {static_cast<void*>(dx), static_cast<void*>(dw), dy, static_cast<void*>(dm),
                      static_cast<void*>(dids), dg, ds}) {
        cudaFree(p);
      }
    }
  }
}

TEST(ModelOpsGpu, RopeBothLayoutsAndBias) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (int d : {64, 128}) {
    for (bool interleaved : {false, true}) {
      const int tokens = 5, heads = 3;
      const std::vector<int32_t> pos = {0, 1, 63, 4095, 131071};
      std::vector<float> x = Random(tokens * heads * d, 6);
      const float theta = 500000.0f;
      std::vector<float> ref = x;
      for (int t = 0; t < tokens; ++t) {
        for (int h = 0; h < heads; ++h) {
          float* v = ref.data() + (t * heads + h) * d;
          for (int i = 0; i < d / 2; ++i) {
            const float inv = static_cast<float>(std::pow(double{theta}, -2.0 * i / d));
            const double angle = static_cast<double>(pos[t]) * inv;
            const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
            float* a = interleaved ? v + 2 * i : v + i;
            float* b = interleaved ? v + 2 * i + 1 : v + i + d / 2;
            const float x0 = *a, x1 = *b;
            *a = x0 * c - x1 * s;
            *b = x0 * s + x1 * c;
          }
        }
      }
      int32_t* dpos = ToDevice(pos);
      float* dx = ToDevice(x);
      float *dcos = nullptr, *dsin = nullptr;
      ASSERT_EQ(cudaMalloc(&dcos, tokens * d / 2 * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dsin, tokens * d / 2 * 4), cudaSuccess);
      ASSERT_EQ(RopeTables(dpos, tokens, d, theta, dcos, dsin, nullptr), cudaSuccess);
      ASSERT_EQ(ApplyRope(dx, tokens, heads, d, dcos, dsin, interleaved, nullptr), cudaSuccess);
      ExpectNear(FromDevice(dx, x.size()), ref, 1e-5f, "ApplyRope");
      const std::vector<float> bias = Random(heads * d, 7);
      ASSERT_EQ(AddBias(dx, tokens, heads * d, ToDevice(bias), nullptr), cudaSuccess);
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += bias[i % (heads * d)];
      ExpectNear(FromDevice(dx, x.size()), ref, 1e-5f, "AddBias");
      cudaFree(dpos);
      cudaFree(dx);
      cudaFree(dcos);
      cudaFree(dsin);
    }
  }
}

// SplitQkvHeads against the steps it replaces, written out here in double: bias, RMS norm per
// head, RoPE, from one [q | k | v] row per token.
TEST(ModelOpsGpu, SplitQkvHeadsIsBiasNormAndRope) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (int d : {64, 128, 256}) {
    for (bool interleaved : {false, true}) {
      for (bool with_bias_and_norm : {false, true}) {
        const int tokens = 5, qh = 6, kvh = 2, heads = qh + 2 * kvh;
        const std::vector<int32_t> pos = {0, 1, 63, 4095, 131071};
        const float theta = 1000000.0f, eps = 1e-6f;
        const std::vector<float> qkv = Random(tokens * heads * d, 20, 2.0f);
        const std::vector<float> bias = Random(heads * d, 21), qn = Random(d, 22), kn = Random(d, 23);
        std::vector<float> ref_q(tokens * qh * d), ref_k(tokens * kvh * d), ref_v(tokens * kvh * d);
        for (int t = 0; t < tokens; ++t) {
          for (int h = 0; h < heads; ++h) {
            std::vector<double> x(d);
            for (int i = 0; i < d; ++i) {
              x[i] = qkv[(t * heads + h) * d + i] + (with_bias_and_norm ? bias[h * d + i] : 0.0f);
            }
            const bool is_v = h >= qh + kvh;
            if (!is_v && with_bias_and_norm) {
              double ss = 0;
              for (double e : x) ss += e * e;
              const double inv = 1.0 / std::sqrt(ss / d + eps);
              for (int i = 0; i < d; ++i) x[i] *= inv * (h < qh ? qn[i] : kn[i]);
            }
            if (!is_v) {
              std::vector<double> y = x;
              for (int i = 0; i < d / 2; ++i) {
                const float inv = static_cast<float>(std::pow(double{theta}, -2.0 * i / d));
                const double angle = static_cast<double>(pos[t]) * inv;
                const double c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
                const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + d / 2;
                y[a] = x[a] * c - x[b] * s;
                y[b] = x[a] * s + x[b] * c;
              }
              x = y;
            }
            float* dst = h < qh ? &ref_q[(t * qh + h) * d]
                         : is_v ? &ref_v[(t * kvh + h - qh - kvh) * d]
                                : &ref_k[(t * kvh + h - qh) * d];
            for (int i = 0; i < d; ++i) dst[i] = static_cast<float>(x[i]);
          }
        }
        int32_t* dpos = ToDevice(pos);
        float* dqkv = ToDevice(qkv);
        float* dbias = ToDevice(bias);
        float* dqn = ToDevice(qn);
        float* dkn = ToDevice(kn);
        float *dcos = nullptr, *dsin = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
        ASSERT_EQ(cudaMalloc(&dcos, tokens * d / 2 * 4), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dsin, tokens * d / 2 * 4), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dq, ref_q.size() * 4), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dk, ref_k.size() * 4), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dv, ref_v.size() * 4), cudaSuccess);
        ASSERT_EQ(RopeTables(dpos, tokens, d, theta, dcos, dsin, nullptr), cudaSuccess);
        QkvHeadsParams p;
        p.qkv = dqkv;
        p.tokens = tokens;
        p.q_heads = qh;
        p.kv_heads = kvh;
        p.head_dim = d;
        if (with_bias_and_norm) {
          p.bq = dbias;
          p.bk = dbias + qh * d;
          p.bv = dbias + (qh + kvh) * d;
          p.q_norm = dqn;
          p.k_norm = dkn;
        }
        p.eps = eps;
        p.cos = dcos;
        p.sin = dsin;
        p.interleaved = interleaved;
        p.q = dq;
        p.k = dk;
        p.v = dv;
        ASSERT_EQ(SplitQkvHeads(p, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ExpectNear(FromDevice(dq, ref_q.size()), ref_q, 2e-5f, "q");
        ExpectNear(FromDevice(dk, ref_k.size()), ref_k, 2e-5f, "k");
        ExpectNear(FromDevice(dv, ref_v.size()), ref_v, 2e-5f, "v");
        // The folded writes of a decode step: K/V rows into BF16 pages and q in BF16, the same
        // bytes as AppendRotatedRows (identity rotations) and GatherRowsTo from the fp32 rows
        // (the cache's head_dims).
        if (d <= 128) {
          const KvGeometry g{.num_layers = 1, .num_kv_heads = kvh, .head_dim = d, .group_size = d};
          const int64_t stride = PageBytes(g, PageEncoding::kBf16);
          const std::vector<int32_t> slot = {2, 0, 2, 1, 3}, row = {5, 63, 6, 0, 17};
          const size_t pool_bytes = static_cast<size_t>(4 * stride);
          const std::vector<uint8_t> zeros(pool_bytes, 0);
          uint8_t* pool_fold = ToDevice(zeros);
          uint8_t* pool_ref = ToDevice(zeros);
          uint16_t* q_fold = ToDevice(std::vector<uint16_t>(ref_q.size(), 0));
          uint16_t* q_ref = ToDevice(std::vector<uint16_t>(ref_q.size(), 0));
          int32_t* dslot = ToDevice(slot);
          int32_t* drow = ToDevice(row);
          std::vector<int32_t> ids(tokens);
          for (int t = 0; t < tokens; ++t) ids[t] = t;
          int32_t* dids = ToDevice(ids);
          QkvHeadsParams f = p;
          f.bf16_pool = pool_fold;
          f.slot_stride = stride;
          f.slot = dslot;
          f.row = drow;
          f.geometry = g;
          f.q_bf16 = q_fold;
          ASSERT_EQ(SplitQkvHeads(f, nullptr), cudaSuccess);
          AppendParams a;
          a.k_f32 = dk;
          a.v_f32 = dv;
          a.num_tokens = tokens;
          a.slot = dslot;
          a.row = drow;
          a.bf16_pool = pool_ref;
          a.slot_stride = stride;
          a.geometry = g;
          ASSERT_EQ(AppendRotatedRows(a, nullptr), cudaSuccess);
          ASSERT_EQ(GatherRowsTo(dq, qh * d, dids, tokens, q_ref, GemmType::kBf16, nullptr),
                    cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_EQ(FromDevice(pool_fold, pool_bytes), FromDevice(pool_ref, pool_bytes))
              << "pages, head_dim " << d;
          EXPECT_EQ(FromDevice(q_fold, ref_q.size()), FromDevice(q_ref, ref_q.size()))
              << "queries, head_dim " << d;
          QkvHeadsParams bad = f;
          bad.row = nullptr;
          EXPECT_EQ(SplitQkvHeads(bad, nullptr), cudaErrorInvalidValue);
          for (void* ptr :
               {static_cast<void*>(pool_fold), static_cast<void*>(pool_ref),
                static_cast<void*>(q_fold), static_cast<void*>(q_ref), static_cast<void*>(dslot),
                static_cast<void*>(drow), static_cast<void*>(dids)}) {
            cudaFree(ptr);
          }
        }
        // One norm without the other is refused, as is a head_dim the kernel has no form for.
        QkvHeadsParams bad = p;
        bad.k_norm = nullptr;
        bad.q_norm = dqn;
        EXPECT_EQ(SplitQkvHeads(bad, nullptr), cudaErrorInvalidValue);
        bad = p;
        bad.head_dim = 96;
        EXPECT_EQ(SplitQkvHeads(bad, nullptr), cudaErrorInvalidValue);
        for (void* ptr : {static_cast<void*>(dpos), static_cast<void*>(dqkv),
                          static_cast<void*>(dbias), static_cast<void*>(dqn),
                          static_cast<void*>(dkn), static_cast<void*>(dcos),
                          static_cast<void*>(dsin), static_cast<void*>(dq), static_cast<void*>(dk),
                          static_cast<void*>(dv)}) {
          cudaFree(ptr);
        }
      }
    }
  }
}

TEST(ModelOpsGpu, RotateHeadsAndRowMoves) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (int d : {64, 128}) {
    for (int group : {1, 3, 4, 8}) {
      const int kv = 2, heads = kv * group, rows = 13;
      const std::vector<float> x = Random(rows * heads * d, 8), R = Random(kv * d * d, 9, 0.1f);
      for (bool transpose : {false, true}) {
        std::vector<float> ref(x.size());
        for (int r = 0; r < rows; ++r) {
          for (int h = 0; h < heads; ++h) {
            const float* m = R.data() + (h / group) * d * d;
            for (int c = 0; c < d; ++c) {
              double acc = 0;
              for (int i = 0; i < d; ++i) {
                acc += double{x[(r * heads + h) * d + i]} * (transpose ? m[c * d + i] : m[i * d + c]);
              }
              ref[(r * heads + h) * d + c] = static_cast<float>(acc);
            }
          }
        }
        float* dx = ToDevice(x);
        float* dR = ToDevice(R);
        float* dout = nullptr;
        ASSERT_EQ(cudaMalloc(&dout, x.size() * 4), cudaSuccess);
        ASSERT_EQ(RotateHeads(dx, rows, heads, d, dR, group, transpose, dout, nullptr), cudaSuccess);
        ExpectNear(FromDevice(dout, x.size()), ref, 1e-4f, "RotateHeads");
        for (GemmType t : {GemmType::kBf16, GemmType::kFp16}) {
          ASSERT_EQ(RotateHeadsTo(dx, rows, heads, d, dR, group, transpose, dout, t, nullptr),
                    cudaSuccess);
          ExpectNear(ReadBack(dout, x.size(), t), ref, Tolerance(t) + 1e-4f, "RotateHeadsTo");
        }
        cudaFree(dx);
        cudaFree(dR);
        cudaFree(dout);
      }
    }
  }
  // Gather then scatter back is the identity on the rows chosen.
  const std::vector<float> m = Random(10 * 33, 10);
  const std::vector<int32_t> rows = {9, 0, 4};
  float* dm = ToDevice(m);
  int32_t* dr = ToDevice(rows);
  float *dg = nullptr, *ds = nullptr;
  ASSERT_EQ(cudaMalloc(&dg, rows.size() * 33 * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ds, m.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(ds, 0, m.size() * 4), cudaSuccess);
  ASSERT_EQ(GatherRows(dm, 33, dr, 3, dg, nullptr), cudaSuccess);
  ASSERT_EQ(ScatterRows(dg, 33, dr, 3, ds, nullptr), cudaSuccess);
  const std::vector<float> back = FromDevice(ds, m.size());
  for (int r = 0; r < 10; ++r) {
    const bool chosen = r == 9 || r == 0 || r == 4;
    for (int c = 0; c < 33; ++c) EXPECT_EQ(back[r * 33 + c], chosen ? m[r * 33 + c] : 0.0f);
  }
  // GatherRowsTo rounds the gathered rows once.
  uint16_t* dgh = nullptr;
  ASSERT_EQ(cudaMalloc(&dgh, rows.size() * 33 * 2), cudaSuccess);
  ASSERT_EQ(GatherRowsTo(dm, 33, dr, 3, dgh, GemmType::kBf16, nullptr), cudaSuccess);
  const std::vector<uint16_t> gathered = FromDevice(dgh, rows.size() * 33);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int c = 0; c < 33; ++c) {
      EXPECT_EQ(gathered[r * 33 + c], FloatToBf16(m[rows[r] * 33 + c])) << r << "," << c;
    }
  }
  // ScatterRowsTo puts them back, rounded, and leaves the other rows.
  uint16_t* dsh = nullptr;
  ASSERT_EQ(cudaMalloc(&dsh, m.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(dsh, 0, m.size() * 2), cudaSuccess);
  ASSERT_EQ(ScatterRowsTo(dg, 33, dr, 3, dsh, GemmType::kFp16, nullptr), cudaSuccess);
  const std::vector<uint16_t> scattered = FromDevice(dsh, m.size());
  for (int r = 0; r < 10; ++r) {
    const bool chosen = r == 9 || r == 0 || r == 4;
    for (int c = 0; c < 33; ++c) {
      EXPECT_EQ(scattered[r * 33 + c], chosen ? FloatToFp16(m[r * 33 + c]) : 0) << r << "," << c;
    }
  }
  cudaFree(dgh);
  cudaFree(dsh);
  // ConvertFloat rounds as the CPU conversions (and copies fp32).
  std::vector<float> f = Random(1000, 11, 100.0f);
  float* df = ToDevice(f);
  uint16_t* dh = nullptr;
  ASSERT_EQ(cudaMalloc(&dh, f.size() * 4), cudaSuccess);
  for (GemmType t : {GemmType::kBf16, GemmType::kFp16}) {
    ASSERT_EQ(ConvertFloat(df, static_cast<int64_t>(f.size()), dh, t, nullptr), cudaSuccess);
    const std::vector<uint16_t> h = FromDevice(dh, f.size());
    for (size_t i = 0; i < f.size(); ++i) {
      EXPECT_EQ(h[i], t == GemmType::kBf16 ? FloatToBf16(f[i]) : FloatToFp16(f[i]));
    }
  }
  ASSERT_EQ(ConvertFloat(df, static_cast<int64_t>(f.size()), dh, GemmType::kFp32, nullptr),
            cudaSuccess);
  EXPECT_EQ(ReadBack(dh, f.size(), GemmType::kFp32), f);
  cudaFree(dm);
  cudaFree(dr);
  cudaFree(dg);
  cudaFree(ds);
  cudaFree(df);
  cudaFree(dh);
}

}  // namespace
}  // namespace kvstrata::kernels
