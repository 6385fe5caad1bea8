"""Sweeps: the points of a grid of training runs (each a checked, resolved config in its own run
folder), their status, and their launch here (torchrun) or on SLURM (an sbatch array). The CLI
and what each option means: scripts/sweep.py.

A sweep folder holds one sweep: a plan that differs from the points written there is refused,
naming the keys (``check_written``), new points are added only when asked, and a point's file is
never rewritten under it. A point is finished only when its run trained what its file says (the
run's config.json equals it on every key that defines what is trained) to the end.
"""
from __future__ import annotations

import ast
import dataclasses
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

import optim
from atomic import atomic_write
from configs import INVOCATION_KEYS, SCALINGS, ConfigError, TrainConfig, load_config
from eval.tasks import check_zero_shot
from study.runs import read_records
from training.batch_schedule import BatchSchedule, half_life_betas, run_lengths
from training.checkpoint import RECORDED, numbered
from training.run_config import resolve_config

ROOT = Path(__file__).resolve().parents[1]
# Short labels of the usual grid keys in point names.
TAGS = {"optimizer": "", "batch_size": "b", "lr": "lr", "seed": "s", "data_seed": "d"}


@dataclass
class Point:
    name: str
    config: TrainConfig   # resolved: what the run trains with
    grid: dict            # this point's grid values
    folder: Path
    edited: str = ""      # how its written file differs from the plan (check_written on a dry run), "" if not

    @property
    def file(self) -> Path:
        return self.folder / "point.py"

    def total_steps(self) -> int:
        return run_lengths(self.config)[0]

    def status(self) -> str:
        """"finished" (its run is this point's, and its metrics hold the final validation loss),
        "at step N" (interrupted: it resumes from its checkpoint of step N), "new", or "another
        run: ..." (the folder's run trained other settings, named); "edited: ..." before them where
        its file differs from the plan (the keys named)."""
        if self.edited:
            return f"edited: {self.edited}"
        differing = self.differing_run()
        if differing:
            return f"another run: {differing}"
        total = self.total_steps()
        if any(r.get("step") == total and "val/loss" in r for r in read_records(self.folder / "metrics.jsonl")):
            return "finished"
        checkpoints = numbered(self.folder)
        return f"at step {int(checkpoints[-1].stem.split('_')[1])}" if checkpoints else "new"


    def differing_run(self) -> str:
        """The keys that define what is trained on which the folder's run (its config.json, with
        any change made on resume) differs from this point, "" if none or no run."""
        try:
            run = json.loads((self.folder / "config.json").read_text())
        except (OSError, ValueError):
            return ""
        mine = self.config.to_dict()
        differing = [f"{key} {run[key]!r}, not {mine[key]!r}" for key in sorted(RECORDED)
                     if key in run and run[key] != mine[key]]
        differing += [f"{c['key']} changed to {c['to']!r} at step {c['step']}" for c in run.get("changes", [])]
        return "; ".join(differing)


def check_written(points: list[Point], out: Path, add_points: bool, dry_run: bool = False) -> None:
    """Refuse a plan other than the one written in the sweep folder ``out``: a point whose file
    says other settings (edited by hand, or another plan: the point and keys named, with the ways
    out; on a ``dry_run`` the point is marked, its ``edited``, instead), or, unless ``add_points``,
    points the folder does not have beside those it has."""
    for point in points:
        if point.file.is_file():
            written = load_config(str(point.file)).to_dict()
            mine = point.config.to_dict()
            differing = "; ".join(f"{key}: written {written[key]!r}, now {mine[key]!r}"
                                  for key in mine if written[key] != mine[key])
            if differing and dry_run:
                point.edited = differing
            elif differing:
                raise ConfigError(
                    f"point {point.name}'s file {point.file} differs from this plan ({differing}): the sweep runs "
                    f"what its command plans. If the file was edited by hand, either restore the point: delete "
                    f"{point.file} and rerun this command with --add-points (the sweep writes it again from the "
                    f"plan), or take the edit as a point of its own: move the file to {out}/NEW/point.py, set "
                    f"run_name = 'NEW' in it, run it with python train.py {out}/NEW/point.py --resume=auto, and "
                    f"restore this point as above. If this is another plan, a sweep folder holds one sweep: choose "
                    f"another --name. (--dry-run shows the plan with the point marked.)")
    written = sorted(path.parent.name for path in out.glob("*/point.py"))
    new = [point.name for point in points if not point.file.is_file()]
    if written and new and not add_points:
        raise ConfigError(f"the sweep folder {out} holds the points {', '.join(written)}; this plan adds "
                          f"{', '.join(new)}: pass --add-points to add them to that sweep, or choose another --name")


