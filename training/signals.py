"""How a run is asked to stop: SIGTERM (a scheduler's preemption notice) and Ctrl-C save at the
next log step, where the ranks agree on it, and exit; a second Ctrl-C stops at once. The handlers
a program had are restored when the run closes, so a run inside another program leaves them as
they were."""
from __future__ import annotations

import signal

from tqdm import tqdm

from training import distributed


class StopSignals:
    def __init__(self, is_main: bool):
        self.is_main = is_main
        self.received: str | None = None  # the name of a signal that asked the run to save and stop
        self.saved = {sig: signal.signal(sig, handler) for sig, handler in
                      ((signal.SIGTERM, self._on_sigterm), (signal.SIGINT, self._on_sigint))}

    def _on_sigterm(self, signum, frame):
        self.received = "SIGTERM"
        if self.is_main:  # (acknowledged at once: the save comes at the next log step, after any evaluation)
            tqdm.write("SIGTERM: saving at the next log step, then exiting")

    def _on_sigint(self, signum, frame):
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = "Ctrl-C"
        if self.is_main:
            tqdm.write("Ctrl-C: saving at the next log step, then exiting (Ctrl-C again to stop at once)")

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
