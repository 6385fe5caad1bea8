"""A grid of training runs from one base config: one run folder (and editable config file) per point.

    python -m scripts.sweep configs/paper/gpt2_small_merit_b480.py --name merit-batch \\
        --grid batch_size=480,1024,2048 --grid lr=1e-4,2e-4,4e-4 --grid seed=0,1 --set micro_batch_size=4 \\
        --lr-scaling sqrt --warmup-scaling tokens --dry-run             # print the plan
    python -m scripts.sweep ... --launch local --nproc-per-node 8     # run the points here, in turn
    python -m scripts.sweep ... --launch slurm --gpus-per-node 8   # write an sbatch array (one node a point)

``--grid KEY=V1,V2,...`` takes any config key (optimizer, batch_size, lr, seed, data_seed,
optimizer_options, ...; values are Python literals, a bare word a string); the grid is their
product (an lr axis brings min_lr along at the base config's ratio to lr). ``--set KEY=VALUE``
changes the base for every point. A key is named once in all of them. The invocation flags
(--resume, --overwrite, --allow_changes, --stop_at_step: what one run of train.py does with its
folder, not what it trains) are refused in both, the message saying how to pass one to a point's
own run (``python train.py OUT_DIR/NAME/POINT/point.py --stop_at_step=N``): the sweep runs every
point with --resume=auto, and a point file holding one would stop or restart its run at every rerun. Every point is checked when
the plan is made (its values against the config schema, its batch against its micro-batches over
the launch's ranks), before anything is written. Each point's config is written,
fully resolved, to ``OUT_DIR/NAME/POINT/point.py`` (open and edit it; the run writes its
config.json, metrics and checkpoints beside it, run_name = POINT, out_dir = OUT_DIR/NAME).

Learning-rate scaling across batch sizes (``--lr-scaling``): the grid's (or the config's) lr and
min_lr are for ``--base-batch`` (default: the base config's batch_size) and are multiplied by
batch / base (``linear``), its square root (``sqrt``, the Adam-family rule) or 1 (``none``).
Warmup scaling (``--warmup-scaling``): the base config's warmup at the base batch is kept as
the same number of steps at every batch (``steps``), as the same number of tokens (``tokens``:
fewer steps at larger batches), or left as the config says (``none``). Beta scaling
(``--beta-scaling half-life``, Marek et al. 2025, "Small Batch Size Training for Language
Models"): the decays ``--scale-betas`` names (beta2 by default; beta1, Muon's momentum) keep
their half-life in tokens, beta_new = beta ** (batch / base batch), from their resolved value at
the base batch (the config's, or the optimizer's published one); the report then says which
value went with each batch.

``--launch local`` runs the points one after another with torchrun (``--nproc-per-node``; one
process runs train.py directly; or ``--jobs`` of them at once, for small CPU runs), each with
``--resume=auto``: a finished point (its run trained what its file says, to the final step) is
skipped, an interrupted one resumes from its last checkpoint, a failed one is reported and the
others go on. A sweep folder holds one sweep: run the same command again to go on; another plan
into it is refused, naming the settings that differ, and new points join only with
``--add-points``; a point's file is never rewritten. A point file edited by hand is refused the
same way, the message naming the ways out (delete the file and rerun with --add-points: the sweep
writes it again; or move the edit to a point of its own); ``--dry-run`` shows the plan with the
point marked "edited".
``--launch slurm`` writes ``sweep.sbatch``, an array job (one task per point) running torchrun
on ``--nodes`` nodes with a c10d rendezvous on the job's first node, requeued on preemption
(SLURM signals the job ahead of its time limit; the ranks save at their next log step and the
task requeues itself; ``--resume=auto`` continues it), and prints how to submit it.
"""
import argparse
import shlex
import sys
from pathlib import Path

from configs import SCALINGS, ConfigError
from study.sweep import (add_slurm_arguments, check_written, grid_and_fixed, launch_local, plan, table, write_points,
                         write_sbatch)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="the base config file")
    parser.add_argument("--name", required=True, help="the sweep's name: its folder is OUT_DIR/NAME")
    parser.add_argument("--out-dir", default="sweeps", help="where sweep folders go (default: sweeps)")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...", help="a grid axis")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a change to the base")
    parser.add_argument("--lr-scaling", choices=list(SCALINGS), default="none")
    parser.add_argument("--warmup-scaling", choices=["none", "steps", "tokens"], default="none")
    parser.add_argument("--beta-scaling", choices=["none", "half-life"], default="none",
                        help="half-life: scale the decays of --scale-betas from --base-batch, their half-life "
                             "fixed in tokens")
    parser.add_argument("--scale-betas", default="beta2", metavar="KEYS",
                        help="with --beta-scaling half-life, the decays scaled, each where a point's optimizer "
                             "declares it (optim.batch_decays: beta1, beta2, Muon's momentum, ...; default beta2)")
    parser.add_argument("--base-batch", type=int, help="the batch the lr is given for (default: the config's)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    parser.add_argument("--add-points", action="store_true",
                        help="add the plan's new points to the sweep already in the folder")
    parser.add_argument("--launch", choices=["none", "local", "slurm"], default="none",
                        help="none: write the point files only (default); local: run them here; slurm: an sbatch")
    parser.add_argument("--nproc-per-node", type=int, default=1, help="local: processes per point (GPUs)")
    parser.add_argument("--jobs", type=int, default=1, help="local: points run at once (CPU runs; default 1)")
    add_slurm_arguments(parser)
    args = parser.parse_args(argv)
    out = Path(args.out_dir).resolve() / args.name  # the runs start in the repository root
    try:
        grid, fixed = grid_and_fixed(args.grid, args.set, str(out))
        betas = (tuple(key.strip() for key in args.scale_betas.split(","))
                 if args.beta_scaling == "half-life" else ())
        world_size = args.nodes * args.gpus_per_node if args.launch == "slurm" else args.nproc_per_node
        points = plan(args.config, grid, fixed, out, args.lr_scaling, args.warmup_scaling, args.base_batch, betas,
                      world_size)
        check_written(points, out, args.add_points, args.dry_run)
    except (ConfigError, ValueError) as error:
        sys.exit(f"sweep: {error}")
    print(f"sweep {args.name}: {len(points)} points in {out}")
    print(table(points))
    if args.dry_run:
        return
    write_points(points, args.config, shlex.join(["python", "-m", "scripts.sweep", *(argv or sys.argv[1:])]))
    if args.launch == "local":
        failed = launch_local(points, args.nproc_per_node, args.jobs)
        if failed:
            sys.exit(f"sweep: {len(failed)} of {len(points)} points failed: {', '.join(failed)}")
        print(f"sweep {args.name}: all {len(points)} points finished")
    elif args.launch == "slurm":
        path = write_sbatch(points, args.name, out, args)
        print(f"wrote {path}: submit it with\n  sbatch {path}\n(its tasks resume on requeue; rerun this command "
              f"with --dry-run to see which points finished)")
    else:
        print(f"wrote {len(points)} point configs; run them with --launch local or --launch slurm")


if __name__ == "__main__":
    main()
