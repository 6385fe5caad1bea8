"""Where a training step's time goes: tokens/s, FLOP/s against the device's limit, the step's parts,
and each optimizer's whole step against AdamW's.

    python -m scripts.bench_train [--config configs/default.py] [--set key=value ...] [--steps 20]
                                  [--warmup 3] [--compare adamw merit muon ...] [--no-parts] [--json FILE]
    python -m scripts.bench_train --set tokenizer=byte ... --models gpt2,vocab_size=50304 llama_130m,vocab_size=32128

Trains the config's model in this process (one rank) on random tokens of its tokenizer, written to
a temporary folder (no data needed), and prints:

* tokens/s of ordinary steps: the loop's own iteration (``Trainer.train_step`` and
  ``Trainer.after_step``: QK-Clip and Sophia-G's extra pass where the config has them; no
  instrument runs), the mean over --steps after --warmup (a periodic extra pass included);
* the achieved training FLOP/s (``GPT.flops_per_token`` x tokens/s: nanoGPT's and PaLM's count,
  attention included) against a measured large matmul in the compute dtype, the limit a step
  made of matmuls approaches (on a GPU also against the nominal bf16 peak: train.py's MFU);
* one ordinary step's parts (``train.SECTIONS``: a clock in ``Trainer.section`` that waits for the
  device at each boundary), each in ms and as a share of the step so timed; "other" is the rest
  (the lr schedule, the loss sum, Python);
* the instruments of a log step amortised over ``log_interval`` (their parts:
  scripts/bench_instruments);
* with --compare: one trainer per optimizer (the same model, batches and backend), their steps
  interleaved round by round (a shared machine's speed drifts by tens of percent), each one's
  mean step and its ratio to the first optimizer's, its tokens/s and FLOP/s;
* with --models: the same for one trainer per model preset (the config's optimizer), each
  ``PRESET[,KEY=VALUE...]`` with its own overrides (a family's vocabulary: the byte tokenizer's
  random tokens with ``vocab_size`` set run the embedding and LM head of any vocabulary), each
  one's shape, FLOP/s by its own ``flops_per_token`` and its step's parts.

``--no-parts`` leaves out the parts and the instruments (each costs steps of its own: for a
configuration whose steps take minutes, such as a large batch by gradient accumulation).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from study.bench import DEFAULT_CONFIG, step_costs
from train import SECTIONS, Trainer


def models(specs: list[str]) -> dict[str, list[str]]:
    """{preset: its trainer's extra overrides} of --models' ``PRESET[,KEY=VALUE...]``."""
    variants = {}
    for spec in specs:
        name, *settings = spec.split(",")
        bad = [s for s in settings if "=" not in s]
        if bad or not name:
            raise SystemExit(f"bench_train: --models {spec!r}: give PRESET or PRESET,KEY=VALUE,... "
                             f"(e.g. llama_130m,vocab_size=32128)")
        if name in variants:
            raise SystemExit(f"bench_train: --models names {name!r} twice: give each preset once")
        variants[name] = [f"--model={name}", *(f"--{setting}" for setting in settings)]
    return variants


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override, as train.py's --key=value")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (their mean)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    versus = parser.add_mutually_exclusive_group()
    versus.add_argument("--compare", nargs="+", metavar="OPTIMIZER",
                        help="optimizers whose whole steps are compared, interleaved, to the first's")
    versus.add_argument("--models", nargs="+", metavar="PRESET[,KEY=VALUE...]",
                        help="model presets (each with its own overrides) whose whole steps are compared, "
                             "interleaved, to the first's")
    parser.add_argument("--parts", action=argparse.BooleanOptionalAction, default=True,
                        help="time one step's parts and the log step's instruments (default: yes)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    results = step_costs(args.config, args.set, args.steps, args.warmup, args.parts, compare=args.compare,
                         models=models(args.models) if args.models else None, trainer_class=Trainer, sections=SECTIONS)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
