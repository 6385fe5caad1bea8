"""What the tests share besides fixtures (those, and pytest's hooks, are conftest.py's): the
repository's root, the text of a small corpus, the tiny run most train.py tests start from and a
run folder's metrics, runners for train.py (a new process, or ``train.main`` in this one), the
backends' skip and a guard against host reads, and what the data-preparation tests share (random
documents, an llm.c shard reader, a preparation killed part way). A test imports it as ``helpers``: pytest puts
tests/ on sys.path to import conftest.py and the test modules beside it."""

import io
import json
import os
import random
import signal
import struct
import subprocess
import sys
import warnings
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

from optim.backends import cpp

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the king queen crown sword castle night morning river stone gold silver bright dark "
         "speaks walks sleeps dreams loves fears hopes sings quickly slowly softly").split()

# The tiny run the train.py tests start from: a 2-layer model of 32 dimensions on byte tokens, 32
# per row, no dropout, evaluations of 512 tokens and a probe of 2 rows. A test adds what it is
# about (batch, steps, lr, ...); of two --key=value arguments the later one wins.
TINY = dict(model="nano", n_layer=2, n_head=2, n_embd=32, block_size=32, tokenizer="byte", dropout=0.0,
            eval_interval=100, val_tokens=512, probe_batch_size=2)
TINY_RUN = [f"--{key}={value}" for key, value in TINY.items()]  # as train.py's arguments


def make_text(n_sentences: int, seed: int) -> str:
    """Sentences from a small word list: structured enough that a tiny model's loss falls fast."""
    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + "."
                     for _ in range(n_sentences))


def read_metrics(run_dir: Path) -> list[dict]:
    """A run folder's metrics.jsonl, one dict per record."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# The backends of the optimizers' fused operations as a parametrization, Triton's (its interpreter,
# slow) in the full suite only: for tests the ``backend`` fixture would run long in the quick tier.
BACKENDS_TRITON_SLOW = ["cpp", pytest.param("triton", marks=pytest.mark.slow), "torch"]


def require_backend(name: str) -> str:
    """``name``, a backend of the optimizers' fused operations (optim/backends/), after skipping the
    test where it cannot run here: "cpp" (the C++ kernels), "triton" (the Triton kernels, in
    Triton's interpreter on CPU tensors) or "torch" (the reference)."""
    if name == "cpp" and not cpp.load(required=False):
        pytest.skip("the C++ optimizer kernels could not be built here")
    if name == "triton":
        pytest.importorskip("triton", reason="Triton is not installed (requirements-dev.txt)")
    return name


def bitwise_but_in_bfloat16(dtype: torch.dtype):
    """``same(ours, theirs, what)``: bitwise equal, but in bfloat16 within a few of its roundings
    at the tensor's scale (4 units in the last place of its largest element: a sum that cancels
    keeps the rounding of its terms), where a fused kernel follows torch's vectorised loop and
    torch's own scalar tails round otherwise (kernels/csrc/sgd.cpp)."""
    def same(ours: torch.Tensor, theirs: torch.Tensor, what) -> None:
        if dtype == torch.bfloat16:
            scale = theirs.abs().max().float().item()
            torch.testing.assert_close(ours, theirs, rtol=0, atol=4 * 2.0 ** -8 * scale, msg=lambda m: f"{what}: {m}")
        else:
            assert torch.equal(ours, theirs), what
    return same


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


# ---- data preparation: documents, llm.c's shard format, a preparation killed part way ----

# Words with multi-byte characters and a newline, so that tokenizers and byte shards see both.
MIXED_WORDS = "the of and café naïve 東京 model batch trust ratio — attention logit\n".split(" ")


def llmc_read(path: Path) -> list[int]:
    """llm.c's shard format read from its description: 256 little-endian int32 (magic 20240520,
    version 1, token count, ...), then the tokens as little-endian uint16."""
    raw = path.read_bytes()
    magic, version, count = struct.unpack("<3i", raw[:12])
    assert (magic, version) == (20240520, 1) and len(raw) == 1024 + 2 * count
    return list(struct.unpack(f"<{count}H", raw[1024:]))


def split_streams(out_dir: Path, manifest: dict | None = None) -> dict[str, list[int]]:
    """Each split's tokens, its shards read in order by llmc_read (manifest: out_dir's, by default)."""
    manifest = manifest or json.loads((out_dir / "manifest.json").read_text())
    return {split: [t for shard in manifest["splits"][split]["shards"] for t in llmc_read(out_dir / shard["file"])]
            for split in ("train", "val")}


def random_documents(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(MIXED_WORDS) for _ in range(rng.randint(1, 40))) for _ in range(n)]


# Kill the preparation (SIGKILL: no cleanup) at a point chosen by patching one function, then
# rerun it normally: the result must be byte-identical to an uninterrupted run, and the shards
# finished by the last checkpoint before the kill must not be rewritten.
PREPARE_KILLER = """
import os, signal, sys
import data.prepare, data.shards
data.prepare.DOCUMENTS_PER_BATCH = 300
target, nth = {target!r}, {nth}
owner = data.shards.ShardWriter
original = getattr(owner, target)
calls = []
def killing(self, *args):
    result = original(self, *args)
    calls.append(1)
    if len(calls) == nth:
        os.kill(os.getpid(), signal.SIGKILL)
    return result
setattr(owner, target, killing)
data.prepare.main(sys.argv[1:])
"""
