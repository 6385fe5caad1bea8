"""The gradient clipped by its global 2-norm: torch's ``clip_grad_norm_``, the same floats, with less
work a step.

At batch 1 a step of a small model takes a few milliseconds, and ``clip_grad_norm_`` spent a tenth
of it finding its tensors (walking the modules for the parameters, grouping the gradients by
device and dtype) before its three operations (docs/performance.md, "Small batches"). Here the
parameters are listed once, and where the gradients form one group (plain tensors of one device
and dtype: every run but FSDP2's sharded ones) the operations are called directly, as torch calls
them for a group: each gradient's norm (``_foreach_norm``), the norm of those norms, and the
gradients multiplied by min(1, max_norm / (norm + 1e-6)). Without clipping (``max_norm`` 0) that
factor is exactly 1, and the multiplication is left out: x * 1 is x (where the norm is not finite
torch's factor is NaN; the loop takes no step with such gradients: training/nonfinite.py). Anything
else goes to torch's function.

On a CPU, ``_foreach_norm`` is one ``vector_norm`` per tensor, and the per-tensor calls are most
of the clip of a small model. A step that asks no exact norm (``exact=False``: the loop's steps
but its log steps, where the norm is recorded) first sums the squares of all the gradients in one
call (kernels/csrc/norm.cpp: in float64) and bounds how far torch's norm can lie from that sum's
root. Where even the bound puts torch's norm under the clip's threshold, torch would multiply the
gradients by exactly 1 (x * 1 is x) and find the norm finite: nothing is done, and that root,
rounded to the gradients' dtype, is the norm returned. Anywhere else (clipping, a norm near the
threshold, a non-finite or overflowing norm, a gradient too long for the bound to be useful)
torch's operations run as above (after the sum, about a fifth of their cost on a small model). So
the gradients and the finite verdict are torch's floats at every step, and the norm returned too
at an exact step; at the others it is within the bound of torch's (``bound``). The short way is a
CPU's: on a GPU ``_foreach_norm`` is already one kernel for many tensors.

The bound holds for any order of summation torch may use: a sum of n terms in a dtype of unit
roundoff u is within gamma(n) = n u / (1 - n u) of the sum (each square rounded adds u); the
square root adds u; the norm of the norms likewise over the k tensors. The float64 sum of squares
adds its own gamma in u = 2^-53. With float32 gradients and 65,536 elements in the longest the
bound is 2.0e-3: a step whose norm is 0.2% or more under max_norm takes the short way.
"""
import math
from collections.abc import Iterable

import torch
from torch import Tensor

import kernels

UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53}  # the dtypes the short way takes


class GradientClip:
    """``clip(exact=True)``: the gradients' total 2-norm (0-d; under FSDP2 a DTensor, as torch returns
    it), the gradients scaled in place as ``torch.nn.utils.clip_grad_norm_(parameters, max_norm)``
    scales them; ``max_norm`` 0 (or None) clips nothing. ``exact=False``: the same gradients, and a
    norm within ``bound`` of torch's, exact where it is computed torch's way."""

    def __init__(self, parameters: Iterable[torch.nn.Parameter], max_norm: float | None):
        self.parameters = list(parameters)
        self.max_norm = max_norm or math.inf
        # A gradient has its parameter's type, device and dtype (torch holds it to them): whether
        # the gradients form one group is the parameters', and the bound over all of them holds for
        # any of them (fewer and shorter tensors: a smaller bound).
        self.one_group = one_group(self.parameters)
        self.bound = (bound([p.numel() for p in self.parameters], self.parameters[0].dtype)
                      if self.one_group and self.parameters[0].device.type == "cpu" else math.inf)
        # Under this the short way's norm leaves no doubt: torch's is under the threshold, where
        # max_norm / (norm + 1e-6) is 1 or more in float32's rounding, and its sums of squares are
        # far from overflowing (both checks fail for a NaN).
        threshold = (self.max_norm * (1 - 1e-5) - 1e-6) * (1 - 1e-5)
        limit = math.sqrt(torch.finfo(self.parameters[0].dtype).max) / 2 if self.parameters else 0.0
        self.short_way_under = min(threshold, limit) / (1 + self.bound)

    def __call__(self, exact: bool = True) -> Tensor:
        if not self.one_group:
            return torch.nn.utils.clip_grad_norm_(self.parameters, self.max_norm)
        grads = [p.grad for p in self.parameters if p.grad is not None]
        if not grads:
            return torch.nn.utils.clip_grad_norm_(self.parameters, self.max_norm)
        if not exact and self.bound < math.inf and kernels.build() is None:
            norm = math.sqrt(torch.ops.nanomerit.sum_of_squares(grads))
            if norm < self.short_way_under:
                return torch.tensor(norm, dtype=grads[0].dtype)
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
        if self.max_norm != math.inf:
            torch._foreach_mul_(grads, torch.clamp(self.max_norm / (norm + 1e-6), max=1.0))
        return norm


def bound(sizes: list[int], dtype: torch.dtype) -> float:
    """How far, relatively, torch's norm of tensors of ``sizes`` elements of ``dtype`` may lie from the
    root of their float64 sum of squares (inf: too far to be of use, or a dtype without a bound)."""
    if dtype not in UNIT_ROUNDOFF or not sizes:
        return math.inf
    u = UNIT_ROUNDOFF[dtype]
    torch_norm = math.sqrt((1 + gamma(max(sizes) + 1, u)) * (1 + gamma(len(sizes) + 1, u))) * (1 + u) ** 3
    ours = math.sqrt(1 - gamma(sum(sizes) + 1, 2.0 ** -53)) * (1 - 2.0 ** -53)
    return torch_norm / ours - 1


def gamma(n: int, u: float) -> float:
    """The relative error bound of a sum of n terms of unit roundoff u (inf where n u >= 1/2)."""
    return n * u / (1 - n * u) if n * u < 0.5 else math.inf


def one_group(tensors: list[Tensor]) -> bool:
    """Whether torch's clip would take the gradients of ``tensors`` as one group of plain tensors
    (none, DTensors or several devices or dtypes: its own grouping)."""
    return bool(tensors) and all(type(t.data) is torch.Tensor and t.device == tensors[0].device
                                 and t.dtype == tensors[0].dtype for t in tensors)
