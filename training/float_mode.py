"""The CPU's float mode of a run: subnormal floats computed as zero where the config asks
(``flush_denormals``: a batch-1 run's tiny gradients and moments can make each CPU operation on
them many times slower), set at start-up before anything computes, restored when the run ends."""
from __future__ import annotations

import warnings

import torch


class FloatMode:
    """The float mode ``flush_denormals`` asks for, set now; ``restore`` gives IEEE floats back
    to the process that ran the run (a test, a study that trains in its process)."""

    def __init__(self, flush: bool):
        self.flush = flush
        if flush:
            flush_denormals()

    def restore(self) -> None:
        if self.flush:
            torch.set_flush_denormal(False)


def flush_denormals() -> None:
    """Compute the CPU's subnormal floats as zero, on every thread of torch's pool (config ``flush_denormals``).

    The mode is a register of each thread (MXCSR on x86), which torch's worker threads copy from
    the main thread when they start: set before the process computes anything in parallel (as
    ``FloatMode`` at train.py's start-up does), it reaches every thread; set later (a run started
    inside a process that has computed, e.g. a test), only the main thread, which a product of two
    small floats in parallel shows, and a warning says."""
    if not torch.set_flush_denormal(True):
        raise ValueError("flush_denormals=True: this CPU has no flush-to-zero mode (x86 with SSE3, or ARM); "
                         "leave flush_denormals at False")
    # 1e-40 is subnormal in float32; a chunk per thread (torch's grain: 32,768 elements)
    tiny = torch.full((32768 * torch.get_num_threads(),), 1e-30) * 1e-10
    if survivors := int(torch.count_nonzero(tiny)):
        warnings.warn(f"flush_denormals=True reached only some of torch's {torch.get_num_threads()} threads "
                      f"({survivors} of {tiny.numel()} subnormal products survived): they started before it was set; "
                      f"start the run in a fresh process (python train.py ...) for every thread to flush")
