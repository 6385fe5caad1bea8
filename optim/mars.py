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
fused AdamW kernel on c. c and its squared norm come from one sweep of g and g_prev, the fused
operation ``mars_correction`` (optim/backends/), which writes c into the gradient's storage.
Everything else (embeddings, the tied LM head, norms, biases) takes plain AdamW on g, through the
same kernel, with its own lr, betas and weight decay (the authors' "1-D" path).
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import sharding
from .base import zeros_like
from .hybrid import HiddenMatricesAndAdamW
from .protocol import ADAM_BETAS


class MARS(HiddenMatricesAndAdamW):
    """MARS-AdamW ("approx": g_prev is the previous step's gradient; the exact variant, which
    evaluates the previous batch again at the new weights, is not implemented) on the param groups
    marked ``hidden_matrix=True`` (``optim.build`` groups a model so), AdamW on the others.

    MARS's part: ``lr``, ``betas``, ``eps``, ``weight_decay`` (decoupled, scaled by lr) and ``gamma``.
    AdamW's part: ``adamw_lr`` (None: lr; kept as a fixed ratio of lr, so it follows lr's schedule, as
    the authors' ``lr_1d`` does), ``adamw_betas``, the same ``eps``, ``adamw_weight_decay`` (None:
    weight_decay) for the groups that decay (the shared builder decays no embedding, norm or bias
    unless ``decay_embeddings``).

    Defaults are the authors' constructor's (AGI-Arena/MARS ``MARS/optimizers/mars.py``: lr 3e-3,
    betas (0.95, 0.99), eps 1e-8, wd 0, gamma 0.025, betas_1d (0.9, 0.95)) but for the AdamW part's
    lr, their ``lr_1d`` a fixed 3e-3 (here: lr), and its weight decay, their ``weight_decay_1d`` 0.1
    (here: weight_decay's). Their GPT-2 small recipe (README): lr 6e-3, wd 1e-2, lr_1d 3e-3,
    weight_decay_1d 0.1. The 2025 benchmark's (optim/published.py): lr 3e-3, wd 0.1, AdamW lr 1e-3
    and betas (0.8, 0.999).

    State: "step", "exp_avg", "exp_avg_sq" per tensor (as torch's fused AdamW keeps them) and
    "last_grad" (g_prev) per MARS matrix. ``step`` consumes the MARS matrices' gradients (p.grad
    holds c afterwards). Diagnostics (requested steps), per MARS matrix:
    ``correction_norm``, ||c||_2 before the clip, and ``correction_clipped``, 1 where it was clipped.
    Under FSDP2 a rank holds rows: ||c||_2 sums the ranks' squares (one all-reduce per matrix).
    """

    BATCH_DECAYS = {**ADAM_BETAS, "adamw_beta1": ("adamw_betas", 0), "adamw_beta2": ("adamw_betas", 1)}

    # c in one sweep (the fused ``mars_correction``, written into the gradient's storage: ``step``
    # consumes the gradients), then torch's fused AdamW kernel on c.
    USES_FUSED_OPERATIONS = True
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
            c, clip = self._corrected(grad, state["last_grad"], group, index, skip, shards)
            self.adamw_step(p, c, state, lr=group["lr"], betas=group["betas"], weight_decay=group["weight_decay"],
                            eps=group["eps"], skip=skip, grad_scale=clip)
        else:
            self.adamw_part(p, grad, state, group, group["adamw_betas"], skip)

    def _corrected(self, grad: Tensor, last_grad: Tensor, group: dict, index: int, skip: Tensor | None,
                   shards: sharding.Shards | None) -> tuple[Tensor, Tensor | None]:
        """(c in the gradient's storage, the divisor that clips it to l2 norm 1 or None where c is
        clipped already); ``last_grad`` becomes ``grad`` (but on a step flagged by ``skip``)."""
        beta1 = group["betas"][0]
        ops = self.implementation(group, grad, last_grad, shards=shards)
        squares = ops.mars_correction(grad, last_grad, scale=group["gamma"] * (beta1 / (1 - beta1)), skip=skip)
        # (FSDP2: this rank's rows; the whole matrix's norm from the ranks' squares)
        norm = sharding.total(squares, shards).sqrt()
        if self.diagnostics_requested:
            self.record_diagnostics(group, index, correction_norm=norm, correction_clipped=norm > 1)
        # c / ||c|| where ||c|| > 1, c itself (bitwise) elsewhere. The AdamW kernel divides by it as it reads c
        # (its grad_scale, float32: a sweep less, bitwise the division for float32 c), but in float64.
        divisor = norm.clamp(min=1.0)
        if grad.dtype == torch.float64:
            return grad.div_(divisor), None
        return grad, divisor.float()

    def backends(self) -> dict[str, str]:
        corrections = super().backends()  # who runs mars_correction: "cpp", "triton x4, torch x1", ...
        return {key: f"{corrections[key]} (MARS's correction), torch (fused AdamW)" if group["hidden_matrix"]
                else "torch (AdamW, fused)" for key, group in zip(corrections, self.param_groups)}
