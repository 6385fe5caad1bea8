"""LAMB (You et al., ICLR 2020) as the MERIT paper's baseline: the pytorch-lamb style of
optimizers.md, sharing MERIT's two passes (optim/passes.py)."""
import math

import torch
from torch import Tensor

from . import passes
from .trust_ratio import TrustRatioOptimizer

_MAX_WEIGHT_NORM = 10.0


class LAMB(TrustRatioOptimizer):
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

    _FLAGS = ("bias_correction", "ratio_only_with_decay")

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, *, bias_correction: bool = False,
                 ratio_only_with_decay: bool = False):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "bias_correction": bias_correction,
                                  "ratio_only_with_decay": ratio_only_with_decay})

    def _update(self, p: Tensor, state: dict, group: dict, index: int) -> None:
        scales = {}
        if group["bias_correction"]:
            beta1, beta2 = group["betas"]
            step = state["step"].item()  # a CPU tensor: no device sync
            scales = {"m_scale": 1 / (1 - beta1 ** step), "v_scale": 1 / math.sqrt(1 - beta2 ** step)}
        use_ratio = group["weight_decay"] != 0 or not group["ratio_only_with_decay"]
        ratios = self._pass1(p, state, group, reduce="tensor" if use_ratio else "none", l2=True,
                             max_p_norm=_MAX_WEIGHT_NORM, **scales)
        trust = ratios[0] if use_ratio else None  # None: ratio 1
        passes.apply_update(p, p.grad, trust, None, lr=group["lr"], clip=False, count=False)
        if self.diagnostics_requested:
            one = torch.ones((), device=p.device)
            self.record_diagnostics(group, index, trust_ratio=one if trust is None else trust.nan_to_num(nan=1.0))
