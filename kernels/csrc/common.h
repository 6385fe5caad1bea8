// What the kernels of this directory share: element storage and conversion, the checks of the
// tensors and their raw pointers, lerp as torch computes it, and the parallel grain.
// kernels/__init__.py builds them into one extension.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

template <typename T>
inline T vmax(T a, T b) { return a < b ? b : a; }
template <typename T>
inline T vmin(T a, T b) { return b < a ? b : a; }

// How elements are stored and converted to the compute type op_t.
template <typename scalar_t>
struct Storage {
  using raw = scalar_t;
  using op_t = scalar_t;
  static op_t load(raw x) { return x; }
  static raw store(op_t x) { return x; }
  static op_t round(op_t x) { return x; }  // x as the storage dtype holds it
};

template <>
struct Storage<c10::BFloat16> {  // c10's conversions (round to nearest even), on the raw bits
  using raw = uint16_t;
  using op_t = float;
  static float load(uint16_t x) {
    const uint32_t bits = uint32_t(x) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  static uint16_t store(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    return std::isnan(x) ? uint16_t(0x7FC0) : uint16_t((bits + ((bits >> 16) & 1) + 0x7FFF) >> 16);
  }
  static float round(float x) { return load(store(x)); }
};

// The storage of a tensor of scalar_t, as the kernels read and write it.
template <typename scalar_t>
typename Storage<scalar_t>::raw* raw_ptr(const at::Tensor& t) {
  return reinterpret_cast<typename Storage<scalar_t>::raw*>(t.data_ptr<scalar_t>());
}

// ``op`` fails unless t is a contiguous CPU tensor of p's dtype and shape.
inline void check_like(const at::Tensor& p, const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == p.scalar_type() && t.sizes() == p.sizes() &&
                  t.is_contiguous(),
              op, ": tensors must be contiguous CPU tensors of p's dtype and shape");
}

// a + w * (b - a), rounded as torch's lerp (ATen/native/Lerp.h): the form depends on |w| < 0.5.
template <typename T>
inline T lerp(T a, T b, T w) {
  return std::abs(w) < T(0.5) ? a + w * (b - a) : b - (b - a) * (T(1) - w);
}

constexpr int64_t kGrain = 1 << 15;  // elements per task, below which one thread does it all
constexpr int64_t kSpan = 1 << 14;   // elements per span of a flat sum: short float sums

}  // namespace
