"""The optimizers' Triton kernels: their fused CUDA path (optim/backends/triton.py launches them).

They compute what the C++ kernels of kernels/csrc/ compute, with the same roundings, so the torch
reference (optim/backends/reference.py) is the reference for both: MERIT's and LAMB's two passes with a
small kernel between them that turns the reduced norms into trust ratios, the one-sweep steps
of Lion, Sophia-G, AdEMAMix, Schedule-Free AdamW and SGD, MARS's correction of the gradient, and
Adafactor's sweeps.
Elements are computed in float32 (float64 for float64 tensors); where a reference rounds an
intermediate to bfloat16, ``_round`` rounds it to nearest even with integer operations, because
Triton's CPU interpreter (how the tests run these kernels without a GPU) truncates in its float
conversions. The launcher disables FMA contraction, and division and square root are the IEEE
ones (``_div``, ``_sqrt``), so the interpreter and a GPU compute the same bits.

Tensors are contiguous and seen as (n_rows, n_cols) row-major matrices; a tensor whose norm is
taken as a whole is its flat elements cut into rows, the last one masked by ``numel``. Offsets
are int64. Scalars arrive as float64 and are rounded to the compute type once, as the C++
kernels' ``op_t(...)`` do. With SKIPS, a float32 flag at ``skip_ptr`` (nonzero: drop this
update) masks the stores of the parameter and its state, read on the device like the flag of
torch's fused AdamW, so that skipping a step costs no host sync.
"""
import triton
import triton.language as tl


@triton.jit
def _load(ptr, offs, mask, COMPUTE: tl.constexpr):
    return tl.load(ptr + offs, mask=mask, other=0.0).to(COMPUTE)


@triton.jit
def _scalar(x, COMPUTE: tl.constexpr):
    """A float64 scalar argument rounded to the compute type (the interpreter passes Python floats)."""
    return tl.full([], x, COMPUTE)


@triton.jit
def _round(x, dtype: tl.constexpr):
    """x rounded to ``dtype`` (nearest even) and kept in x's float type; the identity unless
    ``dtype`` is bfloat16, where it is c10's float -> BFloat16 conversion on the raw bits."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return tl.where(x == x, bits.to(tl.float32, bitcast=True), x)  # NaN stays NaN
    else:
        return x


@triton.jit
def _sqrt(x):
    """IEEE square root: sqrt_rn for float32 (plain tl.sqrt may be approximate), float64's is exact."""
    if x.dtype == tl.float64:
        return tl.sqrt(x)
    else:
        return tl.sqrt_rn(x)


@triton.jit
def _div(a, b):
    """IEEE division: div_rn for float32 (plain / may be approximate), float64's is exact."""
    if a.dtype == tl.float64:
        return a / b
    else:
        return tl.div_rn(a, b)


@triton.jit
def _lerp(a, b, w):
    """a + w * (b - a) in torch's rounding (ATen/native/Lerp.h: the form depends on |w| < 0.5)."""
    return tl.where(tl.abs(w) < 0.5, a + w * (b - a), b - (b - a) * (1.0 - w))


@triton.jit
def _kept(mask, skip_ptr, SKIPS: tl.constexpr):
    """The store mask of the parameter and its state: ``mask``, cleared when the flag is set."""
    if SKIPS:
        return tl.where(tl.load(skip_ptr) == 0, mask, False)
    else:
        return mask


@triton.jit
def _combine(a, b, L2: tl.constexpr):
    if L2:
        return a + b
    else:
        return tl.maximum(a, b)


@triton.jit
def _reduce(x, axis: tl.constexpr, L2: tl.constexpr):
    if L2:
        return tl.sum(x, axis=axis)
    else:
        return tl.max(x, axis=axis)


