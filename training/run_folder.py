"""The run folder, out_dir/run_name: one run owns it.

A folder that holds a run (its checkpoint, metrics, config) is continued only with
``resume`` and started over only with ``overwrite``; anything else is an error that says which
to choose, so a rerun of a run name never silently replaces a run. ``resume="auto"`` continues
a checkpoint if there is one and otherwise starts afresh, clearing what a run that died before
its first checkpoint left: what ``torchrun --max-restarts`` and a requeued SLURM job need. A
folder whose log shows training steps but which has no checkpoint (they were deleted, say to free
disk) is not such a run: ``resume="auto"`` refuses it rather than replace its log.

``RunLock`` makes the ownership hold while a run is going: the run's main rank holds the lock
file ``.lock`` in the folder (created exclusively, which works on NFS and Lustre too, with the
holder's host, pid and start time, its modification time renewed as a heartbeat), so a second
run on the same folder is refused at once, naming the holder. A lock whose holder is gone is
taken over, and said so: on this host when its process is dead (its pid gone, or reused by a
process that started later), whatever the heartbeat's age, so a run stopped for a while (Ctrl-Z,
SLURM's suspend) keeps its folder; from another host when its heartbeat stopped (kill -9, a lost
node). A run whose lock was taken over all the same (another host's run, after a long stop)
stops before its next write, checkpoint or metrics, and says why (``RunLock.check``). A live
holder is named before anything else is decided: a resume or a start-over of a folder in use is
refused as a plain start is.

What is derived from a checkpoint and written beside it (``DERIVED_FILES``: python -m eval's
results, scripts/hessian.py's hessian.json, the Hugging Face export the guide names) records the
model it came from, ``model_sha256`` (a hash of its weights) and its step, and is the run's: a run
started over removes it with its own files.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import socket
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import torch

from configs import INVOCATION_KEYS, TrainConfig
from model import HF_CLASSES, hf_export_refusal
from training import distributed
from training.checkpoint import CHECKPOINT_NAME, NUMBERED, numbered
from training.distributed import Distributed

# What a run writes into its folder (wandb/ holds offline wandb runs, which are kept).
RUN_FILES = (CHECKPOINT_NAME, "metrics.jsonl", "config.json", "wandb_id.txt")
# What is derived from a checkpoint and written into the run folder by default (glob patterns): python -m
# eval's results (one file per checkpoint), the Hessian and the Hugging Face export the guide names.
# The run's too, so a run started over removes them.
DERIVED_FILES = ("results*.json", "hessian.json", "hf")
LOCK_NAME = ".lock"
HEARTBEAT_SECONDS = 30.0  # how often the holder renews the lock's modification time
STALE_SECONDS = 300.0  # a lock not renewed for this long is a dead holder's (a lost node's)


def claim(run_dir: Path, resume: bool | str, overwrite: bool) -> tuple[bool, list[str]]:
    """Check the run folder, changing nothing: (whether the run resumes, the files of an earlier
    run and what was derived from its checkpoints, which ``prepare`` removes before this one
    writes: on --overwrite, or on --resume=auto after a run that never checkpointed). A folder a
    live run holds is refused first, naming the holder, whatever is asked."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise NotADirectoryError(f"the run folder {run_dir} is a file: choose another out_dir or run_name")
    in_use = RunLock(run_dir).in_use()
    if in_use:  # (what it holds is being written: neither resumed nor started over)
        raise RunFolderLocked(in_use)
    for name in RUN_FILES[1:]:  # (ckpt.pt is a link the run makes itself)
        if (run_dir / name).is_symlink():
            raise FileExistsError(f"{run_dir / name} is a symbolic link (to {os.readlink(run_dir / name)}): a run's "
                                  f"files are its own; remove the link, or choose another run_name")
    has_checkpoint = run_dir.is_dir() and bool(numbered(run_dir) or (run_dir / CHECKPOINT_NAME).is_file()
                                               or (run_dir / CHECKPOINT_NAME).is_symlink())
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
    held += derived_files(run_dir) if held else []  # (of the earlier model)
    existing = next(p for p in (run_dir, *run_dir.parents) if p.exists())
    if not existing.is_dir():
        raise NotADirectoryError(f"cannot make the run folder {run_dir}: {existing} is a file; choose another out_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write the run folder {run_dir}: {existing} is not writable; choose a "
                              f"writable out_dir")
    return False, held


