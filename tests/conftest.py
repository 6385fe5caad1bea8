"""Shared fixtures: a small byte-level corpus written as shards, runners for train.py (a new process,
or ``train.main`` in this one), and the three backends of the optimizers' fused operations."""

import io
import os
import signal
import warnings

# The optimizers' Triton kernels run in Triton's CPU interpreter here (read when Triton is imported,
# on first use): the tests need no GPU. scripts/check_cuda.py runs them on one.
os.environ["TRITON_INTERPRET"] = "1"

import random
from contextlib import contextmanager, redirect_stderr, redirect_stdout
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


MAX_WORKERS = 4  # more would mostly wait on each other's torchrun launches


def pytest_xdist_auto_num_workers(config):
    """pytest.ini's ``-n auto``: one worker per core, at most MAX_WORKERS."""
    return min(MAX_WORKERS, os.cpu_count() or 1)


def pytest_configure(config):
    """A worker of ``-n N`` computes on its share of the cores: N workers each on all of them
    would oversubscribe the machine."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items):
    """Triton's CPU interpreter takes about 0.3 s a case: where a test module names the cases of its
    reference tests (parametrized ``name``) that run on the triton ``backend`` in the quick tier,
    ``QUICK_TRITON_CASES``, its other cases on triton are marked slow (the full suite runs them all;
    the cpp and torch backends run every case in both tiers)."""
    for item in items:
        quick = getattr(getattr(item, "module", None), "QUICK_TRITON_CASES", None)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if quick is not None and params.get("backend") == "triton" and params.get("name", quick[0]) not in quick:
            item.add_marker(pytest.mark.slow)


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


def train_here(*args: str, cwd: Path = ROOT, check: bool = True, threads: int | None = 1) -> subprocess.CompletedProcess:
    """Run train.py's ``main`` in this process, as ``run_train`` runs it in a new one (same argv), for
    the tests that are not about the process itself (its exit on a signal, torchrun, a fresh import):
    it saves a new interpreter, the torch import and the C++ kernels' load. The result reads as the
    process's would: returncode 1 and the message in stderr on ``sys.exit(message)``, printed output
    in stdout and stderr (warnings, as Python prints them, in stderr). One thread by default, as
    run_train's OMP_NUM_THREADS=1, so a run here and one in a process compute bitwise alike (None:
    torch's default, where no test compares with a process's run); the SIGTERM handler the Trainer
    installs, the thread count and the working directory are restored afterwards."""
    import train
    out, err = io.StringIO(), io.StringIO()
    sigterm, saved_threads, here = signal.getsignal(signal.SIGTERM), torch.get_num_threads(), os.getcwd()
    returncode = 0
    try:
        torch.set_num_threads(threads or saved_threads)
        os.chdir(cwd)
        with warnings.catch_warnings(record=True) as caught, redirect_stdout(out), redirect_stderr(err):
            warnings.simplefilter("always")
            try:
                train.main(list(args))
            except SystemExit as exit:
                returncode = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
                if exit.code is not None and not isinstance(exit.code, int):
                    print(exit.code, file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, sigterm)
        torch.set_num_threads(saved_threads)
        os.chdir(here)
    stderr = err.getvalue() + "".join(f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}\n"
                                      for w in caught)
    result = subprocess.CompletedProcess(["train.py", *args], returncode, out.getvalue(), stderr)
    assert returncode == 0 or not check, f"train.main failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
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
