"""Sophia-G (Liu et al., 2023), docs/optimizers.md "Sophia-G":

    p = p * (1 - lr*wd)
    m = b1*m + (1-b1)*g
    p = p - lr * sign(m) * min(|m| / (rho * bs * h + eps), 1)      # eps = 1e-15

with ``h`` an EMA (beta2) of squared Gauss-Newton-Bartlett gradients, refreshed after every
``hessian_interval``-th step (the training loop runs ``extra_pass``), and ``bs`` the tokens per
optimizer step.
"""
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import sharding
from .base import Optimizer, step_counter, zeros_like
from .protocol import ADAM_BETAS, GradientFn, LossFn


class SophiaG(Optimizer):
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
    0.1-0.5) and ``hessian_norm`` (the norm of h: a blow-up or collapse of the curvature estimate
    shows in it before the loss diverges).
    """

    BATCH_DECAYS = ADAM_BETAS  # (beta2 the Hessian EMA's, per Hessian step)

    _ATTRIBUTES = (*Optimizer._ATTRIBUTES, "batch_tokens", "hessian_interval")

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.965, 0.99),
                 rho: float = 0.04, eps: float = 1e-15, weight_decay: float = 0.0, *,
                 batch_tokens: int | None = None, hessian_interval: int = 10, backend: str = "auto"):
        if batch_tokens is None or not batch_tokens > 0:
            raise ValueError(f"Sophia-G needs batch_tokens > 0 (tokens per optimizer step, the "
                             f"Hessian scale), got batch_tokens={batch_tokens}")
        if not (isinstance(hessian_interval, int) and hessian_interval >= 1):
            raise ValueError(f"Invalid hessian_interval: {hessian_interval} (must be an int >= 1)")
        super().__init__(params, {"lr": lr, "betas": betas, "rho": rho, "eps": eps, "weight_decay": weight_decay},
                         backend=backend)
        self.batch_tokens = batch_tokens
        self.hessian_interval = hessian_interval

    def check_options(self, h: dict) -> None:
        if not h["rho"] >= 0.0:
            raise ValueError(f"Invalid rho value: {h['rho']} (must be >= 0)")
        # eps > 0 keeps the denominator positive where h = 0 (before the first Hessian update).
        if not h["eps"] > 0.0:
            raise ValueError(f"Invalid epsilon value: {h['eps']} (must be > 0)")

    def init_state(self, p: Tensor) -> dict:
        return {"step": step_counter(), "exp_avg": zeros_like(p), "hessian": zeros_like(p)}

    def update(self, p: Tensor, grad: Tensor, state: dict, group: dict, index: int, skip: Tensor | None,
               shards: sharding.Shards | None) -> None:
        (beta1, _), m, h = group["betas"], state["exp_avg"], state["hessian"]
        scale = group["rho"] * self.batch_tokens
        self.implementation(group, p, grad, m, h, shards=shards).sophia_step(
            p, grad, m, h, lr=group["lr"], wd=group["weight_decay"], beta1=beta1, scale=scale, eps=group["eps"],
            skip=skip)
        if self.diagnostics_requested:
            # Over the whole tensor: sums of the local rows' counts and squares.
            numel = p.numel() if shards is None else shards.numel
            won = sharding.total((m.abs() < h * scale).sum(), shards)
            self.record_diagnostics(group, index, win_rate=won / numel,
                                    hessian_norm=sharding.total(h.square().sum(), shards).sqrt())

    def set_batch_tokens(self, tokens: int) -> None:
        self.batch_tokens = tokens  # the Hessian scale follows a scheduled batch

    def extra_pass_due(self, step: int) -> bool:
        """Whether the Hessian estimate is refreshed after optimizer step ``step`` (1-based)."""
        return step % self.hessian_interval == 0

    def extra_pass(self, gradients: GradientFn, seed: int) -> None:
        """The Gauss-Newton-Bartlett estimate: the gradient, on the next global batch, of the loss
        against labels sampled (seeded by ``seed``) from the model's own softmax at every position,
        clipped to norm 1, squared into h (skipped if not finite: fp16 overflow)."""
        with gradients(sampled_label_loss(seed)) as parameters:
            norm = torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            if norm.isfinite():  # one host sync every hessian_interval steps
                self.update_hessian()

    @torch.no_grad()
    def update_hessian(self) -> None:
        """h = b2*h + (1-b2)*g*g, with g each parameter's ``.grad`` (the estimate's gradient)."""
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            hessians = [self.state_of(p)["hessian"] for p in params]
            beta2 = group["betas"][1]
            torch._foreach_mul_(hessians, beta2)
            torch._foreach_addcmul_(hessians, grads, grads, value=1 - beta2)


def sampled_label_loss(seed: int) -> LossFn:
    """Cross-entropy of the model's logits against labels sampled from its own softmax."""
    def loss(model: nn.Module, x: Tensor, _: Tensor, offset: int) -> Tensor:
        logits = model(x)[0].float().flatten(0, 1)
        # Seeded by the batch's place in the token stream, so the labels (and the estimate) are
        # the same on any number of ranks, and after a resume.
        generator = torch.Generator(logits.device).manual_seed(seed * 1_000_003 + offset)
        labels = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator).squeeze(1)
        return F.cross_entropy(logits, labels)
    return loss
