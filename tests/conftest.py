"""The fixtures (a small byte-level corpus written as shards, the three backends of the
optimizers' fused operations, a torchft lighthouse) and pytest's hooks; the plain helpers are
tests/helpers.py's."""

import os
import socket
import subprocess
import sys
import time

# The optimizers' Triton kernels run in Triton's CPU interpreter here (read when Triton is imported,
# on first use): the tests need no GPU. scripts/check_cuda.py runs them on one.
os.environ["TRITON_INTERPRET"] = "1"

from pathlib import Path

import numpy as np
import pytest
import torch

from data.shards import write_shard
from helpers import make_text, require_backend


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


class Lighthouse:
    """A torchft lighthouse that forms a quorum of whoever is alive: the replica groups' coordinator
    (training/replicas.py); a dead group is noticed within 1 s. On a port of its own, where a test
    may kill it and start it again."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("localhost", 0))
            self.port = s.getsockname()[1]
        self.address = f"http://localhost:{self.port}"
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen([str(Path(sys.executable).parent / "torchft_lighthouse"), "--min_replicas=1",
                                         "--quorum_tick_ms=10", "--join_timeout_ms=1000", "--heartbeat_timeout_ms=1000",
                                         f"--bind=[::]:{self.port}"], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex(("localhost", self.port)):  # (until it listens)
            assert time.monotonic() < deadline and self.process.poll() is None, "the lighthouse did not start"
            time.sleep(0.05)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def lighthouse_process():
    """A ``Lighthouse``, killed at the end."""
    pytest.importorskip("torchft", reason="torchft is not installed (requirements-ft.txt)")
    house = Lighthouse()
    yield house
    house.kill()


@pytest.fixture
def lighthouse(lighthouse_process) -> str:
    """A lighthouse's address (``Lighthouse``)."""
    return lighthouse_process.address
