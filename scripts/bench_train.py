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
* one ordinary step's parts (``train.PHASES``: a clock in ``Trainer.phase`` that waits for the
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
import contextlib
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from training.instruments import Probe
from training.metrics import Speed
from training.parts import Step

ROOT = Path(__file__).resolve().parents[1]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(fn, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return 1e3 * (time.perf_counter() - start)


def median_ms(fn, repeats: int, device: torch.device = torch.device("cpu")) -> float:
    fn()  # warm-up
    return statistics.median(timed_ms(fn, device) for _ in range(repeats))


def paired_ratio(fn, baseline, repeats: int, device: torch.device = torch.device("cpu")) -> tuple[float, float]:
    """(median ms of fn, median of fn's time over baseline's), the two alternating."""
    fn(), baseline()  # warm-up
    times, ratios = [], []
    for _ in range(repeats):
        base, ms = timed_ms(baseline, device), timed_ms(fn, device)
        times.append(ms)
        ratios.append(ms / base)
    return statistics.median(times), statistics.median(ratios)


def synthetic_trainer(config_path: Path, overrides: list[str], folder: Path, run_name: str = "bench"):
    """A Trainer of the config (train.py's ``--key=value`` overrides) on 2M random tokens of its
    tokenizer written under ``folder``: no data, no wandb, nothing kept."""
    from configs import load_config
    from data.shards import write_shard
    from data.tokenizer import get_tokenizer
    from train import Trainer
    from training.run_config import resolve_config

    tokenizer = load_config(config_path, overrides).tokenizer
    data = folder / "data" / tokenizer
    if not data.exists():
        rng = np.random.default_rng(0)
        vocab = get_tokenizer(tokenizer).n_vocab
        for split in ("train", "val"):
            write_shard(data / f"{split}_000000.bin", rng.integers(0, vocab, 2_000_000, dtype=np.uint16))
    config = load_config(config_path, overrides + [f"--data_dir={data}", f"--out_dir={folder / 'runs'}",
                                                   f"--run_name={run_name}", "--wandb_mode=disabled"])
    return Trainer(resolve_config(config))


def ordinary_step(trainer) -> None:
    """``Trainer.train_step`` of an ordinary step (no log step), the step counter left as it is."""
    trainer.train_step(Step(trainer.step + 1))


def loop_step(trainer) -> None:
    """An ordinary iteration of Trainer.train()'s loop, without its logging."""
    step = Step(trainer.step + 1)
    trainer.train_step(step)
    trainer.state.step += 1
    trainer.after_step(step)


def log_step_ms(trainer, repeats: int) -> tuple[float, float, float]:
    """(an ordinary ``train_step``, a measured one with the parts' measurements but the probe's,
    the probe), median ms each: what a log step adds is the measured step and the probe less the
    ordinary step (train.py's log_train runs these)."""
    probe = trainer.parts.find(Probe)
    others = [part for part in trainer.parts if part is not probe]

    def measured():
        step = Step(trainer.step + 1, log=True)
        trainer.train_step(step)
        for part in others:
            part.measure(step)

    return (median_ms(lambda: ordinary_step(trainer), repeats, trainer.device),
            median_ms(measured, repeats, trainer.device),
            median_ms(lambda: probe.measure(Step(trainer.step, log=True)), repeats, trainer.device))


class PhaseClock:
    """``Trainer.phase``'s stand-in: the wall time of each part, the device waited for at both ends.
    A part inside another (the forward of Sophia-G's extra pass) counts as the outer one's."""

    def __init__(self, device: torch.device):
        self.device, self.ms, self.inside = device, defaultdict(float), False

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.inside:
            yield
            return
        synchronize(self.device)
        start, self.inside = time.perf_counter(), True
        try:
            yield
        finally:
            synchronize(self.device)
            self.inside = False
            self.ms[name] += 1e3 * (time.perf_counter() - start)


def breakdown(trainer, steps: int) -> tuple[dict[str, float], float]:
    """({phase: ms per step}, the whole step's ms) over ``steps`` ordinary steps timed by parts."""
    from train import PHASES
    clock, saved = PhaseClock(trainer.device), trainer.phase
    trainer.phase = clock
    try:
        total = sum(timed_ms(lambda: loop_step(trainer), trainer.device) for _ in range(steps)) / steps
    finally:
        trainer.phase = saved
    parts = {name: clock.ms[name] / steps for name in PHASES if name in clock.ms}
    parts["other"] = max(0.0, total - sum(parts.values()))
    return parts, total


def compared(args) -> dict[str | None, list[str]]:
    """{label: its trainer's extra overrides}: the optimizers of --compare, the models of --models,
    or one trainer of the config as it is (label None)."""
    if args.compare:
        return {name: [f"--optimizer={name}", "--optimizer_options={}"] for name in args.compare}
    if args.models:
        variants = {}
        for spec in args.models:
            name, *settings = spec.split(",")
            bad = [s for s in settings if "=" not in s]
            if bad or not name:
                raise SystemExit(f"bench_train: --models {spec!r}: give PRESET or PRESET,KEY=VALUE,... "
                                 f"(e.g. llama_130m,vocab_size=32128)")
            if name in variants:
                raise SystemExit(f"bench_train: --models names {name!r} twice: give each preset once")
            variants[name] = [f"--model={name}", *(f"--{setting}" for setting in settings)]
        return variants
    return {None: []}


def describe(trainer) -> str:
    """The trainer's model, batch, dtype, device and optimizer in one line."""
    config, m, model = trainer.config, trainer.model_config, trainer.model
    return (f"model {config.model}: {m.n_layer} layers, {m.n_head} heads, {m.n_embd} dims, block {m.block_size}, "
            f"vocab {m.vocab_size} ({model.num_params() / 1e6:.2f}M parameters); batch {config.batch_size} = micro "
            f"{config.micro_batch_size} x {trainer.batches.accumulation}; {trainer.dtype} on {trainer.device} "
            f"({torch.get_num_threads()} threads); optimizer {config.optimizer}, compile {config.compile}")


def throughput(trainer, step_ms: float, peak: float) -> tuple[float, float, str]:
    """(tokens/s, training FLOP/s by the model's flops_per_token, both in words) of steps of step_ms."""
    tokens_per_s = trainer.batches.schedule.tokens_per_step(trainer.step) / (step_ms / 1e3)
    flops = trainer.model.flops_per_token() * tokens_per_s
    nominal = trainer.parts.find(Speed).peak_flops
    words = (f"{tokens_per_s:,.0f} tokens/s; {flops / 1e9:.1f} GFLOP/s = {100 * flops / peak:.1f}% of a "
             f"{peak / 1e9:.1f} GFLOP/s {str(trainer.dtype).removeprefix('torch.')} matmul here"
             + (f", MFU {100 * trainer.model.estimate_mfu(tokens_per_s, nominal):.1f}% of the nominal peak"
                if nominal else ""))
    return tokens_per_s, flops, words


def print_parts(parts: dict[str, float], parted_ms: float) -> None:
    print(f"one step by parts ({parted_ms:.1f} ms timed with a device wait at each boundary):")
    for name, ms in parts.items():
        print(f"  {name:12s} {ms:9.2f} ms  {100 * ms / parted_ms:5.1f}%")


def matmul_flops(device: torch.device, dtype: torch.dtype, repeats: int = 5) -> float:
    """FLOP/s of a large square matmul (n = 2048 on a CPU, 8192 on a GPU) in ``dtype``: what the
    device sustains on the operation a transformer's step is made of."""
    n = 8192 if device.type == "cuda" else 2048
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    ms = median_ms(lambda: a @ b, repeats, device)
    return 2 * n ** 3 / (ms / 1e3)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.py")
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
    overrides = [f"--{item}" for item in args.set]
    variants = compared(args)
    names = list(variants)

    results = {"config": str(args.config), "overrides": args.set}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {}
        try:
            for i, name in enumerate(names):
                trainers[name] = synthetic_trainer(args.config, overrides + variants[name], Path(tmp),
                                                   run_name=f"bench{i}")
            first = trainers[names[0]]
            device, config = first.device, first.config
            for trainer in trainers.values():
                for _ in range(args.warmup):
                    loop_step(trainer)
            # Whole steps, the trainers taking turns.
            step_ms = {name: [] for name in names}
            for _ in range(args.steps):
                for name, trainer in trainers.items():
                    step_ms[name].append(timed_ms(lambda: loop_step(trainer), device))
            if args.parts:
                parted = {name: breakdown(trainer, args.steps) for name, trainer in trainers.items()}
                ordinary_ms, measured_ms, probe_ms = log_step_ms(first, max(3, args.steps // 4))
            peak = matmul_flops(device, first.dtype)
        finally:
            for trainer in trainers.values():
                trainer.close()

    # Means, not medians: Sophia-G's extra pass every 10 steps belongs to its average step.
    mean = {name: statistics.fmean(times) for name, times in step_ms.items()}
    tokens_per_s, flops, words = throughput(first, mean[names[0]], peak)
    print(describe(first))
    print(f"step {mean[names[0]]:.1f} ms (mean of {args.steps}), {words}")
    results.update(model=config.model, params=first.model.num_params(), dtype=str(first.dtype), device=str(device),
                   step_ms=mean[names[0]], tokens_per_s=tokens_per_s, flops=flops, matmul_flops=peak)
    if args.parts:
        parts, parted_ms = parted[names[0]]
        instruments_ms = (measured_ms + probe_ms - ordinary_ms) / config.log_interval
        print_parts(parts, parted_ms)
        print(f"  {'instruments':12s} {instruments_ms:9.2f} ms  {100 * instruments_ms / mean[names[0]]:5.1f}%  "
              f"(a log step's, amortised over log_interval {config.log_interval})")
        results.update(parts_ms=parts, parts_step_ms=parted_ms, instruments_ms=instruments_ms)
    for name in names[1:] if args.models else []:  # each other model's shape and parts
        print(describe(trainers[name]))
        if args.parts:
            print_parts(*parted[name])
    if args.compare or args.models:
        print(f"whole steps, interleaved ({args.steps} rounds), mean against {names[0]}'s"
              + ("; the optimizer's part of a step:" if args.parts else ":"))
        results["compare"] = {}
        for name in names:
            ratio = mean[name] / mean[names[0]]
            name_tokens_per_s, name_flops, _ = throughput(trainers[name], mean[name], peak)
            results["compare"][name] = {"step_ms": mean[name], "ratio": ratio, "tokens_per_s": name_tokens_per_s,
                                        "flops": name_flops, "params": trainers[name].model.num_params()}
            line = (f"  {name:10s} {mean[name]:9.1f} ms  {ratio:6.3f}x  {name_tokens_per_s:10,.0f} tokens/s  "
                    f"{name_flops / 1e9:7.1f} GFLOP/s = {100 * name_flops / peak:4.1f}%")
            if args.parts:
                name_parts, name_ms = parted[name]
                optimizer_ms = name_parts.get("optimizer", 0.0)
                line += f"   optimizer {optimizer_ms:8.2f} ms = {100 * optimizer_ms / name_ms:4.1f}%"
                results["compare"][name]["parts_ms"] = name_parts
            print(line)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
