#pragma once

// Rotations applied to keys and values before quantisation (docs/kv-format.md, "Rotations").
//
// Row vectors multiply on the right: k' = k·R_K and q' = q·R_K, so q·k is unchanged; values
// are stored as v·R_V and the attention output is multiplied by R_Vᵀ. OSCAR's composite is
// R = U·H·P: U holds the eigenvectors of the attention-aware covariance as columns (sorted by
// descending eigenvalue), H is the normalised Sylvester Walsh-Hadamard matrix and P the
// bit-reversal permutation that sends the i-th column to position bitrev(i).
//
// Matrices are dense row-major [d][d] with d a power of two.

#include <cstdint>

namespace kvstrata::kernels {

// In-place fast Walsh-Hadamard transform of x [n], scaled by 1/sqrt(n) so it is orthonormal
// (and its own inverse). n must be a power of two.
void FwhtNormalized(float* x, int n);
void FwhtNormalized(double* x, int n);

// Reverses the low `bits` bits of i.
int BitReverse(int i, int bits);

// H[i][j] = (-1)^popcount(i & j) / sqrt(d).
void HadamardMatrix(int d, double* h);

// R = U·H·P, with U [d][d] (eigenvectors as columns, sorted by descending eigenvalue).
void ComposeRotation(const double* u, int d, float* r);

// y [n][d] = x [n][d] · R [d][d]. x and y must not alias.
void ApplyRotation(const float* x, int64_t n, int d, const float* r, float* y);

// y [n][d] = x [n][d] · Rᵀ (the inverse of ApplyRotation for an orthogonal R).
void ApplyRotationTransposed(const float* x, int64_t n, int d, const float* r, float* y);

// Identity, written into r [d][d].
void IdentityRotation(int d, float* r);

// A seeded random orthogonal matrix of the form H·diag(s) with random signs s (the
// randomised Hadamard transform used by the TurboQuant-like baseline).
void RandomSignHadamard(int d, uint64_t seed, float* r);

}  // namespace kvstrata::kernels
