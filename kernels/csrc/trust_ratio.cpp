// The two memory-bound passes of the trust-ratio optimizers (MERIT, LAMB) on CPU tensors.
// optim/backends/__init__.py documents the semantics (kernels/__init__.py builds the extension);
// optim/backends/reference.py is the torch reference these kernels are tested against.
//
// Pass 1 reads p, g, m, v once and writes m, v and u (into g's storage) while reducing |p| and
// |u| (max) or p^2 and u^2 (sum, for l2 norms): over the whole tensor, or per row and per column
// of a matrix; it returns the trust ratios N(p) / N(u). Rows are split between threads; each
// thread keeps its own column accumulators (a few KiB, in L1) that are merged at the end, so the
// columns cost no second sweep of memory.
// Pass 2 reads p and u and writes p: p -= lr * [clamp](s * u), s = max(rows_i, cols_j).
// Inputs are contiguous CPU tensors of one dtype (float, double or bfloat16), computed in float
// (double for double).
//
// The loops are plain element-wise loops with `omp simd` reductions, written so that GCC
// vectorises them: values, not references (std::max), locals marked __restrict, bfloat16 moved
// as raw bits.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.h"

namespace {

// The per-element reduction: max |x| or sum x^2 (both start from 0).
template <typename acc_t, bool L2>
struct Norm {
  static acc_t term(acc_t x) { return L2 ? x * x : std::abs(x); }
  static acc_t combine(acc_t a, acc_t b) { return L2 ? a + b : vmax(a, b); }
  static acc_t finish(acc_t a) { return L2 ? std::sqrt(a) : a; }
};

// Accumulators: the compute type is exact for max. l2 sums: over a row, column or span in
// acc_type (double; float for bfloat16, whose ratios keep 8 bits, and which GCC does not
// vectorise when converted on to double), over the whole tensor in total_type (double).
template <typename scalar_t, bool L2>
using acc_type = std::conditional_t<L2, std::conditional_t<std::is_same_v<scalar_t, c10::BFloat16>, float, double>,
                                    typename Storage<scalar_t>::op_t>;
template <typename scalar_t, bool L2>
using total_type = std::conditional_t<L2, double, typename Storage<scalar_t>::op_t>;

struct Hyper {
  double beta1, beta2, eps, wd, m_scale, v_scale;
};

template <typename scalar_t>
struct Pass1 {
  using S = Storage<scalar_t>;
  using raw = typename S::raw;
  using op_t = typename S::op_t;
  struct Coef {  // u = m / (sqrt(v) * a + b) + wd * p, the reference's form of u (reference.py)
    op_t w1, b2, w2, a, b, wd;
  };
  const raw* p;
  raw *g, *m, *v;  // g holds u on return
  Coef coef;

  Pass1(const at::Tensor& p_, at::Tensor& g_, at::Tensor& m_, at::Tensor& v_, const Hyper& h)
      : p(reinterpret_cast<const raw*>(p_.const_data_ptr<scalar_t>())),
        g(reinterpret_cast<raw*>(g_.data_ptr<scalar_t>())),
        m(reinterpret_cast<raw*>(m_.data_ptr<scalar_t>())),
        v(reinterpret_cast<raw*>(v_.data_ptr<scalar_t>())),
        coef{op_t(1 - h.beta1), op_t(h.beta2), op_t(1 - h.beta2), op_t(h.v_scale / h.m_scale),
             op_t(h.eps / h.m_scale), op_t(h.wd)} {}

  // Element j: stores m, v and u; returns the norm terms of p_j (before the update) and u_j.
  template <bool L2, typename acc_t>
  static std::pair<acc_t, acc_t> element(const Coef& c, const raw* __restrict P, raw* __restrict G,
                                         raw* __restrict M, raw* __restrict V, int64_t j) {
    const op_t gj = S::load(G[j]), mj = S::load(M[j]), vj = S::load(V[j]), pj = S::load(P[j]);
    // m = m + (1-b1)*(g-m) (torch's lerp for b1 > 0.5; common.h's lerp, which also covers b1 <=
    // 0.5, measured 5-10% slower here), v = v*b2 + (1-b2)*g*g: both rounded to the storage dtype
    // before u reads them, as in the reference.
    const raw m_new = S::store(mj + c.w1 * (gj - mj));
    const raw v_new = S::store(S::load(S::store(vj * c.b2)) + c.w2 * gj * gj);
    const raw u = S::store(S::load(m_new) / (std::sqrt(S::load(v_new)) * c.a + c.b) + c.wd * pj);
    M[j] = m_new;
    V[j] = v_new;
    G[j] = u;
    return {Norm<acc_t, L2>::term(acc_t(pj)), Norm<acc_t, L2>::term(acc_t(S::load(u)))};
  }

