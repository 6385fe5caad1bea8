"""flush_denormals (training/float_mode.py): subnormal floats computed as zero
on every thread of torch's pool when set before it starts, a warning where it reached only some,
and IEEE floats again in the process once a run that set it has ended."""
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, TINY_RUN, train_here


@pytest.mark.parametrize("when", ["first", "late"])
def test_flush_denormals_reaches_every_thread_when_set_first_and_says_so_when_not(when):
    # 1e-20 * 1e-20 = 1e-40 is subnormal in float32: IEEE keeps it (as this process shows), flush-to-zero
    # makes it 0. A fresh process with two threads, the flag set before any parallel op ("first", as
    # train.py's start-up sets it) or after one ("late": the worker thread keeps IEEE floats, and a
    # warning says so).
    assert torch.count_nonzero(torch.full((1 << 20,), 1e-20) * 1e-20) == 1 << 20
    code = f"""
import warnings, torch
from training.float_mode import flush_denormals
torch.set_num_threads(2)
if {when == "late"}:
    (torch.ones(1 << 20) * 2).sum()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    flush_denormals()
print(int(torch.count_nonzero(torch.full((1 << 20,), 1e-20) * 1e-20)), len(caught))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    survivors, warned = map(int, out.split())
    if when == "first":
        assert (survivors, warned) == (0, 0)
    else:
        assert 0 < survivors < 1 << 20 and warned == 1  # the main thread's half flushed, the worker's not


def test_a_run_with_flush_denormals_leaves_the_process_s_floats_ieee(byte_shards, tmp_path):
    train_here(*TINY_RUN, "--max_steps=2", f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--flush_denormals=True")
    assert float(torch.tensor(1e-20) * torch.tensor(1e-20)) > 0  # subnormal again after the run
