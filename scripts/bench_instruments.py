"""What the instability instruments cost: a log step against an ordinary step, as a fraction of training.

    python -m scripts.bench_instruments [--config configs/default.py] [--steps 20] [--set key=value ...]

Trains the config's model (on random byte tokens in a temporary folder, so no data is needed) with
one rank and two accumulation micro-steps (micro_batch_size = batch_size / 2: the noise scale is
measured then), and times in this process, medians over --steps:

* an ordinary step (``Trainer.train_step`` of an ordinary step: no instrument runs, no host sync);
* a measured step (``train_step`` of a log step: the gradient noise scale's norms, the update
  statistics' weight copy and the optimizer's diagnostics), plus what ``log_train`` then computes:
  the parts' measurements (the noise-scale estimate, the memory report, the statistics' transfer
  to the host), and the probe on the probe batch, timed on its own.

Prints each part in ms and the instruments' overhead at the config's log_interval and at 10:
(log-step extra) / (log_interval x ordinary step). Then QK-Clip's cost, on every step (its logit
maximum in the training forward, the MAX all-reduce and the rows' scaling): steps with it
alternate with ordinary steps, and the median of their per-pair ratios is printed.
"""
import argparse
from pathlib import Path

from study.bench import DEFAULT_CONFIG, instrument_costs
from train import Trainer


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--steps", type=int, default=20, help="timed repetitions of each part (median)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override, as train.py's --key=value")
    args = parser.parse_args(argv)
    return instrument_costs(args.config, args.set, args.steps, trainer_class=Trainer)


if __name__ == "__main__":
    main()
