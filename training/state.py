"""A run's state, with one owner: everything a checkpoint holds.

Each piece saves and loads itself (torchtitan's ``Stateful`` idea: ``state_dict`` /
``load_state_dict``): the loop's own (the GradScaler, the training loader's position, every rank's
RNG states, the train-loss window since the last log step), each keyed by its ``Checkpoint``
field (training/checkpoint/format.py), and the run's parts with state (training/parts.py: the gradient
noise scale's EMAs, a config's extra parts), kept in the ``parts`` field by their names.
``RunState`` collects them with the step counter, the batch schedule, the model and the optimizer; the
layout's checkpoint writer (training/checkpoint/writers.py) saves and loads it, and is the only code
that knows how the model and the optimizer state are written (inline, ZeRO-1 consolidated or DCP shards).

``state_dict`` and ``load_state_dict`` are called on every rank, in step: parts that hold one
value per rank gather them (a collective).
"""
from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
from torch import Tensor, nn

from training import distributed
from training.batch_schedule import BatchSchedule
from training.distributed import Distributed
from training.parts import Part


class Stateful(Protocol):
    def state_dict(self) -> object: ...

    def load_state_dict(self, state) -> None: ...


class RunState:
    """The step counter, the model, the optimizer, the loop's stateful ``pieces`` (``{Checkpoint
    field: piece}``) and the run's ``parts`` (those with a ``name`` have state), plus what a
    checkpoint records of the run: ``config`` (the resolved config's dict). Pieces load in their
    order, then parts in theirs."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, config: dict,
                 batch_schedule: BatchSchedule, parts: list[Part] = (), **pieces: Stateful):
        self.model, self.optimizer, self.config = model, optimizer, config
        self.batch_schedule = batch_schedule  # the run's batch phases: the tokens of its steps
        self.step = 0  # optimizer steps taken
        self.changes: list[dict] = []  # settings changed on resume (Checkpoint.changes_on_resume)
        self.evaluation_pending = False  # a stop interrupted this step's evaluation (run first on resume)
        self.pieces = pieces
        self.parts = {part.name: part for part in parts if part.name is not None}

    @property
    def tokens(self) -> int:
        return self.batch_schedule.tokens(self.step)

    def state_dict(self) -> dict:
        """The ``Checkpoint`` fields but the model's and the optimizer's tensors (every rank)."""
        return {"step": self.step, "tokens": self.tokens, "batch_phases": self.batch_schedule.state_dict(),
                "config": self.config, "changes": list(self.changes),
                "evaluation_pending": self.evaluation_pending,
                "model_args": vars(self.model.config).copy(), "optim_backends": self.optimizer.backends(),
                **{name: piece.state_dict() for name, piece in self.pieces.items()},
                "parts": {name: part.state_dict() for name, part in self.parts.items()}}

    def load_state_dict(self, checkpoint) -> None:
        """Continue from ``checkpoint`` (a ``Checkpoint``; its model and optimizer state are the
        layout's to load). A piece whose field is empty (a file of an older format version), or a
        part the checkpoint has no state of (a run without that part), keeps its fresh state."""
        self.step, self.changes = checkpoint.step, list(checkpoint.changes)
        self.evaluation_pending = checkpoint.evaluation_pending
        for name, piece in self.pieces.items():
            saved = getattr(checkpoint, name)
            if saved:
                piece.load_state_dict(saved)
        for name, part in self.parts.items():
            if name in checkpoint.parts:
                part.load_state_dict(checkpoint.parts[name])


    def peer_state_dict(self) -> dict:
        """What a replica group hands one that (re)joins it (training/replicas.py, through torchft's
        checkpoint transport), rank by rank: this rank's step, model, optimizer, pieces and parts,
        with no collective (torchft asks from its own thread), so without the pieces that gather
        every rank's (``GATHERS``: the RNG states, the loss window), which the joining rank keeps.
        A sharded tensor (FSDP2's DTensor) goes as this rank's shard and how it lies (``_packed``):
        the same rank of the joining group holds the same shard."""
        return {"step": self.step, "model": _packed(self.model.state_dict()),
                "optimizer": _packed(self.optimizer.state_dict()),
                "pieces": {name: piece.state_dict() for name, piece in self.pieces.items()
                           if not getattr(piece, "GATHERS", False)},
                "parts": {name: part.state_dict() for name, part in self.parts.items()}}

    def load_peer_state_dict(self, state: dict) -> None:
        """Continue from a peer's ``peer_state_dict`` (the same config: nothing to check)."""
        self.step = state["step"]
        mesh = next((p.device_mesh for p in self.model.parameters() if hasattr(p, "device_mesh")), None)
        self.model.load_state_dict(_unpacked(state["model"], mesh))
        self.optimizer.load_state_dict(_unpacked(state["optimizer"], mesh))
        for name, saved in state["pieces"].items():
            self.pieces[name].load_state_dict(saved)
        for name, saved in state["parts"].items():
            self.parts[name].load_state_dict(saved)


class _Shard(NamedTuple):
    """A DTensor as it travels to a joining group: this rank's shard and where it lies in the whole."""
    local: Tensor
    placements: tuple
    shape: torch.Size
    stride: tuple


def _packed(value):
    """``value`` (a state dict) with each DTensor as its ``_Shard`` (the transport pickles plain tensors)."""
    if hasattr(value, "device_mesh"):
        return _Shard(value.to_local(), tuple(value.placements), value.shape, value.stride())
    if isinstance(value, dict):
        return {key: _packed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_packed(item) for item in value]
    return value


def _unpacked(value, mesh):
    """``_packed``'s inverse on this rank's ``mesh`` (the joining group's: the same ranks and shards)."""
    if isinstance(value, _Shard):
        from torch.distributed.tensor import DTensor
        return DTensor.from_local(value.local, mesh, value.placements, run_check=False, shape=value.shape,
                                  stride=value.stride)
    if isinstance(value, dict):
        return {key: _unpacked(item, mesh) for key, item in value.items()}
    if isinstance(value, list):
        return [_unpacked(item, mesh) for item in value]
    return value


class RankRNG:
    """Every rank's torch RNG states (CPU, and the rank's CUDA device): dropout noise continues."""

    GATHERS = True  # (state_dict is a collective)

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
    """The train-loss sum of the kept steps since the last log step (per rank) and their number;
    checkpointed, so a resumed run logs the uninterrupted one's losses. A step hands over its loss
    and verdict (0-d device tensors) and nothing is computed then (no device operation, no host
    sync): they are summed where the loop syncs anyway (a log step's mean, a checkpoint), in one
    host read, step by step in the losses' dtype, as adding each on the device would (the window
    holds log_interval's at most)."""

    GATHERS = True  # (state_dict is a collective)

    def __init__(self, ctx: Distributed):
        self.ctx = ctx
        self.loss_sum = torch.zeros(()).numpy()[()]  # a numpy scalar of torch's default dtype, as the losses
        self.steps = 0
        self.pending: list[tuple[Tensor, Tensor]] = []  # (loss, finite) of the steps not summed yet

    def add(self, loss: Tensor, finite: Tensor) -> None:
        self.pending.append((loss, finite))

    def sum_pending(self) -> None:
        """The pending steps in the sums (one host read): a dropped step's loss is not summed nor counted."""
        if not self.pending:
            return
        n, add = len(self.pending), self.loss_sum.dtype.type
        values = torch.stack([loss for loss, _ in self.pending] + [finite for _, finite in self.pending]).tolist()
        self.pending = []
        for loss, finite in zip(values[:n], values[n:]):
            if finite:
                self.loss_sum, self.steps = self.loss_sum + add(loss), self.steps + 1

    def pop_mean(self) -> Tensor:
        """This rank's mean loss over the window, which starts afresh (on the device, for the ranks' mean)."""
        self.sum_pending()
        mean = torch.tensor(self.loss_sum, device=self.ctx.device) / self.steps
        self.loss_sum, self.steps = self.loss_sum.dtype.type(0), 0
        return mean

    def state_dict(self) -> dict:
        self.sum_pending()
        return {"steps": self.steps, "loss_sums": distributed.all_gather_objects(torch.tensor(self.loss_sum), self.ctx)}

    def load_state_dict(self, state: dict) -> None:
        sums = state["loss_sums"]
        # On another number of ranks each rank starts from the mean: the logged mean is the same.
        mine = sums[self.ctx.rank] if len(sums) == self.ctx.world_size else torch.stack(sums).mean()
        self.loss_sum, self.steps, self.pending = mine.cpu().numpy()[()], state["steps"], []
