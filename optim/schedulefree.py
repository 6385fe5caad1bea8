"""Schedule-Free AdamW (Defazio et al. 2024, "The Road Less Scheduled"; the ``schedulefree``
package, facebookresearch/schedule_free), docs/optimizers.md "Schedule-Free AdamW".

No lr decay: an average x of the base iterates z replaces it. Three points, two of them stored:
z (optimizer state), and y, where gradients are taken, in the parameters while training; the
model is evaluated at x, which ``eval()`` puts in the parameters (``train()`` puts y back):

    v = b2*v + (1-b2)*g*g                              # g: the gradient at y; t = k+1, the step
    u = g / (sqrt(v / (1 - b2^t)) + eps) + wd*y        # decay taken at y
    z = z - lr*u
    x = (1 - c)*x + c*z,  c = w_t / (w_1 + ... + w_t),  w_t = t^r * lr_max^weight_lr_power
    y = (1 - b1)*z + b1*x

lr_max is the largest lr so far, so the warmup's steps weigh less in the average. y is updated
without forming x (``y = lerp(y, z, c) + lr*(b1*(1-c) - 1)*u``, z before its step), and
``x = lerp(y, z, 1 - 1/b1)``, ``y = lerp(x, z, 1 - b1)``: the package's operations, in its order.
One sweep per tensor: the fused ``schedulefree_step`` of optim/backends/.
"""
import torch
from torch import Tensor

from . import sharding
from .base import Optimizer, zeros_like
from .protocol import ADAM_BETAS


