"""How a run is asked to stop: SIGTERM (a scheduler's preemption notice) and Ctrl-C save at the
next log step, where the ranks agree on it, and exit; a second Ctrl-C stops at once, unsaved, in one
line that names the last checkpoint and the resume command (no traceback), with exit status 130; during
a checkpoint's write (``deferred``) it stops once the file is whole. The handlers a program had are
restored when the run closes, so a run inside another program leaves them as they were."""
from __future__ import annotations

import contextlib
import shlex
import signal
import sys
from collections.abc import Callable, Iterator

from tqdm import tqdm

from training import distributed
from training.checkpoint import CHECKPOINT_NAME
from training.run_folder import resume_command

AT_ONCE_STATUS = 128 + signal.SIGINT  # (130: the shell's status of a process Ctrl-C stopped)


class StopSignals:
    def __init__(self, is_main: bool, checkpoints=None, step: Callable[[], int] = lambda: 0):
        """``checkpoints``: the run's Checkpointer (its folder and the steps saved), ``step``: the steps
        taken; what a second Ctrl-C's line says."""
        self.is_main, self.checkpoints, self.step = is_main, checkpoints, step
        self.received: str | None = None  # the name of a signal that asked the run to save and stop
        self.deferring = self.stop_deferred = False  # (a checkpoint being written; a second Ctrl-C during it)
        self.saved = {sig: signal.signal(sig, handler) for sig, handler in
                      ((signal.SIGTERM, self._on_sigterm), (signal.SIGINT, self._on_sigint))}

    def _on_sigterm(self, signum, frame):
        self.received = "SIGTERM"
        if self.is_main:  # (acknowledged at once: the save comes at the next log step, after any evaluation)
            tqdm.write("SIGTERM: saving at the next log step, then exiting")

    def _on_sigint(self, signum, frame):
        if self.received is not None and self.deferring:
            self.stop_deferred = True
            if self.is_main:
                tqdm.write("Ctrl-C again: stopping once the checkpoint being written is whole")
            return
        if self.received is not None:
            self.stop_at_once()
        self.received = "Ctrl-C"
        if self.is_main:
            tqdm.write("Ctrl-C: saving at the next log step, then exiting (Ctrl-C again to stop at once)")

    def stop_at_once(self):
        """A second Ctrl-C: nothing saved, one line on stderr (the main rank's), exit status 130. SystemExit,
        not KeyboardInterrupt: the run's ``finally`` still closes it (its lock given up), and no traceback."""
        if self.is_main:
            tqdm.write(self.at_once_line(), file=sys.stderr)
        raise SystemExit(AT_ONCE_STATUS)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A checkpoint's write: a second Ctrl-C during it stops at its end. (Raised inside torch.save,
        the stop left its zip writer mid-record, whose own error then replaced it: a traceback, status 1.)"""
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False
        if self.stop_deferred:
            self.stop_at_once()

    def at_once_line(self) -> str:
        """What a second Ctrl-C says: the step reached, the last checkpoint and how to resume from it."""
        said = f"train.py: stopped at once by a second Ctrl-C after step {self.step()}, unsaved"
        saved = self.checkpoints.steps if self.checkpoints is not None else []
        if not saved:
            return f"{said}; no checkpoint was saved: run the same command again to start over"
        own = sys.argv[0].endswith("train.py")  # (train.main called by another program: its argv is not ours)
        resume = (shlex.join(resume_command(distributed.launcher(), sys.argv[1:])) if own
                  else "the same command with --resume")
        return (f"{said}; the last checkpoint is {self.checkpoints.run_dir / CHECKPOINT_NAME} (step {saved[-1]}): "
                f"resume with {resume}")

    def agreed(self, ctx) -> bool:
        """Whether a signal reached any rank (every rank calls it: a host sync, at log steps)."""
        return distributed.any_rank(self.received is not None, ctx)

    def announce_stop(self, rank: int, step: int, evaluation_pending: bool) -> None:
        """The stop, saved at ``step``: with its evaluation pending where it interrupted it, which
        any resume runs first."""
        pending = f", with step {step}'s evaluation pending (any resume runs it first)" if evaluation_pending else ""
        tqdm.write(f"rank {rank}: {self.received or 'SIGTERM'} received, saved step {step}{pending}, exiting")

    def restore(self) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
