"""Metrics: one JSON line per record in the run folder, always; wandb as well when enabled.

wandb is a convenience, never a dependency of training: if it is missing, cannot start or
fails while logging, a warning is printed and the run goes on with the JSONL file alone.
``MetricsLog`` is the logger as a part of a run (training/parts.py): the main rank logs every
record, and the optimizer's implementation once at the start (``run_info``). ``TrainLoss`` and
``Speed`` are the loop's own series at log steps.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import string
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.profiler import record_function

from atomic import atomic_write
from training import distributed
from training.parts import Part


# Dense bf16 peak FLOP/s of common training GPUs, by a part of their device name, for MFU.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "4090": 165e12}


def peak_bf16_flops(device_name: str) -> float | None:
    """The dense bf16 peak of the GPU called ``device_name`` (e.g. "NVIDIA H200"), None if unknown."""
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in device_name), None)


def _jsonable(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


class MetricsLogger:
    def __init__(self, run_dir: Path, config: dict, *, wandb_mode: str = "disabled", project: str = "nanomerit",
                 entity: str | None = None, group: str | None = None, resume_step: int | None = None):
        """resume_step: the step a resumed run continues from; records the interrupted run wrote
        after its last checkpoint are dropped (the file rewritten atomically), so the log reads as
        one uninterrupted run; a torn last line (a kill mid-write) is dropped too, a damaged line
        before it is kept, with a warning. The log is append-only and flushed per record; it is
        opened without following a link planted in its place."""
        self.path = run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            lines = self.path.read_text().splitlines()
            kept = []
            for number, line in enumerate(lines, 1):
                step = _step_of(line)
                if step is None and number < len(lines):
                    warnings.warn(f"{self.path} line {number} is not a JSON record ({line[:60]!r}): kept as it is")
                    kept.append(line)
                elif step is not None and step <= resume_step:
                    kept.append(line)
            with atomic_write(self.path, "w") as f:
                f.writelines(line + "\n" for line in kept)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        self._file = os.fdopen(fd, "a", encoding="utf-8")
        self._wandb = None
        if wandb_mode != "disabled":
            self._wandb = self._start_wandb(run_dir, config, wandb_mode, project, entity, group,
                                            resume=resume_step is not None)

    @staticmethod
    def _start_wandb(run_dir, config, mode, project, entity, group, resume):
        try:
            import wandb

            wandb_run = wandb.init(project=project, entity=entity, group=group, name=config["run_name"],
                                   config=config, mode=mode, dir=str(run_dir), id=_run_id(run_dir),
                                   resume="allow" if resume else None)
            # Per-layer max attention logits and optimizer diagnostics share a step axis with the loss.
            wandb_run.define_metric("*", step_metric="step")
            return wandb_run
        except Exception as e:  # noqa: BLE001 - any wandb failure must leave training running
            warnings.warn(f"wandb could not start ({e}); logging to {run_dir / 'metrics.jsonl'} only")
            return None

    def log(self, record: dict):
        record = {k: _jsonable(v) for k, v in record.items()}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._wandb is not None:
            try:
                self._wandb.log(record)
            except Exception as e:  # noqa: BLE001
                warnings.warn(f"wandb.log failed ({e}); continuing with the JSONL log only")
                self._wandb = None

    def log_run_info(self, info: dict, key: str = "run_info"):
        """Facts about the run that are not series (which optimizer implementation runs; an
        ``event`` such as settings changed on resume): one ``{key: info}`` line in the JSONL log,
        and the wandb run's config."""
        self._file.write(json.dumps({key: info}) + "\n")
        self._file.flush()
        if self._wandb is not None:
            try:
                self._wandb.config.update({key: info}, allow_val_change=True)
            except Exception as e:  # noqa: BLE001
                warnings.warn(f"wandb.config.update failed ({e}); continuing with the JSONL log only")
                self._wandb = None

    def close(self):
        self._file.close()
        if self._wandb is not None:
            try:
                self._wandb.finish()
            except Exception as e:  # noqa: BLE001
                warnings.warn(f"wandb.finish failed ({e})")


class TrainLoss(Part):
    """At log steps: ``train/loss`` (the mean over the kept steps since the last log step and the
    ranks), the ``lr``, the ``grad_norm`` and the batch of the step (``batch/size`` in sequences,
    ``batch/tokens_per_step``, trained, ``batch/phase``: its index in the batch schedule; with a
    sequence-length warmup ``batch/seq_len``, the step's, ``batch/tokens_read_per_step`` and
    ``batch/tokens_read``, the tokens read so far, of which ``tokens`` trained), and with
    nonfinite="skip" the ``skipped_steps`` so far."""

    metric_keys = ("train/loss", "lr", "grad_norm", "batch/", "skipped_steps")

    def __init__(self, run):
        self.run = run

    def measure(self, step) -> dict[str, float]:
        run = self.run
        record = {"train/loss": distributed.all_reduce_mean(run.loss_window.pop_mean(), run.ctx).item(),
                  "lr": run.optimizer.param_groups[0]["lr"], "grad_norm": step.grad_norm.item()}
        taken, schedule = step.number - 1, run.schedule.batch_schedule
        record.update({"batch/size": schedule.phase(taken).batch, "batch/phase": schedule.phase_index(taken),
                       "batch/tokens_per_step": schedule.tokens_per_step(taken)})
        if schedule.seq_len_warmup is not None:  # (the tokens read and trained differ: the record keeps both)
            record.update({"batch/seq_len": schedule.seq_len_warmup.length(taken),
                           "batch/tokens_read_per_step": schedule.tokens_read_per_step(taken),
                           "batch/tokens_read": schedule.tokens_read(step.number)})
        if run.config.nonfinite == "skip":
            record["skipped_steps"] = run.nonfinite.skipped
        return record


