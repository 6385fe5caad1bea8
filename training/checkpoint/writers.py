"""How a layout writes the run's state (training/state.py) as a checkpoint, and reads it back on
resume: the one thing a layout (training/parallel.py) decides about checkpoints is which writer.

============================  =======================================================================
``InlineWriter``              one process, DDP: rank 0 writes the whole state in one file
``ConsolidatingWriter``       ZeRO-1: the optimizer state gathered on rank 0 first, then inline
``ShardedWriter``             FSDP2: every rank writes its shards with DCP (sharded.py), rank 0 the rest
============================  =======================================================================

A sharded checkpoint resumes on any number of ranks, FSDP2 or not (DCP reshards); an inline one
anywhere but under FSDP2, where ``check_loads`` says how to resume it instead.
"""
from __future__ import annotations

from pathlib import Path

from training import distributed
from training.checkpoint.files import save_in
from training.checkpoint.format import Checkpoint
from training.checkpoint.tensors import load_tensors
from training.distributed import Distributed
from training.state import RunState


class InlineWriter:
    """The whole state in one file, ``ckpt_<step>.pt``, written by rank 0; the base of the others."""

    def __init__(self, ctx: Distributed):
        self.ctx = ctx

    def save(self, state: RunState, run_dir: Path) -> None:
        """Write ``state`` as run_dir's newest checkpoint (ckpt.pt names it once it is whole); every
        rank calls it."""
        fields = state.state_dict()  # (collectives: every rank's RNG states and loss sums)
        optimizer = self.optimizer_state(state.optimizer)
        if self.ctx.is_main:
            save_in(run_dir, Checkpoint(model=state.model.state_dict(), optimizer=optimizer, **fields))
        distributed.barrier(self.ctx)

    def optimizer_state(self, optimizer) -> dict:
        return optimizer.state_dict()

    def load(self, state: RunState, checkpoint: Checkpoint, path: Path) -> None:
        """Continue ``state`` from ``checkpoint`` (read from ``path``); every rank calls it."""
        self.check_loads(checkpoint, path)
        # The optimizer's state is the checkpoint's, its hyper-parameters this run's: the same values
        # but where the config changed one on resume (allow_changes), which so applies. (Group keys
        # that are state, GROUP_STATE, such as Schedule-Free's step count, stay the checkpoint's.)
        settings = [{key: value for key, value in group.items()
                     if key != "params" and key not in state.optimizer.GROUP_STATE}
                    for group in state.optimizer.param_groups]
        load_tensors(checkpoint, path, state.model, state.optimizer)
        for group, own in zip(state.optimizer.param_groups, settings, strict=True):
            group.update(own)
        state.load_state_dict(checkpoint)

    def check_loads(self, checkpoint: Checkpoint, path: Path) -> None:
        """Refuse a checkpoint this writer's layout cannot continue, saying how to."""


class ConsolidatingWriter(InlineWriter):
    """ZeRO-1: the optimizer state, split over the ranks, consolidated on rank 0 into the plain
    optimizer's format, so the file is the inline one; loaded, each rank keeps its partition's share."""

    def optimizer_state(self, optimizer) -> dict:
        return optimizer.consolidated_state_dict()  # (a collective)

    def check_loads(self, checkpoint: Checkpoint, path: Path) -> None:
        if checkpoint.tensors == "dcp":
            raise ValueError(f"checkpoint {path} is sharded (written with fsdp=True): resume it with "
                             f"fsdp=True, or with zero_stage=0")


class ShardedWriter(InlineWriter):
    """FSDP2: every rank writes its shards (DCP), rank 0 the rest of the state (sharded.py)."""

    def save(self, state: RunState, run_dir: Path) -> None:
        from training.checkpoint.sharded import save_sharded_in  # (DCP: imported by the runs that use it)
        fields = state.state_dict()  # (collectives)
        checkpoint = Checkpoint(model={}, optimizer={}, **fields) if self.ctx.is_main else None
        save_sharded_in(run_dir, checkpoint, state.model, state.optimizer, state.step)
        distributed.barrier(self.ctx)

    def check_loads(self, checkpoint: Checkpoint, path: Path) -> None:
        if checkpoint.tensors != "dcp":
            raise ValueError(f"checkpoint {path} is a whole-model file (written without fsdp): resume it without "
                             f"fsdp (DDP or zero_stage=1 shard no parameters), or start a new run_name")
