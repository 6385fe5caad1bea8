"""The two streaming passes of the trust-ratio optimizers (MERIT, LAMB), fast on CPU.

optimizers.md: the step is memory-bound, so each tensor is swept twice and nothing full-size is
allocated:

* ``moments_and_ratios`` (pass 1) reads p, g, m, v; writes m, v and the update direction
  ``u = m * m_scale / (sqrt(v) * v_scale + eps) + wd * p`` INTO THE GRADIENT'S STORAGE (the grad is
  consumed, as apex's FusedLAMB does with its update); returns trust ratios N(p) / N(u) with p
  before the update and N the max norm or the l2 norm: of the whole tensor, or of each row (dim 0)
  and each column (dim 1) of a matrix.
* ``apply_update`` (pass 2) reads p and u, writes p: ``p -= lr * [clamp](s * u, -1, 1)`` with
  ``s = max(rows_i, cols_j)`` (or one scalar).

A ratio is NaN where N(p) or N(u) is 0: the zero guard, s = 1 in pass 2.

CPU tensors that optim/kernels.py accepts (matrices 2-D) use the C++ kernels of
``csrc/trust_ratio.cpp``, CUDA tensors that optim/triton_ops.py accepts its Triton kernels;
anything else, tensors with more than 2 dims included, runs the torch fallback below, which is
also the reference both kernels are tested against. The fallback makes no host syncs on CUDA, and
its pass 2 allocates one p-sized temporary for a matrix's s.
"""
import functools
import math

import torch
from torch import Tensor

from . import kernels, triton_ops


def moments_and_ratios(p: Tensor, g: Tensor, m: Tensor, v: Tensor, *, beta1: float, beta2: float,
                       eps: float, wd: float, reduce: str, l2: bool, m_scale: float = 1.0,
                       v_scale: float = 1.0, max_p_norm: float = math.inf) -> tuple[Tensor, ...]:
    """Pass 1 (see the module docstring); g holds u on return. N(p) is clamped at ``max_p_norm``.

    ``reduce``: "none" -> (); "tensor" -> (ratio,), 0-d; "rows_cols" (ndim >= 2) ->
    (row ratios, column ratios, whole-tensor ratio): rows reduced over dim 1 and columns over
    dim 0 with keepdim (further dims are not reduced), the whole ratio 0-d. In p's dtype.
    """
    rows_cols = reduce == "rows_cols"
    if kernels.usable(p, g, m, v, matrix=rows_cols):
        ratios = torch.ops.nanomerit.moments_and_ratios(p, g, m, v, beta1, beta2, eps, wd, m_scale,
                                                        v_scale, max_p_norm, rows_cols, l2)
        return tuple(ratios) if reduce != "none" else ()
    if triton_ops.usable(p, g, m, v, matrix=rows_cols):
        return triton_ops.moments_and_ratios(p, g, m, v, beta1=beta1, beta2=beta2, eps=eps, wd=wd, reduce=reduce,
                                             l2=l2, m_scale=m_scale, v_scale=v_scale, max_p_norm=max_p_norm)
    m.lerp_(g, 1 - beta1)                          # m = b1*m + (1-b1)*g, in one sweep
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)  # v = b2*v + (1-b2)*g*g
    # u = m * m_scale / (sqrt(v) * v_scale + eps), computed as m / (sqrt(v) * a + b): one
    # operation fewer per element (the kernels' form too); a = 1, b = eps without bias correction.
    u = torch.sqrt(v, out=g)                       # eps outside the sqrt
    if v_scale != m_scale:
        u.mul_(v_scale / m_scale)
    torch.div(m, u.add_(eps / m_scale), out=u)
    if wd != 0:
        u.add_(p, alpha=wd)                        # wd folded into u before any ratio
    if reduce == "none":
        return ()
    norm = functools.partial(torch.linalg.vector_norm, ord=2 if l2 else math.inf)
    if reduce == "tensor":
        return (_ratio(norm(p), norm(u), max_p_norm),)
    p_rows, u_rows = norm(p, dim=1, keepdim=True), norm(u, dim=1, keepdim=True)
    return (_ratio(p_rows, u_rows, max_p_norm),
            _ratio(norm(p, dim=0, keepdim=True), norm(u, dim=0, keepdim=True), max_p_norm),
            _ratio(norm(p_rows), norm(u_rows), max_p_norm))  # the whole tensor's norms from its rows'


def apply_update(p: Tensor, u: Tensor, rows: Tensor | None, cols: Tensor | None, *, lr: float,
                 clip: bool, count: bool) -> Tensor | None:
    """Pass 2: ``p -= lr * [clamp](s * u, -1, 1)``; returns the number of |s * u| > 1 if ``count``.

    ``rows`` None means s = 1; a 0-d ``rows`` with ``cols`` None is one s for the whole tensor;
    else s = max(rows, cols) broadcast (rows (R, 1, ...), cols (1, C, ...)). NaN means s = 1.
    Overwrites u.
    """
    if rows is None:
        rows = torch.ones((), dtype=p.dtype, device=p.device)
    # The kernels take the factors in their compute dtype.
    compute = torch.float64 if p.dtype == torch.float64 else torch.float32
    if kernels.usable(p, u, matrix=cols is not None):
        return torch.ops.nanomerit.apply_update(p, u, rows.to(compute), None if cols is None else cols.to(compute),
                                                lr, clip, count)
    if triton_ops.usable(p, u, matrix=cols is not None):
        return triton_ops.apply_update(p, u, rows.to(compute), None if cols is None else cols.to(compute),
                                       lr=lr, clip=clip, count=count)
    s = rows if cols is None else torch.maximum(rows, cols)  # the one p-sized temporary
    u.mul_(s.nan_to_num(nan=1.0))
    clipped = (u.abs() > 1).sum() if count else None
    if clip:
        u.clamp_(-1.0, 1.0)                        # clip AFTER scaling, sign kept
    p.add_(u, alpha=-lr)
    return clipped


def _ratio(p_norm: Tensor, u_norm: Tensor, max_p_norm: float) -> Tensor:
    """min(p_norm, max_p_norm) / u_norm, NaN where either is 0; an overflow (finite / denormal)
    becomes the largest finite value, so that a zero element of u still gets a zero update."""
    p_norm = p_norm.clamp(max=max_p_norm)
    ratio = (p_norm / u_norm).clamp_(max=torch.finfo(p_norm.dtype).max)
    return ratio.masked_fill_((p_norm == 0) | (u_norm == 0), float("nan"))
