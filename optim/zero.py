"""ZeRO-1: any optimizer of this package with its state sharded across the data-parallel ranks.

torch's ``ZeroRedundancyOptimizer`` gives each rank WHOLE parameters (partitioned by size, per
param group) and builds the inner optimizer on that rank's share: each rank keeps and updates
the state of its own parameters only, then broadcasts them. Every trust ratio is over one
tensor, so it stays local and exact, with no collective beyond ZeRO's own (docs/optimizers.md,
"Sharded optimizer state"). Gradients stay replicated (DDP all-reduces them), so everything the
training loop does with them (clipping, the noise scale, Sophia-G's Hessian pass) is unchanged.

``ZeroRedundancy`` is the training-loop protocol around it: diagnostics are gathered from the
ranks that own the parameters, a ``found_inf`` flag reaches the inner optimizer, and the state is
consolidated for checkpoints into the plain optimizer's format, which loads on any number of
ranks, with or without ZeRO.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

from .protocol import GradientFn, TrainingHooks


class ZeroRedundancy(TrainingHooks, ZeroRedundancyOptimizer):
    """``factory(param_groups, **defaults)``'s optimizer over this rank's share of ``params``
    (group dicts, as ``optim.param_groups`` makes them; their "names" follow the partition)."""

    def __init__(self, params: list[dict], factory: Callable, **defaults):
        names = {p: name for group in params if isinstance(group, dict)
                 for p, name in zip(group["params"], group.get("names", ()))}

        def local_optimizer(groups, **kwargs):
            groups = list(groups)
            for group in groups:  # ZeroRedundancyOptimizer copies each group with this rank's params
                if "names" in group:
                    group["names"] = [names[p] for p in group["params"]]
            optimizer = factory(groups, **kwargs)
            if not isinstance(optimizer, TrainingHooks):
                raise TypeError(f"ZeRO-1 needs an optimizer that implements optim.TrainingHooks, got "
                                f"{type(optimizer).__name__}")
            return optimizer

        # An option left None takes the optimizer's own default, which the rank's optimizer resolves
        # (Muon's adamw_lr and adamw_weight_decay: "follow lr and weight_decay"). The whole groups
        # must not hold the None: ZeroRedundancyOptimizer would copy it over the resolved value.
        super().__init__(params, optimizer_class=local_optimizer,
                         **{key: value for key, value in defaults.items() if value is not None})

    @staticmethod
    def _sync_param_groups(src_param_groups: list[dict], dst_param_groups: list[dict]) -> None:
        # ZeroRedundancyOptimizer copies every key but "params" between the whole groups and this
        # rank's (lr before a step, loaded hyper-parameters); "names" lists a group's own
        # parameters, so it stays: the whole groups keep every name (the consolidated state loads
        # anywhere), this rank's groups their share's (its diagnostics' keys).
        for src, dst in zip(src_param_groups, dst_param_groups):
            dst.update({key: value for key, value in src.items() if key not in ("params", "names")})

    # --- the protocol, delegated to this rank's optimizer ---
    @property
    def _step_supports_amp_scaling(self) -> bool:
        return getattr(self.optim, "_step_supports_amp_scaling", False)

    @torch.no_grad()
    def step(self, closure=None):
        # torch's GradScaler (and step_unless) set found_inf on the optimizer it was given.
        for flag in ("found_inf", "grad_scale"):
            if hasattr(self, flag):
                setattr(self.optim, flag, getattr(self, flag))
        try:
            return super().step(closure)
        finally:
            for flag in ("found_inf", "grad_scale"):
                self.optim.__dict__.pop(flag, None)

    def request_diagnostics(self) -> None:
        self.optim.request_diagnostics()

    @property
    def diagnostics_requested(self) -> bool:
        return self.optim.diagnostics_requested

    def pop_diagnostics(self) -> dict[str, float]:
        """Every rank's statistics of its own parameters, on every rank (a collective)."""
        parts = [None] * self.world_size
        dist.all_gather_object(parts, self.optim.pop_diagnostics(), group=self.process_group)
        return {key: value for part in parts for key, value in part.items()}

    def set_batch_tokens(self, tokens: int) -> None:
        self.optim.set_batch_tokens(tokens)

    def extra_pass_due(self, step: int) -> bool:
        return self.optim.extra_pass_due(step)

    def extra_pass(self, gradients: GradientFn, seed: int) -> None:
        self.optim.extra_pass(gradients, seed)  # (it updates this rank's state only)

    @property
    def GROUP_STATE(self) -> tuple[str, ...]:  # noqa: N802 (the protocol's class attribute)
        return self.optim.GROUP_STATE

    def eval(self) -> bool:
        return self._move(self.optim.eval)

    def train(self) -> bool:
        return self._move(self.optim.train)

    def _move(self, move) -> bool:
        """This rank's optimizer moves the parameters whose state it keeps (Schedule-Free's z is
        there only), then every rank receives the others' from their owners, as after a step
        (exact: each parameter is computed once), and the exposed groups learn where the parameters
        are. The exposed groups' settings reach this rank's optimizer first, as before a step: the
        loop sets the step's lr there before it moves the weights back, and copying the groups back
        after the move would otherwise restore the previous step's lr. Every rank agrees on the
        move: it follows the groups' settings, the same on every rank."""
        self._sync_param_groups(self.param_groups, self.optim.param_groups)
        moved = move()
        if moved:
            self._sync_params()
            self._sync_param_groups(self.optim.param_groups, self.param_groups)
        return moved

    def backends(self) -> dict[str, str]:
        return self.optim.backends()

    def describe(self) -> str:
        owned = self.partition_numel()
        return (f"  ZeRO-1 over {self.world_size} ranks: the state of {owned[self.rank] / 1e6:.2f}M of "
                f"{sum(owned) / 1e6:.2f}M elements on this rank (largest share {max(owned) / 1e6:.2f}M)\n"
                + self.optim.describe())

    # --- the partition and the checkpoint ---
    def partition_numel(self) -> list[int]:
        """Per rank, the parameter elements whose state it keeps."""
        return [sum(p.numel() for group in groups for p in group["params"])
                for groups in self._partition_parameters()]

    def consolidated_state_dict(self) -> dict | None:
        """The whole state in the plain optimizer's ``state_dict`` format on rank 0 (None on the
        others); every rank must call it."""
        self.consolidate_state_dict(to=0)
        return self.state_dict() if self.rank == 0 else None
