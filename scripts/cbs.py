"""The critical batch size of a run by branching (Merrill et al. 2025; study/cbs.py, docs/batch.md).

    python -m scripts.cbs RUN --branch-tokens 65536                       # every numbered checkpoint before the end
    python -m scripts.cbs RUN --steps 200,400 --multipliers 0.25,0.5,1,2,4,8,16 --seeds 0,1,2 \\
        --branch-tokens 65536 --beta-scaling half-life --launch local
    python -m scripts.cbs RUN ... --launch slurm --gpus-per-node 8        # writes RUN/branches/cbs.sbatch
    python -m scripts.cbs RUN --launch none                               # the table of what finished

RUN is a run folder with numbered checkpoints (ckpt_<step>.pt: train it with
``permanent_checkpoint_interval``). From each chosen checkpoint (``--steps``; default: every one
that leaves ``--branch-tokens`` of the run), for each multiplier k and seed, a branch trains
``--branch-tokens`` more tokens at batch k x B with the lr times sqrt(k) (``--lr-scaling``) and
the decays the parent holds at their half-life in tokens (its ``batch_half_life_betas``) at that
half-life, beta ** k (``--beta-scaling``: ``parent`` by default; ``none``, or ``half-life`` with the
decays of ``--scale-betas``; the branch's config records the rule it trained with), on the parent's
lr schedule in tokens. Each branch
is a run folder, RUN/branches/step_<step>/k<k>_s<seed>, with its config (branch.py) and a copy of
the parent's checkpoint (seed s: the data read from s x branch tokens past the parent's position).
``--launch local`` trains the unfinished branches in this process, one after another (a killed
command resumes them: run it again), or under torchrun with ``--nproc-per-node``; ``--launch slurm``
writes an array job of them. Then it prints, per checkpoint, k* and B* = k* x B by the paper's rule
(``--epsilon`` on the EMA-smoothed final loss, ``--ema``) and, with several seeds, by the 95%
interval of the paired loss differences, beside the run's live B_simple; ``--json`` writes them.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from configs import SCALINGS, ConfigError
from study import cbs
from study.runs import find_runs
from study.sweep import add_slurm_arguments, write_sbatch

SEEDS = "the seeds (each reads the data from seed x branch tokens on) comma-separated, e.g. 0,1,2"
MULTIPLIERS = "the batch multipliers k comma-separated, e.g. 0.25,0.5,1,2,4"
EMA = "the weight of each new loss in the smoothed loss, in (0, 1], e.g. 0.5"


def _number(kind, positive: bool, fix: str):
    """An argparse type: a ``kind`` value > 0 (``positive``) or >= 0; else the error, ending "give ``fix``"."""
    what = f"{'a whole number' if kind is int else 'a number'} {'>' if positive else '>='} 0"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not (value > 0 if positive else value >= 0):  # (nan is neither)
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}: give {fix}")
        return value
    return parse


def _numbers(kind, positive: bool, fix: str):
    """An argparse type: comma-separated values of ``_number``, each given once."""
    number = _number(kind, positive, fix)

    def parse(text: str) -> list:
        values = [number(piece) for piece in text.split(",")]
        twice = sorted({value for value in values if values.count(value) > 1})
        if twice:
            raise argparse.ArgumentTypeError(f"{text} gives {', '.join(f'{v:g}' for v in twice)} twice: give each once")
        return values
    return parse


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.cbs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder with numbered checkpoints")
    parser.add_argument("--steps", type=_numbers(int, False, "the checkpoints' steps comma-separated, e.g. 200,400"),
                        help="the checkpoints' steps, comma-separated (default: every numbered one that leaves "
                             "--branch-tokens of the run)")
    parser.add_argument("--multipliers", type=_numbers(float, True, MULTIPLIERS), default="0.25,0.5,1,2,4,8",
                        help="the batch multipliers k")
    parser.add_argument("--branch-tokens", type=_number(int, True, "the tokens each branch trains (a whole number of "
                                                                    "steps of every branch), e.g. 65536"),
                        help="tokens each branch trains (required to plan branches)")
    parser.add_argument("--lr-scaling", choices=list(SCALINGS), default="sqrt", help="the lr times f(k)")
    parser.add_argument("--beta-scaling", choices=["parent", "none", "half-life"], default="parent",
                        help="parent (default): the parent's own rule, the decays its batch_half_life_betas names "
                             "at their half-life in tokens (none if it names none); none: the parent's betas at "
                             "every k; half-life: the decays of --scale-betas. A branch's config records the rule "
                             "in its batch_half_life_betas")
    parser.add_argument("--scale-betas", default="beta2", metavar="KEYS",
                        help="with --beta-scaling half-life, the decays scaled, each where the parent's optimizer "
                             "declares it (optim.batch_decays: beta1, beta2, Muon's momentum, ...; default beta2)")
    parser.add_argument("--seeds", type=_numbers(int, False, SEEDS), default="0",
                        help="the branches' seeds, comma-separated (their data offsets)")
    parser.add_argument("--epsilon", type=_number(float, False, "the loss a larger batch may lose, e.g. 0.01"),
                        default=0.01, help="the loss a larger batch may lose")
    parser.add_argument("--ema", type=_number(float, True, EMA), default=0.5,
                        help="the smoothing of the training loss")
    parser.add_argument("--launch", choices=["none", "local", "slurm"], default="none",
                        help="none: write the branches, print what finished; local: train them here; slurm")
    parser.add_argument("--nproc-per-node", type=int, default=1, help="local: ranks per branch (slurm: the GPUs)")
    parser.add_argument("--json", type=Path, help="also write the measurements to this file")
    add_slurm_arguments(parser)
    args = parser.parse_args(argv)
    if args.ema > 1:
        parser.error(f"--ema {args.ema:g} is above 1: give {EMA}")
    if args.run.is_file():
        parser.error(f"argument run: {args.run} is a file: give the run folder that holds the checkpoints, "
                     f"{args.run.parent}")
    if not args.run.is_dir():
        parser.error(f"argument run: {args.run} does not exist: give a run folder with numbered checkpoints "
                     f"(ckpt_<step>.pt)")
    run = args.run.resolve()
    try:
        if args.branch_tokens is None:
            branches = []
            if not (run / cbs.BRANCHES).is_dir():
                raise ConfigError(f"{run} holds no branches yet: give --branch-tokens to plan them")
        else:
            betas = {"parent": None, "none": (), "half-life": tuple(args.scale_betas.split(","))}[args.beta_scaling]
            world_size = args.gpus_per_node * args.nodes if args.launch == "slurm" else args.nproc_per_node
            branches = cbs.plan(run, args.steps, sorted(args.multipliers), args.branch_tokens, args.lr_scaling, betas,
                                args.seeds, world_size)
            cbs.check_written(branches)
            cbs.write(branches, run, shlex.join(["python", "-m", "scripts.cbs", *(argv or sys.argv[1:])]))
    except (ConfigError, ValueError, OSError) as error:
        sys.exit(f"cbs: {error}")
    if branches:
        finished = sum(b.status() == "finished" for b in branches)
        print(f"cbs: {len(branches)} branches of {run} ({finished} finished)")
    if args.launch == "local":
        import train  # (the top layer hands train.py's entry point down; only a local launch needs it)
        failed = cbs.launch_local(branches, args.nproc_per_node, train.main)
        if failed:
            sys.exit(f"cbs: {len(failed)} of {len(branches)} branches failed: {', '.join(failed)}")
    elif args.launch == "slurm":
        path = write_sbatch(branches, f"cbs-{run.name}", run / cbs.BRANCHES, args, script="cbs")
        print(f"wrote {path}: submit it with\n  sbatch {path}\n(then run this command with --launch none for "
              f"the table)")
    measurements = cbs.measured_runs(find_runs([run]), args.epsilon, args.ema).get(run, [])
    if measurements:
        print(cbs.table(measurements, args.epsilon))
    else:
        print("no checkpoint has all its branches finished yet: --launch local trains them")
    if args.json:
        cbs.save_json(measurements, args.json)


if __name__ == "__main__":
    main()
