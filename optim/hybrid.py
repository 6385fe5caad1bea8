"""What the hybrid optimizers share (Muon, MARS): a rule of their own on the transformer blocks'
hidden weight matrices, and AdamW, through torch's fused kernel, on everything else (embeddings, the
tied LM head, norms and biases).

The parameters come in groups marked ``hidden_matrix`` True or False, as ``optim.param_groups(...,
hidden_matrices_apart=True)`` makes them (``optim.build`` asks for it: ``HIDDEN_MATRICES_APART``).
The AdamW part has its own lr, kept as a fixed ratio of the rule's (``adamw_lr_ratio``), so that it
follows the training loop's schedule, and its own weight decay for the groups that decay. Its state
is torch's fused AdamW's: "step" (a float32 counter on the parameter's device), "exp_avg",
"exp_avg_sq"; a step flagged non-finite is dropped on the device (the kernel's ``found_inf``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Optimizer, zeros_like


class HiddenMatricesAndAdamW(Optimizer):
    HIDDEN_MATRICES_APART = True  # optim.build groups a model's parameters for it so
    NAME = ""  # the rule's, for messages

    def __init__(self, params, defaults: dict, *, lr: float, adamw_lr: float | None,
                 weight_decay: float, adamw_weight_decay: float | None, backend: str):
        params = list(params)
        if not all(isinstance(group, dict) and "hidden_matrix" in group for group in params):
            raise ValueError(f"{self.NAME} needs param groups marked hidden_matrix=True ({self.NAME}) or False "
                             f"(AdamW), as optim.param_groups(model, ..., hidden_matrices_apart=True) makes them")
        super().__init__(params, {
            **defaults, "lr": lr, "weight_decay": weight_decay,
            "adamw_lr_ratio": 1.0 if adamw_lr is None or lr == 0 else adamw_lr / lr,
            "adamw_weight_decay": weight_decay if adamw_weight_decay is None else adamw_weight_decay},
            backend=backend)
        for group in self.param_groups:
            for p in group["params"]:
                if group["hidden_matrix"] and p.ndim != 2:
                    raise ValueError(f"{self.NAME} steps 2-D matrices, got a hidden_matrix parameter of shape "
                                     f"{tuple(p.shape)}")
                if not group["hidden_matrix"] and not (p.is_floating_point() and p.device.type in ("cpu", "cuda")):
                    raise ValueError(f"{self.NAME}'s AdamW part runs torch's fused AdamW kernel, which takes "
                                     f"floating CPU and CUDA tensors, got {p.dtype} on {p.device}")

    @property
    def _step_supports_amp_scaling(self) -> bool:
        return True  # a step flagged non-finite is dropped on the device (update's skip)

    def check_options(self, h: dict) -> None:
        if not h["adamw_lr_ratio"] >= 0.0:
            raise ValueError(f"Invalid adamw_lr: {h['adamw_lr_ratio'] * h['lr']} (must be >= 0)")
        if not h["adamw_weight_decay"] >= 0.0:
            raise ValueError(f"Invalid adamw_weight_decay: {h['adamw_weight_decay']} (must be >= 0)")

    @staticmethod
    def adamw_state(p: Tensor) -> dict:
        """A new parameter's AdamW state, as torch's fused AdamW keeps it."""
        return {"step": torch.zeros((), dtype=torch.float32, device=p.device), "exp_avg": zeros_like(p),
                "exp_avg_sq": zeros_like(p)}

    @staticmethod
    def adamw_step(p: Tensor, grad: Tensor, state: dict, *, lr: float, betas: tuple[float, float],
                   weight_decay: float, eps: float, skip: Tensor | None, grad_scale: Tensor | None = None) -> None:
        """torch's fused AdamW kernel on p (the base class counted "step" already; ``skip``: its
        found_inf, which drops the update on the device; ``grad_scale``: a float32 0-d tensor the
        kernel divides the gradient by as it reads it)."""
        torch._fused_adamw_([p], [grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [state["step"]],
                            amsgrad=False, lr=lr, beta1=betas[0], beta2=betas[1], weight_decay=weight_decay,
                            eps=eps, maximize=False, grad_scale=grad_scale, found_inf=skip)

    def adamw_part(self, p: Tensor, grad: Tensor, state: dict, group: dict, betas: tuple[float, float],
                   skip: Tensor | None) -> None:
        """The AdamW part's step of p, of a group not marked ``hidden_matrix``."""
        self.adamw_step(p, grad, state, lr=group["lr"] * group["adamw_lr_ratio"], betas=betas, eps=group["eps"],
                        weight_decay=group["adamw_weight_decay"] if group["weight_decay"] else 0.0, skip=skip)