def remove_stale_temporaries(run_dir: Path) -> list[str]:
    """Remove what writes interrupted by a crash left in the folder (temporary files and partial
    DCP checkpoints, which can be as large as a checkpoint), only those whose writer is gone;
    returns their names. Called by the lock's holder, so no live run writes here."""
    removed = []
    for path in sorted(Path(run_dir).glob(".*")):
        if path.name.endswith(".tmp"):  # atomic.py's .NAME.PID.HEX.tmp
            pid = path.name.rsplit(".", 3)[-3] if path.name.count(".") >= 3 else ""
            if pid.isdigit() and _alive(int(pid)):
                continue  # (e.g. python -m eval writing results.json here right now)
        elif not path.name.endswith(".partial"):  # save_sharded_in's .ckpt_<step>.dcp.partial
            continue
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        removed.append(path.name)
    return removed


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


def run_folder_around(path: Path) -> Path | None:
    """The run folder ``path`` lies in (or is): the nearest folder at or above it that holds a run,
    its config.json with its metrics.jsonl or a checkpoint (a config.json alone, as a home folder
    may have, is not one); None if none does."""
    for folder in (path, *path.parents):
        if (folder / "config.json").is_file() and ((folder / "metrics.jsonl").is_file() or numbered(folder)
                                                    or (folder / CHECKPOINT_NAME).exists()):
            return folder
    return None


def derived_files(run_dir: Path) -> list[str]:
    """The names of what in ``run_dir`` was derived from a checkpoint (``DERIVED_FILES``), sorted."""
    return sorted({path.name for pattern in DERIVED_FILES for path in Path(run_dir).glob(pattern)})


def model_sha256(model: torch.nn.Module) -> str:
    """The sha256 of the model's weights (names, dtypes, shapes and bytes): the model an artefact
    derived from a checkpoint came from, however the checkpoint was named."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def make(run_dir: Path) -> None:
    """Make the run folder (and its parents), or raise an OSError saying it cannot and why, and the fix."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # e.g. under /proc, which even root cannot write; a read-only file system
        where = f" ({error.filename})" if error.filename and str(error.filename) != str(run_dir) else ""
        raise type(error)(f"cannot make the run folder {run_dir}: {error.strerror or error}{where}; choose a "
                          f"writable out_dir") from None


def prepare(run_dir: Path, stale: list[str]) -> None:
    """Make the run folder and remove ``stale`` (from ``claim``): the main rank, before writing."""
    make(run_dir)
    for name in stale:
        path = run_dir / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def fingerprint(run_dir: Path) -> list[tuple]:
    """The run's own files in the folder (names, sizes, modification times, where ckpt.pt points;
    not what others write beside them, such as a launcher's log): a run compares them before
    deciding how to start and after taking the lock."""
    if not run_dir.is_dir():
        return []
    entries = []
    for path in sorted(run_dir.iterdir()):
        if path.name not in RUN_FILES and not NUMBERED.fullmatch(path.name):
            continue
        stat = path.lstat()
        entries.append((path.name, stat.st_size, stat.st_mtime_ns,
                        os.readlink(path) if path.is_symlink() else None))
    return entries


def resume_command(launcher: list[str], argv: list[str]) -> list[str]:
    """The command that continues a run started with ``launcher`` and ``argv`` from its last checkpoint."""
    dropped = [f"--{key}" for key in INVOCATION_KEYS]  # (this invocation's, not the run's)
    return [*launcher, "train.py", *(arg for arg in argv if arg.split("=")[0] not in dropped), "--resume"]