  // Elements [begin, begin + n): m, v and u, and the column accumulators pc / uc when Cols
  // (element begin + j is in column j); combines the norms of p and u over the span into pr / ur.
  template <bool L2, bool Cols, typename acc_t>
  void span(int64_t begin, int64_t n, acc_t& pr, acc_t& ur, acc_t* __restrict pc,
            acc_t* __restrict uc) const {
    using N = Norm<acc_t, L2>;
    const raw* __restrict P = p + begin;
    raw* __restrict G = g + begin;
    raw* __restrict M = m + begin;
    raw* __restrict V = v + begin;
    const Coef c = coef;
    // The same loop twice: omp simd needs the reduction operator spelled out to vectorise it.
    acc_t a = 0, b = 0;
    if constexpr (L2) {
#pragma omp simd reduction(+ : a, b)
      for (int64_t j = 0; j < n; ++j) {
        const auto [tp, tu] = element<L2, acc_t>(c, P, G, M, V, j);
        a += tp;
        b += tu;
        if constexpr (Cols) {
          pc[j] += tp;
          uc[j] += tu;
        }
      }
    } else {
#pragma omp simd reduction(max : a, b)
      for (int64_t j = 0; j < n; ++j) {
        const auto [tp, tu] = element<L2, acc_t>(c, P, G, M, V, j);
        a = vmax(a, tp);
        b = vmax(b, tu);
        if constexpr (Cols) {
          pc[j] = vmax(pc[j], tp);
          uc[j] = vmax(uc[j], tu);
        }
      }
    }
    pr = N::combine(pr, a);
    ur = N::combine(ur, b);
  }
};

constexpr int64_t kBlock = 1 << 16;  // elements per block of pass 2 (float counts: < 2^24)

// ratio(N(p), N(u)) from two accumulators, exactly as the reference computes it in p's dtype:
// norms rounded to scalar_t, N(p) clamped at max_p_norm, NaN (the "ratio = 1" guard) if either
// norm is 0, an overflow the largest finite value.
template <typename scalar_t, bool L2, typename acc_t>
scalar_t trust_ratio(acc_t p_acc, acc_t u_acc, double max_p_norm) {
  using N = Norm<acc_t, L2>;
  using op_t = typename Storage<scalar_t>::op_t;
  const scalar_t pn = std::min(scalar_t(N::finish(p_acc)), scalar_t(max_p_norm)), un = scalar_t(N::finish(u_acc));
  if (op_t(pn) == 0 || op_t(un) == 0) return std::numeric_limits<scalar_t>::quiet_NaN();
  return std::min(scalar_t(op_t(pn) / op_t(un)), std::numeric_limits<scalar_t>::max());
}

template <typename scalar_t, bool L2>
std::vector<at::Tensor> pass1_tensor(const Pass1<scalar_t>& k, const at::Tensor& p, double max_p_norm) {
  using acc_t = acc_type<scalar_t, L2>;
  using total_t = total_type<scalar_t, L2>;
  using N = Norm<total_t, L2>;
  const int64_t numel = p.numel(), threads = at::get_num_threads();
  std::vector<total_t> partial(2 * threads, 0);
  at::parallel_for(0, numel, kGrain, [&](int64_t begin, int64_t end) {
    total_t pt = 0, ut = 0;  // locals, as in pass1_rows_cols
    for (int64_t b = begin; b < end; b += kSpan) {
      acc_t pn = 0, un = 0;
      k.template span<L2, false, acc_t>(b, std::min(kSpan, end - b), pn, un, nullptr, nullptr);
      pt = N::combine(pt, pn);
      ut = N::combine(ut, un);
    }
    total_t* mine = partial.data() + 2 * at::get_thread_num();
    mine[0] = N::combine(mine[0], pt);
    mine[1] = N::combine(mine[1], ut);
  });
  total_t pn = 0, un = 0;
  for (int64_t t = 0; t < threads; ++t) {
    pn = N::combine(pn, partial[2 * t]);
    un = N::combine(un, partial[2 * t + 1]);
  }
  return {at::scalar_tensor(trust_ratio<scalar_t, L2>(pn, un, max_p_norm), p.options())};
}

template <typename scalar_t, bool L2>
std::vector<at::Tensor> pass1_rows_cols(const Pass1<scalar_t>& k, const at::Tensor& p, double max_p_norm) {
  using acc_t = acc_type<scalar_t, L2>;
  using total_t = total_type<scalar_t, L2>;
  using N = Norm<acc_t, L2>;
  using NT = Norm<total_t, L2>;
  const int64_t rows = p.size(0), cols = p.size(1), threads = at::get_num_threads();
  at::Tensor row_ratio = at::empty({rows, 1}, p.options()), col_ratio = at::empty({1, cols}, p.options());
  scalar_t* rr = row_ratio.data_ptr<scalar_t>();
  std::vector<acc_t> col_acc(2 * threads * cols, 0);
  std::vector<total_t> whole(2 * threads, 0);
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)), [&](int64_t begin, int64_t end) {
    const int64_t t = at::get_thread_num();
    acc_t* pc = col_acc.data() + 2 * t * cols;
    total_t pw = 0, uw = 0;  // locals: threads writing one cache line per row would stall
    for (int64_t i = begin; i < end; ++i) {
      acc_t pr = 0, ur = 0;
      k.template span<L2, true, acc_t>(i * cols, cols, pr, ur, pc, pc + cols);
      rr[i] = trust_ratio<scalar_t, L2>(pr, ur, max_p_norm);
      pw = NT::combine(pw, pr);
      uw = NT::combine(uw, ur);
    }
    whole[2 * t] = NT::combine(whole[2 * t], pw);
    whole[2 * t + 1] = NT::combine(whole[2 * t + 1], uw);
  });
  scalar_t* cr = col_ratio.data_ptr<scalar_t>();
  total_t pw = 0, uw = 0;
  for (int64_t t = 0; t < threads; ++t) {
    pw = NT::combine(pw, whole[2 * t]);
    uw = NT::combine(uw, whole[2 * t + 1]);
    for (int64_t j = 0; j < cols && t > 0; ++j) {  // into thread 0's accumulators
      col_acc[j] = N::combine(col_acc[j], col_acc[2 * t * cols + j]);
      col_acc[cols + j] = N::combine(col_acc[cols + j], col_acc[(2 * t + 1) * cols + j]);
    }
  }
  for (int64_t j = 0; j < cols; ++j) cr[j] = trust_ratio<scalar_t, L2>(col_acc[j], col_acc[cols + j], max_p_norm);
  return {row_ratio, col_ratio, at::scalar_tensor(trust_ratio<scalar_t, L2>(pw, uw, max_p_norm), p.options())};
}

