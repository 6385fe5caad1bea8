"""Sophia-G (Liu et al., 2023), exactly as optimizers.md specifies:

    p = p * (1 - lr*wd)
    m = b1*m + (1-b1)*g
    p = p - lr * sign(m) * min(|m| / (rho * bs * h + eps), 1)      # eps = 1e-15

with ``h`` an EMA (beta2) of squared Gauss-Newton-Bartlett gradients, refreshed every
``hessian_interval`` steps by the training loop (``wants_hessian_update`` / ``update_hessian``),
and ``bs`` the tokens per optimizer step.
"""
import torch
from torch import Tensor

from . import kernels, triton_ops
from .lion import SignOptimizer


class SophiaG(SignOptimizer):
    """Sophia-G optimizer.

    ``batch_tokens`` (required): tokens per optimizer step (global batch sequences x block size),
    the ``bs`` of the update. It must follow the configured batch (the authors' script hard-codes
    480 x 1024), or the Hessian scale is wrong; it is context, not state, so it is not saved.

    Defaults are the authors' (lr=1e-4, betas=(0.965, 0.99), rho=0.04). Their GPT-2 settings:
    betas (0.965, 0.99), weight_decay 0.2, lr 6e-4 / 7e-4 / 3e-4 and rho 0.05 / 0.08 / 0.05 for
    125M / 355M / 770M. Every param group may override lr, betas, rho, eps and weight_decay.

    State per parameter: "step" (float32 scalar tensor, a counter), "exp_avg" (m), "hessian" (h,
    zero until the first Hessian update, so the first steps are sign-momentum steps clipped at 1).
    Diagnostics: ``win_rate`` (fraction of coordinates not clipped, |m| < rho*bs*h; healthy
    0.1-0.5) and ``update_rms``.
    """

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.965, 0.99),
                 rho: float = 0.04, eps: float = 1e-15, weight_decay: float = 0.0, *,
                 batch_tokens: int | None = None, hessian_interval: int = 10):
        if batch_tokens is None or not batch_tokens > 0:
            raise ValueError(f"Sophia-G needs batch_tokens > 0 (tokens per optimizer step, the "
                             f"Hessian scale), got batch_tokens={batch_tokens}")
        if not (isinstance(hessian_interval, int) and hessian_interval >= 1):
            raise ValueError(f"Invalid hessian_interval: {hessian_interval} (must be an int >= 1)")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "rho": rho, "eps": eps,
                                  "weight_decay": weight_decay})
        self.batch_tokens = batch_tokens
        self.hessian_interval = hessian_interval

    def __getstate__(self) -> dict:
        # Pickling (deepcopy, torch.save of the optimizer) keeps only torch's own attributes.
        return {**super().__getstate__(), "batch_tokens": self.batch_tokens,
                "hessian_interval": self.hessian_interval}

    @staticmethod
    def check_hyperparameters(h: dict) -> None:
        SignOptimizer.check_hyperparameters(h)
        if not h["rho"] >= 0.0:
            raise ValueError(f"Invalid rho value: {h['rho']} (must be >= 0)")
        # eps > 0 keeps the denominator positive where h = 0 (before the first Hessian update).
        if not h["eps"] > 0.0:
            raise ValueError(f"Invalid epsilon value: {h['eps']} (must be > 0)")

    def wants_hessian_update(self, step: int) -> bool:
        """Whether to call ``update_hessian`` after optimizer step number ``step`` (1-based)."""
        return step % self.hessian_interval == 0

    @torch.no_grad()
    def update_hessian(self) -> None:
        """h = b2*h + (1-b2)*g*g, with g each parameter's ``.grad``.

        The caller puts there the gradient of the Gauss-Newton-Bartlett loss (labels sampled from
        the model's softmax at all positions), clipped to global norm 1 and all-reduced.
        """
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            hessians = [self._state(p)["hessian"] for p in params]
            beta2 = group["betas"][1]
            torch._foreach_mul_(hessians, beta2)
            torch._foreach_addcmul_(hessians, grads, grads, value=1 - beta2)

    def _step_group(self, group: dict, params: list[Tensor]) -> None:
        lr, wd, (beta1, _), eps = group["lr"], group["weight_decay"], group["betas"], group["eps"]
        scale = group["rho"] * self.batch_tokens
        grads = [p.grad for p in params]
        states = [self._state(p) for p in params]
        for state in states:
            state["step"] += 1
        exp_avgs = [state["exp_avg"] for state in states]
        if all(kernels.usable(p, g, s["exp_avg"], s["hessian"]) for p, g, s in zip(params, grads, states)):
            for p, g, state in zip(params, grads, states):
                torch.ops.nanomerit.sophia_step(p, g, state["exp_avg"], state["hessian"], lr, wd, beta1, scale, eps)
        elif all(triton_ops.usable(p, g, s["exp_avg"], s["hessian"]) for p, g, s in zip(params, grads, states)):
            for p, g, state in zip(params, grads, states):
                triton_ops.sophia_step(p, g, state["exp_avg"], state["hessian"], lr=lr, wd=wd, beta1=beta1,
                                       scale=scale, eps=eps)
        else:
            if wd != 0:
                torch._foreach_mul_(params, 1 - lr * wd)
            torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)       # m = b1*m + (1-b1)*g
            for p, state in zip(params, states):
                # sign(m) * min(|m| / d, 1) == clamp(m / d, -1, 1) bitwise for d > 0 (eps > 0): IEEE
                # division is sign-symmetric, so one temporary does the work of three.
                u = torch.mul(state["hessian"], scale, out=self.scratch(p)).add_(eps)
                p.add_(torch.div(state["exp_avg"], u, out=u).clamp_(-1.0, 1.0), alpha=-lr)
        if self.diagnostics_requested:
            for index, p in enumerate(group["params"]):
                if p.grad is not None:
                    m, h = self.state[p]["exp_avg"], self.state[p]["hessian"]
                    win_rate = (m.abs() < h * scale).float().mean()
                    self.record_diagnostics(group, index, win_rate=win_rate)

    def _state(self, p: Tensor) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["hessian"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state
