// Adafactor as Marek et al. run it (optim/adafactor.py documents the rule) on CPU tensors, in the
// fewest sweeps its arithmetic allows: the update u of an element needs the whole tensor's rms of
// u (the block-RMS clip) and of p (the parameter-scale factor), so u is computed twice, never
// stored. A factored matrix: one sweep over g for its row means and column sums of g*g + eps,
// then (the optimizer folds them into its row and column statistics) one over p and g for the two
// sums of squares, one that writes p. A vector (or a matrix too small to factor): one sweep that
// updates v and takes the sums, one that writes p. optim/backends/reference.py is the torch
// reference these kernels are tested against: each element's operations are its operations in its
// order, rounded where it rounds (in float32, or float64 for float64 parameters: the state's
// dtype); the sums are taken in double (so that their order hardly matters: a bfloat16 parameter
// steps as its float32 copy), not in torch's order, so they differ from its sums by rounding.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common.h"

namespace {

template <typename scalar_t>
using raw_t = typename Storage<scalar_t>::raw;
// The compute (and state) type of a parameter's dtype: double for double, else float.
template <typename scalar_t>
using op_type = typename Storage<scalar_t>::op_t;

at::ScalarType compute_type(const at::Tensor& p) {
  return p.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// p and g: contiguous CPU tensors of one dtype and shape.
void check_pair(const at::Tensor& p, const at::Tensor& g) {
  check_like(p, p, "adafactor");
  check_like(p, g, "adafactor");
}

void check_state(const at::Tensor& p, const at::Tensor& t, int64_t numel) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == compute_type(p) && t.numel() == numel,
              "adafactor: its state must be contiguous CPU tensors of the compute dtype");
}

void check_factors(const at::Tensor& p, const at::Tensor& g, const at::Tensor& row, const at::Tensor& col) {
  check_pair(p, g);
  TORCH_CHECK(p.dim() == 2, "adafactor: a factored parameter is a matrix");
  check_state(p, row, p.size(0));
  check_state(p, col, p.size(1));
}

// g*g + eps (optax's 1e-30: optim/backends/common.py), as the reference rounds it: the square, then the sum.
template <typename op_t>
inline op_t squared(op_t g, op_t eps) {
  return (g * g) + eps;
}

// A factored matrix's direction: g times the first factor, then the second, each rounded
// (``rows_first``: the row's factor r first, else the column's c).
template <bool RowsFirst, typename op_t>
inline op_t factored_direction(op_t g, op_t r, op_t c) {
  return RowsFirst ? (g * r) * c : (g * c) * r;
}

// An unfactored tensor's direction: u = rsqrt(v) * g, torch's CPU rsqrt being 1 / sqrt.
template <typename op_t>
inline op_t unfactored_direction(op_t g, op_t v) {
  return (op_t(1) / std::sqrt(v)) * g;
}

// p + ((u / divisor) * -lr) * scale, each product rounded, the sum rounded to the compute type.
template <typename op_t>
inline op_t stepped(op_t p, op_t u, op_t divisor, op_t neg_lr, op_t scale) {
  return p + ((u / divisor) * neg_lr) * scale;
}

// Row i of sweep 1: its mean of g*g + eps into R[i], each term added to its column's sum in ``cols``.
template <typename scalar_t>
void statistics_row(const raw_t<scalar_t>* __restrict G, int64_t n, op_type<scalar_t> eps, op_type<scalar_t>& mean,
                    double* __restrict cols) {
  using S = Storage<scalar_t>;
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    const double s = squared(S::load(G[j]), eps);
    sum += s;
    cols[j] += s;
  }
  mean = op_type<scalar_t>(sum / double(n));
}

// Row i of sweep 2 (factored): sum(u*u) and sum(p*p) over its elements.
template <bool RowsFirst, typename scalar_t>
void factored_sums_row(const raw_t<scalar_t>* __restrict P, const raw_t<scalar_t>* __restrict G,
                       const op_type<scalar_t>* __restrict C, op_type<scalar_t> r, int64_t n, double& u2, double& p2) {
  using S = Storage<scalar_t>;
  double a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
  for (int64_t j = 0; j < n; ++j) {
    const auto u = factored_direction<RowsFirst>(S::load(G[j]), r, C[j]);
    const auto pj = S::load(P[j]);
    a += double(u) * double(u);
    b += double(pj) * double(pj);
  }
  u2 += a;
  p2 += b;
}

// Row i of sweep 3 (factored): p += ((u / divisor) * -lr) * scale.
template <bool RowsFirst, typename scalar_t>
void factored_apply_row(raw_t<scalar_t>* __restrict P, const raw_t<scalar_t>* __restrict G,
                        const op_type<scalar_t>* __restrict C, op_type<scalar_t> r, int64_t n, op_type<scalar_t> divisor,
                        op_type<scalar_t> neg_lr, op_type<scalar_t> scale) {
  using S = Storage<scalar_t>;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j)
    P[j] = S::store(stepped(S::load(P[j]), factored_direction<RowsFirst>(S::load(G[j]), r, C[j]), divisor, neg_lr,
                            scale));
}