// Pass 1. Returns [ratio] of the whole tensor (0-d), or with rows_cols (a matrix) [row ratios
// (R, 1), column ratios (1, C), whole-tensor ratio (0-d)], in p's dtype.
std::vector<at::Tensor> moments_and_ratios(const at::Tensor& p, at::Tensor g, at::Tensor m, at::Tensor v,
                                           double beta1, double beta2, double eps, double wd,
                                           double m_scale, double v_scale, double max_p_norm,
                                           bool rows_cols, bool l2) {
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&p, &g, &m, &v})
    check_like(p, *t, "trust_ratio");
  TORCH_CHECK(!rows_cols || p.dim() == 2, "trust_ratio: rows_cols needs a matrix");
  const Hyper h{beta1, beta2, eps, wd, m_scale, v_scale};
  std::vector<at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, p.scalar_type(), "moments_and_ratios", [&] {
    const Pass1<scalar_t> k(p, g, m, v, h);
    if (rows_cols)
      out = l2 ? pass1_rows_cols<scalar_t, true>(k, p, max_p_norm) : pass1_rows_cols<scalar_t, false>(k, p, max_p_norm);
    else
      out = l2 ? pass1_tensor<scalar_t, true>(k, p, max_p_norm) : pass1_tensor<scalar_t, false>(k, p, max_p_norm);
  });
  return out;
}

