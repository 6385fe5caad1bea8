"""The torch reference of every fused operation (optim/backends/__init__.py says what each computes).

It is what the C++ and Triton kernels are tested against, and it runs whatever they do not take
(other dtypes or devices, non-contiguous tensors, tensors with more than 2 dims reduced per row
and column, ``optim_backend="torch"``). It makes no host syncs on CUDA, also when a ``skip`` flag
drops the update: then the new values are computed aside and selected on the device (one more
temporary per written tensor; the kernels mask their stores instead).

The element-wise temporaries live in ``_scratch``: on CPU a fresh full-size temporary costs more
than the arithmetic (page faults: 75 ms to allocate and fill the 155 MB GPT-2 embedding against
8-20 ms for one pass of an element-wise op), so a step with fresh temporaries ran 2-3x slower.
"""
import functools
import math

import torch
from torch import Tensor

from . import common

NAME = "torch"
TAKES = "any tensors"
_scratch_buffers: dict[tuple[torch.device, torch.dtype], Tensor] = {}


def ready() -> bool:
    return True


def takes(tensors: list[Tensor], *, matrix: bool = False) -> bool:
    return True


def moments_and_ratios(p: Tensor, g: Tensor, m: Tensor, v: Tensor, *, beta1: float, beta2: float,
                       eps: float, wd: float, reduce: str, l2: bool, m_scale: float = 1.0,
                       v_scale: float = 1.0, max_p_norm: float = math.inf,
                       skip: Tensor | None = None) -> tuple[Tensor, ...]:
    m_new, v_new = _staged(m, skip), _staged(v, skip)
    m_new.lerp_(g, 1 - beta1)                          # m = b1*m + (1-b1)*g, in one sweep
    v_new.mul_(beta2).addcmul_(g, g, value=1 - beta2)  # v = b2*v + (1-b2)*g*g
    _commit(m, m_new, skip)
    _commit(v, v_new, skip)
    # u = m * m_scale / (sqrt(v) * v_scale + eps), computed as m / (sqrt(v) * a + b): one
    # operation fewer per element (the kernels' form too); a = 1, b = eps without bias correction.
    u = torch.sqrt(v_new, out=g)                   # eps outside the sqrt
    if v_scale != m_scale:
        u.mul_(v_scale / m_scale)
    torch.div(m_new, u.add_(eps / m_scale), out=u)
    if wd != 0:
        u.add_(p, alpha=wd)                        # wd folded into u before any ratio
    if reduce == "none":
        return ()
    norm = functools.partial(torch.linalg.vector_norm, ord=2 if l2 else math.inf)
    if reduce == "tensor":
        return (ratio(norm(p), norm(u), max_p_norm),)
    p_rows, u_rows = norm(p, dim=1, keepdim=True), norm(u, dim=1, keepdim=True)
    return (ratio(p_rows, u_rows, max_p_norm),
            ratio(norm(p, dim=0, keepdim=True), norm(u, dim=0, keepdim=True), max_p_norm),
            ratio(norm(p_rows), norm(u_rows), max_p_norm))  # the whole tensor's norms from its rows'


def apply_update(p: Tensor, u: Tensor, rows: Tensor | None, cols: Tensor | None, *, lr: float,
                 clip: bool, count: bool, skip: Tensor | None = None) -> Tensor | None:
    if rows is None:
        rows = torch.ones((), dtype=p.dtype, device=p.device)
    s = rows if cols is None else torch.maximum(rows, cols)  # the one p-sized temporary
    u.mul_(s.nan_to_num(nan=1.0))
    clipped = (u.abs() > 1).sum() if count else None
    if clip:
        u.clamp_(-1.0, 1.0)                        # clip AFTER scaling, sign kept
    if skip is None:
        p.add_(u, alpha=-lr)
    else:
        _commit(p, torch.add(p, u, alpha=-lr), skip)
    return clipped


def lion_step(p: Tensor, g: Tensor, m: Tensor, *, lr: float, wd: float, beta1: float, beta2: float,
              skip: Tensor | None = None) -> None:
    p_new = _staged(p, skip)
    if wd != 0:
        p_new.mul_(1 - lr * wd)
    c = torch.lerp(m, g, 1 - beta1, out=_scratch(p))  # c = b1*m + (1-b1)*g
    p_new.add_(c.sign_(), alpha=-lr)
    _commit(p, p_new, skip)
    m_new = _staged(m, skip)
    m_new.lerp_(g, 1 - beta2)                         # m = b2*m + (1-b2)*g
    _commit(m, m_new, skip)


