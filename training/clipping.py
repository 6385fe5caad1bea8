"""The gradient clipped by its global 2-norm: torch's ``clip_grad_norm_``, the same floats, with less
Python a step.

At batch 1 a step of a small model takes a few milliseconds, and ``clip_grad_norm_`` spent a tenth
of it finding its tensors (walking the modules for the parameters, grouping the gradients by
device and dtype) before its three operations (docs/performance.md, "Small batches"). Here the
parameters are listed once, and where the gradients form one group (plain tensors of one device
and dtype: every run but FSDP2's sharded ones) the operations are called directly, as torch calls
them for a group: each gradient's norm (``_foreach_norm``), the norm of those norms, and the
gradients multiplied by min(1, max_norm / (norm + 1e-6)). Without clipping (``max_norm`` 0) that
factor is exactly 1, and the multiplication is left out: x * 1 is x. Anything else goes to
torch's function itself.
"""
import math
from collections.abc import Iterable

import torch
from torch import Tensor


class GradientClip:
    """``clip()``: the gradients' total 2-norm (0-d; under FSDP2 a DTensor, as torch returns it),
    the gradients scaled in place as ``torch.nn.utils.clip_grad_norm_(parameters, max_norm)``
    scales them; ``max_norm`` 0 (or None) clips nothing."""

    def __init__(self, parameters: Iterable[torch.nn.Parameter], max_norm: float | None):
        self.parameters = list(parameters)
        self.max_norm = max_norm or math.inf

    def __call__(self) -> Tensor:
        grads = [p.grad for p in self.parameters if p.grad is not None]
        if not one_group(grads):
            return torch.nn.utils.clip_grad_norm_(self.parameters, self.max_norm)
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
        if self.max_norm != math.inf:
            torch._foreach_mul_(grads, torch.clamp(self.max_norm / (norm + 1e-6), max=1.0))
        return norm


def one_group(grads: list[Tensor]) -> bool:
    """Whether torch's clip would take ``grads`` as one group of plain tensors (none, DTensors or
    several devices or dtypes: its own grouping)."""
    return bool(grads) and all(type(g) is torch.Tensor and g.device == grads[0].device and g.dtype == grads[0].dtype
                               for g in grads)
