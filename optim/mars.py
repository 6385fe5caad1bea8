"""MARS-AdamW (Yuan et al. 2024, "MARS: Unleashing the Power of Variance Reduction for Training
Large Models"), its "approx" variant, with an AdamW part (docs/optimizers.md, "MARS-AdamW").

For each hidden weight matrix (the groups marked ``hidden_matrix``, the ones Muon takes), g its
gradient and g_prev the previous step's (state, zero before the first step, as the authors keep it)::

    c = g + gamma * b1/(1-b1) * (g - g_prev)    # the variance-reduced gradient
    c = c / ||c||_2 if ||c||_2 > 1              # the whole matrix's l2 norm
    m = b1*m + (1-b1)*c
    v = b2*v + (1-b2)*c*c
    p = p * (1 - lr*wd) - lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)

The authors write the last line as ``p - lr * (wd*p + m / ((sqrt(v)/sqrt(1-b2^t) + eps) * (1-b1^t)))``:
the same formula as ``torch.optim.AdamW``'s, bias correction and eps included, so it runs torch's
fused AdamW kernel on c. Everything else (embeddings, the tied LM head, norms, biases) takes plain
AdamW on g, through the same kernel, with its own lr, betas and weight decay (the authors' "1-D" path).
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import sharding
from .base import zeros_like
from .hybrid import HiddenMatricesAndAdamW


class MARS(HiddenMatricesAndAdamW):
    """MARS-AdamW ("approx": g_prev is the previous step's gradient; the exact variant, which
    evaluates the previous batch again at the new weights, is not implemented) on the param groups
    marked ``hidden_matrix=True`` (``optim.build`` groups a model so), AdamW on the others.

    MARS's part: ``lr``, ``betas``, ``eps``, ``weight_decay`` (decoupled, scaled by lr) and ``gamma``.
    AdamW's part: ``adamw_lr`` (None: lr; a fixed ratio of lr, so it follows lr's schedule, as the
    authors' ``lr_1d``), ``adamw_betas``, the same ``eps``, ``adamw_weight_decay`` (None:
    weight_decay) for the groups that decay (the shared builder decays no embedding, norm or bias
    unless ``decay_embeddings``).

    Defaults are the authors' constructor's (AGI-Arena/MARS ``MARS/optimizers/mars.py``: lr 3e-3,
    betas (0.95, 0.99), eps 1e-8, wd 0, gamma 0.025, lr_1d = lr, betas_1d (0.9, 0.95)) but for their
    weight_decay_1d 0.1 (here: weight_decay's). Their GPT-2 small recipe (README): lr 6e-3,
    wd 1e-2, lr_1d 3e-3, weight_decay_1d 0.1. The 2025 benchmark's (optim/published.py): lr 3e-3,
    wd 0.1, AdamW lr 1e-3 and betas (0.8, 0.999).

    State: "step", "exp_avg", "exp_avg_sq" per tensor (as torch's fused AdamW keeps them) and
    "last_grad" (g_prev) per MARS matrix. Diagnostics (requested steps), per MARS matrix:
    ``correction_norm``, ||c||_2 before the clip, and ``correction_clipped``, 1 where it was clipped.
    Under FSDP2 a rank holds rows: ||c||_2 sums the ranks' squares (one all-reduce per matrix).
    """

    USES_FUSED_OPERATIONS = False  # torch code and torch's fused AdamW kernel
    NAME = "MARS"

    def __init__(self, params, lr: float = 3e-3, betas: tuple[float, float] = (0.95, 0.99), eps: float = 1e-8,
                 weight_decay: float = 0.0, gamma: float = 0.025, adamw_lr: float | None = None,
                 adamw_betas: tuple[float, float] = (0.9, 0.95), adamw_weight_decay: float | None = None, *,
                 backend: str = "auto"):
        super().__init__(params, {"betas": betas, "eps": eps, "gamma": gamma, "adamw_betas": tuple(adamw_betas)},
                         lr=lr, adamw_lr=adamw_lr, weight_decay=weight_decay, adamw_weight_decay=adamw_weight_decay,
                         backend=backend)

    def check_options(self, h: dict) -> None:
        super().check_options(h)
        if not 0.0 <= h["gamma"] < float("inf"):
            raise ValueError(f"Invalid gamma: {h['gamma']} (must be finite and >= 0)")
        if len(h["adamw_betas"]) != 2 or not all(0.0 <= beta < 1.0 for beta in h["adamw_betas"]):
            raise ValueError(f"Invalid adamw_betas: {h['adamw_betas']!r} (must be two numbers in [0, 1))")

    def init_state(self, p: Tensor) -> dict:
        state = self.adamw_state(p)
        if self.group_of(p)["hidden_matrix"]:
            state["last_grad"] = zeros_like(p)
        return state

    def update(self, p: Tensor, grad: Tensor, state: dict, group: dict, index: int, skip: Tensor | None,
               shards: sharding.Shards | None) -> None:
        if group["hidden_matrix"]:  # AdamW on the corrected gradient c, with MARS's lr, betas and decay
            c = self._corrected(grad, state["last_grad"], group, index, skip, shards)
            self.adamw_step(p, c, state, lr=group["lr"], betas=group["betas"], weight_decay=group["weight_decay"],
                            eps=group["eps"], skip=skip)
        else:
            self.adamw_part(p, grad, state, group, group["adamw_betas"], skip)

    def _corrected(self, grad: Tensor, last_grad: Tensor, group: dict, index: int, skip: Tensor | None,
                   shards: sharding.Shards | None) -> Tensor:
        """c, clipped to l2 norm 1; ``last_grad`` becomes ``grad`` (but on a step flagged by ``skip``)."""
        beta1 = group["betas"][0]
        c = (grad - last_grad).mul_(group["gamma"] * (beta1 / (1 - beta1))).add_(grad)
        norm = torch.linalg.vector_norm(c)
        if shards is not None:  # (FSDP2: this rank's rows; the whole matrix's norm from the ranks' squares)
            norm = sharding.total(norm.square(), shards).sqrt()
        c.div_(norm.clamp(min=1.0))  # c / ||c|| where ||c|| > 1, c itself (bitwise) elsewhere
        last_grad.copy_(grad if skip is None else torch.where(skip == 0, grad, last_grad))
        if self.diagnostics_requested:
            self.record_diagnostics(group, index, correction_norm=norm, correction_clipped=norm > 1)
        return c

    def backends(self) -> dict[str, str]:
        return {f"group{i}": "torch (MARS, fused AdamW kernel)" if group["hidden_matrix"] else "torch (AdamW, fused)"
                for i, group in enumerate(self.param_groups)}
