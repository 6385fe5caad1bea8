"""Replica groups (torchft) against plain DDP on the same ranks: what averaging every gradient across
groups through a lighthouse costs a training step, on this machine.

    python -m scripts.bench_replicas [--config configs/default.py] [--data_dir cache/data/shakespeare-byte]
                                     [--steps 200] [--rounds 3] [--set key=value ...]
                                     [--variant NAME:key=value,key=value ...] [--quorum_tick_ms 100] [--json FILE]

Runs train.py as a user would, each run in a temporary out_dir, the variants taking turns round by
round (a shared machine's speed drifts by tens of percent: the drift hits every variant alike):

============  ==========================================================================================
ddp           ``torchrun --standalone --nproc_per_node=2 train.py CONFIG``: gloo DDP, 2 ranks
replicas      a torchft lighthouse of its own (``torchft_lighthouse --min_replicas=1 --quorum_tick_ms=100
              --join_timeout_ms=10000``) and 2 processes ``train.py CONFIG --replica_groups=2 --replica_id=i``,
              one rank each, started together: every gradient averaged across the groups every step
NAME          each ``--variant NAME:key=value,...``: a replicas run with those train.py overrides as well
              (``--variant check_every_step:replica_check_interval=1``), passed through as ``--key=value``
============  ==========================================================================================

Every run trains the config for --steps steps at its global batch on 2 ranks (``micro_batch_size`` =
batch_size / 2), a thread each (OMP_NUM_THREADS=1: the two ranks share 2 cores alike in every variant),
logging every 20 steps, and does as little else as the config allows: no evaluation but train.py's
first and last (of one micro-batch, ``val_tokens=1``), a probe of one sequence, no samples, no
zero-shot tasks, no checkpoint but the last, no wandb. ``--set key=value`` adds a train.py override to
every run (after those; a variant's own come last).

A step's time is read from what the run logged: each log record's ``tokens_per_s`` (the wall time
between log steps, everything in it: the log step's instruments too) in the run folder's
metrics.jsonl (a replica run's group 0: ``replica_0/``), the first record dropped (start-up, the
first evaluation, the first quorum), as ``batch_size x block_size / tokens_per_s``. Printed: each
variant's median over the records of all rounds, the range of its rounds' medians, and its median
against ddp's; with the CPU that measured them and the torch and torchft versions. Numbers of one
invocation compare; nothing here asserts a speed. Needs torchft (requirements-ft.txt); the
Shakespeare byte shards (the default --data_dir) are prepared if missing.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT / "cache" / "data" / "shakespeare-byte"
PREPARE = [sys.executable, "-m", "data.prepare", "shakespeare", "--tokenizer", "byte"]  # (writes DEFAULT_DATA)
RANKS = 2
LOG_INTERVAL = 20
RUN_NAME = "bench"
# What a run does besides its training steps, made as little as the config schema allows (train.py
# still evaluates before the first step and after the last, and checkpoints after the last: outside
# the measured records, see the docstring).
QUIET = {"log_interval": LOG_INTERVAL, "eval_interval": 100_000, "checkpoint_interval": 0, "val_tokens": 1,
         "heldout_tokens": 0, "probe_batch_size": 1, "sample_tokens": 0, "zero_shot_tasks": "",
         "wandb_mode": "disabled"}
# What makes a run one of RANKS replica groups (the lighthouse's address and the group's number added).
REPLICAS = [f"--replica_groups={RANKS}"]
LOG_TAIL = 4000  # characters of a failed run's log in the error


@dataclass
class Variant:
    name: str
    overrides: list[str]  # train.py's --key=value, beside the common ones
    replicas: bool = True
    round_ms: list[list[float]] = field(default_factory=list)  # each round's ms a step, one per log record kept


def parse_variant(spec: str) -> Variant:
    """``NAME:key=value,key=value`` (a value may hold commas: a new setting starts at ``,key=``)."""
    name, colon, settings = spec.partition(":")
    items = [item for item in re.split(r",(?=\s*\w+=)", settings) if item.strip()] if settings.strip() else []
    bad = [item for item in items if not re.fullmatch(r"\s*\w+=.*", item, flags=re.DOTALL)]
    if not colon or not name or bad or not re.fullmatch(r"[\w.-]+", name):
        raise SystemExit(f"bench_replicas: --variant {spec!r}: give NAME:key=value,key=value (e.g. "
                         f"check_every_step:replica_check_interval=1)")
    return Variant(name, [f"--{item.strip()}" for item in items])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("localhost", port)) == 0


def tail(path: Path) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return text[-LOG_TAIL:]


class Lighthouse:
    """A torchft lighthouse on a free port (tests/conftest.py's ``lighthouse`` fixture, with the
    docs' tick and join timeout), its log in ``log``."""

    def __init__(self, log: Path, quorum_tick_ms: int):
        self.port, self.log = free_port(), log
        binary = Path(sys.executable).parent / "torchft_lighthouse"
        if not binary.exists():
            raise SystemExit(f"bench_replicas: {binary} not found: pip install -r requirements-ft.txt")
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [str(binary), "--min_replicas=1", f"--quorum_tick_ms={quorum_tick_ms}", "--join_timeout_ms=10000",
                 f"--bind=[::]:{self.port}"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while not listening(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the torchft lighthouse did not start; its log:\n{tail(log)}")
            time.sleep(0.05)
        self.address = f"http://localhost:{self.port}"

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def stop(process: subprocess.Popen) -> None:
    """End ``process`` and what it started (its own session: torchrun's ranks)."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


def run_all(commands: list[list[str]], logs: list[Path], label: str, timeout: float) -> None:
    """Start ``commands`` together (cwd: the repository, OMP_NUM_THREADS=1) and wait for all; a
    failed one (or the timeout) ends the others and raises with the tail of its log."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    processes = []
    try:
        for command, log in zip(commands, logs):
            with log.open("w") as out:
                processes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                  start_new_session=True))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in processes):
            failed = [(p, log) for p, log in zip(processes, logs) if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                process, log = failed[0] if failed else next((p, log) for p, log in zip(processes, logs)
                                                             if p.poll() is None)
                why = f"exited with {process.returncode}" if failed else f"ran past {timeout:.0f} s"
                raise RuntimeError(f"bench_replicas: the {label} run failed: {' '.join(process.args)} {why}; "
                                   f"the end of its log:\n{tail(log)}")
            time.sleep(0.2)
        for process, log in zip(processes, logs):
            if process.returncode:
                raise RuntimeError(f"bench_replicas: the {label} run failed: {' '.join(process.args)} exited with "
                                   f"{process.returncode}; the end of its log:\n{tail(log)}")
    finally:
        for process in processes:
            stop(process)


def step_ms(run_dir: Path) -> list[float]:
    """ms a step of each log record of the run folder but the first: its batch_size x block_size tokens
    (config.json) over the record's tokens_per_s."""
    from model import GPTConfig

    config = json.loads((run_dir / "config.json").read_text())
    block = config.get("block_size") or GPTConfig.preset(config["model"]).block_size
    tokens = config["batch_size"] * block
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    speeds = [record["tokens_per_s"] for record in records if isinstance(record, dict) and "tokens_per_s" in record]
    if len(speeds) < 2:
        raise RuntimeError(f"bench_replicas: {run_dir / 'metrics.jsonl'} has {len(speeds)} records with tokens_per_s: "
                           f"give --steps of at least {2 * LOG_INTERVAL}")
    return [tokens / speed * 1e3 for speed in speeds[1:]]


def run_variant(variant: Variant, train: list[str], args, folder: Path) -> list[float]:
    """Train ``variant`` once in ``folder``; its ms a step (one per kept log record)."""
    train = [*train, *variant.overrides]
    if not variant.replicas:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}",
                   str(ROOT / "train.py"), *train]
        run_all([command], [folder / "train.log"], variant.name, args.timeout)
        return step_ms(folder / RUN_NAME)
    lighthouse = Lighthouse(folder / "lighthouse.log", args.quorum_tick_ms)
    try:
        commands = [[sys.executable, str(ROOT / "train.py"), *train, *REPLICAS, f"--replica_id={i}",
                     f"--lighthouse={lighthouse.address}"] for i in range(RANKS)]
        run_all(commands, [folder / f"replica_{i}.log" for i in range(RANKS)], variant.name, args.timeout)
    finally:
        lighthouse.close()
    return step_ms(folder / RUN_NAME / "replica_0")


