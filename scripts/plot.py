"""The study's figures (PNG) from run folders: the paper's plots for any set of runs.

    python -m scripts.plot sweeps/merit-batch runs/gpt2-small-owt --out figures/

Writes into --out (default: figures/):
* ``val_loss.png``: validation loss against training tokens, a line per run at its point's best
  lr (colour: optimizer, style: batch size);
* ``max_logit.png``: the per-layer maximum attention logit over steps on a log scale (the paper's
  figure), a panel per optimizer and batch (at its best lr, first seed), a line per layer;
* ``scaling.png``: final validation loss against batch size per optimizer, each point at the
  optimizer's best lr for that batch, the bar the spread (std) over seeds;
* ``merit_diagnostics.png`` (when a MERIT run logged them): per layer, the fraction of
  element-wise clipped updates and the trust-ratio spread (max / min) over steps;
* ``max_logit_heads.png``: layer x head heatmaps of the max attention logit at four steps, for
  the runs (best lr) with the largest final logits;
* ``attn_entropy.png``: per layer, the lowest head's attention entropy over steps, a panel per run;
* ``noise_scale.png``: the gradient noise scale B_simple over steps, each run's batch (tokens) dashed.
The last three are drawn where the runs logged those keys (train.py does at every log step).
"""
import argparse
import sys
from pathlib import Path

from study.plot import draw_all
from study.runs import find_runs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="run folders, sweep folders or folders above them")
    parser.add_argument("--out", type=Path, default=Path("figures"), help="where the PNGs go (default: figures/)")
    args = parser.parse_args(argv)
    runs = [r for r in find_runs(args.paths) if r.series("val/loss")[0]]
    if not runs:
        sys.exit(f"plot: no run folders with a validation loss under {', '.join(map(str, args.paths))} "
                 f"(a run folder holds config.json and metrics.jsonl)")
    written = draw_all(runs, args.out)
    print(f"{len(runs)} runs -> " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()
