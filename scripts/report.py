"""The study's tables (markdown) from run folders, like the paper's.

    python -m scripts.report sweeps/merit-batch --target 3.3 --out report.md

Tables, per optimizer (its ablation / QK-Norm marked) and batch size, each point at the lr with
the lowest mean final validation loss over seeds (the full lr grid is its own table):
* final validation loss, mean +- std over seeds, with that lr;
* the whole lr grid: final validation loss per lr;
* the max attention logit per layer: its peak over training and its final value (mean over seeds);
* steps and tokens to reach ``--target`` validation loss (default: the highest of the points'
  best final losses, so that every point has a value), mean over seeds;
* zero-shot scores (the final ``zero_shot/<task>/<metric>`` values), when the runs logged them;
* the Hessian's top eigenvalue and trace (scripts/hessian.py's ``hessian.json``), when present.
A note under the loss table names the optimizers at the same batch whose mean +- std intervals
overlap: with these seeds their difference is not significant.
"""
import argparse
import sys
from pathlib import Path

from atomic import atomic_write
from study.report import report
from study.runs import find_runs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="run folders, sweep folders or folders above them")
    parser.add_argument("--target", type=float, help="the validation loss to reach (default: see above)")
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    runs = [r for r in find_runs(args.paths) if r.final("val/loss") is not None]
    if not runs:
        sys.exit(f"report: no run folders with a validation loss under {', '.join(map(str, args.paths))}")
    text = report(runs, args.target)
    print(text, end="")
    if args.out:
        with atomic_write(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