@triton.jit
def moments_and_norms(p_ptr, g_ptr, m_ptr, v_ptr, norms_ptr, norms_stride, partials_ptr, skip_ptr,
                      n_rows, n_cols, numel, w1: tl.float64, beta2: tl.float64, w2: tl.float64,
                      a: tl.float64, b: tl.float64, wd: tl.float64, L2: tl.constexpr,
                      COLS: tl.constexpr, SKIPS: tl.constexpr, COMPUTE: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Pass 1: m = lerp(m, g, w1), v = v*beta2 + w2*g*g, u = m / (sqrt(v)*a + b) + wd*p into g,
    and the norm terms of p (before the update) and u: |x|, or x^2 if L2.

    Program k sweeps row blocks k, k + P, ... (P programs) one column chunk at a time. It combines
    each row's terms into norms[0, i] (p) and norms[1, i] (u) (final: a row belongs to one
    program) and, with COLS, each column's over its own rows into partials[k, 0, j] and
    partials[k, 1, j] (the caller combines the P partials; no atomics, so l2 sums come out the same
    on every run).
    """
    dtype = p_ptr.dtype.element_ty
    w1, beta2, w2 = _scalar(w1, COMPUTE), _scalar(beta2, COMPUTE), _scalar(w2, COMPUTE)
    a, b, wd = _scalar(a, COMPUTE), _scalar(b, COMPUTE), _scalar(wd, COMPUTE)
    program, programs = tl.program_id(0), tl.num_programs(0)
    for c0 in range(0, n_cols, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        p_cols = tl.zeros([BLOCK_C], COMPUTE)
        u_cols = tl.zeros([BLOCK_C], COMPUTE)
        for row_block in range(program, tl.cdiv(n_rows, BLOCK_R), programs):
            rows = row_block * BLOCK_R + tl.arange(0, BLOCK_R)
            offs = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
            mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols) & (offs < numel)
            p = _load(p_ptr, offs, mask, COMPUTE)
            g = _load(g_ptr, offs, mask, COMPUTE)
            m = _round(_lerp(_load(m_ptr, offs, mask, COMPUTE), g, w1), dtype)
            v = _round(_round(_load(v_ptr, offs, mask, COMPUTE) * beta2, dtype) + w2 * g * g, dtype)
            u = _round(_div(m, _sqrt(v) * a + b) + wd * p, dtype)
            tl.store(m_ptr + offs, m.to(dtype), mask=_kept(mask, skip_ptr, SKIPS))
            tl.store(v_ptr + offs, v.to(dtype), mask=_kept(mask, skip_ptr, SKIPS))
            tl.store(g_ptr + offs, u.to(dtype), mask=mask)
            if L2:
                p_terms, u_terms = p * p, u * u
            else:
                p_terms, u_terms = tl.abs(p), tl.abs(u)
            p_terms = tl.where(mask, p_terms, 0.0)  # padding: u may be 0/0 there when eps = 0
            u_terms = tl.where(mask, u_terms, 0.0)
            in_rows = rows < n_rows
            seen = in_rows & (c0 > 0)  # the rows' terms of the column chunks before this one
            p_rows = tl.load(norms_ptr + rows, mask=seen, other=0.0)
            u_rows = tl.load(norms_ptr + norms_stride + rows, mask=seen, other=0.0)
            tl.store(norms_ptr + rows, _combine(p_rows, _reduce(p_terms, 1, L2), L2), mask=in_rows)
            tl.store(norms_ptr + norms_stride + rows, _combine(u_rows, _reduce(u_terms, 1, L2), L2), mask=in_rows)
            if COLS:
                p_cols = _combine(p_cols, _reduce(p_terms, 0, L2), L2)
                u_cols = _combine(u_cols, _reduce(u_terms, 0, L2), L2)
        if COLS:
            mine = partials_ptr + program.to(tl.int64) * 2 * n_cols + cols
            tl.store(mine, p_cols, mask=cols < n_cols)
            tl.store(mine + n_cols, u_cols, mask=cols < n_cols)


@triton.jit
def trust_ratios(norms_ptr, norms_stride, out_ptr, n, max_p_norm: tl.float64, max_ratio: tl.float64,
                 L2: tl.constexpr, COMPUTE: tl.constexpr, BLOCK: tl.constexpr):
    """out[j] = min(N(p), max_p_norm) / N(u) from the accumulated terms norms[0, j], norms[1, j],
    in out's dtype as the reference computes it there (norms and ratio rounded to it, an overflow
    the largest finite value ``max_ratio``), NaN (the guard: s = 1) where either norm is 0."""
    dtype = out_ptr.dtype.element_ty
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p_norm = _load(norms_ptr, offs, mask, COMPUTE)
    u_norm = _load(norms_ptr + norms_stride, offs, mask, COMPUTE)
    if L2:
        p_norm, u_norm = _sqrt(p_norm), _sqrt(u_norm)
    p_norm = tl.minimum(_round(p_norm, dtype), _round(_scalar(max_p_norm, COMPUTE), dtype))
    u_norm = _round(u_norm, dtype)
    ratio = tl.minimum(_round(_div(p_norm, u_norm), dtype), _scalar(max_ratio, COMPUTE))
    ratio = tl.where((p_norm == 0) | (u_norm == 0), float("nan"), ratio)
    tl.store(out_ptr + offs, ratio.to(dtype), mask=mask)


@triton.jit
def _flat_block(numel, BLOCK: tl.constexpr):
    """This program's block of a flat tensor of ``numel`` elements: its offsets and mask."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return offs, offs < numel


