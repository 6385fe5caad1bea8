// GPT-2's tanh GELU, forward and backward, for contiguous float32 CPU tensors (model.py's MLP).
//
// torch's own CPU kernel evaluates SLEEF's vectorised tanhf, about five times torch.tanh (MKL's):
// over the default job's 4096 x 512 activations it took 2.13 ms forward and 2.25 ms backward,
// against 0.40 / 0.78 ms for the exact (erf) GELU, on the project's Intel CPU. The same function
// through the identity 0.5 (1 + tanh(u)) = sigmoid(2u), with one vectorised exp, takes 0.62 /
// 0.80 ms (docs/performance.md, "GELU on a CPU"):
//   gelu(x)  = x s = x / (1 + e),   e = exp(-2u),  u = sqrt(2/pi) (x + 0.044715 x^3),  s = 1 / (1 + e)
//   gelu'(x) = s (1 + 2 x (1 - s) du/dx),  1 - s = e s,  du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// It is within a few float32 roundings of the function computed in float64 (tests/test_gelu.py);
// an element's result does not depend on its place in the tensor (a ragged tail
// goes through the same vector code with a partial load), so a sequence computes the same
// activations wherever it sits in a batch.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include "common.h"

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

// exp(-2u) of each lane, u = sqrt(2/pi) (x + 0.044715 x^3); sigmoid(2u) = 1 / (1 + it) and
// 1 - sigmoid(2u) = it / (1 + it), each without the other's cancellation. exp_u20 is ATen's
// polynomial exp (within 2 ulp; torch's softmax uses it), cheaper than SLEEF's. The exponent stops
// at 80 (x below about -9.2), where sigmoid(2u) < 2e-35 is still a normal float and 1 + e is
// finite: the GELU there is x times that, and its derivative that, where torch's form gives 0.
inline Vec exp_minus_2u(Vec x, Vec x2) {
  return at::vec::minimum(Vec(-2.f * kBeta) * (x + Vec(kKappa) * x2 * x), Vec(80.f)).exp_u20();
}

// body(i, n) over [0, numel) in whole vectors, the last one partial; tasks of kGrain elements.
template <typename Body>
void for_vectors(int64_t numel, const Body& body) {
  at::parallel_for(0, (numel + Vec::size() - 1) / Vec::size(), kGrain / Vec::size(),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t v = begin; v < end; ++v) {
                       const int64_t i = v * Vec::size();
                       body(i, std::min<int64_t>(Vec::size(), numel - i));
                     }
                   });
}

void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(),
              "nanomerit::gelu_tanh: ", name, " must be a contiguous float32 CPU tensor");
}

at::Tensor gelu_tanh(const at::Tensor& x) {
  check(x, "x");
  at::Tensor y = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for_vectors(x.numel(), [&](int64_t i, int64_t n) {
    const Vec v = Vec::loadu(xp + i, n);
    (v / (Vec(1.f) + exp_minus_2u(v, v * v))).store(yp + i, n);
  });
  return y;
}

at::Tensor gelu_tanh_backward(const at::Tensor& grad, const at::Tensor& x) {
  check(grad, "grad");
  check(x, "x");
  TORCH_CHECK(grad.sizes() == x.sizes(), "nanomerit::gelu_tanh_backward: grad and x differ in shape");
  at::Tensor dx = at::empty_like(x);
  const float* gp = grad.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  float* dp = dx.data_ptr<float>();
  for_vectors(x.numel(), [&](int64_t i, int64_t n) {
    const Vec one(1.f);
    const Vec v = Vec::loadu(xp + i, n);
    const Vec v2 = v * v;
    const Vec e = exp_minus_2u(v, v2);
    const Vec s = one / (one + e);  // sigmoid(2u); 1 - s is e * s
    const Vec du = Vec(kBeta) * (one + Vec(3.f * kKappa) * v2);
    (Vec::loadu(gp + i, n) * s * (one + Vec(2.f) * v * (e * s) * du)).store(dp + i, n);
  });
  return dx;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nanomerit, lib) {
  lib.def("gelu_tanh(Tensor x) -> Tensor");
  lib.def("gelu_tanh_backward(Tensor grad, Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(nanomerit, CPU, lib) {
  lib.impl("gelu_tanh", &gelu_tanh);
  lib.impl("gelu_tanh_backward", &gelu_tanh_backward);
}