def guide(run_dir: Path, step: int, total_steps: int, config: TrainConfig, launcher: list[str],
          argv: list[str], evaluation_pending: bool = False) -> str:
    """Where a run's files are and the commands that evaluate, continue and export it (printed at
    the end of an invocation). ``launcher`` and ``argv``: how train.py was started and its
    arguments, so the resume command is the user's own; a finished run continues only with a
    longer schedule. ``evaluation_pending``: a stop left the step's evaluation pending, which any
    resume runs first. A model no Hugging Face class computes gets no export command, but why."""
    checkpoint = run_dir / CHECKPOINT_NAME
    length = "--max_steps" if config.max_steps else "--max_tokens"
    resume = resume_command(launcher, argv)
    pending = f"step {step}'s pending evaluation" if evaluation_pending else ""
    lines = [f"run folder {run_dir}:",
             f"  checkpoint  {checkpoint} (step {step} of {total_steps}"
             + (f"; step {step}'s evaluation, which a stop interrupted, is pending)" if pending else ")"),
             f"  metrics     {run_dir / 'metrics.jsonl'}",
             f"  config      {run_dir / 'config.json'}",
             f"evaluate  python -m eval --ckpt {checkpoint} --tasks paper  (offline, on sample tasks: add --samples)"]
    if step < total_steps or pending:
        lines.append(f"resume    {shlex.join(resume)}" + (f"  (runs {pending} first)" if pending else ""))
    if step == total_steps:  # twice the length, as an example: any longer schedule continues it, a change said as one
        longer = [*(arg for arg in resume if arg.split("=")[0] != length),
                  f"{length}={2 * (config.max_steps or config.max_tokens)}", f"--allow_changes={length[2:]}"]
        lines.append(f"train on  {shlex.join(longer)}  (any longer run; the lr schedule follows the new "
                     f"length" + (f"; {pending} runs first)" if pending else ")"))
    model_config = config.model_config(n_vocab=1)  # (the model's family and options; its vocabulary aside)
    refusal = hf_export_refusal(model_config)
    lines.append(f"export    none to Hugging Face: {refusal}; python -m eval evaluates it (above)" if refusal else
                 f"export    python -m scripts.export_hf {checkpoint} {run_dir / 'hf'}  (a Hugging Face "
                 f"{HF_CLASSES[model_config.arch]} folder)")
    return "\n".join(lines)


def lock(run_dir: Path, seen: list, ctx: Distributed) -> RunLock:
    """The main rank takes the run folder's lock, refused if another live run holds it, or if the
    folder changed since ``seen`` (its ``fingerprint`` when the run decided how to start: another
    run used it meanwhile); it removes what interrupted writes left. Every rank learns the outcome
    (RunFolderLocked on a refusal) and gets the lock to check and release (the main rank's is held)."""
    held, refusal = RunLock(run_dir), None  # (held by the main rank; the others' is never taken)
    if ctx.is_main:
        try:
            took_over = held.acquire()
            if took_over:
                print(f"{run_dir}: {took_over}")
            removed = remove_stale_temporaries(run_dir)
            if removed:
                print(f"{run_dir}: removed what interrupted writes left: {', '.join(removed)}")
                seen = [entry for entry in seen if entry[0] not in removed]
            if fingerprint(run_dir) != seen:
                held.release()
                refusal = (f"the run folder {run_dir} changed while this run started (another run wrote "
                           f"to it meanwhile): start this run again")
        except OSError as error:
            refusal = str(error)
    refusal = distributed.all_gather_objects(refusal, ctx)[0]
    if refusal:
        raise RunFolderLocked(refusal)
    return held


class RunFolderLocked(OSError):
    """Another live run holds the run folder."""


