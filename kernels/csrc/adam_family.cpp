// The one-sweep steps of the Adam-family optimizers with extra state (AdEMAMix, Schedule-Free
// AdamW, whose parameter is y) on CPU tensors: read p, g and the state once, write p and the
// state once; nothing else touches memory. And MARS's correction of the gradient, one sweep
// before torch's fused AdamW. optim/ademamix.py, optim/schedulefree.py and optim/mars.py document the rules;
// optim/backends/reference.py is the torch reference these kernels are tested against, computed
// in the same order, and every intermediate is rounded to the storage dtype where the reference
// rounds it (bfloat16), so the two agree to float rounding.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "common.h"

namespace {

// AdEMAMix's coefficients in the compute type.
template <typename op_t>
struct AdemamixCoef {
  op_t b1, w1, b3, w3, b2, w2, bc1, sqrt_bc2, eps, alpha, wd, neg_lr;
};

// Elements [0, n) of AdEMAMix's step, in the reference's order:
// m1 = m1*b1 + (1-b1)*g; m2 = m2*b3 + (1-b3)*g; v = v*b2 + (1-b2)*g*g;
// p -= lr * ((m1/bc1 + alpha*m2) / (sqrt(v)/sqrt(bc2) + eps) + wd*p), wd*p added only if wd != 0.
template <typename scalar_t, typename op_t, typename raw>
void ademamix_span(raw* __restrict P, const raw* __restrict G, raw* __restrict M1, raw* __restrict M2,
                   raw* __restrict V, int64_t n, bool decays, const AdemamixCoef<op_t> c) {
  using S = Storage<scalar_t>;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const op_t gj = S::load(G[j]), pj = S::load(P[j]);
    const raw m1 = S::store(S::round(S::load(M1[j]) * c.b1) + c.w1 * gj);
    const raw m2 = S::store(S::round(S::load(M2[j]) * c.b3) + c.w3 * gj);
    const raw v = S::store(S::round(S::load(V[j]) * c.b2) + c.w2 * gj * gj);
    const op_t denom = S::round(S::round(S::round(std::sqrt(S::load(v))) / c.sqrt_bc2) + c.eps);
    const op_t mix = S::round(S::round(S::load(m1) / c.bc1) + S::round(c.alpha * S::load(m2)));
    op_t update = S::round(mix / denom);
    if (decays) update = S::round(update + c.wd * pj);
    P[j] = S::store(pj + S::round(c.neg_lr * update));
    M1[j] = m1;
    M2[j] = m2;
    V[j] = v;
  }
}

// Schedule-Free AdamW's coefficients in the compute type.
template <typename op_t>
struct ScheduleFreeCoef {
  op_t b2, w2, bc2, eps, wd, ckp1, y_lr, neg_lr;
};

// Elements [0, n) of Schedule-Free AdamW's step, in the reference's order:
// v = v*b2 + (1-b2)*g*g; u = g / (sqrt(v/bc2) + eps) + wd*y (if wd != 0);
// y = lerp(y, z, ckp1) + y_lr*u; z -= lr*u.
template <typename scalar_t, typename op_t, typename raw>
void schedulefree_span(raw* __restrict Y, const raw* __restrict G, raw* __restrict Z, raw* __restrict V,
                       int64_t n, bool decays, const ScheduleFreeCoef<op_t> c) {
  using S = Storage<scalar_t>;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const op_t gj = S::load(G[j]), yj = S::load(Y[j]), zj = S::load(Z[j]);
    const raw v = S::store(S::round(S::load(V[j]) * c.b2) + c.w2 * gj * gj);
    const op_t denom = S::round(S::round(std::sqrt(S::round(S::load(v) / c.bc2))) + c.eps);
    op_t u = S::round(gj / denom);
    if (decays) u = S::round(u + c.wd * yj);
    Y[j] = S::store(S::round(lerp(yj, zj, c.ckp1)) + c.y_lr * u);
    Z[j] = S::store(zj + c.neg_lr * u);
    V[j] = v;
  }
}

void ademamix_step(at::Tensor p, const at::Tensor& g, at::Tensor m1, at::Tensor m2, at::Tensor v, double lr,
                   double wd, double beta1, double beta2, double beta3, double alpha, double bias_correction1,
                   double bias_correction2, double eps) {
  for (const at::Tensor& t : {g, m1, m2, v}) check_like(p, t, "adam-family step");
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, p.scalar_type(), "ademamix_step", [&] {
    using op_t = typename Storage<scalar_t>::op_t;
    const AdemamixCoef<op_t> c{op_t(beta1), op_t(1 - beta1), op_t(beta3), op_t(1 - beta3), op_t(beta2),
                               op_t(1 - beta2), op_t(bias_correction1), op_t(std::sqrt(bias_correction2)),
                               op_t(eps), op_t(alpha), op_t(wd), op_t(-lr)};
    auto P = raw_ptr<scalar_t>(p), G = raw_ptr<scalar_t>(g);
    auto M1 = raw_ptr<scalar_t>(m1), M2 = raw_ptr<scalar_t>(m2), V = raw_ptr<scalar_t>(v);
    at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
      ademamix_span<scalar_t, op_t>(P + begin, G + begin, M1 + begin, M2 + begin, V + begin, end - begin, wd != 0,
                                    c);
    });
  });
}