// p[j] -= lr * [clamp](s_j * u[j]) for j in [0, n): s_j = r, or max(r, lo[j]) with Columns, or
// min(max(r, lo[j]), hi[j]) with Guards. Returns the number of |s_j * u[j]| > 1 when Count (a
// float sum: exact as n < 2^24).
template <bool Clip, bool Count, bool Columns, bool Guards, typename scalar_t, typename op_t, typename raw>
inline op_t update_span(raw* __restrict P, const raw* __restrict U, int64_t n, op_t r,
                        const op_t* __restrict lo, const op_t* __restrict hi, op_t neg_lr) {
  using S = Storage<scalar_t>;
  op_t count = 0;
#pragma omp simd reduction(+ : count)
  for (int64_t j = 0; j < n; ++j) {
    op_t s = r;
    if constexpr (Columns) s = vmax(r, lo[j]);
    if constexpr (Guards) s = vmin(s, hi[j]);
    op_t x = s * S::load(U[j]);
    if constexpr (Count) count += std::abs(x) > op_t(1) ? op_t(1) : op_t(0);
    if constexpr (Clip) x = vmin(vmax(x, op_t(-1)), op_t(1));
    P[j] = S::store(S::load(P[j]) + neg_lr * x);
  }
  return count;
}

// Calls f(b, e) on [begin, end) cut into blocks, the last block first. Pass 1 has just swept
// the same range in the same thread forwards, so what it touched last is still in the last-level
// cache (much of p and u for a GPT-2 block's matrices in a 32 MiB L3), while a forward sweep
// would evict each line just before reading it: about 5% off a GPT-2 Small step, measured.
// Rows stay forwards inside a block (a descending stream defeats the prefetchers: measured 2x
// slower).
template <typename F>
void backwards_in_blocks(int64_t begin, int64_t end, int64_t block, const F& f) {
  for (int64_t b = begin + (end - begin - 1) / block * block; b >= begin; b -= block) f(b, std::min(b + block, end));
}

template <typename scalar_t, bool Clip, bool Count>
int64_t pass2(at::Tensor& p, const at::Tensor& u, const at::Tensor& rows,
              const std::optional<at::Tensor>& cols, double lr) {
  using S = Storage<scalar_t>;
  using raw = typename S::raw;
  using op_t = typename S::op_t;
  raw* P = reinterpret_cast<raw*>(p.data_ptr<scalar_t>());
  const raw* U = reinterpret_cast<const raw*>(u.const_data_ptr<scalar_t>());
  const op_t neg_lr = -lr;
  std::vector<int64_t> counts(at::get_num_threads(), 0);
  // NaN in rows / cols is the zero guard: s = 1 for the whole row / column.
  if (!cols) {  // one s for the whole tensor
    const op_t r = rows.item<op_t>(), s = std::isnan(r) ? op_t(1) : r;
    at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
      int64_t n = 0;
      backwards_in_blocks(begin, end, kBlock, [&](int64_t b, int64_t e) {  // (lo and hi are not read)
        n += update_span<Clip, Count, false, false, scalar_t>(P + b, U + b, e - b, s, &s, &s, neg_lr);
      });
      counts[at::get_thread_num()] += n;
    });
  } else {
    const int64_t nrows = p.size(0), ncols = p.size(1);
    // s_ij = min(max(r_i, lo_j), hi_j): a guarded column has lo = hi = 1, so s = 1 (r_i >= 0);
    // a guarded row has r = 1 and uses hi = 1 everywhere. Without guards hi is not read (it
    // would compete with the streams for L1 on wide rows).
    std::vector<op_t> lo(ncols), hi(ncols), ones(ncols, op_t(1));
    const op_t* C = cols->const_data_ptr<op_t>();
    bool any_guarded = false;
    for (int64_t j = 0; j < ncols; ++j) {
      const bool guarded = std::isnan(C[j]);
      any_guarded |= guarded;
      lo[j] = guarded ? op_t(1) : C[j];
      hi[j] = guarded ? op_t(1) : std::numeric_limits<op_t>::infinity();
    }
    const op_t* R = rows.const_data_ptr<op_t>();
    at::parallel_for(0, nrows, std::max<int64_t>(1, kGrain / std::max<int64_t>(ncols, 1)), [&](int64_t begin, int64_t end) {
      int64_t n = 0;
      backwards_in_blocks(begin, end, std::max<int64_t>(1, kBlock / std::max<int64_t>(ncols, 1)), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          raw* Pi = P + i * ncols;
          const raw* Ui = U + i * ncols;
          if (std::isnan(R[i]))
            n += update_span<Clip, Count, true, true, scalar_t>(Pi, Ui, ncols, op_t(1), lo.data(), ones.data(), neg_lr);
          else if (any_guarded)
            n += update_span<Clip, Count, true, true, scalar_t>(Pi, Ui, ncols, R[i], lo.data(), hi.data(), neg_lr);
          else
            n += update_span<Clip, Count, true, false, scalar_t>(Pi, Ui, ncols, R[i], lo.data(), hi.data(), neg_lr);
        }
      });
      counts[at::get_thread_num()] += n;
    });
  }
  int64_t total = 0;
  for (int64_t n : counts) total += n;
  return total;
}

