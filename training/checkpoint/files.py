"""A run folder's checkpoints: their names, the latest pointer, what is kept, which one a resume reads.

Each checkpoint is ``ckpt_<step>.pt`` (inline: one file) or ``ckpt_<step>.dcp/`` (sharded: a
folder, sharded.py). ``ckpt.pt``, a link to the newest, is the latest pointer, switched
atomically once the new one is complete (``make_latest``), so a crash at any moment leaves the
last good checkpoint named; ``prune`` (the checkpointer's, after each save) then removes all but
the newest ``keep`` and every ``permanent_interval``-th. Readers that take ``RUN/ckpt.pt`` get the
newest; ``load_latest`` is what a resume reads, falling back past a corrupt newest one if asked.
"""
from __future__ import annotations

import os
import re
import shutil
import uuid
import warnings
from pathlib import Path

from training.checkpoint.format import CHECKPOINT_NAME, Checkpoint

NUMBERED = re.compile(r"ckpt_(\d{8,})\.(pt|dcp)")


def numbered(run_dir: Path) -> list[Path]:
    """The run folder's checkpoints (files and sharded folders), oldest first."""
    found = [p for p in Path(run_dir).iterdir() if NUMBERED.fullmatch(p.name)] if Path(run_dir).is_dir() else []
    return sorted(found, key=lambda p: int(NUMBERED.fullmatch(p.name).group(1)))


def save_in(run_dir: Path, checkpoint: Checkpoint) -> Path:
    """Write ``checkpoint`` as run_dir/ckpt_<step>.pt and point ckpt.pt at it."""
    path = run_dir / f"ckpt_{checkpoint.step:08d}.pt"
    checkpoint.save(path)
    make_latest(run_dir, path)
    return path


def make_latest(run_dir: Path, path: Path) -> None:
    """Point ckpt.pt at the complete checkpoint ``path``."""
    link = run_dir / f".{CHECKPOINT_NAME}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    os.symlink(path.name, link)
    os.replace(link, run_dir / CHECKPOINT_NAME)  # written last: it only ever names a complete checkpoint


def prune(run_dir: Path, keep: int, permanent_interval: int = 0) -> None:
    """Remove all but the newest ``keep`` numbered checkpoints (and every ``permanent_interval``-th);
    after a save, so ckpt.pt names the newest, which stays."""
    for old in numbered(run_dir)[:-keep]:
        step = int(NUMBERED.fullmatch(old.name).group(1))
        if not (permanent_interval and step % permanent_interval == 0):
            shutil.rmtree(old) if old.is_dir() else old.unlink()


def load_latest(run_dir: Path, fall_back: bool, map_location="cpu") -> tuple[Checkpoint, Path]:
    """The newest checkpoint of a run folder and its file. With ``fall_back`` a newest one that
    cannot be read (truncated, corrupt) is skipped with a warning for the one before it."""
    latest = run_dir / CHECKPOINT_NAME
    candidates = [latest.resolve()] if latest.exists() else []
    candidates += [p for p in reversed(numbered(run_dir)) if p not in candidates]
    if not candidates and latest.is_symlink():
        raise FileNotFoundError(f"{latest} is a link to {os.readlink(latest)}, which does not exist, and {run_dir} "
                                f"holds no other checkpoint: the run cannot resume; put the checkpoint back, or "
                                f"start the run again with --overwrite")
    if not candidates:
        raise FileNotFoundError(f"no checkpoint in {run_dir}")
    if latest.is_symlink() and not latest.exists():  # the newest was deleted
        missing = run_dir / os.readlink(latest)
        if not fall_back:
            raise FileNotFoundError(f"the newest checkpoint {missing} ({CHECKPOINT_NAME} points at it) is missing: "
                                    f"resume the one before it, {candidates[0].name}, with --resume=auto")
        warnings.warn(f"the newest checkpoint {missing} ({CHECKPOINT_NAME} points at it) is missing; resuming the "
                      f"one before it, {candidates[0].name}")
    for i, path in enumerate(candidates):
        try:
            return Checkpoint.load(path, map_location=map_location), path
        except ValueError as error:
            if not fall_back or i == len(candidates) - 1:
                raise
            warnings.warn(f"skipping the checkpoint {path}: {error}; trying {candidates[i + 1].name}")