def parse_values(text: str) -> list:
    """``1e-3,3e-3`` -> [0.001, 0.003]; ``adamw,merit`` -> ["adamw", "merit"]; literals otherwise."""
    try:
        return list(ast.literal_eval(f"({text},)"))
    except (ValueError, SyntaxError):
        values = []
        for piece in text.split(","):
            try:
                values.append(ast.literal_eval(piece))
            except (ValueError, SyntaxError):
                values.append(piece.strip())
        return values


def key_values(texts: list[str], flag: str) -> dict[str, str]:
    """{KEY: VALUE} of ``flag``'s ``KEY=VALUE`` arguments; a key given twice is refused (the later
    would silently replace the earlier)."""
    given = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {text!r}: expected KEY=VALUE")
        if key in given:
            fix = (f" (one axis per key): give its values in one, {flag} {key}={given[key]},{value}"
                   if flag == "--grid" else ": give each key once")
            raise ConfigError(f"{flag} {text} repeats the key {key} of {flag} {key}={given[key]}{fix}")
        given[key] = value
    return given


# How to pass each invocation flag to a point's run instead of a sweep's --set or --grid (grid_and_fixed).
INVOCATION_HINTS = {
    "resume": "drop it; every point resumes already",
    "overwrite": "to start a point over, run it alone with python train.py {folder}/POINT/point.py "
                 "--resume=False --overwrite=True",
    "allow_changes": "to resume a point with changed settings, run it alone with python train.py "
                     "{folder}/POINT/point.py --resume=auto --allow_changes={value} and the changes",
    "stop_at_step": "to stop a point early, run it alone with python train.py {folder}/POINT/point.py "
                    "--resume=auto --stop_at_step={value} (the sweep, run again, resumes it to its end)",
}


def invocation_flag(where: str, key: str, value, folder: str) -> ConfigError:
    """The refusal of the invocation flag ``key`` in a sweep's plan (``where``: as given), saying how
    to pass it to a point's own run in the sweep's ``folder``."""
    return ConfigError(f"{where}: {key} is an invocation flag (configs.INVOCATION_KEYS: what one run of train.py "
                       f"does with its run folder), not a setting of the points, which the sweep always runs with "
                       f"--resume=auto (a finished point skipped, an interrupted one resumed): "
                       f"{INVOCATION_HINTS[key].format(value=value, folder=folder)}")


def grid_and_fixed(grid_texts: list[str], set_texts: list[str],
                   folder: str = "OUT_DIR/NAME") -> tuple[dict[str, list], list[str]]:
    """The grid of ``--grid KEY=V1,V2,...`` ({key: values}) and the overrides of ``--set KEY=VALUE``
    (``--key=value``), each key named once in all of them, none an invocation flag (INVOCATION_KEYS:
    refused, saying how to pass it to a point's run in the sweep's ``folder``)."""
    grid = key_values(grid_texts, "--grid")
    fixed = key_values(set_texts, "--set")
    for flag, given in (("--grid", grid), ("--set", fixed)):
        for key in INVOCATION_KEYS:
            if key in given:
                raise invocation_flag(f"{flag} {key}={given[key]}", key, given[key], folder)
    shared = sorted(grid.keys() & fixed.keys())
    if shared:
        key = shared[0]
        raise ConfigError(f"--grid {key}={grid[key]} and --set {key}={fixed[key]} name the same key: the grid's "
                          f"values replace the --set one at every point; drop one of them")
    return {key: parse_values(values) for key, values in grid.items()}, [f"--{k}={v}" for k, v in fixed.items()]


