"""The MERIT paper's mechanism on a CPU, end to end: a small GPT on Shakespeare at a batch large
for it, AdamW, LAMB, MERIT and maxLAMB each on its own lr grid, several seeds, one token budget.

    python -m scripts.mini_study                    # the full study: about 30 minutes on 2 cores
    python -m scripts.mini_study --out runs/mini --seeds 3 --optimizers adamw,merit

Writes OUT/ (default runs/mini_study): a sweep folder per optimizer (scripts/sweep.py's point
folders: point.py, metrics, checkpoint), ``report.md`` (scripts/report.py's tables over every
run, the full lr grid included) and ``figures/`` (scripts/plot.py's PNGs). Rerunning skips the
finished runs and resumes interrupted ones. The Shakespeare byte shards are prepared if missing.

The setup (``BASE`` below): a 4-layer, 64-dim GPT (0.2M parameters) with 64-token context, a
global batch of 128 sequences (8,192 tokens: large for a model this size), 4 warmup steps then
cosine to lr / 10, clipping at 1.0, ~1.2M training tokens (one pass over the text). The lr grids
are factor-of-3 grids over two orders of magnitude, centred differently because the optimizers'
lrs mean different things: AdamW's step is about lr per element, LAMB's and MERIT's about lr
relative to each weight's scale.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from atomic import atomic_write
from study import sweep
from study.plot import draw_all
from study.report import report
from study.runs import find_runs

ROOT = Path(__file__).resolve().parents[1]
DATA = "cache/data/shakespeare-byte"
BASE = {
    "data_dir": DATA, "tokenizer": "byte",
    "model": "nano", "n_layer": 4, "n_head": 4, "n_embd": 64, "block_size": 64, "dropout": 0.0,
    "batch_size": 128, "micro_batch_size": 64, "max_tokens": 1_228_800, "warmup_steps": 4,
    "lr_schedule": "cosine", "grad_clip": 1.0,
    "log_interval": 5, "eval_interval": 25, "val_tokens": 65_536, "probe_batch_size": 8, "sample_tokens": 0,
}
OPTIMIZERS = {  # name: (config changes, lr grid)
    "adamw": ({"optimizer": "adamw"}, [1e-4, 3e-4, 1e-3, 3e-3, 1e-2]),
    "lamb": ({"optimizer": "lamb"}, [3e-3, 1e-2, 3e-2, 1e-1, 3e-1]),
    "merit": ({"optimizer": "merit"}, [3e-3, 1e-2, 3e-2, 1e-1, 3e-1]),
    "maxlamb": ({"optimizer": "merit", "optimizer_options": {"maxlamb": True}}, [3e-3, 1e-2, 3e-2, 1e-1, 3e-1]),
}


def middle(values: list, count: int) -> list:
    """The ``count`` values at the centre of the grid (all of them by default)."""
    start = max(0, (len(values) - count) // 2)
    return values[start:start + count]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/mini_study"))
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS), help="comma-separated, of: "
                        + ", ".join(OPTIMIZERS))
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--lr-points", type=int, default=5, help="the central N points of each lr grid")
    parser.add_argument("--data-dir", default=DATA, help=f"byte-token shards (default {DATA}, prepared if missing)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, sharing the CPU threads (default 2)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a change to the base config (e.g. max_tokens=...)")
    args = parser.parse_args(argv)
    names = args.optimizers.split(",")
    unknown = [n for n in names if n not in OPTIMIZERS]
    if unknown:
        sys.exit(f"mini_study: unknown optimizers {unknown}: choose from {', '.join(OPTIMIZERS)}")
    start = time.perf_counter()
    if args.data_dir == DATA and not (ROOT / DATA / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "data.prepare", "shakespeare", "--tokenizer", "byte"], cwd=ROOT,
                       check=True)
    data_dir = args.data_dir if args.data_dir == DATA else str(Path(args.data_dir).resolve())
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    base = out / "base.py"
    base.write_text("# The mini-study's base config (scripts/mini_study.py writes it).\n"
                    + "".join(f"{key} = {value!r}\n" for key, value in {**BASE, "data_dir": data_dir}.items()))
    points = []
    for name in names:
        changes, lrs = OPTIMIZERS[name]
        fixed = [*(f"--{k}={v!r}" for k, v in changes.items()), *(f"--{t}" for t in args.set)]
        grid = {"lr": middle(lrs, args.lr_points), "seed": list(range(args.seeds))}
        points += sweep.plan(str(base), grid, fixed, out / name, "none", "none", None)
    print(f"mini-study: {len(points)} runs in {out}")
    print(sweep.table(points))
    sweep.write_points(points, str(base), "python -m scripts.mini_study")
    sweep.launch_local(points, nproc=1, jobs=args.jobs)
    runs = [run for run in find_runs([out]) if run.final("val/loss") is not None]
    tables = report(runs, target=None)
    with atomic_write(out / "report.md", "w") as f:
        f.write(tables)
    print(tables, end="")
    draw_all(runs, out / "figures")
    minutes = (time.perf_counter() - start) / 60
    # A run that diverges (nonfinite="stop" ends it) is a result of the study, not a failure of it:
    # the report lists it, and a rerun tries it again.
    print(f"mini-study: {len(runs)} runs, {sum(not r.finished for r in runs)} did not finish, {minutes:.1f} "
          f"minutes; {out / 'report.md'}, {out / 'figures'}")


if __name__ == "__main__":
    main()
