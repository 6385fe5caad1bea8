"""The run folder, out_dir/run_name: one run owns it.

A folder that holds a run (its checkpoint, metrics, config) is continued only with
``resume`` and started over only with ``overwrite``; anything else is an error that says which
to choose, so a rerun of a run name never silently replaces a run. ``resume="auto"`` continues
a checkpoint if there is one and otherwise starts afresh, clearing what a run that died before
its first checkpoint left: what ``torchrun --max-restarts`` and a requeued SLURM job need. A
folder whose log shows training steps but which has no checkpoint (they were deleted, say to free
disk) is not such a run: ``resume="auto"`` refuses it rather than replace its log.
"""
from __future__ import annotations

import os
import shutil
import json
from pathlib import Path

from training.checkpoint import CHECKPOINT_NAME, numbered

# What a run writes into its folder (wandb/ holds offline wandb runs, which are kept).
RUN_FILES = (CHECKPOINT_NAME, "metrics.jsonl", "config.json", "wandb_id.txt")


def claim(run_dir: Path, resume: bool | str, overwrite: bool) -> tuple[bool, list[str]]:
    """Check the run folder, changing nothing: (whether the run resumes, the files of an earlier
    run that ``prepare`` removes before this one writes: on --overwrite, or on --resume=auto after
    a run that never checkpointed)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise NotADirectoryError(f"the run folder {run_dir} is a file: choose another out_dir or run_name")
    has_checkpoint = run_dir.is_dir() and bool(numbered(run_dir) or (run_dir / CHECKPOINT_NAME).is_file())
    if resume is True:
        if not has_checkpoint:
            raise FileNotFoundError(f"--resume: no checkpoint at {run_dir / CHECKPOINT_NAME}; start without "
                                    f"--resume, use --resume=auto, or point out_dir/run_name at the run folder")
        return True, []
    if resume == "auto" and has_checkpoint:
        return True, []
    held = [name for name in RUN_FILES if (run_dir / name).exists() or (run_dir / name).is_symlink()]
    held += [path.name for path in numbered(run_dir)] if run_dir.is_dir() else []
    trained = last_logged_step(run_dir / "metrics.jsonl")
    if held and resume == "auto" and trained:
        raise FileExistsError(f"--resume=auto: the run folder {run_dir} holds a run that trained to step {trained} "
                              f"(its metrics.jsonl) but no checkpoint ({', '.join(held)}): starting afresh would "
                              f"replace its log. Restore its checkpoints to continue it, start it over with "
                              f"--overwrite, or choose another run_name")
    if held and resume != "auto" and not overwrite:
        raise FileExistsError(f"the run folder {run_dir} already holds a run ({', '.join(held)}): continue it with "
                              f"--resume (or --resume=auto), start it over with --overwrite, or choose another "
                              f"run_name")
    existing = next(p for p in (run_dir, *run_dir.parents) if p.exists())
    if not existing.is_dir():
        raise NotADirectoryError(f"cannot make the run folder {run_dir}: {existing} is a file; choose another out_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write the run folder {run_dir}: {existing} is not writable; choose a "
                              f"writable out_dir")
    return False, held


def last_logged_step(log: Path) -> int:
    """The largest step a metrics log records (0 without one; torn lines are skipped)."""
    if not log.is_file() or log.is_symlink():
        return 0
    steps = [0]
    for line in log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            steps.append(record["step"])
    return max(steps)


def prepare(run_dir: Path, stale: list[str]) -> None:
    """Make the run folder and remove ``stale`` (from ``claim``): the main rank, before writing."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in stale:
        path = run_dir / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
