#include "calibration/rotation_fit.h"

#include <Eigen/Eigenvalues>
#include <algorithm>
#include <numeric>

#include "kernels/rotation.h"

namespace kvstrata::calibration {

void AccumulateCovariance(const float* x, int64_t n, int d, std::vector<double>* cov) {
  cov->resize(static_cast<size_t>(d) * d, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    const float* row = x + t * d;
    for (int i = 0; i < d; ++i) {
      const double xi = row[i];
      double* out = cov->data() + static_cast<int64_t>(i) * d;
      for (int j = 0; j < d; ++j) out[j] += xi * row[j];
    }
  }
}

FittedRotation FitRotation(const std::vector<double>& cov, int d) {
  Eigen::MatrixXd c(d, d);
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) c(i, j) = 0.5 * (cov[i * d + j] + cov[j * d + i]);
  }
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver(c);
  const Eigen::VectorXd& values = solver.eigenvalues();  // ascending
  const Eigen::MatrixXd& vectors = solver.eigenvectors();
  std::vector<int> order(d);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return values(a) > values(b); });
  std::vector<double> u(static_cast<size_t>(d) * d);
  FittedRotation out;
  out.eigenvalues.resize(d);
  for (int k = 0; k < d; ++k) {
    out.eigenvalues[k] = values(order[k]);
    for (int i = 0; i < d; ++i) u[i * d + k] = vectors(i, order[k]);
  }
  out.rotation.resize(static_cast<size_t>(d) * d);
  kernels::ComposeRotation(u.data(), d, out.rotation.data());
  return out;
}

}  // namespace kvstrata::calibration
