"""The study's figures (PNG) from run folders: the paper's plots for any set of runs.

    python -m scripts.plot sweeps/merit-batch runs/gpt2-small-owt --out figures/

Runs are grouped into points (study/runs.py: every config key but the lr and the seeds), each
drawn at its selected lr (the lowest mean ``--select-on`` among the lrs all of whose seeds
finished), its seeds as a band from the lowest to the highest around their mean. Logit axes are
symmetric-log (linear within [-1, 1]), so a logit <= 0 is drawn where it is. Writes into --out
(default: figures/):
* ``val_loss.png``: the selection metric against training tokens (colour: point, style: batch);
* ``max_logit.png``: the per-layer maximum attention logit over steps (the paper's figure), a
  panel per point and batch, a line per layer;
* ``scaling.png``: final loss against the global batch at the fixed token budget, a line per
  point (circled: the selected lr is on its grid's edge, so the best may lie beyond);
* ``peak_logit.png``: the peak max attention logit (the largest layer) against the batch;
* ``merit_diagnostics.png`` (when plain MERIT logged them): per layer, the fraction of element-wise
  clipped updates and the trust-ratio spread (max / min) over steps, at MERIT's largest batch;
* ``max_logit_heads.png``: layer x head heatmaps of the max attention logit at four steps, for
  the points with the largest final logits;
* ``attn_entropy.png``: per layer, the lowest head's attention entropy over steps, a panel per point;
* ``noise_scale.png``: the gradient noise scale B_simple over training, each point's batch (tokens) dashed.
The last four are drawn where the runs logged those keys (train.py does at every log step).
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
    parser.add_argument("--select-on", default="val/loss", help="the metric each point's lr is chosen on")
    args = parser.parse_args(argv)
    runs = [r for r in find_runs(args.paths) if r.series(args.select_on)[0]]
    if not runs:
        sys.exit(f"plot: no run folders with a validation loss under {', '.join(map(str, args.paths))} "
                 f"(a run folder holds config.json and metrics.jsonl)")
    written = draw_all(runs, args.out, args.select_on)
    print(f"{len(runs)} runs -> " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()
