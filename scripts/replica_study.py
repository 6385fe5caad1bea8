"""Local steps against the large batch, on a CPU: DiLoCo and LocalSGD with 2 replica groups meeting
every H = 10 and 50 steps, against data-parallel training at the global batch B and at H x B, at
equal tokens, with AdamW and MERIT as the inner optimizers.

    python -m scripts.replica_study --archive docs/replica_study/runs.tar.xz   # the study, then its archive
    python -m scripts.replica_study --report docs/replica_study/runs.tar.xz   # its report and figures again

The mini study's model and data (scripts/mini_study.py: 4 layers of 64 dims on byte-level
Shakespeare, 64 tokens a sequence), TOKENS tokens a run (500 steps at B = 32 sequences):

============  ============================================================================
dp_b32        one process, 32 sequences a step
dp_b320       one process, 320 a step (10 x B): a tenth of the steps, so of the all-reduces
dp_b1600      one process, 1,600 a step (50 x B)
diloco_h10    2 replica groups (torchft), 16 sequences a step each, meeting every 10 steps: the
              mean pseudo-gradient through SGD with Nesterov momentum (outer lr 0.7, momentum 0.9)
diloco_h50    ... every 50 steps
localsgd_h10  2 replica groups meeting every 10 steps: the mean of their weights
localsgd_h50  ... every 50 steps
============  ============================================================================

Each point's lr is its best on val/loss among a factor-of-3 grid of three around the mini study's
centre for the optimizer at the point's global batch (``mini_study.lr_grid``: AdamW 3e-3 at every
batch, MERIT 3e-2 x sqrt(batch / 128); the local methods' inner steps are at B), with seed 0; then
seeds 1 and 2 (init and data order) at that lr; a grid whose best lr is on its edge grows one lr
past it, twice at most (as the mini study's). OUT/report.md gives, per optimizer, each point's
final heldout/loss (validation tokens the choice never saw: mean and 95% interval over the seeds),
its difference from dp_b32 paired by seed, the all-reduces between the groups and their bytes: a
replica run's as it logged them (``replicas/bytes_allreduced``), a one-process run's as two groups
averaging its gradient every step would send them (its float32 parameters a step, a replica run's
bytes a meeting; tests/test_replicas.py holds such a run to that). OUT/figures/ draws the seeds'
mean val/loss against tokens and against bytes sent. ``--archive`` packs every run's config.json and
metrics.jsonl (the replica runs' group 0: the groups meet at the last step, so end equal);
``--report ARCHIVE`` writes the report and figures beside it, from it. Needs torchft
(requirements-ft.txt); the Shakespeare byte shards are prepared if missing.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

from study.mini_study import BASE, BLOCK, DATA, OPTIMIZERS, lr_grid
from study.runs import Run, find_runs, pack_runs, paired, summary

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 1_024_000  # 500 steps of 32 x 64 tokens; 50 of 320, 10 of 1,600
BATCH = 32
GROUPS = 2
METHODS = {  # name: (global batch a step, the replica groups' settings; {}: one process)
    "dp_b32": (BATCH, {}),
    "dp_b320": (10 * BATCH, {}),
    "dp_b1600": (50 * BATCH, {}),
    "diloco_h10": (BATCH, {"local_steps": 10, "local_method": "diloco"}),
    "diloco_h50": (BATCH, {"local_steps": 50, "local_method": "diloco"}),
    "localsgd_h10": (BATCH, {"local_steps": 10, "local_method": "localsgd"}),
    "localsgd_h50": (BATCH, {"local_steps": 50, "local_method": "localsgd"}),
}
STUDIED = ("adamw", "merit")
SEEDS = 3
REPORTED, CHOSEN_ON = "heldout/loss", "val/loss"


def settings(optimizer: str, method: str, lr: float, seed: int, tokens: int) -> dict:
    """A run's config: the mini study's base at the method's batch, 8 evaluations, 16 log steps."""
    batch, groups = METHODS[method]
    steps = tokens // (batch * BLOCK)
    return {**BASE, **OPTIMIZERS[optimizer][0], "data_dir": DATA, "max_steps": steps, "batch_size": batch,
            "micro_batch_size": min(batch // (GROUPS if groups else 1), 64),
            "warmup_steps": min(max(5, round(0.05 * steps)), steps // 2),
            "eval_interval": max(1, steps // 8), "log_interval": max(1, steps // 16), "lr": lr, "min_lr": lr / 10,
            "seed": seed, "data_seed": seed, **({"replica_groups": GROUPS, "replica_timeout": 600.0, **groups}
                                                if groups else {})}


def method_of(run: Run) -> str:
    config = run.config
    if config.get("replica_groups"):
        return f"{config['local_method']}_h{config['local_steps']}"
    return f"dp_b{config['batch_size']}"


class Launcher:
    """train.py for a config: one process, or one a replica group through a lighthouse of its own
    that waits for both groups (--min_replicas 2)."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        self.lighthouse = subprocess.Popen(
            [str(Path(sys.executable).parent / "torchft_lighthouse"), f"--min_replicas={GROUPS}",
             "--join_timeout_ms=60000", f"--bind=[::]:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.address = f"http://localhost:{port}"
        while socket.socket().connect_ex(("localhost", port)):
            if self.lighthouse.poll() is not None:
                sys.exit("replica_study: torchft_lighthouse did not start: pip install -r requirements-ft.txt")
            time.sleep(0.05)

    def run(self, folder: Path, config: dict) -> None:
        """Train ``config`` in ``folder`` (resumed if a run there stopped; nothing if it finished)."""
        folder.parent.mkdir(parents=True, exist_ok=True)
        args = [*(f"--{key}={value!r}" for key, value in config.items()), f"--out_dir={str(folder.parent)!r}",
                f"--run_name={folder.name!r}", "--resume='auto'"]
        groups = config.get("replica_groups", 0)
        commands = [[*args, f"--lighthouse={self.address!r}", f"--replica_id={i}"] for i in range(groups)] or [args]
        # (two groups share the 2 cores: a thread each)
        env = {**os.environ, **({"OMP_NUM_THREADS": "1"} if groups else {})}
        logs = [folder.parent / f"{folder.name}.{i}.log" for i in range(len(commands))]
        processes = [subprocess.Popen([sys.executable, str(ROOT / "train.py"), *command], cwd=ROOT, env=env,
                                      stdout=subprocess.DEVNULL, stderr=log.open("w"))
                     for command, log in zip(commands, logs)]
        if any(process.wait() for process in processes):
            sys.exit(f"replica_study: a run of {folder} failed: see {', '.join(map(str, logs))}")

    def close(self) -> None:
        self.lighthouse.kill()
        self.lighthouse.wait()


def studied_runs(paths: list[Path]) -> dict[tuple[str, str], list[Run]]:
    """{(optimizer, method): its runs}, a replica run by its group 0."""
    points: dict[tuple[str, str], list[Run]] = {}
    for run in find_runs(paths):
        if not run.config.get("replica_id"):
            points.setdefault((run.config["optimizer"], method_of(run)), []).append(run)
    return points


def best(runs: list[Run]) -> Run:
    """The seed-0 run with the lowest final val/loss (a diverged run's, None, last)."""
    return min((r for r in runs if r.seed == 0), key=lambda r: (r.final(CHOSEN_ON) is None, r.final(CHOSEN_ON) or 0))


def at_best_lr(runs: list[Run]) -> list[Run]:
    """Every seed of the point's chosen lr."""
    lr = best(runs).lr
    return [r for r in runs if r.lr == lr]


def study(out: Path, tokens: int, optimizers: list[str], methods: list[str], seeds: int, extend: int) -> None:
    """Each point's grid at seed 0, grown by one lr past an edge its best lr is on (``extend`` times
    at most), then its other seeds at the best lr."""
    launcher = Launcher()
    try:
        with tqdm(total=len(optimizers) * len(methods) * (2 + seeds), desc="replica study", unit="run") as bar:
            for optimizer in optimizers:
                for method in methods:
                    batch, groups = METHODS[method]
                    _, centre, exponent = OPTIMIZERS[optimizer]
                    folder = out / optimizer / method
                    lrs = lr_grid(centre, exponent, BATCH if groups else batch)
                    for _ in range(extend + 1):
                        for lr in lrs:
                            launcher.run(folder / f"lr{lr:g}_s0", settings(optimizer, method, lr, 0, tokens))
                            bar.update()
                        runs = studied_runs([folder])[optimizer, method]
                        lr, grid = best(runs).lr, sorted({r.lr for r in runs})
                        below, _, above = lr_grid(lr, 0.0, BATCH)  # (lr / 3 and lr x 3, rounded as the grid)
                        lrs = [above] if lr == grid[-1] else [below] if lr == grid[0] else []
                        bar.total += len(lrs)
                    for seed in range(1, seeds):
                        launcher.run(folder / f"lr{lr:g}_s{seed}", settings(optimizer, method, lr, seed, tokens))
                        bar.update()
    finally:
        launcher.close()


def communication(run: Run, parameter_bytes: float) -> tuple[int, float]:
    """(all-reduces between the groups, their bytes) over the run (the module's docstring)."""
    steps = run.config["max_steps"]
    if run.config.get("replica_groups"):
        return steps // run.config["local_steps"], run.final("replicas/bytes_allreduced")
    return steps, steps * parameter_bytes


def bytes_by_step(run: Run, parameter_bytes: float, step: int) -> float:
    every = run.config.get("local_steps") or 1
    return step // every * parameter_bytes


def report(points: dict[tuple[str, str], list[Run]], out: Path) -> str:
    """The report's markdown (and its figures under out/figures)."""
    replica = next(r for runs in points.values() for r in runs if r.config.get("replica_groups"))
    parameter_bytes = replica.final("replicas/bytes_allreduced") / (replica.config["max_steps"]
                                                                    // replica.config["local_steps"])
    lines = ["# Local steps against the large batch (scripts/replica_study.py)", "",
             f"Every run {replica.config['max_steps'] * replica.config['batch_size'] * BLOCK:,} tokens; "
             f"{REPORTED} at the end, mean [95% interval] over the seeds at each point's lr (chosen on "
             f"{CHOSEN_ON}, seed 0); 'vs dp_b32': the difference paired by seed; the bytes between 2 groups "
             f"({parameter_bytes / 1e6:.3f} MB of float32 parameters an all-reduce).", ""]
    for optimizer in STUDIED:
        rows = [(method, points[optimizer, method]) for method in METHODS if (optimizer, method) in points]
        if not rows:
            continue
        lines += [f"## {optimizer}", "",
                  f"| method | batch a step | steps | lr (grid) | seeds | {REPORTED} | vs dp_b32 | all-reduces | MB sent |",
                  "|---|---|---|---|---|---|---|---|---|"]
        reference = at_best_lr(points[optimizer, "dp_b32"]) if (optimizer, "dp_b32") in points else []
        for method, runs in rows:
            chosen, at_lr = best(runs), at_best_lr(runs)
            grid = sorted({r.lr for r in runs if r.seed == 0})
            edge = " (edge)" if chosen.lr in (grid[0], grid[-1]) else ""
            loss = summary([r.final(REPORTED) for r in at_lr])
            versus = paired(at_lr, reference, REPORTED) if reference and method != "dp_b32" else None
            reduces, sent = communication(chosen, parameter_bytes)
            lines.append(f"| {method} | {chosen.batch_size} | {chosen.config['max_steps']} | {chosen.lr:g}{edge} "
                         f"({', '.join(f'{lr:g}' for lr in grid)}) | {loss.n} | {loss.mean:.4f} [±{loss.ci95:.4f}] | "
                         + (f"{versus.mean:+.4f} [±{versus.ci95:.4f}]" if versus else "-")
                         + f" | {reduces} | {sent / 1e6:.1f} |")
        lines.append("")
    draw(points, parameter_bytes, out / "figures")
    lines += ["Figures: figures/loss_vs_tokens.png, figures/loss_vs_bytes.png (the seeds' mean val/loss of each "
              "point's lr).", ""]
    return "\n".join(lines)


def draw(points: dict[tuple[str, str], list[Run]], parameter_bytes: float, folder: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    folder.mkdir(parents=True, exist_ok=True)
    for name, xlabel in (("tokens", "tokens"), ("bytes", "bytes sent between the groups")):
        figure, axes = plt.subplots(1, len(STUDIED), figsize=(6 * len(STUDIED), 4.5), squeeze=False)
        for axis, optimizer in zip(axes[0], STUDIED):
            for method in METHODS:
                runs = points.get((optimizer, method))
                if not runs:
                    continue
                at_lr = at_best_lr(runs)
                steps, losses = at_lr[0].series(CHOSEN_ON)
                mean = [summary([r.series(CHOSEN_ON)[1][i] for r in at_lr]).mean for i in range(len(steps))]
                xs = ([s * at_lr[0].batch_size * BLOCK for s in steps] if name == "tokens"
                      else [bytes_by_step(at_lr[0], parameter_bytes, s) for s in steps])
                shown = [(x, y) for x, y in zip(xs, mean) if name == "tokens" or x > 0]  # (log axis: from the first)
                axis.plot(*zip(*shown), marker="o", markersize=3, label=method)
            axis.set(title=optimizer, xlabel=xlabel, ylabel=CHOSEN_ON, xscale="linear" if name == "tokens" else "log")
            if axis.lines:
                axis.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(folder / f"loss_vs_{name}.png", dpi=100)
        plt.close(figure)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/replica_study"))
    parser.add_argument("--optimizers", default=",".join(STUDIED), help=f"of {', '.join(STUDIED)}")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"of {', '.join(METHODS)}")
    parser.add_argument("--seeds", type=int, default=SEEDS)
    parser.add_argument("--tokens", type=int, default=TOKENS, help=f"a run's tokens ({TOKENS:,})")
    parser.add_argument("--extend", type=int, default=2, help="times a grid may grow past an edge (2)")
    parser.add_argument("--archive", type=Path, help="also pack the runs' configs and metrics into this .tar.xz")
    parser.add_argument("--report", type=Path, metavar="ARCHIVE", help="only write the report and figures of an "
                                                                        "archive, beside it")
    args = parser.parse_args(argv)
    if args.report:
        points, out = studied_runs([args.report]), args.report.parent
    else:
        optimizers, methods = args.optimizers.split(","), args.methods.split(",")
        unknown = [name for name in [*optimizers, *methods] if name not in (*STUDIED, *METHODS)]
        if unknown:
            parser.error(f"unknown {unknown}: optimizers of {', '.join(STUDIED)}, methods of {', '.join(METHODS)}")
        if not (ROOT / DATA / "manifest.json").is_file():
            subprocess.run([sys.executable, "-m", "data.prepare", "shakespeare", "--tokenizer", "byte"], cwd=ROOT,
                           check=True)
        started = time.time()
        study(args.out, args.tokens, optimizers, methods, args.seeds, args.extend)
        print(f"replica study: {(time.time() - started) / 60:.1f} minutes")
        points, out = studied_runs([args.out]), args.out
        if args.archive:
            pack_runs([r for runs in points.values() for r in runs], args.out, args.archive)
            out = args.archive.parent
    text = report(points, out)
    (out / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
