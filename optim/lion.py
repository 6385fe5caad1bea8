"""Lion (Chen et al., 2023), exactly as optimizers.md specifies:

    p = p * (1 - lr*wd)          # decoupled decay, scaled by the scheduled lr
    c = b1*m + (1-b1)*g
    p = p - lr * sign(c)
    m = b2*m + (1-b2)*g

Also ``SignOptimizer``, the skeleton Lion shares with Sophia-G (optim/sophia.py).
"""
from contextlib import nullcontext

import torch
from torch import Tensor

from . import kernels, triton_ops
from .diagnostics import DiagnosticsMixin, update_rms_recorded
from .hyperparameters import check_hyperparameters


class SignOptimizer(DiagnosticsMixin, torch.optim.Optimizer):
    """Shared skeleton of the sign-based optimizers: hyper-parameter checks (also of each param
    group's own values), the step loop with the ``update_rms`` diagnostic, and a scratch buffer.

    Subclasses implement ``_step_group(group, params)`` for the params of ``group`` that have a
    gradient, and may extend ``check_hyperparameters``. A step is one sweep of a C++ kernel per
    tensor where optim/kernels.py takes the tensors (CPU), of a Triton kernel where
    optim/triton_ops.py takes them (CUDA), else torch code: state updates in place with
    torch._foreach_* (one call per group), and the per-tensor temporary in ``scratch`` instead of
    an out-of-place foreach op: on CPU a fresh full-size temporary costs more than the arithmetic
    (page faults: 75 ms to allocate and fill the 155 MB GPT-2 embedding against 8-20 ms for one
    pass of an elementwise op), so the step ran 2-3x slower with foreach temporaries.
    """

    def __init__(self, params, defaults: dict):
        self.check_hyperparameters(defaults)
        super().__init__(params, defaults)
        self._buffers = {}

    def __setstate__(self, state: dict) -> None:
        # Unpickling (deepcopy, torch.load of the optimizer) bypasses __init__.
        super().__setstate__(state)
        self._buffers = {}

    def add_param_group(self, param_group: dict) -> None:
        # Groups may override any hyper-parameter: check before the group joins the optimizer.
        self.check_hyperparameters({**self.defaults, **param_group})
        super().add_param_group(param_group)

    @staticmethod
    def check_hyperparameters(h: dict) -> None:
        check_hyperparameters(h)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with update_rms_recorded(self) if self.diagnostics_requested else nullcontext():
            for group in self.param_groups:
                params = [p for p in group["params"] if p.grad is not None]
                if any(p.grad.is_sparse for p in params):
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                if params:
                    self._step_group(group, params)
        return loss

    def _step_group(self, group: dict, params: list[Tensor]) -> None:
        raise NotImplementedError

    def scratch(self, p: Tensor) -> Tensor:
        """A p-shaped temporary: a view of one buffer per device and dtype, reused across tensors
        and steps (the size of the largest parameter; not optimizer state, not saved)."""
        key = (p.device, p.dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < p.numel():
            buf = self._buffers[key] = torch.empty(p.numel(), dtype=p.dtype, device=p.device)
        return buf[:p.numel()].view(p.shape)


class Lion(SignOptimizer):
    """Lion optimizer.

    Defaults are the authors' (lr=1e-4, betas=(0.9, 0.99)). Their guidance: lr 3-10x smaller than
    AdamW's and weight decay 3-10x larger; GPT-2 lr 1e-4 (125M, 355M), 8e-5 (770M). Every param
    group may override lr, betas and weight_decay. State per parameter: "exp_avg" (m).
    Diagnostics: ``update_rms``.
    """

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})

    def _step_group(self, group: dict, params: list[Tensor]) -> None:
        lr, wd, (beta1, beta2) = group["lr"], group["weight_decay"], group["betas"]
        grads = [p.grad for p in params]
        exp_avgs = []
        for p in params:
            state = self.state[p]
            if not state:
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            exp_avgs.append(state["exp_avg"])
        if all(kernels.usable(p, g, m) for p, g, m in zip(params, grads, exp_avgs)):
            for p, g, m in zip(params, grads, exp_avgs):
                torch.ops.nanomerit.lion_step(p, g, m, lr, wd, beta1, beta2)
            return
        if all(triton_ops.usable(p, g, m) for p, g, m in zip(params, grads, exp_avgs)):
            for p, g, m in zip(params, grads, exp_avgs):
                triton_ops.lion_step(p, g, m, lr=lr, wd=wd, beta1=beta1, beta2=beta2)
            return
        if wd != 0:
            torch._foreach_mul_(params, 1 - lr * wd)
        for p, g, m in zip(params, grads, exp_avgs):
            c = torch.lerp(m, g, 1 - beta1, out=self.scratch(p))  # c = b1*m + (1-b1)*g
            p.add_(c.sign_(), alpha=-lr)
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta2)         # m = b2*m + (1-b2)*g
