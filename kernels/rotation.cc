#include "kernels/rotation.h"

#include <cmath>
#include <vector>

namespace kvstrata::kernels {

namespace {

template <typename T>
void Fwht(T* x, int n) {
  for (int len = 1; len < n; len <<= 1) {
    for (int i = 0; i < n; i += 2 * len) {
      for (int j = i; j < i + len; ++j) {
        const T a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
    }
  }
  const T norm = static_cast<T>(1.0 / std::sqrt(static_cast<double>(n)));
  for (int i = 0; i < n; ++i) x[i] *= norm;
}

int Log2(int d) {
  int bits = 0;
  while ((1 << bits) < d) ++bits;
  return bits;
}

}  // namespace

void FwhtNormalized(float* x, int n) { Fwht(x, n); }
void FwhtNormalized(double* x, int n) { Fwht(x, n); }

int BitReverse(int i, int bits) {
  int r = 0;
  for (int b = 0; b < bits; ++b) r |= ((i >> b) & 1) << (bits - 1 - b);
  return r;
}

void HadamardMatrix(int d, double* h) {
  const double norm = 1.0 / std::sqrt(static_cast<double>(d));
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) h[i * d + j] = (__builtin_popcount(i & j) & 1) ? -norm : norm;
  }
}

void ComposeRotation(const double* u, int d, float* r) {
  // Each row of U·H is the Hadamard transform of the corresponding row of U (H is symmetric).
  const int bits = Log2(d);
  std::vector<double> row(d);
  for (int i = 0; i < d; ++i) {
    for (int k = 0; k < d; ++k) row[k] = u[i * d + k];
    FwhtNormalized(row.data(), d);
    for (int k = 0; k < d; ++k) r[i * d + BitReverse(k, bits)] = static_cast<float>(row[k]);
  }
}

void ApplyRotation(const float* x, int64_t n, int d, const float* r, float* y) {
  std::vector<double> acc(d);
  for (int64_t t = 0; t < n; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const float* xr = x + t * d;
    for (int i = 0; i < d; ++i) {
      const double xi = xr[i];
      const float* rr = r + int64_t{i} * d;
      for (int j = 0; j < d; ++j) acc[j] += xi * rr[j];
    }
    for (int j = 0; j < d; ++j) y[t * d + j] = static_cast<float>(acc[j]);
  }
}

void ApplyRotationTransposed(const float* x, int64_t n, int d, const float* r, float* y) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * d;
    for (int j = 0; j < d; ++j) {
      const float* rr = r + int64_t{j} * d;
      double acc = 0;
      for (int i = 0; i < d; ++i) acc += double{xr[i]} * rr[i];
      y[t * d + j] = static_cast<float>(acc);
    }
  }
}

void IdentityRotation(int d, float* r) {
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) r[i * d + j] = i == j ? 1.0f : 0.0f;
  }
}

void RandomSignHadamard(int d, uint64_t seed, float* r) {
  // splitmix64: a fixed, portable generator so the baseline is reproducible everywhere.
  uint64_t state = seed;
  std::vector<double> h(int64_t{d} * d);
  HadamardMatrix(d, h.data());
  for (int j = 0; j < d; ++j) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const double sign = (z & 1) ? -1.0 : 1.0;
    for (int i = 0; i < d; ++i)
      r[int64_t{i} * d + j] = static_cast<float>(h[int64_t{i} * d + j] * sign);
  }
}

}  // namespace kvstrata::kernels