// Elements [0, n) of sweep 1 (unfactored): v = v * beta + w * (g*g + eps), torch's ``add`` with an
// alpha a fused multiply-add; then sum(u*u) and sum(p*p).
template <typename scalar_t>
void unfactored_sums_span(const raw_t<scalar_t>* __restrict P, const raw_t<scalar_t>* __restrict G,
                          op_type<scalar_t>* __restrict V, int64_t n, op_type<scalar_t> beta, op_type<scalar_t> w,
                          op_type<scalar_t> eps, double& u2, double& p2) {
  using S = Storage<scalar_t>;
  double a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
  for (int64_t j = 0; j < n; ++j) {
    const auto gj = S::load(G[j]), pj = S::load(P[j]);
    const auto vj = std::fma(squared(gj, eps), w, V[j] * beta);
    V[j] = vj;
    const auto u = unfactored_direction(gj, vj);
    a += double(u) * double(u);
    b += double(pj) * double(pj);
  }
  u2 += a;
  p2 += b;
}

// Elements [0, n) of sweep 2 (unfactored): p += ((u / divisor) * -lr) * scale, u from the updated v.
template <typename scalar_t>
void unfactored_apply_span(raw_t<scalar_t>* __restrict P, const raw_t<scalar_t>* __restrict G,
                           const op_type<scalar_t>* __restrict V, int64_t n, op_type<scalar_t> divisor,
                           op_type<scalar_t> neg_lr, op_type<scalar_t> scale) {
  using S = Storage<scalar_t>;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j)
    P[j] = S::store(stepped(S::load(P[j]), unfactored_direction(S::load(G[j]), V[j]), divisor, neg_lr, scale));
}

// The two sums of squares, ``body(begin, end, u2, p2)`` accumulating per thread in double, as a
// (2,) tensor of the compute dtype.
template <typename op_t, typename Body>
at::Tensor sums_of_squares(const at::Tensor& p, int64_t n, int64_t grain, const Body& body) {
  const int64_t threads = at::get_num_threads();
  std::vector<double> partial(2 * threads, 0.0);
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    double u2 = 0, p2 = 0;
    body(begin, end, u2, p2);
    partial[2 * at::get_thread_num()] += u2;
    partial[2 * at::get_thread_num() + 1] += p2;
  });
  double u2 = 0, p2 = 0;
  for (int64_t t = 0; t < threads; ++t) {
    u2 += partial[2 * t];
    p2 += partial[2 * t + 1];
  }
  at::Tensor out = at::empty({2}, p.options().dtype(compute_type(p)));
  out.data_ptr<op_t>()[0] = op_t(u2);
  out.data_ptr<op_t>()[1] = op_t(p2);
  return out;
}

int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)); }

// Sweep 1 of a factored matrix: the mean of each row and the sum of each column of g*g + eps, in
// double; returned in the compute dtype (the reference's ``s.mean(dim=1)`` and ``s.sum(dim=0)``).
std::vector<at::Tensor> adafactor_statistics(const at::Tensor& g, double eps) {
  TORCH_CHECK(g.device().is_cpu() && g.is_contiguous() && g.dim() == 2,
              "adafactor_statistics: g must be a contiguous CPU matrix");
  const int64_t rows = g.size(0), cols = g.size(1), threads = at::get_num_threads();
  at::Tensor row_means = at::empty({rows}, g.options().dtype(compute_type(g)));
  at::Tensor col_sums = at::empty({cols}, g.options().dtype(compute_type(g)));
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, g.scalar_type(), "adafactor_statistics", [&] {
    using op_t = op_type<scalar_t>;
    const auto G = raw_ptr<scalar_t>(g);
    op_t* R = row_means.data_ptr<op_t>();
    std::vector<double> partial(threads * cols, 0.0);
    at::parallel_for(0, rows, row_grain(cols), [&](int64_t begin, int64_t end) {
      double* mine = partial.data() + at::get_thread_num() * cols;
      for (int64_t i = begin; i < end; ++i) statistics_row<scalar_t>(G + i * cols, cols, op_t(eps), R[i], mine);
    });
    op_t* C = col_sums.data_ptr<op_t>();
    for (int64_t j = 0; j < cols; ++j) {
      double sum = 0;
      for (int64_t t = 0; t < threads; ++t) sum += partial[t * cols + j];
      C[j] = op_t(sum);
    }
  });
  return {row_means, col_sums};
}

