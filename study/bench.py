"""Timing training in this process, on random tokens: what the benchmarks (scripts/bench_*.py) and
the GPU checks (scripts/check_cuda.py) share.

* the timers: a call's ms with the device waited for at both ends (``timed_ms``), medians of
  repeated calls (``median_ms``) and of the ratios of two interleaved ones (``paired_ratio``);
* a trainer of a config on 2M random tokens of its tokenizer written to a folder
  (``synthetic_trainer``: no data needed), an ordinary iteration of its loop (``loop_step``), its
  ``train_step`` alone (``ordinary_step``), a log step's instruments (``log_step_ms``) and one
  step's parts by a clock in ``Trainer.section`` (``breakdown``);
* two whole measurements: scripts/bench_train's (``step_costs``: tokens/s, FLOP/s, the parts, the
  optimizers or models against each other) and scripts/bench_instruments' (``instrument_costs``),
  which scripts/check_cuda.py runs on GPT-2 Small too.

train.py sits above this library (tests/test_layers.py): the script that builds a trainer hands in
``train.Trainer`` (``trainer_class``) and, for the parts, ``train.SECTIONS`` (``sections``).
"""
from __future__ import annotations

import contextlib
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

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "default.py"


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


def synthetic_trainer(config_path: Path, overrides: list[str], folder: Path, run_name: str = "bench", *,
                      trainer_class):
    """A Trainer (``trainer_class``: train.Trainer) of the config (train.py's ``--key=value``
    overrides) on 2M random tokens of its tokenizer written under ``folder``: no data, no wandb,
    nothing kept."""
    from configs import load_config
    from data.shards import write_shard
    from data.tokenizer import get_tokenizer
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
    return trainer_class(resolve_config(config))


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


