"""SGD as ``torch.optim.SGD`` steps it (docs/optimizers.md, "SGD"), through one fused sweep.

Marek et al. 2025 ("Small Batch Size Training for Language Models"; martin-marek/batch-size,
``pretraining/optimizer.py``) run SGD as optax's ``trace(decay=b1)`` (none without b1), then the
scheduled lr, and no weight decay: ``buf = momentum*buf + g; p = p - lr*buf``, torch's SGD with
no dampening and no Nesterov, which this is.

The step is the fused ``sgd_step`` of optim/backends/ (the C++ kernel on CPU tensors, Triton's on
CUDA ones, the torch reference elsewhere): one sweep over p, g and the buffer. It computes torch's
for-loop step operation for operation, each ``add`` with an alpha a fused multiply-add as torch's
is, so it is ``torch.optim.SGD`` bitwise in float32 and float64; in bfloat16 it is torch's
vectorised loop, whose scalar tails round a product more (docs/optimizers.md, "SGD"). The
momentum buffer starts at zero, where torch clones the first step's direction d into it:
0*momentum + d is d, the same floats but for the sign of a zero d. A step with a non-finite
gradient is dropped on the device (``skip``), with no host sync.

``weight_decay`` is torch SGD's: ``g = g + wd*p`` before the momentum (an L2 term, coupled), not
the decoupled decay of the other optimizers here; with momentum 0 it is the same step as a
decoupled ``p = p*(1 - lr*wd)``. The authors run none (their code asserts it).
"""
from torch import Tensor

from . import sharding
from .base import Optimizer, zeros_like


class SGD(Optimizer):
    """``torch.optim.SGD(params, lr, momentum, weight_decay=weight_decay)``; no diagnostics of its own.

    ``momentum`` in [0, 1) (torch takes any momentum >= 0; a momentum of 1 or more never forgets a
    gradient). State: "momentum_buffer" per parameter with momentum, none without."""

    # The decays a batch change may scale by their half-life in tokens (beta' = beta ** (B'/B)):
    # the momentum, a param-group scalar.
    BATCH_DECAYS = {"momentum": ("momentum", None)}

    def __init__(self, params, *, lr: float, weight_decay: float = 0.0, momentum: float = 0.0,
                 backend: str = "auto"):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum}, backend=backend)

    def check_options(self, h: dict) -> None:
        if not 0.0 <= h["momentum"] < 1.0:
            raise ValueError(f"Invalid momentum value: {h['momentum']} (must be in [0, 1))")

    def init_state(self, p: Tensor) -> dict:
        # (A parameter without a buffer has an empty state, made again at each step, so without
        # momentum this is asked every step: it looks p's group up only where a group has one. A
        # momentum resumed from 0 to nonzero gets its buffer then.)
        if all(group["momentum"] == 0 for group in self.param_groups) or self.group_of(p)["momentum"] == 0:
            return {}
        return {"momentum_buffer": zeros_like(p)}

    def update(self, p: Tensor, grad: Tensor, state: dict, group: dict, index: int, skip: Tensor | None,
               shards: sharding.Shards | None) -> None:
        buf = state.get("momentum_buffer") if group["momentum"] != 0 else None
        self.implementation(group, *(t for t in (p, grad, buf) if t is not None)).sgd_step(
            p, grad, buf, lr=group["lr"], momentum=group["momentum"], wd=group["weight_decay"], skip=skip)