// Sweep 2 of a factored matrix: sum(u*u), sum(p*p).
at::Tensor adafactor_factored_sums(const at::Tensor& p, const at::Tensor& g, const at::Tensor& row,
                                   const at::Tensor& col, bool rows_first) {
  check_factors(p, g, row, col);
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, p.scalar_type(), "adafactor_factored_sums", [&] {
    using op_t = op_type<scalar_t>;
    const auto P = raw_ptr<scalar_t>(p);
    const auto G = raw_ptr<scalar_t>(g);
    const op_t* R = row.data_ptr<op_t>();
    const op_t* C = col.data_ptr<op_t>();
    const int64_t cols = p.size(1);
    out = sums_of_squares<op_t>(p, p.size(0), row_grain(cols), [&](int64_t begin, int64_t end, double& u2, double& p2) {
      for (int64_t i = begin; i < end; ++i) {
        if (rows_first) {
          factored_sums_row<true, scalar_t>(P + i * cols, G + i * cols, C, R[i], cols, u2, p2);
        } else {
          factored_sums_row<false, scalar_t>(P + i * cols, G + i * cols, C, R[i], cols, u2, p2);
        }
      }
    });
  });
  return out;
}

// Sweep 3 of a factored matrix: p += ((u / divisor) * -lr) * scale.
void adafactor_factored_apply(at::Tensor p, const at::Tensor& g, const at::Tensor& row, const at::Tensor& col,
                              bool rows_first, double divisor, double lr, double scale) {
  check_factors(p, g, row, col);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, p.scalar_type(), "adafactor_factored_apply", [&] {
    using op_t = op_type<scalar_t>;
    auto P = raw_ptr<scalar_t>(p);
    const auto G = raw_ptr<scalar_t>(g);
    const op_t* R = row.data_ptr<op_t>();
    const op_t* C = col.data_ptr<op_t>();
    const int64_t cols = p.size(1);
    at::parallel_for(0, p.size(0), row_grain(cols), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (rows_first) {
          factored_apply_row<true, scalar_t>(P + i * cols, G + i * cols, C, R[i], cols, op_t(divisor), op_t(-lr),
                                             op_t(scale));
        } else {
          factored_apply_row<false, scalar_t>(P + i * cols, G + i * cols, C, R[i], cols, op_t(divisor), op_t(-lr),
                                              op_t(scale));
        }
      }
    });
  });
}

// Sweep 1 of an unfactored tensor: v updated, then sum(u*u), sum(p*p).
at::Tensor adafactor_unfactored_sums(const at::Tensor& p, const at::Tensor& g, at::Tensor v, double beta, double w,
                                     double eps) {
  check_pair(p, g);
  check_state(p, v, p.numel());
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, p.scalar_type(), "adafactor_unfactored_sums", [&] {
    using op_t = op_type<scalar_t>;
    const auto P = raw_ptr<scalar_t>(p);
    const auto G = raw_ptr<scalar_t>(g);
    op_t* V = v.data_ptr<op_t>();
    out = sums_of_squares<op_t>(p, p.numel(), kGrain, [&](int64_t begin, int64_t end, double& u2, double& p2) {
      for (int64_t b = begin; b < end; b += kSpan) {
        unfactored_sums_span<scalar_t>(P + b, G + b, V + b, std::min(kSpan, end - b), op_t(beta), op_t(w),
                                       op_t(eps), u2, p2);
      }
    });
  });
  return out;
}

// Sweep 2 of an unfactored tensor: p += ((u / divisor) * -lr) * scale.
void adafactor_unfactored_apply(at::Tensor p, const at::Tensor& g, const at::Tensor& v, double divisor, double lr,
                                double scale) {
  check_pair(p, g);
  check_state(p, v, p.numel());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, p.scalar_type(), "adafactor_unfactored_apply", [&] {
    using op_t = op_type<scalar_t>;
    auto P = raw_ptr<scalar_t>(p);
    const auto G = raw_ptr<scalar_t>(g);
    const op_t* V = v.data_ptr<op_t>();
    at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
      unfactored_apply_span<scalar_t>(P + begin, G + begin, V + begin, end - begin, op_t(divisor), op_t(-lr),
                                      op_t(scale));
    });
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nanomerit, lib) {
  lib.def("adafactor_statistics(Tensor g, float eps) -> Tensor[]");
  lib.def("adafactor_factored_sums(Tensor p, Tensor g, Tensor row, Tensor col, bool rows_first) -> Tensor");
  lib.def("adafactor_factored_apply(Tensor(a!) p, Tensor g, Tensor row, Tensor col, bool rows_first, "
          "float divisor, float lr, float scale) -> ()");
  lib.def("adafactor_unfactored_sums(Tensor p, Tensor g, Tensor(a!) v, float beta, float w, float eps) -> Tensor");
  lib.def("adafactor_unfactored_apply(Tensor(a!) p, Tensor g, Tensor v, float divisor, float lr, float scale) -> ()");
}

TORCH_LIBRARY_IMPL(nanomerit, CPU, lib) {
  lib.impl("adafactor_statistics", &adafactor_statistics);
  lib.impl("adafactor_factored_sums", &adafactor_factored_sums);
  lib.impl("adafactor_factored_apply", &adafactor_factored_apply);
  lib.impl("adafactor_unfactored_sums", &adafactor_unfactored_sums);
  lib.impl("adafactor_unfactored_apply", &adafactor_unfactored_apply);
}
