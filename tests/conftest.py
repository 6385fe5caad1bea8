"""Shared fixtures: a small byte-level corpus written as shards, a runner for train.py, and the
three backends of the optimizers' fused operations."""

import os

# The optimizers' Triton kernels run in Triton's CPU interpreter here (read when Triton is imported,
# on first use): the tests need no GPU. scripts/check_cuda.py runs them on one.
os.environ["TRITON_INTERPRET"] = "1"

import random
from contextlib import contextmanager
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from data.shards import write_shard
from optim.backends import cpp

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the king queen crown sword castle night morning river stone gold silver bright dark "
         "speaks walks sleeps dreams loves fears hopes sings quickly slowly softly").split()


def make_text(n_sentences: int, seed: int) -> str:
    """Sentences from a small word list: structured enough that a tiny model's loss falls fast."""
    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + "."
                     for _ in range(n_sentences))


def require_backend(name: str) -> str:
    """``name``, a backend of the optimizers' fused operations (optim/backends/), after skipping the
    test where it cannot run here: "cpp" (the C++ kernels), "triton" (the Triton kernels, in
    Triton's interpreter on CPU tensors) or "torch" (the reference)."""
    if name == "cpp" and not cpp.load(required=False):
        pytest.skip("the C++ optimizer kernels could not be built here")
    if name == "triton":
        pytest.importorskip("triton", reason="Triton is not installed (requirements-dev.txt)")
    return name


@pytest.fixture(params=["cpp", "triton", "torch"])
def backend(request):
    """Run a test on each backend of the optimizers' fused operations (see ``require_backend``)."""
    return require_backend(request.param)


@pytest.fixture(scope="session")
def byte_shards(tmp_path_factory) -> Path:
    """A train and a val split of byte tokens (end-of-text 256 before each document)."""
    root = tmp_path_factory.mktemp("byte_shards")
    for split, n_docs, seed in (("train", 40, 0), ("val", 6, 1)):
        tokens = []
        for doc in range(n_docs):
            tokens += [256] + list(make_text(60, seed * 1000 + doc).encode())
        write_shard(root / f"{split}_000000.bin", np.array(tokens, dtype=np.uint16))
    return root


def run_train(*args: str, nproc: int = 1, cwd: Path = ROOT, timeout: int = 300,
              check: bool = True) -> subprocess.CompletedProcess:
    """Run train.py in a subprocess (torchrun with gloo when nproc > 1); fail with its output if `check`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
                if nproc > 1 else [sys.executable])
    result = subprocess.run([*launcher, str(ROOT / "train.py"), *args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0 or not check, f"train.py failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


@contextmanager
def no_host_reads():
    """Fail on a Python-level read of a tensor's value (item, bool, tolist, float, int): how the
    tests see, without a GPU, that code makes no host sync (a CUDA read is one)."""
    def refuse(*args, **kwargs):
        raise AssertionError("a host read of a tensor's value")
    saved = {name: getattr(torch.Tensor, name) for name in ("item", "__bool__", "tolist", "__float__", "__int__")}
    try:
        for name in saved:
            setattr(torch.Tensor, name, refuse)
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
