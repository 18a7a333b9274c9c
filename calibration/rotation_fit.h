#pragma once

// Fitting the composite rotation R = U·H·P from an attention-aware covariance. The covariances
// themselves (the query covariance for keys, the score-weighted value covariance for values)
// are accumulated by the calibration command; this is the part they share.

#include <cstdint>
#include <vector>

namespace kvstrata::calibration {

// Accumulates C += Σ_t x_t x_tᵀ over rows x [n][d], in float64. cov is [d][d] row-major.
void AccumulateCovariance(const float* x, int64_t n, int d, std::vector<double>* cov);

struct FittedRotation {
  std::vector<float> rotation;      // [d][d], R = U·H·P
  std::vector<double> eigenvalues;  // descending
};

// Symmetrises cov [d][d], takes its eigenvectors sorted by descending eigenvalue as the columns
// of U, and composes R = U·H·P (kernels/rotation.h). d must be a power of two.
FittedRotation FitRotation(const std::vector<double>& cov, int d);

}  // namespace kvstrata::calibration
