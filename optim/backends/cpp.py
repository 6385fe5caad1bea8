"""The fused operations as C++/OpenMP kernels for CPU tensors (kernels/csrc/).

The project's one extension (kernels/) holds them: the two passes of the trust-ratio optimizers
(``trust_ratio.cpp``), the one-sweep steps of Lion and Sophia-G (``sign.cpp``), those of
AdEMAMix and Schedule-Free AdamW, with MARS's correction (``adam_family.cpp``), SGD's
(``sgd.cpp``) and Adafactor's sweeps (``adafactor.cpp``).
``load`` builds it (or loads it from torch's extensions directory, where the first build put it). It is
called by ``optim.backends.prepare`` when an optimizer is created, never as a side effect of a
step. The kernels compute what optim/backends/reference.py computes (up to rounding: float32
sums in another order), in float32 (float64 for float64 tensors). A ``skip`` flag is read on the
host (it is a CPU tensor like theirs: no device to wait for) and skips the kernel (MARS's
correction, whose c AdamW's own flag then drops, runs but keeps g_prev).
"""
import math

import torch
from torch import Tensor

import kernels

from . import common, reference

NAME = "cpp"
TAKES = "contiguous CPU tensors of one dtype: float32, bfloat16 or float64"


def takes(tensors: list[Tensor], *, matrix: bool = False) -> bool:
    """Whether the kernels take ``tensors`` (p first; a 2-D p if ``matrix``)."""
    return common.takes(tensors, matrix=matrix, device_types=("cpu",))


def ready() -> bool:
    """Whether ``load`` has built and loaded the kernels in this process."""
    return kernels.ready()


def load(required: bool) -> bool:
    """Build (or reuse) and load the kernels, once per process, with a line on stderr saying so.
    A failure raises if ``required``, else is one warning and False (the reference runs)."""
    error = kernels.build()
    if error is None:
        return True
    message = f"optim: {kernels.failure(error)}"
    if required:
        raise RuntimeError(f"{message}: install a C++ compiler and ninja, or use optim_backend='auto' "
                           f"or 'torch'") from error
    common.warn_once(f"{message}; the optimizers use their torch reference on CPU tensors")
    return False


def moments_and_ratios(p: Tensor, g: Tensor, m: Tensor, v: Tensor, *, beta1: float, beta2: float,
                       eps: float, wd: float, reduce: str, l2: bool, m_scale: float = 1.0,
                       v_scale: float = 1.0, max_p_norm: float = math.inf,
                       skip: Tensor | None = None) -> tuple[Tensor, ...]:
    if _skipped(skip):
        return reference.skipped_ratios(p, reduce)
    ratios = torch.ops.nanomerit.moments_and_ratios(p, g, m, v, beta1, beta2, eps, wd, m_scale, v_scale,
                                                    max_p_norm, reduce == "rows_cols", l2)
    return tuple(ratios) if reduce != "none" else ()


def apply_update(p: Tensor, u: Tensor, rows: Tensor | None, cols: Tensor | None, *, lr: float,
                 clip: bool, count: bool, skip: Tensor | None = None) -> Tensor | None:
    if _skipped(skip):
        return torch.zeros((), dtype=torch.long) if count else None
    rows, cols = common.kernel_factors(p, rows, cols)
    return torch.ops.nanomerit.apply_update(p, u, rows, cols, lr, clip, count)


def lion_step(p: Tensor, g: Tensor, m: Tensor, *, lr: float, wd: float, beta1: float, beta2: float,
              skip: Tensor | None = None) -> None:
    if not _skipped(skip):
        torch.ops.nanomerit.lion_step(p, g, m, lr, wd, beta1, beta2)


def sophia_step(p: Tensor, g: Tensor, m: Tensor, h: Tensor, *, lr: float, wd: float, beta1: float,
                scale: float, eps: float, skip: Tensor | None = None) -> None:
    if not _skipped(skip):
        torch.ops.nanomerit.sophia_step(p, g, m, h, lr, wd, beta1, scale, eps)


def ademamix_step(p: Tensor, g: Tensor, m1: Tensor, m2: Tensor, v: Tensor, *, lr: float, wd: float, beta1: float,
                  beta2: float, beta3: float, alpha: float, bias_correction1: float, bias_correction2: float,
                  eps: float, skip: Tensor | None = None) -> None:
    if not _skipped(skip):
        torch.ops.nanomerit.ademamix_step(p, g, m1, m2, v, lr, wd, beta1, beta2, beta3, alpha, bias_correction1,
                                          bias_correction2, eps)


def schedulefree_step(y: Tensor, g: Tensor, z: Tensor, v: Tensor, *, lr: float, y_lr: float, ckp1: float, wd: float,
                      beta2: float, bias_correction2: float, eps: float, skip: Tensor | None = None) -> None:
    if not _skipped(skip):
        torch.ops.nanomerit.schedulefree_step(y, g, z, v, lr, y_lr, ckp1, wd, beta2, bias_correction2, eps)


def mars_correction(g: Tensor, g_prev: Tensor, *, scale: float, skip: Tensor | None = None) -> Tensor:
    return torch.ops.nanomerit.mars_correction(g, g_prev, scale, not _skipped(skip))  # (c is computed anyway)


def sgd_step(p: Tensor, g: Tensor, buf: Tensor | None, *, lr: float, momentum: float, wd: float,
             skip: Tensor | None = None) -> None:
    if not _skipped(skip):
        torch.ops.nanomerit.sgd_step(p, g, buf, lr, momentum, wd)


def adafactor_statistics(g: Tensor) -> tuple[Tensor, Tensor]:
    return tuple(torch.ops.nanomerit.adafactor_statistics(g, common.ADAFACTOR_EPSILON))


def adafactor_factored_sums(p: Tensor, g: Tensor, row: Tensor, col: Tensor, *, rows_first: bool) -> Tensor:
    return torch.ops.nanomerit.adafactor_factored_sums(p, g, row, col, rows_first)


def adafactor_factored_apply(p: Tensor, g: Tensor, row: Tensor, col: Tensor, *, rows_first: bool,
                             divisor: Tensor | None, lr: float, scale: Tensor, skip: Tensor | None = None) -> None:
    if not _skipped(skip):
        torch.ops.nanomerit.adafactor_factored_apply(p, g, row, col, rows_first, _value(divisor), lr, scale.item())


def adafactor_unfactored_sums(p: Tensor, g: Tensor, v: Tensor, *, beta: float, w: float,
                              skip: Tensor | None = None) -> Tensor:
    if _skipped(skip):  # (v kept; the apply that follows is skipped too)
        return torch.zeros(2, dtype=v.dtype)
    return torch.ops.nanomerit.adafactor_unfactored_sums(p, g, v, beta, w, common.ADAFACTOR_EPSILON)


def adafactor_unfactored_apply(p: Tensor, g: Tensor, v: Tensor, *, divisor: Tensor | None, lr: float,
                               scale: Tensor, skip: Tensor | None = None) -> None:
    if not _skipped(skip):
        torch.ops.nanomerit.adafactor_unfactored_apply(p, g, v, _value(divisor), lr, scale.item())


def _value(divisor: Tensor | None) -> float:
    """A divisor's value for a kernel; none divides by 1 (the same floats)."""
    return 1.0 if divisor is None else divisor.item()


def _skipped(skip: Tensor | None) -> bool:
    return skip is not None and bool(skip)
