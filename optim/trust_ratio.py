"""What MERIT and LAMB share: hyper-parameter checks, state and the loop over tensors.

A subclass implements ``_update(p, state, group, index)`` with the two passes of ``optim.passes``
and lists its boolean options in ``_FLAGS`` (more checks in ``_check_options``). The step consumes
the gradients: on return ``p.grad`` holds the update direction u of pass 1, not the gradient.
"""
import torch
from torch import Tensor

from . import passes
from .diagnostics import DiagnosticsMixin
from .hyperparameters import check_hyperparameters


class TrustRatioOptimizer(DiagnosticsMixin, torch.optim.Optimizer):
    """Adam moments without bias correction (unless a subclass scales them), then a trust ratio.

    State per parameter: "step" (float32 scalar tensor, a counter), "exp_avg" (m) and
    "exp_avg_sq" (v). Every param group may override every hyper-parameter and option.
    """

    _FLAGS: tuple[str, ...] = ()  # the subclass's boolean options

    def __init__(self, params, defaults: dict):
        defaults = {**defaults, "betas": tuple(defaults["betas"])}
        self._check(defaults)
        super().__init__(params, defaults)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        # A checkpoint saved before an option existed has no value for it: use this optimizer's.
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)

    def add_param_group(self, param_group: dict) -> None:
        # Groups may override any hyper-parameter: check before the group joins the optimizer.
        self._check({**self.defaults, **param_group})
        super().add_param_group(param_group)

    def _check(self, h: dict) -> None:
        check_hyperparameters(h)
        self._check_options(h)

    def _check_options(self, group: dict) -> None:
        for key in self._FLAGS:
            if not isinstance(group[key], bool):
                raise ValueError(f"Invalid {key}: {group[key]!r} (must be True or False)")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for index, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                self._update(p, state, group, index)
        return loss

    def _update(self, p: Tensor, state: dict, group: dict, index: int) -> None:
        raise NotImplementedError

    @staticmethod
    def _pass1(p: Tensor, state: dict, group: dict, **kwargs) -> tuple[Tensor, ...]:
        """``passes.moments_and_ratios`` with the group's hyper-parameters; p.grad holds u afterwards."""
        beta1, beta2 = group["betas"]
        return passes.moments_and_ratios(p, p.grad, state["exp_avg"], state["exp_avg_sq"], beta1=beta1,
                                         beta2=beta2, eps=group["eps"], wd=group["weight_decay"], **kwargs)