def section_range(name: str):
    """A torch.profiler range named ``name`` while a profiler records (a trace shows the step's
    sections), else nothing: ``record_function`` costs about 20 us a range even with no profiler,
    140 us of a batch-1 step of the mini-study's model (docs/performance.md, "Small batches")."""
    return record_function(name) if torch.autograd._profiler_enabled() else nullcontext()


class Speed(Part):
    """``tokens_per_s`` at log steps: the tokens trained since the last log step per second of
    wall time, everything included (the instruments, validation, checkpoints; the device waited
    for at log steps only), and ``mfu`` where the device's peak FLOP/s is known (the config's
    ``peak_flops``, else the GPU's by its name); with a sequence-length warmup also
    ``tokens_read_per_s``, the tokens read."""

    metric_keys = ("tokens_per_s", "tokens_read_per_s", "mfu")

    def __init__(self, run):
        self.run = run
        self.peak_flops = run.config.peak_flops
        if self.peak_flops is None and run.device.type == "cuda":
            self.peak_flops = peak_bf16_flops(torch.cuda.get_device_name(run.device))
        self.start()

    def start(self) -> None:
        self.since, self.tokens, self.tokens_read = time.perf_counter(), 0, 0

    def after_step(self, step) -> None:
        schedule = self.run.schedule.batch_schedule
        self.tokens += schedule.tokens_per_step(step.number - 1)
        if schedule.seq_len_warmup is not None:  # (else the tokens read are those trained: nothing more a step)
            self.tokens_read += schedule.tokens_read_per_step(step.number - 1)

    def measure(self, step) -> dict[str, float]:
        if self.run.device.type == "cuda":
            torch.cuda.synchronize(self.run.device)
        now = time.perf_counter()
        tokens_per_s, schedule = self.tokens / (now - self.since), self.run.schedule.batch_schedule
        record = {"tokens_per_s": tokens_per_s}
        if schedule.seq_len_warmup is not None:
            record["tokens_read_per_s"] = self.tokens_read / (now - self.since)
        self.since, self.tokens, self.tokens_read = now, 0, 0
        if self.peak_flops:
            record["mfu"] = self.run.model.estimate_mfu(tokens_per_s / self.run.layout.data_ranks, self.peak_flops)
        return record


class MetricsLog(Part):
    def __init__(self, run):
        self.run = run
        self.logger: MetricsLogger | None = None  # the main rank's, from the start

    def start(self) -> None:
        run, config = self.run, self.run.config
        if run.ctx.is_main:
            self.logger = MetricsLogger(run.run_dir, config.to_dict(), wandb_mode=config.wandb_mode,
                                        project=config.wandb_project, entity=config.wandb_entity,
                                        group=config.wandb_group, resume_step=run.step if run.resuming else None)
            self.logger.log_run_info({"optim_backend": config.optim_backend, **run.optimizer.backends()})
            changes = [c for c in run.state.changes if run.resuming and c["step"] == run.step]
            if changes:  # an event in the record: settings this resume changed
                self.logger.log_run_info({"changes": changes}, key="event")

    def record(self, metrics: dict) -> None:
        self.run.run_lock.check()  # (a run whose folder was taken over writes nothing more)
        self.logger.log(metrics)

    def event(self, info: dict) -> None:
        """An ``{"event": info}`` line in the main rank's record (e.g. a stop on a non-finite gradient)."""
        if self.logger is not None:
            self.logger.log_run_info(info, key="event")

    def close(self) -> None:
        if self.logger is not None:
            self.logger.close()
            self.logger = None


def _step_of(line: str) -> float | None:
    """The step of a JSONL record (0 for a record without one); None for a line that is not one."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record.get("step", 0) if isinstance(record, dict) else None


def _run_id(run_dir: Path) -> str:
    """A wandb run id stored in the run folder, so a resumed run appends to the same wandb run.
    Made here (8 characters of [a-z0-9], wandb's own form): wandb's helpers for it moved between
    versions (wandb.util.generate_id is gone in 0.31)."""
    path = run_dir / "wandb_id.txt"
    if not path.exists():
        alphabet = string.ascii_lowercase + string.digits
        with atomic_write(path, "w") as f:
            f.write("".join(secrets.choice(alphabet) for _ in range(8)))
    return path.read_text().strip()
