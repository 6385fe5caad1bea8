"""The study's tables (markdown) from run folders, like the paper's.

    python -m scripts.report sweeps/merit-batch --target 3.3 --out report.md
    python -m scripts.report runs/mini_study --report-on heldout/loss   # lrs chosen on val/loss
    python -m scripts.report docs/demo/runs.tar.xz --out docs/demo/runs.md --update docs/results/default_job.md

Runs are grouped into points (study/runs.py): every config key but the lr and the seeds, named
by what varies across the runs (the optimizer, its ablation, QK-Norm or QK-Clip, and any other
key: "adamw, n_layer=24"); runs of different points are never averaged. Each point's lr is the
one with the lowest mean final ``--select-on`` (default val/loss) among the lrs all of whose
seeds finished; an lr on the grid's edge is flagged. The numbers come from ``--report-on``
(default the same; heldout/loss, train.py's held-out validation tokens, keeps the choice of lr
from flattering them). Cells are mean ± std [±95% t-interval half-width] over seeds. Tables:
* the final loss per point and batch, at the selected lr;
* against AdamW: each point minus AdamW at the same batch and other keys, paired by seed (the
  difference's mean and 95% interval), and minus AdamW's mean at its smallest batch (the paper's Δ);
  the same against MERIT and against Muon, where the runs hold them;
* the whole lr grid: the final loss of every lr, the seeds that finished, the peak and final max
  attention logit (the largest layer), diverged lrs included;
* the max attention logit per layer at every lr (the selected one marked): its peak and final values;
* where runs soft-capped a logit or added z-loss: the raw and capped logits and the final log Z; where
  they logged their optimizer's second moment: its largest element and l2 norm beside the max logit;
  where a run warmed its sequence length up: the steps, tokens trained and tokens read of each point;
* steps and tokens to reach ``--target`` (default: the highest of the points' best final losses,
  so that every point has a value), interpolated between evaluations;
* zero-shot scores (the final ``zero_shot/<task>/<metric>`` values, and their mean accuracy), when logged;
* the Hessian's top eigenvalue and trace (scripts/hessian.py's ``hessian.json``), when present and
  of the run folder's checkpoint of its step (study/runs.py; another model's is named on stderr);
* where the runs reach a batch of one sequence (scripts/mini_study.py --preset small_batch), or
  with ``--small-batch``, the small-batch section (Marek et al. 2025's claims): each point against
  its optimizer's largest batch, paired by seed (AdamW with beta2 by half-life against AdamW's with
  fixed betas); against every AdamW point at the same batch; the range of good lrs (those next to
  the best whose seed-0 loss is within 1% of its, and that range's width, also interpolated in log
  lr; "≥" where it reaches the grid's edge); the wall time per million tokens and per step with the
  micro-batch and the micro-steps accumulated;
* the critical batch size over training of each run that holds branches (scripts/cbs.py): per
  checkpoint k* and B* by ``--epsilon`` on the ``--ema``-smoothed losses (and by the interval of
  the paired differences with several seeds), beside the run's live B_simple.

``--update FILE`` rewrites the tables of FILE (docs/results/*.md) that come from this report: each block
``<!-- report: PATH [SELECT_ON REPORT_ON], SECTION -->`` ... ``<!-- end -->`` whose PATH is the one
path given gets that section's first table (tests/test_doc_numbers.py checks they agree).
"""
import argparse
import sys
from pathlib import Path

from atomic import atomic_write
from study.report import fill_blocks, report
from study.runs import branch_runs, study_arguments, study_runs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    study_arguments(parser, "the tables report")
    parser.add_argument("--target", type=float, help="the loss to reach (default: see above)")
    parser.add_argument("--epsilon", type=float, default=0.01, help="the critical batch's rule: the loss a larger "
                                                                    "batch may lose (scripts/cbs.py)")
    parser.add_argument("--ema", type=float, default=0.5, help="the critical batch's rule: the loss's smoothing")
    parser.add_argument("--small-batch", action="store_true", default=None,
                        help="add the small-batch section also where the runs do not reach a batch of one sequence "
                             "(see above)")
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument("--update", type=Path, metavar="FILE", help="refresh FILE's blocks of this report's tables")
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.paths if not Path(path).exists()]
    if missing:
        sys.exit(f"report: {', '.join(missing)} {'does' if len(missing) == 1 else 'do'} not exist: give run folders "
                 f"(each with config.json and metrics.jsonl), folders of them, or .tar.xz archives of them")
    runs = study_runs(args, "report")
    text = report(runs, args.target, args.select_on, args.report_on, branch_runs(args.paths), args.epsilon, args.ema,
                  small_batch=args.small_batch)
    print(text, end="")
    if args.out:
        with atomic_write(args.out, "w") as f:
            f.write(text)
    if args.update:
        if len(args.paths) != 1:
            sys.exit("report: --update takes the tables of one path (the one its blocks name)")
        with atomic_write(args.update, "w") as f:
            f.write(fill_blocks(args.update.read_text(), str(args.paths[0]), text))


if __name__ == "__main__":
    main()
