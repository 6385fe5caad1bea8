"""A run's checkpoints as its loop sees them: when it saves, what a save writes and keeps, what a
resume loads, and the steps this invocation wrote.

The layout's writer (writers.py) writes and reads the state (the whole of it on rank 0, or each
rank's shards); the checkpointer decides when (``due``: the run's last step, a stop, every
``checkpoint_interval`` steps), prunes the folder after each save to the newest
``keep_checkpoints`` and every ``permanent_checkpoint_interval``-th, and writes only while the run
still holds its folder (run_folder.lock: a run whose folder was taken over writes nothing more).
"""
from __future__ import annotations

from pathlib import Path

from configs import TrainConfig
from training.batch_schedule import StepSchedule
from training.checkpoint.files import load_latest, prune
from training.checkpoint.format import Checkpoint
from training.checkpoint.writers import InlineWriter
from training.state import RunState


class Checkpointer:
    def __init__(self, writer: InlineWriter, run_dir: Path, config: TrainConfig):
        self.writer, self.ctx, self.run_dir, self.config = writer, writer.ctx, run_dir, config
        self.steps: list[int] = []  # of this invocation's checkpoints (and the resumed one), oldest first
        self.lock = None  # the run folder's lock (run_folder.lock), once the run holds the folder

    def due(self, step: int, last_step: int, stop: bool) -> bool:
        """Whether the run saves after ``step``: its last step of this invocation, a stop, an interval."""
        interval = self.config.checkpoint_interval
        return step == last_step or stop or bool(interval and step % interval == 0)

    def save(self, state: RunState) -> None:
        """``state`` as the run folder's newest checkpoint, the folder pruned; every rank calls it."""
        self.lock.check()
        self.writer.save(state, self.run_dir)
        if self.ctx.is_main:
            prune(self.run_dir, self.config.keep_checkpoints, self.config.permanent_checkpoint_interval)
        self.steps.append(state.step)

    def resume(self, state: RunState, schedule: StepSchedule, model_args: dict, config: dict) -> Checkpoint:
        """Continue ``state`` and ``schedule`` from the checkpoint a resume reads (``latest``), the
        changes ``config`` (a resolved config's dict) makes refused unless allowed; returns it."""
        checkpoint, path = self.latest()
        schedule.resume(checkpoint)
        state.batch_schedule = schedule.batch_schedule
        changes = checkpoint.changes_on_resume(model_args, config, path, schedule.total_steps)
        self.load(state, checkpoint, path, changes)
        return checkpoint

    def latest(self) -> tuple[Checkpoint, Path]:
        """The checkpoint a resume continues (with ``resume="auto"``, the newest that loads)."""
        return load_latest(self.run_dir, fall_back=self.config.resume == "auto")

    def load(self, state: RunState, checkpoint: Checkpoint, path: Path, changes: list[dict]) -> None:
        """Continue ``state`` from ``checkpoint`` (read from ``path``), this run's ``changes`` to its
        config (each named by allow_changes) added to its record, and say so; every rank calls it."""
        self.writer.load(state, checkpoint, path)
        state.changes += changes
        self.steps.append(state.step)
        if self.ctx.is_main:
            print(f"resumed {path} at step {state.step} (written by code {checkpoint.code_version})" + "".join(
                f"; {c['key']} {c['from']!r} -> {c['to']!r} from here on" for c in changes)
                + (f"; step {state.step}'s pending evaluation runs first" if state.evaluation_pending else ""))