class SectionClock:
    """``Trainer.section``'s stand-in: the wall time of each part, the device waited for at both ends.
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


def breakdown(trainer, steps: int, sections: tuple[str, ...]) -> tuple[dict[str, float], float]:
    """({section: ms per step}, the whole step's ms) over ``steps`` ordinary steps timed by parts,
    in the order of ``sections`` (train.SECTIONS)."""
    clock, saved = SectionClock(trainer.device), trainer.section
    trainer.section = clock
    try:
        total = sum(timed_ms(lambda: loop_step(trainer), trainer.device) for _ in range(steps)) / steps
    finally:
        trainer.section = saved
    parts = {name: clock.ms[name] / steps for name in sections if name in clock.ms}
    parts["other"] = max(0.0, total - sum(parts.values()))
    return parts, total


def describe(trainer) -> str:
    """The trainer's model, batch, dtype, device and optimizer in one line."""
    config, m, model = trainer.config, trainer.model_config, trainer.model
    return (f"model {config.model}: {m.n_layer} layers, {m.n_head} heads, {m.n_embd} dims, block {m.block_size}, "
            f"vocab {m.vocab_size} ({model.num_params() / 1e6:.2f}M parameters); batch {config.batch_size} = micro "
            f"{config.micro_batch_size} x {trainer.schedule.accumulation}; {trainer.dtype} on {trainer.device} "
            f"({torch.get_num_threads()} threads); optimizer {config.optimizer}, compile {config.compile}")


def throughput(trainer, step_ms: float, peak: float) -> tuple[float, float, str]:
    """(tokens/s, training FLOP/s by the model's flops_per_token, both in words) of steps of step_ms."""
    tokens_per_s = trainer.schedule.batch_schedule.tokens_per_step(trainer.step) / (step_ms / 1e3)
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


def step_costs(config_path: Path, settings: list[str], steps: int, warmup: int, parts: bool,
               compare: list[str] | None = None, models: dict[str, list[str]] | None = None, *,
               trainer_class, sections: tuple[str, ...]) -> dict:
    """scripts/bench_train's measurement (its docstring), printed and returned: the config with
    ``settings`` (KEY=VALUE, train.py's overrides without their dashes), ``steps`` timed steps after
    ``warmup``, the parts and the instruments if ``parts``; with ``compare`` (optimizer names) or
    ``models`` ({preset: its trainer's extra ``--key=value`` overrides}) one trainer each, compared
    to the first's."""
    overrides = [f"--{item}" for item in settings]
    if compare:
        variants = {name: [f"--optimizer={name}", "--optimizer_options={}"] for name in compare}
    else:
        variants = models or {None: []}
    names = list(variants)

    results = {"config": str(config_path), "overrides": settings}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {}
        try:
            for i, name in enumerate(names):
                trainers[name] = synthetic_trainer(config_path, overrides + variants[name], Path(tmp),
                                                   run_name=f"bench{i}", trainer_class=trainer_class)
            first = trainers[names[0]]
            device, config = first.device, first.config
            for trainer in trainers.values():
                for _ in range(warmup):
                    loop_step(trainer)
            # Whole steps, the trainers taking turns.
            step_ms = {name: [] for name in names}
            for _ in range(steps):
                for name, trainer in trainers.items():
                    step_ms[name].append(timed_ms(lambda: loop_step(trainer), device))
            if parts:
                parted = {name: breakdown(trainer, steps, sections) for name, trainer in trainers.items()}
                ordinary_ms, measured_ms, probe_ms = log_step_ms(first, max(3, steps // 4))
            peak = matmul_flops(device, first.dtype)
        finally:
            for trainer in trainers.values():
                trainer.close()

    # Means, not medians: Sophia-G's extra pass every 10 steps belongs to its average step.
    mean = {name: statistics.fmean(times) for name, times in step_ms.items()}
    tokens_per_s, flops, words = throughput(first, mean[names[0]], peak)
    print(describe(first))
    print(f"step {mean[names[0]]:.1f} ms (mean of {steps}), {words}")
    results.update(model=config.model, params=first.model.num_params(), dtype=str(first.dtype), device=str(device),
                   step_ms=mean[names[0]], tokens_per_s=tokens_per_s, flops=flops, matmul_flops=peak)
    if parts:
        first_parts, parted_ms = parted[names[0]]
        instruments_ms = (measured_ms + probe_ms - ordinary_ms) / config.log_interval
        print_parts(first_parts, parted_ms)
        print(f"  {'instruments':12s} {instruments_ms:9.2f} ms  {100 * instruments_ms / mean[names[0]]:5.1f}%  "
              f"(a log step's, amortised over log_interval {config.log_interval})")
        results.update(parts_ms=first_parts, parts_step_ms=parted_ms, instruments_ms=instruments_ms)
    for name in names[1:] if models else []:  # each other model's shape and parts
        print(describe(trainers[name]))
        if parts:
            print_parts(*parted[name])
    if compare or models:
        print(f"whole steps, interleaved ({steps} rounds), mean against {names[0]}'s"
              + ("; the optimizer's part of a step:" if parts else ":"))
        results["compare"] = {}
        for name in names:
            ratio = mean[name] / mean[names[0]]
            name_tokens_per_s, name_flops, _ = throughput(trainers[name], mean[name], peak)
            results["compare"][name] = {"step_ms": mean[name], "ratio": ratio, "tokens_per_s": name_tokens_per_s,
                                        "flops": name_flops, "params": trainers[name].model.num_params()}
            line = (f"  {name:10s} {mean[name]:9.1f} ms  {ratio:6.3f}x  {name_tokens_per_s:10,.0f} tokens/s  "
                    f"{name_flops / 1e9:7.1f} GFLOP/s = {100 * name_flops / peak:4.1f}%")
            if parts:
                name_parts, name_ms = parted[name]
                optimizer_ms = name_parts.get("optimizer", 0.0)
                line += f"   optimizer {optimizer_ms:8.2f} ms = {100 * optimizer_ms / name_ms:4.1f}%"
                results["compare"][name]["parts_ms"] = name_parts
            print(line)
    return results


def instrument_costs(config_path: Path, settings: list[str], steps: int, *, trainer_class) -> dict:
    """scripts/bench_instruments' measurement (its docstring), printed and returned: the config with
    ``settings`` (KEY=VALUE), medians over ``steps``."""
    from configs import load_config
    from training.noise_scale import GradientNoiseScale
    from training.qk_clip import QKClip

    overrides = [f"--{item}" for item in settings]
    config = load_config(config_path, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = synthetic_trainer(config_path, overrides + ["--tokenizer=byte",
                                                             f"--micro_batch_size={max(1, config.batch_size // 2)}"],
                                    Path(tmp), trainer_class=trainer_class)
        try:
            assert trainer.parts.find(GradientNoiseScale) is not None, \
                "the noise scale needs accumulation: batch_size >= 2"

            def clipped():
                with qk_clip.measuring():
                    ordinary_step(trainer)
                qk_clip.apply(torch.ones((), dtype=torch.bool))

            step_ms, measured_ms, probe_ms = log_step_ms(trainer, steps)
            qk_clip = QKClip(trainer.model, tau=100.0, ctx=trainer.ctx)
            clipped_ms, clipped_ratio = paired_ratio(clipped, lambda: ordinary_step(trainer), steps)
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
          f"{steps} pairs with an ordinary step)")
    return {"step_ms": step_ms, "measured_step_ms": measured_ms, "probe_ms": probe_ms, "log_step_extra_ms": extra,
            "qk_clip_step_ms": clipped_ms, "qk_clip_ratio": clipped_ratio}