// p -= lr * [clamp](s * u). rows: one s (numel 1, cols absent) or the row factors of a matrix
// (numel R) with cols the column factors (numel C); contiguous, in the compute dtype (float for
// bfloat16). Returns the number of |s * u| > 1 when count, else None.
std::optional<at::Tensor> apply_update(at::Tensor p, const at::Tensor& u, const at::Tensor& rows,
                                       const std::optional<at::Tensor>& cols, double lr, bool clip,
                                       bool count) {
  check_like(p, p, "trust_ratio");
  check_like(p, u, "trust_ratio");
  TORCH_CHECK(cols ? p.dim() == 2 && rows.numel() == p.size(0) && cols->numel() == p.size(1)
                   : rows.numel() == 1,
              "trust_ratio: factor shapes do not match p");
  int64_t n = 0;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, p.scalar_type(), "apply_update", [&] {
    using op_t = typename Storage<scalar_t>::op_t;
    for (const at::Tensor* f : {&rows, cols ? &*cols : &rows})
      TORCH_CHECK(f->scalar_type() == c10::CppTypeToScalarType<op_t>::value && f->is_contiguous() &&
                      f->device().is_cpu(),
                  "trust_ratio: factors must be contiguous CPU tensors of the compute dtype");
    if (clip)
      n = count ? pass2<scalar_t, true, true>(p, u, rows, cols, lr) : pass2<scalar_t, true, false>(p, u, rows, cols, lr);
    else
      n = count ? pass2<scalar_t, false, true>(p, u, rows, cols, lr) : pass2<scalar_t, false, false>(p, u, rows, cols, lr);
  });
  if (!count) return std::nullopt;
  return at::scalar_tensor(n, at::TensorOptions().dtype(at::kLong));
}

}  // namespace

TORCH_LIBRARY(nanomerit, lib) {
  lib.def("moments_and_ratios(Tensor p, Tensor(a!) g, Tensor(b!) m, Tensor(c!) v, float beta1, "
          "float beta2, float eps, float wd, float m_scale, float v_scale, float max_p_norm, "
          "bool rows_cols, bool l2) -> Tensor[]");
  lib.def("apply_update(Tensor(a!) p, Tensor u, Tensor rows, Tensor? cols, float lr, bool clip, "
          "bool count) -> Tensor?");
}

TORCH_LIBRARY_IMPL(nanomerit, CPU, lib) {
  lib.impl("moments_and_ratios", &moments_and_ratios);
  lib.impl("apply_update", &apply_update);
}
