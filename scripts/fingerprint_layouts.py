"""Fingerprints of short train.py runs of a checkout, one per (layout, optimizer): run it against the
code before and after a refactor and diff the outputs; a refactor that changes nothing prints the same.

    python scripts/fingerprint_layouts.py [--repo PATH] [--only single,adamw,ddp:merit] [--workdir DIR]
                                          [--json OUT] [--compare OLD.json] [--python PY] [--repeat N] [--list]

    git worktree add /tmp/before HEAD        # the code before the refactor
    python scripts/fingerprint_layouts.py --repo /tmp/before --json before.json > before.txt
    python scripts/fingerprint_layouts.py --json after.json --compare before.json > after.txt
    diff before.txt after.txt                # nothing: every run bitwise the same

Each case is one run of ``train.py`` of the checkout (``--repo``, by default the repository this
script lives in), on a tiny model (2 layers, 32 dims, byte tokens, dropout 0.1: tests/helpers.py's
TINY) and a small byte corpus this script writes (offline, the tests' ``byte_shards``): 4 steps of a
global batch of 8 rows of 32 tokens, a checkpoint every 2 steps, stopped at step 2
(``--stop_at_step=2``) and resumed to step 4 (``--resume``), so that the checkpoint writers and
readers of the layout are exercised. Layouts:

* ``single``: one process; ``ddp``: torchrun, 2 gloo ranks; ``zero1``: the same with
  ``--zero_stage=1``; ``fsdp``: with ``--fsdp=True`` (a DCP checkpoint folder): every optimizer of
  the checkout's registry (``optim.available()``, read from the checkout at run time);
* ``replicas``: 2 replica groups of one process each against a torchft lighthouse this script
  starts (``--replica_groups=2 --replica_id=i --lighthouse=...``); ``replicas_fsdp``: 2 groups of
  2 FSDP2 ranks each (torchrun); ``replicas_diloco``: 2 groups of one process meeting every 2
  steps (``--local_steps=2``, DiLoCo): for the optimizers ``REPLICA_LAYOUTS`` names. The groups
  are started with ``--min_replicas=2``: every step's quorum waits for both, so which groups take a
  step does not depend on which one starts first (with the default of 1 a group may take a first
  step alone: a race, not a property of the code).

The fingerprint of a case is the sha256 of ``"weights=<hex> optimizer=<hex> losses=<hex>"``, three
sha256 digests, the first two over a canonical serialization of nested dicts (``tensor_digest``: each
leaf's key path, dict keys sorted, then a tensor's dtype, shape and raw bytes, another leaf's repr):

* ``weights``: the final checkpoint's model state dict (RUN/ckpt.pt: ``torch.load(weights_only=True)
  ["model"]``; a DCP folder: the model the checkout's own loader builds, ``training.checkpoint``'s
  ``load_model`` else ``training.parallel``'s, run in a subprocess inside the checkout, and checked
  equal to the model in the DCP files);
* ``optimizer``: the tensors and other leaves of the final checkpoint's ``optimizer["state"]`` (a
  DCP folder's, read with torch's ``dcp_to_torch_save``);
* ``losses``: every (step, key, value) of metrics.jsonl whose key names a loss (``train/loss``,
  ``val/loss``), in the file's order, the values as Python's ``repr`` of the JSON floats.

For replica groups the three cover both groups (replica_0's, then replica_1's). The JSON (``--json``)
holds, beside each case's fingerprint and its parts, diagnostics that are not in the fingerprint:
the step-2 checkpoint's weights and optimizer state (``checkpoint_step2``), the other fields of the
final and step-2 checkpoints (``checkpoint_rest``: step, RNG, data position, scaler, parts' state, ...;
not the optimizer's param groups, nor the config, which holds the workdir's paths, nor the code's
version), a digest of every metric but the timing and memory ones
(``metrics``), the optimizer implementations the run reported (``run_info``), for replica groups
each step's participants, and train.py's arguments (``train_args``: but the stop, the resume and a
group's ``--replica_id``). It prints one line a case: ``layout optimizer sha256``
(``ERROR`` where a run failed: its output's tail goes to stderr and the JSON, and the exit status
is 1). ``--repeat N`` runs each case N times and says where the fingerprints differ (a check that
the runs are deterministic).

The script imports nothing of the checkout in its own process (torch, numpy and the standard
library only): the checkout is reached through subprocesses run in it, with ``PYTHONPATH`` unset,
so the same file fingerprints any version of the code.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parents[1]

# tests/helpers.py's TINY run, with dropout (the RNG state is then part of what a resume restores).
TINY = dict(model="nano", n_layer=2, n_head=2, n_embd=32, block_size=32, tokenizer="byte", dropout=0.1,
            eval_interval=2, val_tokens=512, probe_batch_size=2)
RUN = [*(f"--{k}={v}" for k, v in TINY.items()), "--log_interval=1", "--lr=0.01", "--min_lr=0.001",
       "--warmup_steps=2", "--max_steps=4", "--batch_size=8", "--micro_batch_size=2", "--checkpoint_interval=2"]
STOP_AT = 2
# An optimizer's own options: Sophia-G's Hessian pass within the 4 steps; Muon with QK-Clip (tests/test_train.py's);
# Schedule-Free AdamW's constant lr after the warmup (it refuses a decaying schedule).
EXTRA = {"sophiag": ["--optimizer_options={'hessian_interval': 2}"], "muon": ["--qk_clip_tau=0.02"],
         "adamw_schedulefree": ["--lr_schedule=constant"]}
# The layouts every optimizer runs in, with train.py's extra arguments and the processes of a group.
LAYOUTS = {"single": ([], 1), "ddp": ([], 2), "zero1": (["--zero_stage=1"], 2), "fsdp": (["--fsdp=True"], 2)}
# Replica groups (2 groups), for the optimizers named: (extra arguments, processes a group, optimizers).
REPLICA_LAYOUTS = {
    "replicas": ([], 1, ("adamw", "merit", "sophiag", "lion")),
    "replicas_fsdp": (["--fsdp=True"], 2, ("adamw", "merit")),
    "replicas_diloco": (["--local_steps=2"], 1, ("adamw", "merit")),
}
GROUPS = 2
# The registry at the time this script was written: used only where the checkout's cannot be read.
FALLBACK_OPTIMIZERS = ("adafactor", "ademamix", "adamw", "adamw_schedulefree", "dmuon", "lamb", "lion", "mars",
                       "merit", "muon", "sgd", "soap", "sophiag")
# Metrics that measure the machine, not the computation (left out of the ``metrics`` diagnostic).
MACHINE_METRICS = ("tokens_per_s", "memory/", "mfu", "time", "comm/", "replicas/bytes_allreduced")
WORDS = ("the king queen crown sword castle night morning river stone gold silver bright dark "
         "speaks walks sleeps dreams loves fears hopes sings quickly slowly softly").split()


# ---- the data: tests/conftest.py's byte_shards, written here (llm.c's shard format) ----

def make_text(n_sentences: int, seed: int) -> str:
    """tests/helpers.py's make_text: sentences from a small word list."""
    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + "."
                     for _ in range(n_sentences))


