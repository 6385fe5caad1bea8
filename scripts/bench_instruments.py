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
import tempfile
from pathlib import Path

import torch

from scripts.bench_train import ROOT, log_step_ms, ordinary_step, paired_ratio, synthetic_trainer


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.py")
    parser.add_argument("--steps", type=int, default=20, help="timed repetitions of each part (median)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override, as train.py's --key=value")
    args = parser.parse_args(argv)

    from configs import load_config
    from training.noise_scale import GradientNoiseScale
    from training.qk_clip import QKClip

    overrides = [f"--{item}" for item in args.set]
    config = load_config(args.config, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = synthetic_trainer(args.config, overrides + ["--tokenizer=byte",
                                                             f"--micro_batch_size={max(1, config.batch_size // 2)}"],
                                    Path(tmp))
        try:
            assert trainer.parts.find(GradientNoiseScale) is not None, \
                "the noise scale needs accumulation: batch_size >= 2"

            def clipped():
                with qk_clip.measuring():
                    ordinary_step(trainer)
                qk_clip.apply(torch.ones((), dtype=torch.bool))

            step_ms, measured_ms, probe_ms = log_step_ms(trainer, args.steps)
            qk_clip = QKClip(trainer.model, tau=100.0, ctx=trainer.ctx)
            clipped_ms, clipped_ratio = paired_ratio(clipped, lambda: ordinary_step(trainer), args.steps)
        finally:
            trainer.close()
    config, m = trainer.config, trainer.model_config
    extra = measured_ms - step_ms + probe_ms
    print(f"model {config.model}: {m.n_layer} layers, {m.n_head} heads, {m.n_embd} dims, block {m.block_size}; "
          f"batch {config.batch_size} = {config.micro_batch_size} x 2 micro-steps; probe batch {config.probe_batch_size}")
    print(f"ordinary step {step_ms:.1f} ms; measured step {measured_ms:.1f} ms (+{measured_ms - step_ms:.1f}); "
          f"probe {probe_ms:.1f} ms; a log step's instruments: {extra:.1f} ms = {extra / step_ms:.2f} steps")
    for interval in sorted({config.log_interval, 10}):
        print(f"overhead at log_interval {interval}: {100 * extra / (interval * step_ms):.2f}% of training time")
    print(f"QK-Clip on every step: {clipped_ms:.1f} ms a step, {100 * (clipped_ratio - 1):+.1f}% (median of "
          f"{args.steps} pairs with an ordinary step)")
    return {"step_ms": step_ms, "measured_step_ms": measured_ms, "probe_ms": probe_ms, "log_step_extra_ms": extra,
            "qk_clip_step_ms": clipped_ms, "qk_clip_ratio": clipped_ratio}


if __name__ == "__main__":
    main()