class RunLock:
    """The run folder's lock, held by one process (the run's main rank) from ``acquire`` to
    ``release``."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def acquire(self) -> str | None:
        """Take the lock (making the folder), or raise RunFolderLocked naming the holder. Returns a
        line saying so when a dead holder's lock was taken over, else None."""
        make(self.path.parent)
        identity = {"host": socket.gethostname(), "pid": os.getpid(), "process_start": _process_start(os.getpid()),
                    "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "token": self.token}
        took_over = None
        for _ in range(3):  # (another process may take over the same stale lock at the same moment)
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder, age = self._holder()
                if not _is_stale(holder, age):
                    raise RunFolderLocked(_in_use(self.path.parent, holder, age)) from None
                took_over = f"took over the lock of a run that is gone ({_describe(holder, age)})"
                stale = self.path.with_name(f"{LOCK_NAME}.stale.{self.token}")
                try:
                    os.rename(self.path, stale)  # atomic: of two processes taking it over, one renames it
                    stale.unlink()
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(identity) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self._heartbeat = threading.Thread(target=self._renew, name="run-lock-heartbeat", daemon=True)
            self._heartbeat.start()
            return took_over
        raise RunFolderLocked(f"the run folder {self.path.parent}: its lock {self.path} keeps changing hands; "
                              f"is another run starting there? choose another run_name")

    def in_use(self) -> str | None:
        """Why the folder is in use, naming the live run that holds its lock; None where no live run
        holds it (no lock, or a dead holder's, which ``acquire`` takes over)."""
        if not self.path.exists():
            return None
        holder, age = self._holder()
        return None if _is_stale(holder, age) else _in_use(self.path.parent, holder, age)

    def check(self) -> None:
        """Before a write: raise RunFolderLocked if this run's lock was taken over (by a run on
        another host, while this one was stopped longer than STALE_SECONDS); the folder is that
        run's now. Nothing to check where the lock is not held (the other ranks)."""
        if self._heartbeat is None:
            return
        holder, age = self._holder()
        if holder.get("token") != self.token:
            raise RunFolderLocked(f"the run folder {self.path.parent}: this run's lock was taken over by another run "
                                  f"({_describe(holder, age)}) while this one was stopped; this run stops without "
                                  f"writing more there: the folder is the other run's now")

    def release(self) -> None:
        """Give the lock up (only if it is still this process's)."""
        if self._heartbeat is None:
            return
        self._stop.set()
        self._heartbeat.join()
        self._heartbeat = None
        holder, _ = self._holder()
        if holder.get("token") == self.token:
            self.path.unlink(missing_ok=True)

    def _renew(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            if self._holder()[0].get("token") not in (self.token, None):
                return  # taken over: never renew another run's lock
            try:
                os.utime(self.path)
            except OSError:  # (the folder removed under the run: nothing to renew)
                pass

    def _holder(self) -> tuple[dict, float]:
        """(the holder's identity, {} if unreadable; seconds since its heartbeat)."""
        try:
            age = time.time() - self.path.stat().st_mtime
            holder = json.loads(self.path.read_text())
        except (OSError, ValueError):  # being written, or gone meanwhile
            return {}, 0.0
        return (holder if isinstance(holder, dict) else {}), age


def _is_stale(holder: dict, age: float) -> bool:
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        return not _alive(holder["pid"], holder.get("process_start"))  # (a stopped process is alive)
    return age > STALE_SECONDS  # another host's (or being written): alive while it renews


def _alive(pid: int, start: int | None = None) -> bool:
    """Whether process ``pid`` runs on this host (and, with ``start``, is the process that started
    then, not a later one given the same pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        pass
    return start is None or _process_start(pid) in (start, None)


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, /proc/PID/stat's 22nd field), None where
    there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _in_use(run_dir: Path, holder: dict, age: float) -> str:
    return (f"the run folder {run_dir} is in use by another run: {_describe(holder, age)}. Wait for it to end, or "
            f"choose another run_name (a lock whose holder died is taken over by itself: at once on the same host, "
            f"after {STALE_SECONDS:.0f} s elsewhere)")


def _describe(holder: dict, age: float) -> str:
    return (f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started {holder.get('started', '?')}, "
            f"heartbeat {age:.0f} s ago")
