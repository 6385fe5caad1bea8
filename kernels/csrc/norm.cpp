// The sum of the squares of every element of a list of CPU tensors, in double, in one call: the
// training loop's gradient clip (training/clipping.py) asks it whether torch's clip_grad_norm_
// could act. It is not torch's norm: the squares are summed in double, in this kernel's order, so
// the clip trusts it only where the bound it computes on the difference leaves no doubt.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "common.h"

namespace {

// kLanes partial sums, so that the additions do not wait on one another (one float64 sum would
// take an addition's latency per element: 4x slower here).
constexpr int kLanes = 32;

template <typename scalar_t>
double span_sum_of_squares(const scalar_t* __restrict x, int64_t n) {
  double lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) {
      const double v = double(x[j + l]);
      lanes[l] += v * v;
    }
  }
  double sum = 0.0;
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
  for (; j < n; ++j) sum += double(x[j]) * double(x[j]);
  return sum;
}

// Each tensor's elements in spans of kGrain, the spans' sums in parallel, then added in order:
// the result does not depend on the number of threads.
double sum_of_squares(at::TensorList tensors) {
  double total = 0.0;
  for (const at::Tensor& tensor : tensors) {
    TORCH_CHECK(tensor.device().is_cpu() && (tensor.scalar_type() == at::kFloat || tensor.scalar_type() == at::kDouble),
                "sum_of_squares: tensors must be float32 or float64 CPU tensors");
    const at::Tensor t = tensor.contiguous();  // (the tensor itself where it is: a gradient almost always)
    const int64_t n = t.numel(), spans = (n + kGrain - 1) / kGrain;
    std::vector<double> sums(spans, 0.0);
    AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "sum_of_squares", [&] {
      const scalar_t* x = t.data_ptr<scalar_t>();
      at::parallel_for(0, spans, 1, [&](int64_t begin, int64_t end) {
        for (int64_t s = begin; s < end; ++s)
          sums[s] = span_sum_of_squares(x + s * kGrain, vmin(kGrain, n - s * kGrain));
      });
    });
    for (const double s : sums) total += s;
  }
  return total;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nanomerit, lib) {
  lib.def("sum_of_squares(Tensor[] tensors) -> float");
}

TORCH_LIBRARY_IMPL(nanomerit, CPU, lib) {
  lib.impl("sum_of_squares", &sum_of_squares);
}