def sophia_step(p: Tensor, g: Tensor, m: Tensor, h: Tensor, *, lr: float, wd: float, beta1: float,
                scale: float, eps: float, skip: Tensor | None = None) -> None:
    p_new, m_new = _staged(p, skip), _staged(m, skip)
    if wd != 0:
        p_new.mul_(1 - lr * wd)
    m_new.lerp_(g, 1 - beta1)                         # m = b1*m + (1-b1)*g
    # sign(m) * min(|m| / d, 1) == clamp(m / d, -1, 1) bitwise for d > 0 (eps > 0): IEEE division
    # is sign-symmetric, so one temporary does the work of three.
    d = torch.mul(h, scale, out=_scratch(p)).add_(eps)
    p_new.add_(torch.div(m_new, d, out=d).clamp_(-1.0, 1.0), alpha=-lr)
    _commit(p, p_new, skip)
    _commit(m, m_new, skip)


def ademamix_step(p: Tensor, g: Tensor, m1: Tensor, m2: Tensor, v: Tensor, *, lr: float, wd: float, beta1: float,
                  beta2: float, beta3: float, alpha: float, bias_correction1: float, bias_correction2: float,
                  eps: float, skip: Tensor | None = None) -> None:
    # The authors' order, each product rounded on its own (apple/ml-ademamix): the kernels round alike.
    m1_new, m2_new, v_new = _staged(m1, skip), _staged(m2, skip), _staged(v, skip)
    m1_new.mul_(beta1).add_(g, alpha=1 - beta1)        # m1 = b1*m1 + (1-b1)*g
    m2_new.mul_(beta3).add_(g, alpha=1 - beta3)        # m2 = b3*m2 + (1-b3)*g
    v_new.mul_(beta2).addcmul_(g, g, value=1 - beta2)  # v = b2*v + (1-b2)*g*g
    # The update is built in the gradient's storage (consumed), with one scratch tensor.
    slow = torch.mul(m2_new, alpha, out=_scratch(p))
    u = torch.div(m1_new, bias_correction1, out=g).add_(slow)  # m1/bc1 + alpha*m2
    u.div_(torch.sqrt(v_new, out=slow).div_(math.sqrt(bias_correction2)).add_(eps))
    if wd != 0:
        u.add_(p, alpha=wd)
    u.mul_(-lr)
    if skip is None:
        p.add_(u)
    else:
        _commit(p, torch.add(p, u), skip)
    for t, new in ((m1, m1_new), (m2, m2_new), (v, v_new)):
        _commit(t, new, skip)


def schedulefree_step(y: Tensor, g: Tensor, z: Tensor, v: Tensor, *, lr: float, y_lr: float, ckp1: float, wd: float,
                      beta2: float, bias_correction2: float, eps: float, skip: Tensor | None = None) -> None:
    # schedulefree.AdamWScheduleFree.step's operations in its order, so that on CPU this is the package
    # bitwise; the update u is built in the gradient's storage (consumed), as the package does.
    v_new, y_new, z_new = _staged(v, skip), _staged(y, skip), _staged(z, skip)
    v_new.mul_(beta2).addcmul_(g, g, value=1 - beta2)  # v = b2*v + (1-b2)*g*g
    u = torch.div(g, torch.div(v_new, bias_correction2, out=_scratch(y)).sqrt_().add_(eps), out=g)
    if wd != 0:
        u.add_(y, alpha=wd)                            # the decay taken at y (before its update)
    y_new.lerp_(z, ckp1).add_(u, alpha=y_lr)           # y = lerp(y, z, ckp1) + y_lr*u, z before its update
    z_new.sub_(u, alpha=lr)                            # z = z - lr*u
    for t, new in ((v, v_new), (y, y_new), (z, z_new)):
        _commit(t, new, skip)


def mars_correction(g: Tensor, g_prev: Tensor, *, scale: float, skip: Tensor | None = None) -> Tensor:
    # c = g + scale*(g - g_prev) in MARS's torch order, each product and sum rounded on its own;
    # c is built in the gradient's storage (consumed), g_prev = g copied before it.
    d = torch.sub(g, g_prev, out=_scratch(g)).mul_(scale)
    if skip is None:
        g_prev.copy_(g)
    else:
        _commit(g_prev, g, skip)
    c = g.add_(d)
    return torch.linalg.vector_norm(c, dtype=common.compute_dtype(c.dtype)).square()  # the sum of c^2


def sgd_step(p: Tensor, g: Tensor, buf: Tensor | None, *, lr: float, momentum: float, wd: float,
             skip: Tensor | None = None) -> None:
    # torch.optim.SGD's for-loop step, operation for operation (no dampening, no Nesterov).
    d = g if wd == 0 else g.add(p, alpha=wd)
    if buf is not None:
        buf_new = _staged(buf, skip)
        buf_new.mul_(momentum).add_(d)
        _commit(buf, buf_new, skip)
        d = buf_new
    if skip is None:
        p.add_(d, alpha=-lr)
    else:
        _commit(p, torch.add(p, d, alpha=-lr), skip)


def adafactor_statistics(g: Tensor) -> tuple[Tensor, Tensor]:
    s = _adafactor_squares(g)
    return s.mean(dim=1), s.sum(dim=0)