@triton.jit
def _matrix_tile(n_rows, n_cols, numel, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's (BLOCK_R, BLOCK_C) tile of an (n_rows, n_cols) matrix of ``numel`` elements
    (fewer where a flat tensor is cut into rows): its rows, columns, element offsets and mask."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    offs = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
    return rows, cols, offs, (rows[:, None] < n_rows) & (cols[None, :] < n_cols) & (offs < numel)


@triton.jit
def apply_update(p_ptr, u_ptr, rows_ptr, cols_ptr, counts_ptr, skip_ptr, n_rows, n_cols, numel,
                 neg_lr: tl.float64, COLS: tl.constexpr, CLIP: tl.constexpr, COUNT: tl.constexpr,
                 SKIPS: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Pass 2: p += neg_lr * [clamp](s * u, -1, 1) on a (BLOCK_R, BLOCK_C) tile, with
    s = max(rows[i], cols[j]) if COLS else the one factor rows[0] (both in the compute dtype;
    NaN, the zero guard, means s = 1). With COUNT, the tile's number of |s * u| > 1 goes to
    counts[program]."""
    dtype = p_ptr.dtype.element_ty
    rows, cols, offs, mask = _matrix_tile(n_rows, n_cols, numel, BLOCK_R, BLOCK_C)
    if COLS:
        r = tl.load(rows_ptr + rows, mask=rows < n_rows, other=1.0)[:, None]
        c = tl.load(cols_ptr + cols, mask=cols < n_cols, other=1.0)[None, :]
        s = tl.where((r != r) | (c != c), 1.0, tl.maximum(r, c))
    else:
        r = tl.load(rows_ptr)
        s = tl.where(r != r, 1.0, r)
    x = s * _load(u_ptr, offs, mask, COMPUTE)
    if COUNT:
        clipped = tl.sum(tl.sum(tl.where(mask & (tl.abs(x) > 1.0), 1, 0), axis=1), axis=0)
        tl.store(counts_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), clipped)
    if CLIP:
        x = tl.minimum(tl.maximum(x, -1.0), 1.0)
    p = _load(p_ptr, offs, mask, COMPUTE) + _scalar(neg_lr, COMPUTE) * x
    tl.store(p_ptr + offs, _round(p, dtype).to(dtype), mask=_kept(mask, skip_ptr, SKIPS))


@triton.jit
def lion_step(p_ptr, g_ptr, m_ptr, skip_ptr, numel, decay: tl.float64, neg_lr: tl.float64, w1: tl.float64,
              w2: tl.float64, DECAYS: tl.constexpr, SKIPS: tl.constexpr, COMPUTE: tl.constexpr,
              BLOCK: tl.constexpr):
    """Lion: p = p*decay; p += neg_lr * sign(lerp(m, g, w1)); m = lerp(m, g, w2)."""
    dtype = p_ptr.dtype.element_ty
    offs, mask = _flat_block(numel, BLOCK)
    kept = _kept(mask, skip_ptr, SKIPS)
    g = _load(g_ptr, offs, mask, COMPUTE)
    m = _load(m_ptr, offs, mask, COMPUTE)
    p = _load(p_ptr, offs, mask, COMPUTE)
    if DECAYS:
        p = _round(p * _scalar(decay, COMPUTE), dtype)
    c = _round(_lerp(m, g, _scalar(w1, COMPUTE)), dtype)
    sign = (c > 0).to(COMPUTE) - (c < 0).to(COMPUTE)
    tl.store(p_ptr + offs, _round(p + _scalar(neg_lr, COMPUTE) * sign, dtype).to(dtype), mask=kept)
    tl.store(m_ptr + offs, _round(_lerp(m, g, _scalar(w2, COMPUTE)), dtype).to(dtype), mask=kept)


@triton.jit
def sophia_step(p_ptr, g_ptr, m_ptr, h_ptr, skip_ptr, numel, decay: tl.float64, neg_lr: tl.float64,
                w1: tl.float64, scale: tl.float64, eps: tl.float64, DECAYS: tl.constexpr,
                SKIPS: tl.constexpr, COMPUTE: tl.constexpr, BLOCK: tl.constexpr):
    """Sophia-G: p = p*decay; m = lerp(m, g, w1); p += neg_lr * clamp(m / (h*scale + eps), -1, 1)."""
    dtype = p_ptr.dtype.element_ty
    offs, mask = _flat_block(numel, BLOCK)
    g = _load(g_ptr, offs, mask, COMPUTE)
    p = _load(p_ptr, offs, mask, COMPUTE)
    if DECAYS:
        p = _round(p * _scalar(decay, COMPUTE), dtype)
    m = _round(_lerp(_load(m_ptr, offs, mask, COMPUTE), g, _scalar(w1, COMPUTE)), dtype)
    d = _round(_round(_load(h_ptr, offs, mask, COMPUTE) * _scalar(scale, COMPUTE), dtype) + _scalar(eps, COMPUTE),
               dtype)
    x = tl.minimum(tl.maximum(_round(_div(m, d), dtype), -1.0), 1.0)
    kept = _kept(mask, skip_ptr, SKIPS)
    tl.store(p_ptr + offs, _round(p + _scalar(neg_lr, COMPUTE) * x, dtype).to(dtype), mask=kept)
    tl.store(m_ptr + offs, m.to(dtype), mask=kept)


@triton.jit
def _ema(x, beta, w, g, dtype: tl.constexpr):
    """x*beta + w*g rounded as torch's ``x.mul_(beta).add_(g, alpha=w)`` rounds it."""
    return _round(_round(x * beta, dtype) + w * g, dtype)


@triton.jit
def _second_moment(v, beta2, w2, g, dtype: tl.constexpr):
    """v*beta2 + w2*g*g rounded as torch's ``v.mul_(beta2).addcmul_(g, g, value=w2)`` rounds it."""
    return _round(_round(v * beta2, dtype) + w2 * g * g, dtype)


@triton.jit
def ademamix_step(p_ptr, g_ptr, m1_ptr, m2_ptr, v_ptr, skip_ptr, numel, b1: tl.float64, w1: tl.float64,
                  b3: tl.float64, w3: tl.float64, b2: tl.float64, w2: tl.float64, bc1: tl.float64,
                  sqrt_bc2: tl.float64, eps: tl.float64, alpha: tl.float64, wd: tl.float64, neg_lr: tl.float64,
                  DECAYS: tl.constexpr, SKIPS: tl.constexpr, COMPUTE: tl.constexpr, BLOCK: tl.constexpr):
    """AdEMAMix: m1 = m1*b1 + w1*g; m2 = m2*b3 + w3*g; v = v*b2 + w2*g*g;
    p += neg_lr * ((m1/bc1 + alpha*m2) / (sqrt(v)/sqrt_bc2 + eps) [+ wd*p if DECAYS])."""
    dtype = p_ptr.dtype.element_ty
    b1, w1, b3, w3 = _scalar(b1, COMPUTE), _scalar(w1, COMPUTE), _scalar(b3, COMPUTE), _scalar(w3, COMPUTE)
    b2, w2, bc1 = _scalar(b2, COMPUTE), _scalar(w2, COMPUTE), _scalar(bc1, COMPUTE)
    sqrt_bc2, eps, alpha = _scalar(sqrt_bc2, COMPUTE), _scalar(eps, COMPUTE), _scalar(alpha, COMPUTE)
    wd, neg_lr = _scalar(wd, COMPUTE), _scalar(neg_lr, COMPUTE)
    offs, mask = _flat_block(numel, BLOCK)
    g = _load(g_ptr, offs, mask, COMPUTE)
    p = _load(p_ptr, offs, mask, COMPUTE)
    m1 = _ema(_load(m1_ptr, offs, mask, COMPUTE), b1, w1, g, dtype)
    m2 = _ema(_load(m2_ptr, offs, mask, COMPUTE), b3, w3, g, dtype)
    v = _second_moment(_load(v_ptr, offs, mask, COMPUTE), b2, w2, g, dtype)
    denom = _round(_round(_div(_round(_sqrt(v), dtype), sqrt_bc2), dtype) + eps, dtype)
    mix = _round(_round(_div(m1, bc1), dtype) + _round(m2 * alpha, dtype), dtype)
    update = _round(_div(mix, denom), dtype)
    if DECAYS:
        update = _round(update + wd * p, dtype)
    kept = _kept(mask, skip_ptr, SKIPS)
    tl.store(p_ptr + offs, _round(p + _round(update * neg_lr, dtype), dtype).to(dtype), mask=kept)
    tl.store(m1_ptr + offs, m1.to(dtype), mask=kept)
    tl.store(m2_ptr + offs, m2.to(dtype), mask=kept)
    tl.store(v_ptr + offs, v.to(dtype), mask=kept)


@triton.jit
def schedulefree_step(y_ptr, g_ptr, z_ptr, v_ptr, skip_ptr, numel, b2: tl.float64, w2: tl.float64, bc2: tl.float64,
                      eps: tl.float64, wd: tl.float64, ckp1: tl.float64, y_lr: tl.float64, neg_lr: tl.float64,
                      DECAYS: tl.constexpr, SKIPS: tl.constexpr, COMPUTE: tl.constexpr, BLOCK: tl.constexpr):
    """Schedule-Free AdamW: v = v*b2 + w2*g*g; u = g / (sqrt(v/bc2) + eps) [+ wd*y if DECAYS];
    y = lerp(y, z, ckp1) + y_lr*u; z += neg_lr*u."""
    dtype = y_ptr.dtype.element_ty
    b2, w2, bc2, eps = _scalar(b2, COMPUTE), _scalar(w2, COMPUTE), _scalar(bc2, COMPUTE), _scalar(eps, COMPUTE)
    wd, ckp1 = _scalar(wd, COMPUTE), _scalar(ckp1, COMPUTE)
    y_lr, neg_lr = _scalar(y_lr, COMPUTE), _scalar(neg_lr, COMPUTE)
    offs, mask = _flat_block(numel, BLOCK)
    g = _load(g_ptr, offs, mask, COMPUTE)
    y = _load(y_ptr, offs, mask, COMPUTE)
    z = _load(z_ptr, offs, mask, COMPUTE)
    v = _second_moment(_load(v_ptr, offs, mask, COMPUTE), b2, w2, g, dtype)
    denom = _round(_round(_sqrt(_round(_div(v, bc2), dtype)), dtype) + eps, dtype)
    u = _round(_div(g, denom), dtype)
    if DECAYS:
        u = _round(u + wd * y, dtype)
    kept = _kept(mask, skip_ptr, SKIPS)
    tl.store(y_ptr + offs, _round(_round(_lerp(y, z, ckp1), dtype) + y_lr * u, dtype).to(dtype), mask=kept)
    tl.store(z_ptr + offs, _round(z + neg_lr * u, dtype).to(dtype), mask=kept)
    tl.store(v_ptr + offs, v.to(dtype), mask=kept)


@triton.jit
def mars_correction(g_ptr, g_prev_ptr, partials_ptr, skip_ptr, numel, scale: tl.float64, SKIPS: tl.constexpr,
                    COMPUTE: tl.constexpr, BLOCK: tl.constexpr):
    """MARS's correction: c = g + (g - g_prev)*scale into g; g_prev = g (the gradient as it came);
    the program's sum of c^2 into partials[program] (the caller sums them: no atomics, so the sum
    comes out the same on every run)."""
    dtype = g_ptr.dtype.element_ty
    offs, mask = _flat_block(numel, BLOCK)
    g = _load(g_ptr, offs, mask, COMPUTE)
    c = _round(g + _round(_round(g - _load(g_prev_ptr, offs, mask, COMPUTE), dtype) * _scalar(scale, COMPUTE),
                          dtype), dtype)
    tl.store(g_prev_ptr + offs, g.to(dtype), mask=_kept(mask, skip_ptr, SKIPS))
    tl.store(g_ptr + offs, c.to(dtype), mask=mask)
    tl.store(partials_ptr + tl.program_id(0), tl.sum(c * c, axis=0))  # (masked elements: c = 0)


@triton.jit
def sgd_step(p_ptr, g_ptr, buf_ptr, skip_ptr, numel, wd: tl.float64, momentum: tl.float64, neg_lr: tl.float64,
             DECAYS: tl.constexpr, MOMENTUM: tl.constexpr, SKIPS: tl.constexpr, COMPUTE: tl.constexpr,
             BLOCK: tl.constexpr):
    """SGD as torch steps it: d = g + wd*p [if DECAYS]; buf = buf*momentum + d, d = buf [if MOMENTUM];
    p += neg_lr*d; each ``add`` with an alpha a fused multiply-add, as torch's (tl.fma: the
    interpreter's rounds once too), its alpha rounded to bfloat16 for bfloat16 tensors (as
    kernels/csrc/sgd.cpp says)."""
    dtype = p_ptr.dtype.element_ty
    offs, mask = _flat_block(numel, BLOCK)
    kept = _kept(mask, skip_ptr, SKIPS)
    p = _load(p_ptr, offs, mask, COMPUTE)
    d = _load(g_ptr, offs, mask, COMPUTE)
    if DECAYS:
        d = _round(tl.fma(p, _round(_scalar(wd, COMPUTE), dtype), d), dtype)
    if MOMENTUM:
        d = _round(_round(_load(buf_ptr, offs, mask, COMPUTE) * _scalar(momentum, COMPUTE), dtype) + d, dtype)
        tl.store(buf_ptr + offs, d.to(dtype), mask=kept)
    tl.store(p_ptr + offs, _round(tl.fma(d, _round(_scalar(neg_lr, COMPUTE), dtype), p), dtype).to(dtype), mask=kept)


@triton.jit
def adafactor_statistics(g_ptr, row_sums_ptr, partials_ptr, n_rows, n_cols, eps: tl.float64, COMPUTE: tl.constexpr,
                         BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """A factored matrix's sums of s = g*g + eps (optax's 1e-30): each row's into row_sums[i] (a row belongs to
    one program), and program k's sum of each column over its rows into partials[k, j] (the caller
    adds the programs' up). Program k sweeps row blocks k, k + P, ... one column chunk at a time."""
    program, programs = tl.program_id(0), tl.num_programs(0)
    eps = _scalar(eps, COMPUTE)
    for c0 in range(0, n_cols, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        col_sums = tl.zeros([BLOCK_C], COMPUTE)
        for row_block in range(program, tl.cdiv(n_rows, BLOCK_R), programs):
            rows = row_block * BLOCK_R + tl.arange(0, BLOCK_R)
            offs = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
            mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
            g = _load(g_ptr, offs, mask, COMPUTE)
            s = tl.where(mask, g * g + eps, 0.0)
            in_rows = rows < n_rows
            before = tl.load(row_sums_ptr + rows, mask=in_rows & (c0 > 0), other=0.0)
            tl.store(row_sums_ptr + rows, before + tl.sum(s, axis=1), mask=in_rows)
            col_sums += tl.sum(s, axis=0)
        tl.store(partials_ptr + program.to(tl.int64) * n_cols + cols, col_sums, mask=cols < n_cols)


@triton.jit
def _adafactor_tile(g_ptr, row_ptr, col_ptr, v_ptr, rows, cols, offs, mask, beta, w, eps, n_rows, n_cols,
                    FACTORED: tl.constexpr, ROWS_FIRST: tl.constexpr, UPDATES_V: tl.constexpr,
                    COMPUTE: tl.constexpr):
    """A tile's direction u (and, if UPDATES_V, its new v = v*beta + w*(g*g + eps), a fused
    multiply-add as torch's ``add`` with an alpha): factored, (g * r) * c or (g * c) * r; else
    (1 / sqrt(v)) * g, torch's rsqrt. Returns (u, v; v is u where FACTORED)."""
    g = _load(g_ptr, offs, mask, COMPUTE)
    if FACTORED:
        r = tl.load(row_ptr + rows, mask=rows < n_rows, other=1.0).to(COMPUTE)[:, None]
        c = tl.load(col_ptr + cols, mask=cols < n_cols, other=1.0).to(COMPUTE)[None, :]
        if ROWS_FIRST:
            u = (g * r) * c
        else:
            u = (g * c) * r
        return u, u
    else:
        v = _load(v_ptr, offs, mask, COMPUTE)
        if UPDATES_V:
            v = tl.fma(g * g + eps, w, v * beta)
        u = _div(_scalar(1.0, COMPUTE), _sqrt(tl.where(mask, v, 1.0))) * g
        return u, v


@triton.jit
def adafactor_sums(p_ptr, g_ptr, row_ptr, col_ptr, v_ptr, partials_ptr, skip_ptr, n_rows, n_cols, numel,
                   beta: tl.float64, w: tl.float64, eps: tl.float64, FACTORED: tl.constexpr, ROWS_FIRST: tl.constexpr,
                   SKIPS: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Adafactor's sums of u*u and p*p over a (BLOCK_R, BLOCK_C) tile into partials[tile, 0 and 1]
    (the caller adds them up); an unfactored tensor's v updated first."""
    rows, cols, offs, mask = _matrix_tile(n_rows, n_cols, numel, BLOCK_R, BLOCK_C)
    u, v = _adafactor_tile(g_ptr, row_ptr, col_ptr, v_ptr, rows, cols, offs, mask, _scalar(beta, COMPUTE),
                           _scalar(w, COMPUTE), _scalar(eps, COMPUTE), n_rows, n_cols, FACTORED, ROWS_FIRST, True,
                           COMPUTE)
    if not FACTORED:
        tl.store(v_ptr + offs, v, mask=_kept(mask, skip_ptr, SKIPS))
    p = _load(p_ptr, offs, mask, COMPUTE)
    u = tl.where(mask, u, 0.0)
    tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    tl.store(partials_ptr + 2 * tile, tl.sum(tl.sum(u * u, axis=1), axis=0))
    tl.store(partials_ptr + 2 * tile + 1, tl.sum(tl.sum(p * p, axis=1), axis=0))


@triton.jit
def adafactor_apply(p_ptr, g_ptr, row_ptr, col_ptr, v_ptr, divisor_ptr, scale_ptr, skip_ptr, n_rows, n_cols, numel,
                    neg_lr: tl.float64, FACTORED: tl.constexpr, ROWS_FIRST: tl.constexpr, DIVIDES: tl.constexpr,
                    SKIPS: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """p += ((u / divisor) * neg_lr) * scale on a tile (no division unless DIVIDES), u computed
    again as ``adafactor_sums`` computed it (v as it left it)."""
    dtype = p_ptr.dtype.element_ty
    rows, cols, offs, mask = _matrix_tile(n_rows, n_cols, numel, BLOCK_R, BLOCK_C)
    zero = _scalar(0.0, COMPUTE)  # (v not updated: its decays unused)
    u, _ = _adafactor_tile(g_ptr, row_ptr, col_ptr, v_ptr, rows, cols, offs, mask, zero, zero, zero, n_rows, n_cols,
                           FACTORED, ROWS_FIRST, False, COMPUTE)
    if DIVIDES:
        u = _div(u, tl.load(divisor_ptr).to(COMPUTE))
    x = (u * _scalar(neg_lr, COMPUTE)) * tl.load(scale_ptr).to(COMPUTE)
    p = _load(p_ptr, offs, mask, COMPUTE) + x
    tl.store(p_ptr + offs, _round(p, dtype).to(dtype), mask=_kept(mask, skip_ptr, SKIPS))