def write_data(root: Path) -> str:
    """A train and a val split of byte tokens (end-of-text 256 before each document) as llm.c shards
    (256 int32 header: magic 20240520, version 1, token count; then uint16 tokens). Returns their sha256."""
    root.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    for split, n_docs, seed in (("train", 40, 0), ("val", 6, 1)):
        tokens = []
        for doc in range(n_docs):
            tokens += [256] + list(make_text(60, seed * 1000 + doc).encode())
        header = np.zeros(256, dtype="<i4")
        header[:3] = 20240520, 1, len(tokens)
        raw = header.tobytes() + np.array(tokens, dtype="<u2").tobytes()
        (root / f"{split}_000000.bin").write_bytes(raw)
        digest.update(raw)
    return digest.hexdigest()


# ---- the cases ----

def run_args(data_dir: Path, out_dir: Path, run_name: str, optimizer: str, layout_args=()) -> list[str]:
    """train.py's arguments of a case (without the stop or the resume)."""
    return [*RUN, f"--data_dir={data_dir}", f"--out_dir={out_dir}", f"--run_name={run_name}",
            f"--optimizer={optimizer}", *EXTRA.get(optimizer, []), *layout_args]


def all_cases(optimizers: list[str]) -> list[tuple[str, str]]:
    cases = [(layout, opt) for layout in LAYOUTS for opt in optimizers]
    cases += [(layout, opt) for layout, (_, _, names) in REPLICA_LAYOUTS.items() for opt in names if opt in optimizers]
    return cases


