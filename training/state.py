"""A run's state, with one owner: everything a checkpoint holds.

Each part saves and loads itself (torchtitan's ``Stateful`` idea: ``state_dict`` /
``load_state_dict``): the GradScaler, the training loader's position, every rank's RNG states,
the train-loss window since the last log step and the gradient noise scale's EMAs. ``RunState``
collects them, keyed by their ``Checkpoint`` field (training/checkpoint.py), with the step
counter, the model and the optimizer; the layout (training/parallel.py) saves and loads it, and
is the only code that knows how the model and the optimizer state are written (inline, ZeRO-1
consolidated or DCP shards). Adding a stateful part is one keyword argument of ``RunState``.

``state_dict`` and ``load_state_dict`` are called on every rank, in step: parts that hold one
value per rank gather them (a collective).
"""
from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from training import distributed
from training.distributed import Distributed


class Stateful(Protocol):
    def state_dict(self) -> object: ...

    def load_state_dict(self, state) -> None: ...


class RunState:
    """The step counter, the model, the optimizer and the stateful ``parts`` (``{Checkpoint field:
    part}``; a part that is None, which this run has not, is left out), plus what a checkpoint
    records of the run: ``config`` (the resolved config's dict). Parts load in their order."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, config: dict, tokens_per_step: int,
                 **parts: Stateful):
        self.model, self.optimizer, self.config = model, optimizer, config
        self.tokens_per_step = tokens_per_step
        self.step = 0  # optimizer steps taken
        self.parts = {name: part for name, part in parts.items() if part is not None}

    @property
    def tokens(self) -> int:
        return self.step * self.tokens_per_step

    def state_dict(self) -> dict:
        """The ``Checkpoint`` fields but the model's and the optimizer's tensors (every rank)."""
        return {"step": self.step, "tokens": self.tokens, "config": self.config,
                "model_args": vars(self.model.config).copy(), "optim_backends": self.optimizer.backends(),
                **{name: part.state_dict() for name, part in self.parts.items()}}

    def load_state_dict(self, checkpoint) -> None:
        """Continue from ``checkpoint`` (a ``Checkpoint``; its model and optimizer state are the
        layout's to load). A part whose field is empty (a file of an older format version, a run
        without that part) keeps its fresh state."""
        self.step = checkpoint.step
        for name, part in self.parts.items():
            saved = getattr(checkpoint, name)
            if saved:
                part.load_state_dict(saved)


class RankRNG:
    """Every rank's torch RNG states (CPU, and the rank's CUDA device): dropout noise continues."""

    def __init__(self, ctx: Distributed):
        self.ctx = ctx

    def state_dict(self) -> list[dict]:
        device = self.ctx.device
        mine = {"cpu": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}
        return distributed.all_gather_objects(mine, self.ctx)

    def load_state_dict(self, per_rank: list[dict]) -> None:
        # On another number of ranks the batches are split differently anyway, so the dropout noise
        # cannot continue exactly: a rank the checkpoint has no state for keeps the fresh state
        # the training loop seeded (seed + rank).
        ctx, saved_ranks = self.ctx, len(per_rank)
        if ctx.rank < saved_ranks:
            rng = per_rank[ctx.rank]
            torch.set_rng_state(rng["cpu"])
            if rng["cuda"] is not None and ctx.device.type == "cuda":
                torch.cuda.set_rng_state(rng["cuda"], ctx.device)
        if saved_ranks != ctx.world_size and ctx.is_main:
            fresh = (f"; ranks {saved_ranks}..{ctx.world_size - 1} start fresh seed-derived RNG states"
                     if ctx.world_size > saved_ranks else "")
            print(f"resuming on {ctx.world_size} ranks from a checkpoint of {saved_ranks}: the global batches "
                  f"continue exactly from the saved data position, dropout noise does not{fresh}")


class LossWindow:
    """The train-loss sum of the kept steps since the last log step (per rank) and their number,
    on the device (no host sync until a log step reads the mean); checkpointed, so a resumed run
    logs the uninterrupted one's losses."""

    def __init__(self, ctx: Distributed):
        self.ctx = ctx
        self.loss_sum = torch.zeros((), device=ctx.device)
        self.steps = torch.zeros((), dtype=torch.long, device=ctx.device)

    def add(self, loss: Tensor, finite: Tensor) -> None:
        self.loss_sum += torch.where(finite, loss, 0.0)  # a dropped step's loss is not averaged in
        self.steps += finite

    def pop_mean(self) -> Tensor:
        """This rank's mean loss over the window, which starts afresh."""
        mean = self.loss_sum / self.steps
        self.loss_sum.zero_()
        self.steps.zero_()
        return mean

    def state_dict(self) -> dict:
        return {"steps": int(self.steps), "loss_sums": distributed.all_gather_objects(self.loss_sum.cpu(), self.ctx)}

    def load_state_dict(self, state: dict) -> None:
        sums = state["loss_sums"]
        # On another number of ranks each rank starts from the mean: the logged mean is the same.
        mine = sums[self.ctx.rank] if len(sums) == self.ctx.world_size else torch.stack(sums).mean()
        self.loss_sum = mine.to(self.ctx.device)
        self.steps.fill_(state["steps"])
