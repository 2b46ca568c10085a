//===- Pca.cpp - power-iteration PCA --------------------------------------===//
#include "Pca.h"

#include <cmath>

using namespace mapp::scope;

Pca2 mapp::scope::pca2(const std::vector<double> &rows, int dim) {
  Pca2 out;
  size_t n = dim ? rows.size() / dim : 0;
  if (n == 0)
    return out;
  std::vector<double> mean(dim, 0), c(dim * dim, 0);
  for (size_t r = 0; r < n; ++r)
    for (int i = 0; i < dim; ++i)
      mean[i] += rows[r * dim + i] / n;
  for (size_t r = 0; r < n; ++r)
    for (int i = 0; i < dim; ++i)
      for (int j = 0; j < dim; ++j)
        c[i * dim + j] += (rows[r * dim + i] - mean[i]) *
                          (rows[r * dim + j] - mean[j]) / n;
  double total = 0;
  for (int i = 0; i < dim; ++i)
    total += c[i * dim + i];
  std::vector<std::vector<double>> comps;
  for (int k = 0; k < 2; ++k) {
    // Deterministic start vector so the same data gives the same picture.
    std::vector<double> v(dim), w(dim);
    for (int i = 0; i < dim; ++i)
      v[i] = 1.0 + 0.1 * i;
    double lambda = 0;
    for (int it = 0; it < 500; ++it) {
      for (int i = 0; i < dim; ++i) {
        w[i] = 0;
        for (int j = 0; j < dim; ++j)
          w[i] += c[i * dim + j] * v[j];
      }
      double norm = 0;
      for (double x : w)
        norm += x * x;
      norm = std::sqrt(norm);
      if (norm == 0)
        break;
      for (int i = 0; i < dim; ++i)
        v[i] = w[i] / norm;
      lambda = norm;
    }
    // Sign convention: the largest-magnitude entry is positive.
    int big = 0;
    for (int i = 1; i < dim; ++i)
      if (std::fabs(v[i]) > std::fabs(v[big]))
        big = i;
    if (v[big] < 0)
      for (double &x : v)
        x = -x;
    out.explained[k] = total > 0 ? lambda / total : 0;
    for (int i = 0; i < dim; ++i)
      for (int j = 0; j < dim; ++j)
        c[i * dim + j] -= lambda * v[i] * v[j];
    comps.push_back(v);
  }
  for (size_t r = 0; r < n; ++r) {
    double a = 0, b = 0;
    for (int i = 0; i < dim; ++i) {
      double d = rows[r * dim + i] - mean[i];
      a += d * comps[0][i];
      b += d * comps[1][i];
    }
    out.x.push_back(a);
    out.y.push_back(b);
  }
  return out;
}