def select(cases: list[tuple[str, str]], only: str) -> list[tuple[str, str]]:
    """``--only``: comma-separated layouts, optimizers and layout:optimizer pairs; a case is kept if it is
    a pair named, or its layout is named (or none is) and its optimizer is named (or none is)."""
    if not only:
        return cases
    tokens = [t.strip() for t in only.split(",") if t.strip()]
    layouts = {*LAYOUTS, *REPLICA_LAYOUTS}
    pairs = {tuple(t.split(":", 1)) for t in tokens if ":" in t}
    named_layouts = {t for t in tokens if ":" not in t and t in layouts}
    named_optimizers = {t for t in tokens if ":" not in t and t not in layouts}
    known = {opt for _, opt in cases}
    unknown = [t for t in named_optimizers if t not in known] + [f"{l}:{o}" for l, o in pairs
                                                                  if (l, o) not in set(cases)]
    if unknown:
        raise SystemExit(f"--only: no such case, layout or optimizer: {', '.join(unknown)} (layouts: "
                         f"{', '.join(sorted(layouts))}; optimizers: {', '.join(sorted(known))})")
    return [(l, o) for l, o in cases
            if (l, o) in pairs or ((named_layouts or named_optimizers)
                                   and (not named_layouts or l in named_layouts)
                                   and (not named_optimizers or o in named_optimizers))]


