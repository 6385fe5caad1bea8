"""SGD: torch's own ``torch.optim.SGD`` (docs/optimizers.md, "SGD") with the training-loop protocol.

Marek et al. 2025 ("Small Batch Size Training for Language Models"; martin-marek/batch-size,
``pretraining/optimizer.py``) run SGD as optax's ``trace(decay=b1)`` (none without b1), then the
scheduled lr, and no weight decay: ``buf = momentum*buf + g; p = p - lr*buf``, torch's SGD with
no dampening and no Nesterov, which this is. The step is torch's, untouched, on torch's default
implementation (a for-loop on CPU, foreach on CUDA), so it is bitwise ``torch.optim.SGD`` in every
dtype: torch's fused SGD rounds bfloat16 and float16 parameters differently (measured on CPU), so
it is not used, and a step with a non-finite gradient is dropped on the host (``step_unless``
reads the flag: one sync).

``weight_decay`` is torch SGD's: ``g = g + wd*p`` before the momentum (an L2 term, coupled), not
the decoupled decay of the other optimizers here; with momentum 0 it is the same step as a
decoupled ``p = p*(1 - lr*wd)``. The authors run none (their code asserts it).
"""
import torch

from .backends import check_setting
from .protocol import TrainingHooks


class SGD(TrainingHooks, torch.optim.SGD):
    """``torch.optim.SGD(params, lr, momentum, weight_decay=weight_decay)``; no diagnostics of its own.

    ``momentum`` in [0, 1) (torch takes any momentum >= 0; a momentum of 1 or more never forgets a
    gradient). State: "momentum_buffer" per parameter with momentum, none without."""

    # The decays a batch change may scale by their half-life in tokens (beta' = beta ** (B'/B)):
    # the momentum, a param-group scalar.
    BATCH_DECAYS = {"momentum": ("momentum", None)}

    def __init__(self, params, *, lr: float, weight_decay: float = 0.0, momentum: float = 0.0,
                 backend: str = "auto"):
        check_setting(backend)
        if backend not in ("auto", "torch"):
            raise ValueError(f"optim_backend={backend!r} does not apply to SGD, which runs torch's own SGD: "
                             f"use 'auto' or 'torch'")
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)

    def add_param_group(self, param_group: dict) -> None:
        # Every group, the defaults' included (torch's __init__ adds them here), before it joins;
        # written as "not (valid)" so that NaN is refused too.
        h = {**self.defaults, **param_group}
        if not h["lr"] >= 0.0:
            raise ValueError(f"Invalid learning rate: {h['lr']} (must be >= 0)")
        if not 0.0 <= h["momentum"] < 1.0:
            raise ValueError(f"Invalid momentum value: {h['momentum']} (must be in [0, 1))")
        if not h["weight_decay"] >= 0.0:
            raise ValueError(f"Invalid weight_decay value: {h['weight_decay']} (must be >= 0)")
        super().add_param_group(param_group)
