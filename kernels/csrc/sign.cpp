// The steps of the sign-based optimizers (Lion, Sophia-G) on CPU tensors, one sweep each: read
// p, g and the state, write p and the state; nothing else touches memory. optim/lion.py and
// optim/sophia.py document the rules; optim/backends/reference.py is the torch reference these
// kernels are tested against, and every intermediate is rounded to the storage dtype where the
// reference rounds it (bfloat16), so the two agree to float rounding.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>

#include "common.h"

namespace {

// Elements [0, n) of Lion's step: p = p*(1 - lr*wd); p -= lr * sign(lerp(m, g, 1-b1));
// m = lerp(m, g, 1-b2). The coefficients are in the compute type.
template <typename scalar_t, typename op_t, typename raw>
void lion_span(raw* __restrict P, const raw* __restrict G, raw* __restrict M, int64_t n, bool decays,
               op_t decay, op_t neg_lr, op_t w1, op_t w2) {
  using S = Storage<scalar_t>;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const op_t gj = S::load(G[j]), mj = S::load(M[j]);
    const op_t pj = decays ? S::load(S::store(S::load(P[j]) * decay)) : S::load(P[j]);
    const op_t c = S::load(S::store(lerp(mj, gj, w1)));
    const op_t sign = op_t(c > 0) - op_t(c < 0);
    P[j] = S::store(pj + neg_lr * sign);
    M[j] = S::store(lerp(mj, gj, w2));
  }
}

// Elements [0, n) of Sophia-G's step: p = p*(1 - lr*wd); m = lerp(m, g, 1-b1);
// p -= lr * clamp(m / (h*scale + eps), -1, 1), which is sign(m) * min(|m| / (h*scale + eps), 1)
// for a positive denominator.
template <typename scalar_t, typename op_t, typename raw>
void sophia_span(raw* __restrict P, const raw* __restrict G, raw* __restrict M, const raw* __restrict H,
                 int64_t n, bool decays, op_t decay, op_t neg_lr, op_t w1, op_t scale, op_t eps) {
  using S = Storage<scalar_t>;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const op_t gj = S::load(G[j]), mj = S::load(M[j]);
    const op_t pj = decays ? S::load(S::store(S::load(P[j]) * decay)) : S::load(P[j]);
    const raw m_new = S::store(lerp(mj, gj, w1));
    const op_t d = S::load(S::store(S::load(S::store(S::load(H[j]) * scale)) + eps));
    const op_t x = S::load(S::store(S::load(m_new) / d));
    P[j] = S::store(pj + neg_lr * vmin(vmax(x, op_t(-1)), op_t(1)));
    M[j] = m_new;
  }
}

void lion_step(at::Tensor p, const at::Tensor& g, at::Tensor m, double lr, double wd, double beta1,
               double beta2) {
  check_like(p, g, "sign step");
  check_like(p, m, "sign step");
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, p.scalar_type(), "lion_step", [&] {
    using op_t = typename Storage<scalar_t>::op_t;
    auto P = raw_ptr<scalar_t>(p), G = raw_ptr<scalar_t>(g), M = raw_ptr<scalar_t>(m);
    at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
      lion_span<scalar_t, op_t>(P + begin, G + begin, M + begin, end - begin, wd != 0, op_t(1 - lr * wd),
                                op_t(-lr), op_t(1 - beta1), op_t(1 - beta2));
    });
  });
}

void sophia_step(at::Tensor p, const at::Tensor& g, at::Tensor m, const at::Tensor& h, double lr, double wd,
                 double beta1, double scale, double eps) {
  check_like(p, g, "sign step");
  check_like(p, m, "sign step");
  check_like(p, h, "sign step");
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, p.scalar_type(), "sophia_step", [&] {
    using op_t = typename Storage<scalar_t>::op_t;
    auto P = raw_ptr<scalar_t>(p), G = raw_ptr<scalar_t>(g), M = raw_ptr<scalar_t>(m), H = raw_ptr<scalar_t>(h);
    at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
      sophia_span<scalar_t, op_t>(P + begin, G + begin, M + begin, H + begin, end - begin, wd != 0,
                                  op_t(1 - lr * wd), op_t(-lr), op_t(1 - beta1), op_t(scale), op_t(eps));
    });
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nanomerit, lib) {
  lib.def("lion_step(Tensor(a!) p, Tensor g, Tensor(b!) m, float lr, float wd, float beta1, float beta2) -> ()");
  lib.def("sophia_step(Tensor(a!) p, Tensor g, Tensor(b!) m, Tensor h, float lr, float wd, float beta1, "
          "float scale, float eps) -> ()");
}

TORCH_LIBRARY_IMPL(nanomerit, CPU, lib) {
  lib.impl("lion_step", &lion_step);
  lib.impl("sophia_step", &sophia_step);
}