def data_folder(path: Path) -> Path:
    """``path``, a prepared folder (its train shards); the default one is prepared if missing."""
    if not any(path.glob("train_*.bin")):
        if path.resolve() != DEFAULT_DATA.resolve():
            raise SystemExit(f"bench_replicas: --data_dir {path} holds no prepared shards (train_*.bin): prepare it "
                             f"with python -m data.prepare, or leave --data_dir out for byte-level Shakespeare")
        print(f"preparing {path}: {' '.join(PREPARE[1:])}", file=sys.stderr)
        subprocess.run(PREPARE, cwd=ROOT, check=True)
    return path


def cpu_line() -> str:
    """This CPU's model name and whether it has AMX tiles and AVX-512 BF16; torch's and torchft's versions."""
    import torch

    name, flags = "an unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name == "an unknown CPU":
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    try:
        torchft = metadata.version("torchft")
    except metadata.PackageNotFoundError:
        torchft = "not installed"
    features = ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in ("amx_tile", "avx512_bf16"))
    return (f"measured on {name} ({os.cpu_count()} cores; {features}); torch {torch.__version__}, "
            f"torchft {torchft}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.py")
    parser.add_argument("--data_dir", type=Path, default=DEFAULT_DATA,
                        help="a prepared folder (default: byte-level Shakespeare, prepared if missing)")
    parser.add_argument("--steps", type=int, default=200, help=f"steps a run (at least {2 * LOG_INTERVAL})")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each variant, taking turns")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a train.py override of every run, as its --key=value")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                        help="a replicas run with these train.py overrides as well (repeatable)")
    parser.add_argument("--quorum_tick_ms", type=int, default=100, help="the lighthouse's quorum tick (the docs': 100)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a run may take before it counts as failed")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args(argv)
    if args.steps < 2 * LOG_INTERVAL or args.rounds < 1:
        parser.error(f"--steps must be at least {2 * LOG_INTERVAL} (the first log record is dropped) and --rounds >= 1")
    variants = [Variant("ddp", [], replicas=False), Variant("replicas", []), *map(parse_variant, args.variant)]
    names = [variant.name for variant in variants]
    if len(set(names)) < len(names):
        parser.error(f"the variants' names must differ (ddp and replicas are taken): {', '.join(names)}")
    try:
        metadata.version("torchft")
    except metadata.PackageNotFoundError:
        raise SystemExit("bench_replicas: the replica groups need torchft: pip install -r requirements-ft.txt")

    from configs import ConfigError, load_config

    overrides = [f"--{item}" for item in args.set]
    try:
        config = load_config(args.config, overrides)
    except ConfigError as error:
        raise SystemExit(f"bench_replicas: {error}")
    if config.batch_size % RANKS:
        raise SystemExit(f"bench_replicas: batch_size={config.batch_size} does not split over {RANKS} ranks")
    data = data_folder(args.data_dir.resolve())
    common = [str(args.config.resolve()), *(f"--{key}={value!r}" for key, value in QUIET.items()),
              f"--data_dir={str(data)!r}", f"--max_steps={args.steps}", "--max_tokens=0",
              f"--micro_batch_size={config.batch_size // RANKS}", f"--run_name={RUN_NAME}"]
    # A warmup longer than the run, which train.py refuses, shortened to the run (the lr is no part of a step's time).
    tokens_per_step = config.batch_size * config.model_config(1).block_size
    warmup = config.warmup_steps or config.warmup_tokens // tokens_per_step
    if warmup > args.steps:
        print(f"bench_replicas: the config's warmup ({warmup} steps) is longer than --steps {args.steps}: "
              f"warming up over the run's {args.steps} steps", file=sys.stderr)
        common += [f"--warmup_steps={args.steps}", "--warmup_tokens=0"]
    common += overrides
    for variant in variants:  # (what train.py would refuse, refused before any run: a variant's key unknown here)
        try:
            load_config(common[0], [*common[1:], *variant.overrides, *REPLICAS * variant.replicas])
        except ConfigError as error:
            raise SystemExit(f"bench_replicas: the {variant.name} variant: {error}")

    started = time.monotonic()
    for round_number in range(1, args.rounds + 1):
        for variant in variants:
            run_started = time.monotonic()
            with tempfile.TemporaryDirectory(prefix=f"bench_replicas_{variant.name}_") as tmp:
                ms = run_variant(variant, [*common, f"--out_dir={tmp!r}"], args, Path(tmp))
            variant.round_ms.append(ms)
            print(f"round {round_number}/{args.rounds} {variant.name}: {statistics.median(ms):.1f} ms a step "
                  f"(median of {len(ms)} records; the run took {time.monotonic() - run_started:.1f} s)",
                  file=sys.stderr, flush=True)

    results = {"config": str(args.config), "overrides": args.set, "steps": args.steps, "rounds": args.rounds,
               "log_interval": LOG_INTERVAL, "quorum_tick_ms": args.quorum_tick_ms, "cpu": cpu_line(),
               "minutes": (time.monotonic() - started) / 60, "variants": {}}
    for variant in variants:
        pooled = [ms for ms_round in variant.round_ms for ms in ms_round]
        rounds = [statistics.median(ms_round) for ms_round in variant.round_ms]
        results["variants"][variant.name] = {"overrides": variant.overrides, "replica_groups": RANKS * variant.replicas,
                                             "ms_per_step": statistics.median(pooled), "min_ms": min(rounds),
                                             "max_ms": max(rounds), "round_ms": rounds, "records_ms": variant.round_ms}
    base = results["variants"]["ddp"]["ms_per_step"]
    for entry in results["variants"].values():
        entry["ratio"] = entry["ms_per_step"] / base

    print(f"{config.batch_size} sequences a step over {RANKS} ranks (micro-batch {config.batch_size // RANKS}), "
          f"{args.steps} steps a run, {args.rounds} round(s) interleaved; ms a step from tokens_per_s every "
          f"{LOG_INTERVAL} steps, the first record dropped:")
    width = max(len(name) for name in names)
    print(f"  {'variant':{width}s}  {'ms/step':>9s}  {'min-max over rounds':>21s}  {'x ddp':>7s}")
    for name, entry in results["variants"].items():
        spread = f"{entry['min_ms']:.1f}-{entry['max_ms']:.1f}"
        print(f"  {name:{width}s}  {entry['ms_per_step']:9.1f}  {spread:>21s}  {entry['ratio']:7.3f}")
    print(results["cpu"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