def plan(base: str, grid: dict[str, list], fixed: list[str], out: Path, lr_scaling: str,
         warmup_scaling: str, base_batch: int | None, betas: tuple[str, ...] = (), world_size: int = 1) -> list[Point]:
    """The points of the grid, each a checked, resolved config (nothing is written) that trains on
    ``world_size`` ranks; a point that cannot is refused, named by its grid values. ``betas``: the
    decays scaled from the base batch by their half-life in tokens (half_life_betas)."""
    base_config = load_config(base, fixed)
    for key in INVOCATION_KEYS:  # (set by the base config file itself: --set and --grid refuse them too)
        value = getattr(base_config, key)
        if value != TrainConfig.__dataclass_fields__[key].default:
            raise invocation_flag(f"the base config {base} sets {key}={value!r}", key, value, str(out))
    base_batch = base_batch or base_config.batch_size
    block = base_config.model_config(1).block_size
    base_warmup_steps = base_config.warmup_steps or base_config.warmup_tokens // (base_batch * block)
    points = []
    for values in itertools.product(*grid.values()):
        chosen = dict(zip(grid, values))
        lr_axis = "lr" in chosen and "min_lr" not in chosen  # min_lr then keeps the base config's ratio to lr
        try:
            # The values are checked by the schema as typed (min_lr 0 lies below any lr); min_lr follows the lr after.
            config = load_config(base, [*fixed, *(f"--{key}={value!r}" for key, value in chosen.items()),
                                        *(["--min_lr=0.0"] if lr_axis else [])])
            factor = SCALINGS[lr_scaling](config.batch_size / base_batch)
            min_lr = config.lr * base_config.min_lr / base_config.lr if lr_axis else config.min_lr
            changes = {"lr": config.lr * factor, "min_lr": min_lr * factor}
            if warmup_scaling == "steps":
                changes.update(warmup_steps=base_warmup_steps, warmup_tokens=0)
            elif warmup_scaling == "tokens":
                changes.update(warmup_steps=0, warmup_tokens=base_warmup_steps * base_batch * block)
            name = point_name(chosen) or "base"
            config = resolve_config(dataclasses.replace(config, **changes, run_name=name, out_dir=str(out),
                                                        resume="auto", overwrite=False)).config
            if betas:  # (of the resolved values: the published ones are the base batch's; each its optimizer's)
                own = tuple(name for name in betas if name in optim.batch_decays(config.optimizer))
                config = resolve_config(dataclasses.replace(
                    config, **half_life_betas(config, config.batch_size / base_batch, own))).config
            if config.zero_shot_tasks:  # (the hub's data is fetched when a point starts)
                check_zero_shot(config.zero_shot_tasks, config.zero_shot_data_dir)
            # A warmup longer than the run, or a batch that does not divide over the ranks: here, not at launch.
            schedule = BatchSchedule.of(config, block)
            schedule.lengths(config)
            schedule.check_divisible(config.micro_batch_size, world_size)
        except ConfigError as error:
            where = (f"--grid point {', '.join(f'{k}={v!r}' for k, v in chosen.items())}" if chosen
                     else f"the base config {base}")
            raise ConfigError(f"{where}: {error}") from error
        points.append(Point(name, config, chosen, out / name))
    declared = {name for p in points for name in optim.batch_decays(p.config.optimizer)}
    if set(betas) - declared:
        raise ConfigError(f"the decays {', '.join(sorted(set(betas) - declared))} belong to none of the grid's "
                          f"optimizers: give decays they declare ({', '.join(sorted(declared)) or 'none'})")
    names = [p.name for p in points]
    if len(set(names)) != len(names):
        raise ConfigError("two points of the grid get the same name: give each --grid key distinct values")
    return points


def point_name(chosen: dict) -> str:
    parts = []
    for key, value in chosen.items():
        text = f"{value:g}" if isinstance(value, float) else str(value)
        parts.append(f"{TAGS.get(key, key + '-')}{text}")
    return re.sub(r"[^A-Za-z0-9._+=-]+", "-", "_".join(parts)).strip("-_")


def write_points(points: list[Point], base: str, command: str) -> None:
    """Each new point's file (one written is left as it is: ``check_written`` found it the same)."""
    for point in points:
        if point.file.is_file():
            continue
        point.folder.mkdir(parents=True, exist_ok=True)
        lines = [f"# Sweep point {point.name}: {json.dumps(point.grid)} on {base}.",
                 f"# Written by: {command}",
                 "# Every setting, resolved (the optimizer's published values filled in); edit freely.", ""]
        lines += [f"{field.name} = {getattr(point.config, field.name)!r}" for field in dataclasses.fields(TrainConfig)]
        with atomic_write(point.file, "w") as f:
            f.write("\n".join(lines) + "\n")


