"""The study's figures (PNG) from runs: the paper's plots for any set of runs.

    python -m scripts.plot sweeps/merit-batch runs/gpt2-small-owt --out figures/
    python -m scripts.plot docs/mini_study/runs.tar.xz --report-on heldout/loss --out docs/mini_study/figures

The paths are run folders (config.json and metrics.jsonl), sweep folders, any folder above them,
or .tar.xz archives of runs (``scripts/mini_study.py --archive`` packs one), as for
scripts/report.py. Runs are grouped into points (study/runs.py: every config key but the lr and
the seeds), each drawn at its selected lr (the lowest mean final ``--select-on``, default
val/loss, among the lrs all of whose seeds finished: scripts/report.py's rule), its seeds as a
band from the lowest to the highest around their mean. The loss figures draw ``--report-on``
(default: --select-on), so that with the same two options they show the numbers of
scripts/report.py's tables. Logit axes are symmetric-log (linear within [-1, 1]), so a logit
<= 0 is drawn where it is. Writes into --out (default: figures/):
* ``val_loss.png``: the --report-on metric against training tokens, a panel per batch, a colour
  per point;
* ``max_logit.png``: the per-layer maximum attention logit over steps (the paper's figure), a
  panel per point and batch, a line per layer;
* ``scaling.png``: the final --report-on metric against the global batch at the fixed token
  budget, a line per point (the report's loss table; circled: the selected lr is on its grid's
  edge, so the best may lie beyond);
* ``peak_logit.png``: the peak max attention logit (the largest layer) against the batch;
* ``merit_diagnostics.png`` (when plain MERIT logged them): per layer, the fraction of element-wise
  clipped updates and the trust-ratio spread (max / min) over steps, at MERIT's largest batch;
* ``max_logit_heads.png``: layer x head heatmaps of the max attention logit at four steps, for
  the points with the largest final logits;
* ``attn_entropy.png``: per layer, the lowest head's attention entropy over steps, a panel per point;
* ``noise_scale.png``: the gradient noise scale B_simple over training, each point's batch (tokens) dashed;
* ``cbs_branches.png`` (runs with branches, scripts/cbs.py): a panel per branched checkpoint, each
  multiplier's EMA-smoothed training loss over its branch (the mean over seeds);
* ``cbs.png``: the critical batch B* over training by the paper's rule (``--epsilon``, ``--ema``)
  with the live B_simple beside it, one line per run, a panel per optimizer;
* ``small_batch.png`` (where the runs reach a batch of one sequence, or ``--small-batch``: the
  report's small-batch section, scripts/mini_study.py --preset small_batch): the final --report-on metric
  against the batch, a panel per optimizer, a line per point with its seeds' range as error bars,
  AdamW's points grey in the other panels;
* ``seq_len_warmup.png`` (where some run warmed its sequence length up, scripts/mini_study.py --preset
  seq_len_warmup): against the tokens trained, a row per batch, the --report-on metric, the max attention
  logit (the largest layer) and the largest element of the optimizer's second moment, a line per point.
All but the two loss figures are drawn where the runs logged their keys (train.py does at every
log step). A point has one colour in every figure, a layer one in every per-layer figure.
"""
import argparse
import os
import sys
from pathlib import Path

from study.plot import draw_all
from study.runs import branch_runs, study_arguments, study_runs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    study_arguments(parser, "the loss figures draw")
    parser.add_argument("--out", type=Path, default=Path("figures"), help="where the PNGs go (default: figures/)")
    parser.add_argument("--epsilon", type=float, default=0.01, help="the critical batch's rule (scripts/cbs.py)")
    parser.add_argument("--ema", type=float, default=0.5, help="the critical batch's rule: the loss's smoothing")
    parser.add_argument("--small-batch", action="store_true", default=None,
                        help="draw small_batch.png also where the runs do not reach a batch of one sequence")
    args = parser.parse_args(argv)
    check_out(args.out)  # (before the runs are read)
    runs = study_runs(args, "plot")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # (e.g. under /proc, which even root cannot write)
        sys.exit(f"plot: --out {args.out}: cannot make the folder ({error.strerror}); choose a writable folder")
    written = draw_all(runs, args.out, args.select_on, args.report_on, branch_runs(args.paths), args.epsilon, args.ema,
                       small_batch=args.small_batch)
    print(f"{len(runs)} runs, lrs selected on {args.select_on}, losses drawn on {args.report_on or args.select_on} -> "
          + ", ".join(map(str, written)))


def check_out(out: Path) -> None:
    """Exit with a message if ``out`` cannot be the figures' folder: a file (never replaced), or
    below a file or a folder this user cannot write."""
    if out.exists() and not out.is_dir():
        sys.exit(f"plot: --out {out} is a file, not a folder for the figures: choose a folder (figures/ by default)")
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        sys.exit(f"plot: --out {out}: cannot make the folder ({existing} is a file); choose a folder elsewhere")
    if not os.access(existing, os.W_OK | os.X_OK):
        sys.exit(f"plot: --out {out}: cannot write the folder ({existing} is not writable); choose a writable folder")


if __name__ == "__main__":
    main()
