"""Lion (Chen et al., 2023), docs/optimizers.md "Lion":

    p = p * (1 - lr*wd)          # decoupled decay, scaled by the scheduled lr
    c = b1*m + (1-b1)*g
    p = p - lr * sign(c)
    m = b2*m + (1-b2)*g

One sweep per tensor: the fused ``lion_step`` of optim/backends/.
"""
from torch import Tensor

from . import sharding
from .base import Optimizer, zeros_like
from .protocol import ADAM_BETAS


class Lion(Optimizer):
    """Lion optimizer.

    Defaults are the authors' (lr=1e-4, betas=(0.9, 0.99)). Their guidance: lr 3-10x smaller than
    AdamW's and weight decay 3-10x larger; GPT-2 lr 1e-4 (125M, 355M), 8e-5 (770M). Every param
    group may override lr, betas and weight_decay. State per parameter: "exp_avg" (m).
    Diagnostics: none of its own (the training loop measures every optimizer's update sizes).
    """

    BATCH_DECAYS = ADAM_BETAS  # (Lion's interpolation and its momentum's decay)

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, *, backend: str = "auto"):
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay}, backend=backend)

    def init_state(self, p: Tensor) -> dict:
        return {"exp_avg": zeros_like(p)}

    def update(self, p: Tensor, grad: Tensor, state: dict, group: dict, index: int, skip: Tensor | None,
               shards: sharding.Shards | None) -> None:
        (beta1, beta2), m = group["betas"], state["exp_avg"]
        self.implementation(group, p, grad, m, shards=shards).lion_step(
            p, grad, m, lr=group["lr"], wd=group["weight_decay"], beta1=beta1, beta2=beta2, skip=skip)