def adafactor_factored_sums(p: Tensor, g: Tensor, row: Tensor, col: Tensor, *, rows_first: bool) -> Tensor:
    return _sums_of_squares(_factored_direction(g, row, col, rows_first), p)


def adafactor_factored_apply(p: Tensor, g: Tensor, row: Tensor, col: Tensor, *, rows_first: bool,
                             divisor: Tensor | None, lr: float, scale: Tensor, skip: Tensor | None = None) -> None:
    _adafactor_apply(p, _factored_direction(g, row, col, rows_first), divisor, lr, scale, skip)


def adafactor_unfactored_sums(p: Tensor, g: Tensor, v: Tensor, *, beta: float, w: float,
                              skip: Tensor | None = None) -> Tensor:
    v_new = _staged(v, skip)
    v_new.mul_(beta).add_(_adafactor_squares(g), alpha=w)
    _commit(v, v_new, skip)
    return _sums_of_squares(_unfactored_direction(g, v_new), p)


def adafactor_unfactored_apply(p: Tensor, g: Tensor, v: Tensor, *, divisor: Tensor | None, lr: float,
                               scale: Tensor, skip: Tensor | None = None) -> None:
    _adafactor_apply(p, _unfactored_direction(g, v), divisor, lr, scale, skip)


def _adafactor_squares(g: Tensor) -> Tensor:
    """g*g + optax's epsilon, in the compute dtype."""
    return g.to(common.compute_dtype(g.dtype)).square().add_(common.ADAFACTOR_EPSILON)


def _factored_direction(g: Tensor, row: Tensor, col: Tensor, rows_first: bool) -> Tensor:
    """g times the row's factor and the column's, in optax's order (the shorter side's first)."""
    g = g.to(row.dtype)
    if rows_first:
        return torch.mul(g, row[:, None]).mul_(col[None, :])
    return torch.mul(g, col[None, :]).mul_(row[:, None])


def _unfactored_direction(g: Tensor, v: Tensor) -> Tensor:
    return torch.rsqrt(v).mul_(g.to(v.dtype))  # optax's g * v ** -0.5 (a product commutes)


def _sums_of_squares(u: Tensor, p: Tensor) -> Tensor:
    """(sum(u*u), sum(p*p)) in u's dtype: the two rms of Adafactor's clip and parameter scale."""
    return torch.stack([u.square().sum(), p.to(u.dtype).square().sum()])


def _adafactor_apply(p: Tensor, u: Tensor, divisor: Tensor | None, lr: float, scale: Tensor,
                     skip: Tensor | None) -> None:
    # optax's three scalings in its order (one factor would save two passes over u, but round otherwise)
    if divisor is not None:
        u.div_(divisor)
    u.mul_(-lr).mul_(scale)
    if skip is None:
        p.add_(u)
    else:
        _commit(p, torch.add(p, u).to(p.dtype), skip)


def skipped_ratios(p: Tensor, reduce: str) -> tuple[Tensor, ...]:
    """What ``moments_and_ratios`` returns for a skipped update that computed nothing: guarded
    (NaN) ratios of the right shapes."""
    nan = functools.partial(torch.full, fill_value=math.nan, dtype=p.dtype, device=p.device)
    return {"none": (), "tensor": (nan(()),),
            "rows_cols": (nan((p.shape[0], 1, *p.shape[2:])), nan((1, *p.shape[1:])), nan(()))}[reduce]


def _staged(t: Tensor, skip: Tensor | None) -> Tensor:
    """Where to compute t's new value: t itself, or (when a ``skip`` flag may drop it) a copy."""
    return t if skip is None else t.clone()


def _commit(t: Tensor, new: Tensor, skip: Tensor | None) -> None:
    """t = new unless the ``skip`` flag (a 0-d tensor on t's device) is set, decided on the device."""
    if skip is not None:
        torch.where(skip == 0, new, t, out=t)


def ratio(p_norm: Tensor, u_norm: Tensor, max_p_norm: float) -> Tensor:
    """min(p_norm, max_p_norm) / u_norm, NaN where either is 0; an overflow (finite / denormal)
    becomes the largest finite value, so that a zero element of u still gets a zero update."""
    p_norm = p_norm.clamp(max=max_p_norm)
    ratio = (p_norm / u_norm).clamp_(max=torch.finfo(p_norm.dtype).max)
    return ratio.masked_fill_((p_norm == 0) | (u_norm == 0), float("nan"))


def _scratch(p: Tensor) -> Tensor:
    """A p-shaped temporary: a view of one buffer per device and dtype, reused across tensors,
    steps and optimizers (the size of the largest tensor this module has stepped; not state)."""
    key = (p.device, p.dtype)
    buf = _scratch_buffers.get(key)
    if buf is None or buf.numel() < p.numel():
        buf = _scratch_buffers[key] = torch.empty(p.numel(), dtype=p.dtype, device=p.device)
    return buf[:p.numel()].view(p.shape)
