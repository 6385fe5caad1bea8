"""AdEMAMix (Pagliardini, Ablin, Grangier 2024, "The AdEMAMix Optimizer: Better, Faster, Older";
the authors' PyTorch code: github.com/apple/ml-ademamix, pytorch/ademamix.py), docs/optimizers.md
"AdEMAMix": Adam with a second, slow momentum mixed in:

    m1 = b1*m1 + (1-b1)*g                  # fast EMA, bias-corrected below
    m2 = b3*m2 + (1-b3)*g                  # slow EMA, no bias correction
    v  = b2*v  + (1-b2)*g*g
    p  = p - lr * ((m1/(1-b1^t) + alpha*m2) / (sqrt(v)/sqrt(1-b2^t) + eps) + wd*p)

with alpha and b3 warmed up, as the authors' schedulers do (t the step, 1-based):

    alpha_t = alpha * t/T_alpha                               while t < T_alpha, then alpha
    b3_t    = f^-1((1 - t/T_b3) * f(b1) + t/T_b3 * f(b3))     while t < T_b3, then b3
              f(b) = ln 0.5 / ln(b + 1e-8) - 1, f^-1(x) = 0.5^(1/(x+1))

f is the half-life of an EMA of b less one: b3 grows linearly in half-life from b1's to b3's, so
the slow momentum does not average in the first steps' gradients at full weight. (The 1e-8 is the
authors'; it keeps f finite for b1 = 0.) One sweep per tensor: the fused ``ademamix_step`` of
optim/backends/.
"""
import math
from numbers import Integral

from torch import Tensor

from . import sharding
from .base import Optimizer, step_counter, zeros_like
from .protocol import ADAM_BETAS


class AdEMAMix(Optimizer):
    """AdEMAMix optimizer.

    ``alpha_warmup``/``beta3_warmup``: the steps over which alpha and b3 warm up; 0 for none (the
    authors' default), None (the default) for the run's steps, ``run_steps``: context the training
    loop supplies (its optimizer steps; not saved), as the 2025 benchmark sets T_alpha = T_b3 = its
    run's length. (None is the default so that a wrapper that leaves an option unset, as ZeRO-1's
    does with None, gets the same warmups.)

    Other defaults are the authors' constructor's (lr 1e-3, betas (0.9, 0.999), beta3 0.9999, alpha
    2, eps 1e-8). The benchmark's GPT-2 (124M) settings (optim/published.py): beta3
    0.999, alpha 8, both warmups over the run, weight decay 0.1. Every param group may override
    lr, betas, beta3, alpha, both warmups, eps and weight_decay.

    State per parameter: "step" (float32 scalar tensor, a counter), "exp_avg_fast" (m1),
    "exp_avg_slow" (m2), "exp_avg_sq" (v): three tensors the size of p, one more than AdamW.
    The bias corrections and warmups read the counter on the host (on CUDA under a skip flag,
    one sync per parameter, as LAMB's bias correction). ``step`` consumes the gradients (the
    torch reference builds the update in p.grad). Diagnostics: none of its own.
    """

    BATCH_DECAYS = {**ADAM_BETAS, "beta3": ("beta3", None)}  # (beta3's warmup ends at it)

    _ATTRIBUTES = (*Optimizer._ATTRIBUTES, "run_steps")

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), beta3: float = 0.9999,
                 alpha: float = 2.0, alpha_warmup: int | None = None, beta3_warmup: int | None = None,
                 eps: float = 1e-8, weight_decay: float = 0.0, *, run_steps: int | None = None, backend: str = "auto"):
        if run_steps is not None and not (_is_int(run_steps) and run_steps >= 1):
            raise ValueError(f"Invalid run_steps: {run_steps!r} (must be an int >= 1, the run's optimizer steps)")
        self.run_steps = run_steps  # before the base class checks the groups' warmups against it
        super().__init__(params, {"lr": lr, "betas": betas, "beta3": beta3, "alpha": alpha,
                                  "alpha_warmup": alpha_warmup, "beta3_warmup": beta3_warmup, "eps": eps,
                                  "weight_decay": weight_decay}, backend=backend)

    def check_options(self, h: dict) -> None:
        if not 0.0 <= h["beta3"] < 1.0:
            raise ValueError(f"Invalid beta3: {h['beta3']} (must be in [0, 1))")
        if not h["alpha"] >= 0.0:
            raise ValueError(f"Invalid alpha: {h['alpha']} (must be >= 0)")
        for key in ("alpha_warmup", "beta3_warmup"):
            if h[key] is None and self.run_steps is None:
                raise ValueError(f"AdEMAMix {key}=None warms up over the run's steps, but run_steps is None: "
                                 f"pass run_steps (optim.build(..., run_steps=)) or set {key} to a number of "
                                 f"steps (0: no warmup)")
            if h[key] is not None and not (_is_int(h[key]) and h[key] >= 0):
                raise ValueError(f"Invalid {key}: {h[key]!r} (must be an int >= 0, or None for the run's steps)")

    def init_state(self, p: Tensor) -> dict:
        return {"step": step_counter(), "exp_avg_fast": zeros_like(p), "exp_avg_slow": zeros_like(p),
                "exp_avg_sq": zeros_like(p)}

    def update(self, p: Tensor, grad: Tensor, state: dict, group: dict, index: int, skip: Tensor | None,
               shards: sharding.Shards | None) -> None:
        (beta1, beta2), t = group["betas"], int(state["step"].item())
        m1, m2, v = state["exp_avg_fast"], state["exp_avg_slow"], state["exp_avg_sq"]
        self.implementation(group, p, grad, m1, m2, v, shards=shards).ademamix_step(
            p, grad, m1, m2, v, lr=group["lr"], wd=group["weight_decay"], beta1=beta1, beta2=beta2,
            beta3=beta3_at(t, beta1, group["beta3"], self._warmup(group["beta3_warmup"])),
            alpha=alpha_at(t, group["alpha"], self._warmup(group["alpha_warmup"])),
            bias_correction1=1 - beta1 ** t, bias_correction2=1 - beta2 ** t, eps=group["eps"], skip=skip)

    def _warmup(self, steps: int | None) -> int:
        return self.run_steps if steps is None else steps


def alpha_at(step: int, alpha: float, warmup: int) -> float:
    """alpha at ``step`` (1-based): linear from 0, reaching ``alpha`` at step ``warmup``."""
    return step / warmup * alpha if step < warmup else alpha


def beta3_at(step: int, beta1: float, beta3: float, warmup: int) -> float:
    """b3 at ``step`` (1-based): from ``beta1`` to ``beta3``, linear in f(b) = ln 0.5 / ln(b + 1e-8) - 1
    (an EMA's half-life less one), reaching ``beta3`` at step ``warmup``."""
    if step >= warmup:
        return beta3
    a = step / warmup
    return 0.5 ** (1 / ((1 - a) * _half_life_less_one(beta1) + a * _half_life_less_one(beta3) + 1))


def _half_life_less_one(beta: float) -> float:
    """The authors' f(b) = ln 0.5 / ln(b + 1e-8) - 1 (their 1e-8 keeps it finite at b = 0)."""
    return math.log(0.5) / math.log(beta + 1e-8) - 1


def _is_int(x) -> bool:
    return isinstance(x, Integral) and not isinstance(x, bool)
