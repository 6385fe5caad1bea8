"""LAMB (You et al., ICLR 2020) as the MERIT paper's baseline, pytorch-lamb style
(docs/optimizers.md, "LAMB"), on MERIT's two fused passes (optim/backends/)."""
import math

import torch
from torch import Tensor

from . import sharding
from .base import Optimizer, step_counter, zeros_like
from .protocol import ADAM_BETAS

_MAX_WEIGHT_NORM = 10.0


class LAMB(Optimizer):
    """LAMB optimizer, pytorch-lamb style (defaults lr=1e-3, betas=(0.9, 0.999), eps=1e-6, wd=0).

    Per tensor, vectors included::

        u      = m / (sqrt(v) + eps) + wd * p     # eps outside the sqrt, wd inside u
        w_norm = min(||p||_2, 10)                 # p before this step's update
        ratio  = w_norm / ||u||_2, or 1 if either norm is 0
        p      = p - lr * ratio * u

    Options (keywords, also per param group):
      bias_correction=False       True: m / (1 - b1^t) and v / (1 - b2^t) in u (as apex/timm).
      ratio_only_with_decay=False True: groups with weight_decay == 0 use ratio 1 (apex/timm).
    ``step`` consumes the gradients (p.grad holds u afterwards). Diagnostics (requested steps):
    ``trust_ratio`` per parameter (1 where the guard or ratio_only_with_decay applies).
    """

    BATCH_DECAYS = ADAM_BETAS

    FLAGS = ("bias_correction", "ratio_only_with_decay")

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, *, bias_correction: bool = False,
                 ratio_only_with_decay: bool = False, backend: str = "auto"):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "bias_correction": bias_correction,
                                  "ratio_only_with_decay": ratio_only_with_decay}, backend=backend)

    def init_state(self, p: Tensor) -> dict:
        return {"step": step_counter(), "exp_avg": zeros_like(p), "exp_avg_sq": zeros_like(p)}

    def update(self, p: Tensor, grad: Tensor, state: dict, group: dict, index: int, skip: Tensor | None,
               shards: sharding.Shards | None) -> None:
        (beta1, beta2), m, v = group["betas"], state["exp_avg"], state["exp_avg_sq"]
        scales = {}
        if group["bias_correction"]:
            # A CPU tensor: no device sync (on CUDA under a found_inf flag it is a CUDA one: one sync).
            step = state["step"].item()
            scales = {"m_scale": 1 / (1 - beta1 ** step), "v_scale": 1 / math.sqrt(1 - beta2 ** step)}
        use_ratio = group["weight_decay"] != 0 or not group["ratio_only_with_decay"]
        ops = self.implementation(group, p, grad, m, v, shards=shards)
        ratios = ops.moments_and_ratios(p, grad, m, v, beta1=beta1, beta2=beta2, eps=group["eps"],
                                        wd=group["weight_decay"], reduce="tensor" if use_ratio else "none", l2=True,
                                        max_p_norm=_MAX_WEIGHT_NORM, skip=skip, **scales)
        trust = ratios[0] if use_ratio else None  # None: ratio 1
        ops.apply_update(p, grad, trust, None, lr=group["lr"], clip=False, count=False, skip=skip)
        if self.diagnostics_requested:
            one = torch.ones((), device=p.device)
            self.record_diagnostics(group, index, trust_ratio=one if trust is None else trust.nan_to_num(nan=1.0))