class AdamWScheduleFree(Optimizer):
    """Schedule-Free AdamW, ``schedulefree.AdamWScheduleFree`` without its ``warmup_steps``.

    The warmup is the training loop's: it sets each step's ``group["lr"]``. Fed the package's
    ``lr * ((k+1) / warmup_steps)`` over the first ``warmup_steps`` steps (k the steps before), this
    optimizer is the package with ``warmup_steps`` bitwise; the loop's warmup, ``lr * (k+1) /
    warmup_steps``, rounds in another order (1 ulp apart at a quarter of the steps). After the
    warmup the lr stays constant (``lr_schedule="constant"``: a run refuses a decaying one,
    ``SCHEDULE_FREE``).

    Defaults are the package's (lr 0.0025, betas (0.9, 0.999), eps 1e-8, no weight decay, r 0,
    weight_lr_power 2). State per parameter: "z" and "exp_avg_sq" (v), as the package keeps them;
    per param group: "k" (steps taken), "lr_max", "weight_sum" and "train_mode" (whether the
    parameters hold y), saved with the groups as the package saves them (``GROUP_STATE``).

    Differences from the package: it starts in train mode (before the first step x = y = z, so the
    package's first ``train()`` moves nothing); ``eval()`` and ``train()`` return whether they moved
    the parameters; beta1 must be > 0 (the package's ``eval()`` divides by it); a non-finite step is
    dropped on the host (below); no ``scheduled_lr`` key (the lr is the loop's ``group["lr"]``).
    Diagnostics: none of its own.
    """

    BATCH_DECAYS = ADAM_BETAS

    SCHEDULE_FREE = True  # a run holds the lr constant after the warmup (training/run_config.py)
    GROUP_STATE = ("k", "lr_max", "weight_sum", "train_mode")

    def __init__(self, params, lr: float = 0.0025, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, r: float = 0.0, weight_lr_power: float = 2.0, *, backend: str = "auto"):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "r": r,
                                  "weight_lr_power": weight_lr_power,
                                  "k": 0, "lr_max": -1.0, "weight_sum": 0.0, "train_mode": True}, backend=backend)
        self._this_step: dict[int, dict] = {}  # during step(): each group's scalars, by id(group)

    @property
    def _step_supports_amp_scaling(self) -> bool:
        # k, lr_max and weight_sum live on the host, as the package keeps them: a step dropped on
        # the device would count there anyway. So step_unless and torch's GradScaler read found_inf
        # on the host (one sync) and skip step(); the fused operation never gets a flag.
        return False

    def check_options(self, h: dict) -> None:
        if not h["betas"][0] > 0.0:
            raise ValueError(f"Invalid beta parameter at index 0: {h['betas'][0]} (must be in (0, 1): eval() "
                             f"recovers x from y and z by dividing by beta1)")
        for key in ("r", "weight_lr_power"):
            if not 0.0 <= h[key] < float("inf"):
                raise ValueError(f"Invalid {key}: {h[key]} (must be a finite number >= 0)")

    @torch.no_grad()
    def step(self, closure=None):
        if not all(group["train_mode"] for group in self.param_groups):
            raise RuntimeError("AdamWScheduleFree.step() with the parameters at x (after eval()): call "
                               "optimizer.train() first, which puts them back at y")
        # Every group's step counts, with or without gradients (as the package's): its scalars first,
        # kept in the group only once the step is taken.
        self._this_step = {id(group): self._scalars(group) for group in self.param_groups}
        loss = super().step(closure)
        for group in self.param_groups:
            scalars = self._this_step[id(group)]
            group.update(k=group["k"] + 1, lr_max=scalars["lr_max"], weight_sum=scalars["weight_sum"])
        self._this_step = {}
        return loss

    @staticmethod
    def _scalars(group: dict) -> dict:
        """This step's scalars of ``group``, as the package computes them (the same floats)."""
        k, lr, (beta1, beta2) = group["k"], group["lr"], group["betas"]
        lr_max = max(lr, group["lr_max"])
        weight = ((k + 1) ** group["r"]) * (lr_max ** group["weight_lr_power"])
        weight_sum = group["weight_sum"] + weight
        ckp1 = weight / weight_sum if weight_sum != 0 else 0.0  # (0/0 before any lr: the package's 0)
        return {"lr_max": lr_max, "weight_sum": weight_sum, "ckp1": ckp1, "y_lr": lr * (beta1 * (1 - ckp1) - 1),
                "bias_correction2": 1 - beta2 ** (k + 1)}

    def init_state(self, p: Tensor) -> dict:
        return {"z": p.detach().clone(memory_format=torch.preserve_format), "exp_avg_sq": zeros_like(p)}

    def update(self, p: Tensor, grad: Tensor, state: dict, group: dict, index: int, skip: Tensor | None,
               shards: sharding.Shards | None) -> None:
        scalars, z, v = self._this_step[id(group)], state["z"], state["exp_avg_sq"]
        self.implementation(group, p, grad, z, v, shards=shards).schedulefree_step(
            p, grad, z, v, lr=group["lr"], y_lr=scalars["y_lr"], ckp1=scalars["ckp1"], wd=group["weight_decay"],
            beta2=group["betas"][1], bias_correction2=scalars["bias_correction2"], eps=group["eps"], skip=skip)

    @torch.no_grad()
    def eval(self) -> bool:
        """The parameters to x = lerp(y, z, 1 - 1/beta1); a no-op where they hold x already."""
        return self._move(train=False)

    @torch.no_grad()
    def train(self) -> bool:
        """The parameters to y = lerp(x, z, 1 - beta1); a no-op where they hold y already."""
        return self._move(train=True)

    def _move(self, train: bool) -> bool:
        moved = False
        for group in self.param_groups:
            if group["train_mode"] == train:
                continue
            beta1 = group["betas"][0]
            weight = 1 - beta1 if train else 1 - 1 / beta1
            for p in group["params"]:
                if p in self.state and "z" in self.state[p]:  # (a parameter never stepped: x = y = z)
                    # (FSDP2: the local rows of p and z, element by element)
                    sharding.local(p).lerp_(sharding.local(self.state[p]["z"]), weight)
            group["train_mode"] = train
            moved = True
        return moved
