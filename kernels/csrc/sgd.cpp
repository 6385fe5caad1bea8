// torch.optim.SGD's step (no dampening, no Nesterov: Marek et al.'s optax ``trace``) on CPU tensors,
// one sweep: read p, g and the momentum buffer, write p and the buffer; nothing else touches memory.
// optim/sgd.py documents the rule; optim/backends/reference.py is the torch reference this kernel is
// tested against. Its arithmetic is torch's, operation for operation: torch's ``add`` with an
// alpha is a fused multiply-add (ATen's ufunc::add: vec::fmadd(other, alpha, self)), so this kernel
// calls std::fma where torch's step calls ``add(..., alpha=)``, and rounds every intermediate to the
// storage dtype where torch stores it (bfloat16). In bfloat16 it is torch's vectorised loop: an
// ``add``'s alpha is rounded to bfloat16 (ATen converts it to the tensor's dtype), a ``mul``'s
// scalar is not; torch's scalar tail of each thread's chunk rounds the product alpha * x to
// bfloat16 before the sum, so there the two differ by bfloat16's rounding.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

#include "common.h"

namespace {

// Elements [0, n) of the step: d = g + wd * p (if wd != 0); with a momentum buffer (Momentum),
// buf = buf * momentum + d and d = buf; p = p - lr * d. Each line is one torch operation, rounded
// to the storage dtype.
template <bool Momentum, typename scalar_t, typename op_t, typename raw>
void sgd_span(raw* __restrict P, const raw* __restrict G, raw* __restrict B, int64_t n, bool decays, op_t wd,
              op_t momentum, op_t neg_lr) {
  using S = Storage<scalar_t>;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const op_t pj = S::load(P[j]);
    op_t d = decays ? S::round(std::fma(pj, wd, S::load(G[j]))) : S::load(G[j]);
    if constexpr (Momentum) {
      d = S::round(S::round(S::load(B[j]) * momentum) + d);
      B[j] = S::store(d);
    }
    P[j] = S::store(std::fma(d, neg_lr, pj));
  }
}

template <bool Momentum, typename scalar_t>
void sgd_sweep(at::Tensor& p, const at::Tensor& g, at::Tensor* buf, double lr, double momentum, double wd) {
  using S = Storage<scalar_t>;
  using op_t = typename S::op_t;
  auto P = raw_ptr<scalar_t>(p), G = raw_ptr<scalar_t>(g);
  auto B = buf == nullptr ? nullptr : raw_ptr<scalar_t>(*buf);
  at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
    sgd_span<Momentum, scalar_t, op_t>(P + begin, G + begin, B == nullptr ? nullptr : B + begin, end - begin, wd != 0,
                                       S::round(op_t(wd)), op_t(momentum), S::round(op_t(-lr)));
  });
}

// ``buf`` absent: no momentum.
void sgd_step(at::Tensor p, const at::Tensor& g, c10::optional<at::Tensor> buf, double lr, double momentum,
              double wd) {
  check_like(p, g, "sgd step");
  if (buf.has_value()) check_like(p, *buf, "sgd step");
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, p.scalar_type(), "sgd_step", [&] {
    if (buf.has_value()) {
      sgd_sweep<true, scalar_t>(p, g, &*buf, lr, momentum, wd);
    } else {
      sgd_sweep<false, scalar_t>(p, g, nullptr, lr, momentum, wd);
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nanomerit, lib) {
  lib.def("sgd_step(Tensor(a!) p, Tensor g, Tensor(b!)? buf, float lr, float momentum, float wd) -> ()");
}

TORCH_LIBRARY_IMPL(nanomerit, CPU, lib) {
  lib.impl("sgd_step", &sgd_step);
}