void schedulefree_step(at::Tensor y, const at::Tensor& g, at::Tensor z, at::Tensor v, double lr, double y_lr,
                       double ckp1, double wd, double beta2, double bias_correction2, double eps) {
  for (const at::Tensor& t : {g, z, v}) check_like(y, t, "adam-family step");
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, y.scalar_type(), "schedulefree_step", [&] {
    using op_t = typename Storage<scalar_t>::op_t;
    const ScheduleFreeCoef<op_t> c{op_t(beta2), op_t(1 - beta2), op_t(bias_correction2), op_t(eps), op_t(wd),
                                   op_t(ckp1), op_t(y_lr), op_t(-lr)};
    auto Y = raw_ptr<scalar_t>(y), G = raw_ptr<scalar_t>(g), Z = raw_ptr<scalar_t>(z), V = raw_ptr<scalar_t>(v);
    at::parallel_for(0, y.numel(), kGrain, [&](int64_t begin, int64_t end) {
      schedulefree_span<scalar_t, op_t>(Y + begin, G + begin, Z + begin, V + begin, end - begin, wd != 0, c);
    });
  });
}

// Elements [0, n) of MARS's correction, in the reference's order: c = g + round(round(g - g_prev) * scale)
// into g's storage, g_prev = g (the gradient as it came) if Keeps; returns the sum of c^2.
template <bool Keeps, typename scalar_t, typename acc_t, typename op_t, typename raw>
acc_t mars_span(raw* __restrict G, raw* __restrict G_prev, int64_t n, op_t scale) {
  using S = Storage<scalar_t>;
  acc_t squares = 0;
#pragma omp simd reduction(+ : squares)
  for (int64_t j = 0; j < n; ++j) {
    const raw g = G[j];
    const op_t gj = S::load(g);
    const op_t c = S::round(gj + S::round(S::round(gj - S::load(G_prev[j])) * scale));
    if constexpr (Keeps) G_prev[j] = g;
    G[j] = S::store(c);
    squares += acc_t(c) * acc_t(c);
  }
  return squares;
}

// The sum of squares is taken per span in acc_t (double; float for bfloat16, which GCC does not
// vectorise when converted on to double), over the whole tensor in double, as trust_ratio.cpp's l2 norms.
at::Tensor mars_correction(at::Tensor g, at::Tensor g_prev, double scale, bool keep) {
  for (const at::Tensor& t : {g, g_prev}) check_like(g, t, "adam-family step");
  at::Tensor total;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, g.scalar_type(), "mars_correction", [&] {
    using op_t = typename Storage<scalar_t>::op_t;
    using acc_t = std::conditional_t<std::is_same_v<scalar_t, c10::BFloat16>, float, double>;
    auto G = raw_ptr<scalar_t>(g), G_prev = raw_ptr<scalar_t>(g_prev);
    std::vector<double> partial(at::get_num_threads(), 0);
    at::parallel_for(0, g.numel(), kGrain, [&](int64_t begin, int64_t end) {
      double mine = 0;
      for (int64_t b = begin; b < end; b += kSpan) {
        const int64_t n = std::min(kSpan, end - b);
        mine += keep ? mars_span<true, scalar_t, acc_t>(G + b, G_prev + b, n, op_t(scale))
                     : mars_span<false, scalar_t, acc_t>(G + b, G_prev + b, n, op_t(scale));
      }
      partial[at::get_thread_num()] += mine;
    });
    double sum = 0;
    for (double part : partial) sum += part;
    total = at::scalar_tensor(op_t(sum), g.options().dtype(c10::CppTypeToScalarType<op_t>::value));
  });
  return total;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nanomerit, lib) {
  lib.def("ademamix_step(Tensor(a!) p, Tensor g, Tensor(b!) m1, Tensor(c!) m2, Tensor(d!) v, float lr, float wd, "
          "float beta1, float beta2, float beta3, float alpha, float bias_correction1, float bias_correction2, "
          "float eps) -> ()");
  lib.def("schedulefree_step(Tensor(a!) y, Tensor g, Tensor(b!) z, Tensor(c!) v, float lr, float y_lr, "
          "float ckp1, float wd, float beta2, float bias_correction2, float eps) -> ()");
  lib.def("mars_correction(Tensor(a!) g, Tensor(b!) g_prev, float scale, bool keep) -> Tensor");
}

TORCH_LIBRARY_IMPL(nanomerit, CPU, lib) {
  lib.impl("ademamix_step", &ademamix_step);
  lib.impl("schedulefree_step", &schedulefree_step);
  lib.impl("mars_correction", &mars_correction);
}
