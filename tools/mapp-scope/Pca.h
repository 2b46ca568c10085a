//===- Pca.h - two principal components of sketch rows ----------*- C++ -*-===//
#ifndef MAPP_SCOPE_PCA_H
#define MAPP_SCOPE_PCA_H

#include <vector>

namespace mapp::scope {

struct Pca2 {
  std::vector<double> x, y;  // projections of each row
  double explained[2] = {0, 0}; // fraction of total variance
};

/// Rows of `dim` values each (row-major); centres them and projects them on
/// the two leading eigenvectors of the covariance (power iteration with
/// deflation: dim is a sketch width, tens at most).
Pca2 pca2(const std::vector<double> &rows, int dim);

} // namespace mapp::scope

#endif