def table(points: list[Point]) -> str:
    header = ["point", "optimizer", "batch", "lr", "min_lr", "beta2", "warmup", "steps", "tokens", "seed",
              "data_seed", "status"]
    rows = [header]
    for p in points:
        c = p.config
        total, warmup = run_lengths(c)
        beta2 = "-" if c.beta2 is None else f"{c.beta2:.6g}"  # (an optimizer without betas: SGD, Adafactor)
        rows.append([p.name, c.optimizer, str(c.batch_size), f"{c.lr:.3g}", f"{c.min_lr:.3g}", beta2,
                     str(warmup), str(total), f"{total * c.batch_size * c.model_config(1).block_size:,}", str(c.seed),
                     str(c.data_seed), p.status()])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def launch_local(points: list[Point], nproc: int, jobs: int = 1) -> list[str]:
    """Run the unfinished points, ``jobs`` at a time; returns the names of those that failed.
    With several jobs each gets an equal share of the CPU threads and writes its output to
    POINT/train.log (one job inherits this terminal)."""
    pending, failed = [], []
    for point in points:
        status = point.status()
        if status == "finished":
            tqdm.write(f"{point.name}: finished, skipped")
        elif status.startswith("another run"):  # (resuming it would be refused: not this point's run)
            tqdm.write(f"{point.name}: FAILED: its folder holds {status}; move that run away to train the point")
            failed.append(point.name)
        else:
            pending.append(point)
    env = dict(os.environ)
    if jobs > 1:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    progress = tqdm(total=len(points), initial=len(points) - len(pending), unit="point", desc="sweep")
    running: dict[subprocess.Popen, tuple[Point, object]] = {}
    while pending or running:
        while pending and len(running) < jobs:
            point = pending.pop(0)
            # (One process needs no torchrun: its agent would be a second interpreter to start.)
            launcher = (["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
                        if nproc > 1 else [])
            command = [sys.executable, *launcher, "train.py", str(point.file), "--resume=auto"]
            tqdm.write(f"{point.name}: {point.status()}: {shlex.join(command)}")
            log = open(point.folder / "train.log", "a") if jobs > 1 else None
            running[subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)] = (point, log)
        done = [process for process in running if process.poll() is not None]
        if not done:
            time.sleep(0.2)
        for process in done:
            point, log = running.pop(process)
            if log is not None:
                log.close()
            progress.update()
            if process.returncode != 0:
                failed.append(point.name)
                where = f"{point.folder / 'train.log'}" if jobs > 1 else "its log above"
                tqdm.write(f"{point.name}: FAILED ({where}; rerun the sweep to retry it)")
    progress.close()
    return failed


SBATCH = """#!/bin/bash
# {count} runs of {name}, one array task each: python -m scripts.{script} wrote this.
#SBATCH --job-name={name}
#SBATCH --array=0-{last}%{parallel}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={gpus}
#SBATCH --cpus-per-task={cpus}
#SBATCH --time={time}
#SBATCH --output={out}/slurm-%A_%a.out
#SBATCH --requeue
#SBATCH --signal=B:USR1@{grace}
{partition}
set -euo pipefail
cd {root}
POINTS=(
{points}
)
CONFIG=${{POINTS[$SLURM_ARRAY_TASK_ID]}}
# The rendezvous: torchrun's c10d store on the task's first node, one port per array task.
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)  # (sed: head would SIGPIPE scontrol)
PORT=$((29500 + SLURM_ARRAY_TASK_ID % 10000))

# Preemption or the time limit: SLURM sends USR1 {grace} s ahead; the ranks get SIGTERM, agree at
# their next log step, save and exit 0, and the task goes back in the queue (--resume=auto then
# continues it from that checkpoint).
requeue() {{
  kill -TERM "$TRAIN" 2>/dev/null || true
  wait "$TRAIN" || true
  scontrol requeue "${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}"
}}
trap requeue USR1

srun --kill-on-bad-exit=1 {python} -m torch.distributed.run \\
  --nnodes="$SLURM_NNODES" --nproc_per_node={gpus} \\
  --rdzv_id="$SLURM_ARRAY_JOB_ID-$SLURM_ARRAY_TASK_ID" --rdzv_backend=c10d --rdzv_endpoint="$HEAD:$PORT" \\
  --max-restarts={restarts} \\
  train.py "$CONFIG" --resume=auto &
TRAIN=$!
wait "$TRAIN"
"""


def add_slurm_arguments(parser) -> None:
    """The options of ``--launch slurm`` (write_sbatch's ``args``)."""
    slurm = parser.add_argument_group("slurm")
    slurm.add_argument("--nodes", type=int, default=1)
    slurm.add_argument("--gpus-per-node", type=int, default=8)
    slurm.add_argument("--cpus-per-task", type=int, default=32)
    slurm.add_argument("--time", default="24:00:00")
    slurm.add_argument("--partition")
    slurm.add_argument("--max-parallel", type=int, default=4, help="array tasks running at once")
    slurm.add_argument("--max-restarts", type=int, default=3, help="torchrun restarts after a failed node")
    slurm.add_argument("--signal-grace", type=int, default=300, help="seconds between USR1 and the kill")


def write_sbatch(points: list, name: str, out: Path, args, script: str = "sweep") -> Path:
    """``out/<script>.sbatch``: an array job of one task per point (anything with a config ``file``)."""
    text = SBATCH.format(script=script,
        count=len(points), name=name, last=len(points) - 1, parallel=args.max_parallel, nodes=args.nodes,
        gpus=args.gpus_per_node, cpus=args.cpus_per_task, time=args.time, out=out, grace=args.signal_grace,
        partition=f"#SBATCH --partition={args.partition}" if args.partition else "", root=ROOT,
        points="\n".join(f"  {shlex.quote(str(p.file))}" for p in points), python=shlex.quote(sys.executable),
        restarts=args.max_restarts)
    path = out / f"{script}.sbatch"
    with atomic_write(path, "w") as f:
        f.write(text)
    return path