class Checkout:
    """A repository checkout and the Python that runs it: every process of a case runs in it, with
    one thread (as the tests' runs: OMP_NUM_THREADS=1), no PYTHONPATH, and a torch extensions
    directory of the checkout's own (``extensions_dir``)."""

    def __init__(self, repo: Path, python: str, timeout: float):
        self.repo, self.python, self.timeout = repo, python, timeout
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONHASHSEED="0", RUST_LOG="warn",
                        CUDA_VISIBLE_DEVICES="", TORCH_EXTENSIONS_DIR=str(extensions_dir(repo)))

    def python_code(self, code: str, *args: str) -> str:
        """Run ``code`` with the checkout's modules (cwd: the checkout); its stdout."""
        result = subprocess.run([self.python, "-c", code, *args], cwd=self.repo, env=self.env, capture_output=True,
                                text=True, timeout=self.timeout)
        if result.returncode:
            raise RuntimeError(f"python -c in {self.repo} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
        return result.stdout

    def optimizers(self) -> list[str]:
        try:
            return json.loads(self.python_code("import json, optim; print(json.dumps(sorted(optim.available())))"))
        except (RuntimeError, ValueError) as error:
            print(f"(the checkout's optimizer registry could not be read, using this script's list: {error})",
                  file=sys.stderr)
            return list(FALLBACK_OPTIMIZERS)

    def train_command(self, nproc: int, args: list[str]) -> list[str]:
        launcher = ([self.python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
                    if nproc > 1 else [self.python])
        return [*launcher, str(self.repo / "train.py"), *args]

    def start(self, nproc: int, args: list[str], log: Path) -> subprocess.Popen:
        """train.py in a session of its own (torchrun's workers with it), so that it can be ended whole."""
        with log.open("w") as out:
            return subprocess.Popen(self.train_command(nproc, args), cwd=self.repo, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def run_all(self, commands: list[tuple[int, list[str], Path]]) -> None:
        """Start every (nproc, args, log) at once and wait for all; an error with the logs' tails if one fails."""
        processes, failed = [], []
        try:
            processes += [(self.start(nproc, args, log), log) for nproc, args, log in commands]
            deadline = time.monotonic() + self.timeout
            for process, log in processes:
                try:
                    code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    code = "timed out"
                if code != 0:
                    failed.append(f"{log.name}: exit {code}\n{log.read_text()[-4000:]}")
        finally:  # (a group left waiting for one that failed; this script interrupted)
            for process, _ in processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        if failed:
            raise RuntimeError("train.py failed:\n" + "\n".join(failed))


def extensions_dir(repo: Path) -> Path:
    """Where the checkout's C++ kernels (kernels/: torch's cpp_extension) are built: a folder per
    checkout, kept between runs of this script. In the shared one (~/.cache/torch_extensions) the
    kernels of two checkouts have one name and other sources, so each checkout's run would rebuild
    them over the other's (and a run ended during a build would leave its lock behind for everyone)."""
    base = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path(tempfile.gettempdir()) / "torch_extensions")
    return base / f"fingerprint_layouts_{hashlib.sha256(str(repo).encode()).hexdigest()[:12]}"


class Lighthouse:
    """tests/conftest.py's: a torchft lighthouse on a free port (the binary beside the checkout's Python)."""

    def __init__(self, python: str):
        with socket.socket() as s:
            s.bind(("localhost", 0))
            self.port = s.getsockname()[1]
        self.address = f"http://localhost:{self.port}"
        self.process = subprocess.Popen([str(Path(python).parent / "torchft_lighthouse"), "--min_replicas=1",
                                         "--quorum_tick_ms=10", "--join_timeout_ms=1000", "--heartbeat_timeout_ms=1000",
                                         f"--bind=[::]:{self.port}"], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex(("localhost", self.port)):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise RuntimeError("the torchft lighthouse did not start")
            time.sleep(0.05)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def train_case(checkout: Checkout, layout: str, optimizer: str, data_dir: Path,
               out_dir: Path) -> tuple[list[Path], list[str]]:
    """Run the case (stopped at step 2, resumed to 4); returns its run folders (one, or one a replica
    group) and train.py's arguments (but the stop, the resume and a group's replica_id)."""
    run_name = f"{layout}_{optimizer}"
    shutil.rmtree(out_dir / run_name, ignore_errors=True)
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if layout in LAYOUTS:
        extra, nproc = LAYOUTS[layout]
        args = run_args(data_dir, out_dir, run_name, optimizer, extra)
        for phase, last in (("first", f"--stop_at_step={STOP_AT}"), ("resumed", "--resume")):
            checkout.run_all([(nproc, [*args, last], logs / f"{run_name}.{phase}.log")])
        return [out_dir / run_name], args
    extra, nproc, _ = REPLICA_LAYOUTS[layout]
    house = Lighthouse(checkout.python)
    try:
        args = run_args(data_dir, out_dir, run_name, optimizer,
                        [*extra, f"--replica_groups={GROUPS}", f"--lighthouse={house.address}", "--min_replicas=2",
                         "--replica_timeout=120.0"])
        for phase, last in (("first", f"--stop_at_step={STOP_AT}"), ("resumed", "--resume")):
            checkout.run_all([(nproc, [*args, last, f"--replica_id={g}"], logs / f"{run_name}.{phase}.{g}.log")
                              for g in range(GROUPS)])
    finally:
        house.close()
    return [out_dir / run_name / f"replica_{g}" for g in range(GROUPS)], args


# ---- the fingerprint ----

def _leaves(value, path=()):
    """(key path, leaf) of nested dicts, lists and tuples, dict keys sorted (by type, then value)."""
    if isinstance(value, dict):
        for key in sorted(value, key=lambda k: (type(k).__name__, k)):
            yield from _leaves(value[key], (*path, key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _leaves(item, (*path, i))
    else:
        yield path, value


def tensor_digest(tree, digest=None):
    """sha256 of nested containers of tensors (and other leaves, by repr): each leaf's key path, then a
    tensor's dtype, shape and raw bytes (contiguous, on the CPU)."""
    digest = digest or hashlib.sha256()
    for path, leaf in _leaves(tree):
        digest.update(repr(path).encode())
        if isinstance(leaf, torch.Tensor):
            t = leaf.detach().cpu().contiguous()
            digest.update(f"{t.dtype} {tuple(t.shape)}".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(leaf).encode())
        digest.update(b"\n")
    return digest


def loss_records(run_dir: Path) -> list[tuple[int, str, float]]:
    """(step, key, value) of each loss in metrics.jsonl, in the file's order."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(r["step"], key, value) for r in records if "step" in r
            for key, value in r.items() if "loss" in key.split("/")[-1]]


def metric_records(run_dir: Path) -> tuple[list, list]:
    """(every metric but the machine's, as (step, key, value); the run_info records)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    metrics = [(r["step"], key, value) for r in records if "step" in r for key, value in sorted(r.items())
               if key not in ("step",) and not any(m in key for m in MACHINE_METRICS)]
    return metrics, [r["run_info"] for r in records if "run_info" in r]


DCP_READER = """
import sys, torch
path, out = sys.argv[1], sys.argv[2]
try:
    from training.checkpoint import load_model
except ImportError:
    from training.parallel import load_model
model, checkpoint = load_model(path)
torch.save({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, out)
"""


def checkpoint_tensors(checkout: Checkout, path: Path, scratch: Path) -> tuple[dict, dict, str]:
    """(model state dict, optimizer state, "inline" or "dcp") of the checkpoint at ``path`` (a file, or a
    DCP folder: its model by the checkout's own loader, its optimizer state by torch's DCP converter)."""
    path = path.resolve()
    if not path.is_dir():
        state = torch.load(path, map_location="cpu", weights_only=True)
        return state["model"], state["optimizer"].get("state", {}), "inline"
    scratch.mkdir(parents=True, exist_ok=True)
    model_file, whole_file = scratch / "model.pt", scratch / "dcp_whole.pt"
    checkout.python_code(DCP_READER, str(path), str(model_file))
    model = torch.load(model_file, map_location="cpu", weights_only=True)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dcp_to_torch_save(path, whole_file)
    whole = torch.load(whole_file, map_location="cpu", weights_only=True)
    # The DCP files' own model must be the loader's (else the loader reads something else than was written).
    saved = whole.get("model", {})
    if saved.keys() - model.keys() or any(not torch.equal(saved[k], model[k]) for k in saved):
        raise RuntimeError(f"{path}: the checkout's load_model disagrees with the DCP files' model")
    return model, whole.get("optimizer", {}), "dcp"


# A checkpoint's fields that hold paths of the workdir (the config) or name the code (git describe).
NOT_REST = ("model", "optimizer", "config", "code_version")


def checkpoint_rest(path: Path) -> dict:
    """The checkpoint's other fields (step, tokens, RNG, data position, scaler, parts' state, ...; a DCP
    folder's checkpoint.pt beside its files), for the ``checkpoint_rest`` diagnostic."""
    path = path.resolve()
    state = torch.load(path / "checkpoint.pt" if path.is_dir() else path, map_location="cpu", weights_only=True)
    return {k: v for k, v in state.items() if k not in NOT_REST}


def fingerprint(checkout: Checkout, run_dirs: list[Path], scratch: Path) -> dict:
    weights, optimizer, losses, metrics, ckpt2, rest_digest = (hashlib.sha256() for _ in range(6))
    info = {"run_info": [], "checkpoints": [], "losses": []}
    for i, run_dir in enumerate(run_dirs):
        for name, digests in (("ckpt.pt", (weights, optimizer)), (f"ckpt_{STOP_AT:08d}", (ckpt2, ckpt2))):
            path = run_dir / name
            if not path.exists():  # ckpt_00000002.pt or .dcp
                path = next(run_dir.glob(f"{name}.*"), None)
                if path is None:
                    raise RuntimeError(f"{run_dir}: no checkpoint {name}")
            model, state, kind = checkpoint_tensors(checkout, path, scratch / f"{i}_{name}")
            tensor_digest(model, digests[0])
            tensor_digest(state, digests[1])
            tensor_digest(checkpoint_rest(path), rest_digest)
            info["checkpoints"].append(f"{run_dir.name}/{path.name} -> {path.resolve().name} ({kind})")
        records = loss_records(run_dir)
        losses.update(repr([(s, k, repr(v)) for s, k, v in records]).encode())
        info["losses"].append(records)
        rest, run_info = metric_records(run_dir)
        metrics.update(repr([(s, k, repr(v)) for s, k, v in rest]).encode())
        info["run_info"].append(run_info)
        if len(run_dirs) > 1:
            info.setdefault("participants", []).append(
                [(s, v) for s, k, v in rest if k == "replicas/participants"])
    parts = {"weights": weights.hexdigest(), "optimizer": optimizer.hexdigest(), "losses": losses.hexdigest()}
    total = hashlib.sha256(" ".join(f"{k}={v}" for k, v in parts.items()).encode()).hexdigest()
    return {"sha256": total, **parts, "diagnostics": {"checkpoint_step2": ckpt2.hexdigest(),
                                                      "checkpoint_rest": rest_digest.hexdigest(),
                                                      "metrics": metrics.hexdigest(), **info}}


def run_case(checkout: Checkout, layout: str, optimizer: str, data_dir: Path, workdir: Path) -> dict:
    start = time.monotonic()
    try:
        run_dirs, args = train_case(checkout, layout, optimizer, data_dir, workdir / "out")
        result = fingerprint(checkout, run_dirs, workdir / "scratch" / f"{layout}_{optimizer}")
        result["diagnostics"]["train_args"] = args
    except (RuntimeError, OSError, subprocess.SubprocessError, KeyError, ValueError) as error:
        result = {"sha256": "ERROR", "error": str(error)[-6000:]}
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


def git_head(repo: Path) -> str:
    result = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return result.stdout.strip() + (" (with uncommitted changes)" if dirty else "") if result.returncode == 0 else ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=HERE, help="the checkout whose train.py runs (default: %(default)s)")
    parser.add_argument("--only", default="", help="comma-separated layouts, optimizers, layout:optimizer pairs")
    parser.add_argument("--workdir", type=Path, help="where the data and runs go (default: a temporary folder, "
                                                     "removed at the end)")
    parser.add_argument("--json", type=Path, help="write the fingerprints and their parts here")
    parser.add_argument("--python", help="the Python that runs the checkout (default: REPO/.venv/bin/python if "
                                         "there is one, else this one)")
    parser.add_argument("--repeat", type=int, default=1, help="run each case N times, say where they differ")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one train.py phase may take")
    parser.add_argument("--compare", type=Path, help="a JSON of an earlier run (--json): say which cases and "
                                                    "which parts differ from it (exit status 1 if any)")
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    options = parser.parse_args(argv)
    repo = options.repo.resolve()
    if not (repo / "train.py").is_file():
        parser.error(f"--repo {repo}: no train.py there")
    venv = repo / ".venv" / "bin" / "python"
    python = options.python or (str(venv) if venv.exists() else sys.executable)
    checkout = Checkout(repo, python, options.timeout)
    optimizers = checkout.optimizers()
    cases = select(all_cases(optimizers), options.only)
    if options.list:
        for layout, optimizer in cases:
            print(layout, optimizer)
        return 0

    # A SIGTERM ends the runs in flight too (run_all's finally), as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = options.workdir.resolve() if options.workdir else Path(tempfile.mkdtemp(prefix="fingerprint_layouts_"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    report = {"repo": str(repo), "commit": git_head(repo), "python": python, "torch": torch.__version__,
              "optimizers": optimizers, "data_sha256": write_data(workdir / "data"), "run_args": RUN,
              "stop_at_step": STOP_AT, "cases": {}}
    failed = unstable = 0
    try:
        for layout, optimizer in cases:
            runs = [run_case(checkout, layout, optimizer, workdir / "data", workdir) for _ in range(options.repeat)]
            result = runs[0]
            if options.repeat > 1:
                result["repeats"] = [{k: r.get(k) for k in ("sha256", "weights", "optimizer", "losses")}
                                     for r in runs]
                result["deterministic"] = len({r["sha256"] for r in runs}) == 1 and result["sha256"] != "ERROR"
                unstable += not result["deterministic"]
            report["cases"][f"{layout} {optimizer}"] = result
            failed += result["sha256"] == "ERROR"
            note = ("" if options.repeat == 1 else "  (same in every repeat)" if result["deterministic"] else
                    "  NOT DETERMINISTIC: " + " ".join(r["sha256"][:12] for r in runs))
            print(f"{layout} {optimizer} {result['sha256']}{note}", flush=True)
            if result["sha256"] == "ERROR":
                print(result["error"], file=sys.stderr)
            if options.json:  # (as it goes: a long run's results so far survive an interruption)
                report["seconds"] = round(time.monotonic() - started, 1)
                options.json.write_text(json.dumps(report, indent=1) + "\n")
    finally:
        if not options.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"{len(cases)} cases in {time.monotonic() - started:.0f} s" + (f", {failed} failed" if failed else "")
          + (f", {unstable} not deterministic" if unstable else ""), file=sys.stderr)
    differ = compare(report, json.loads(options.compare.read_text())) if options.compare else 0
    return 1 if failed or unstable or differ else 0


def compare(report: dict, base: dict) -> int:
    """Print (stderr) each case of ``report`` whose fingerprint differs from ``base``'s, with the parts
    that do; returns how many differ."""
    differ = 0
    for name, case in report["cases"].items():
        if name not in base["cases"]:
            print(f"{name}: not in the compared run", file=sys.stderr)
            continue
        other = base["cases"][name]
        if case["sha256"] != other["sha256"] or case["sha256"] == "ERROR":
            differ += 1
            parts = [k for k in ("weights", "optimizer", "losses") if case.get(k) != other.get(k)]
            extra = [k for k in ("checkpoint_step2", "checkpoint_rest", "metrics")
                     if case.get("diagnostics", {}).get(k) != other.get("diagnostics", {}).get(k)]
            print(f"{name}: DIFFERS ({', '.join(parts) or 'an error'}; diagnostics differing: "
                  f"{', '.join(extra) or 'none'})", file=sys.stderr)
    print(f"compared with {base.get('repo')} ({base.get('commit')}): {differ} of {len(report['cases'])} cases "
          f"differ", file=sys.stderr)
    return differ


if __name__ == "__main__":
    sys.exit(main())
