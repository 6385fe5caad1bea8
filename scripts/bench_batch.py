"""What the batch axis costs (docs/batch.md, docs/performance.md): a batch schedule's per-step cost
against a fixed batch, a CBS branch's overhead over training the same tokens from scratch, and what
a token costs at small batches; and apart, what subnormal floats cost a model that has them.

    python -m scripts.bench_batch [schedule] [branch] [small] [--config FILE] [--set key=value ...]
                                  [--steps 40] [--repeats 3] [--optimizers adamw merit]
                                  [--batches 1 2 4 8 16 32 64] [--accumulated 64] [--rounds 10] [--json FILE]
    python -m scripts.bench_batch subnormal --checkpoint CKPT [--steps 40] [--rounds 10]

Each (all three by default) on the config's model in this process (one rank), on random tokens of
its tokenizer (study/bench.py's synthetic data); without ``--config``, schedule and branch take
configs/default.py and small the mini-study's model and settings (``mini_study_shape``: 4 layers,
4 heads, 64 dims, block 64, byte tokens), as overrides of configs/default.py:

* **schedule**: two trainers, one with the config's fixed batch and one with a batch schedule
  whose change lies beyond the run (the same batch, every step going through the schedule: the
  phase lookup, the lr in tokens, the phase check), their ordinary loop steps interleaved round
  by round; the mean step of each and their ratio (target: 1.00), per repeat;
* **branch**: a parent trained ``--steps`` steps with a kept checkpoint halfway; then, in turn, a
  k = 1 branch of it (scripts/cbs: planned, its start written, resumed, trained to the parent's
  end; log every step) and a run of the same config trained the same number of steps from
  scratch (log every step; the same schedule, stopped halfway: no evaluation but the step-0
  validation of one micro-batch), each through ``train.main`` in this process; their wall times
  and ratio, per repeat;
* **small**: per optimizer (``--optimizers``), one trainer per batch of ``--batches`` in one
  micro-batch, and one of ``--accumulated`` sequences as that many accumulated micro-batches of
  one; round by round every trainer trains the largest batch's sequences (64 steps of batch 1,
  one of batch 64), the trainers taking turns: the cost per token (microseconds, tokens/s) and
  its ratio to the largest batch's in the same round, medians over ``--rounds``. Then at the
  smallest batch what the loop costs: its step against the model's forward and backward plus the
  optimizer step timed bare on the same tensors (the same model and optimizer, batches read
  beforehand), and against that plus the gradient clip the config asks for, every optimizer's
  three taking turns in blocks of 10 steps, as a run steps one trainer over and over (the medians
  of a block's steps but its first, then of the rounds' and of a round's differences); and the
  loop step's parts (study/bench.py's section clock).

And, only when named, with ``--checkpoint``:

* **subnormal**: the checkpoint's model (``--checkpoint`` a checkpoint train.py wrote, or a run
  folder: its newest, RUN/ckpt.pt), one thread, ``--steps`` forwards and backwards of one
  sequence of random tokens a round, with IEEE floats and with subnormals flushed to zero
  (``flush_denormals``) in turn, ``--rounds`` rounds: each mode's median ms per step, their
  ratio, and the subnormal gradient entries of one step. A checkpoint whose attention logits ran
  away (the small-batch study's MERIT at batch 1, lr 0.00795 and up) shows what they cost.
"""
from __future__ import annotations

import argparse
import functools
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path
from typing import NamedTuple

import train
from study.bench import DEFAULT_CONFIG, breakdown, loop_step, synthetic_trainer, timed_ms
from study.mini_study import BASE

MEASUREMENTS = ("schedule", "branch", "small", "subnormal")
DEFAULT_MEASUREMENTS = MEASUREMENTS[:3]  # (subnormal needs a checkpoint)
# What of the mini-study's base config (study/mini_study.BASE) the small-batch measurement trains with.
SHAPE_KEYS = ("tokenizer", "model", "n_layer", "n_head", "n_embd", "block_size", "dropout", "lr_schedule", "grad_clip")


def schedule_ratio(config: Path, overrides: list[str], folder: Path, steps: int) -> tuple[float, float]:
    """(fixed batch ms per step, scheduled / fixed), ``steps`` ordinary steps each, interleaved."""
    fixed = synthetic_trainer(config, overrides, folder, run_name="fixed", trainer_class=train.Trainer)
    batch = fixed.config.batch_size
    scheduled = synthetic_trainer(config, [*overrides, f"--batch_schedule=[(0, {batch}), ({10 ** 15}, {2 * batch})]"],
                                  folder, run_name="scheduled", trainer_class=train.Trainer)
    try:
        for trainer in (fixed, scheduled):
            loop_step(trainer)  # warm-up
        times = {"fixed": [], "scheduled": []}
        for _ in range(steps):
            times["fixed"].append(timed_ms(lambda: loop_step(fixed), fixed.device))
            times["scheduled"].append(timed_ms(lambda: loop_step(scheduled), scheduled.device))
    finally:
        fixed.close()
        scheduled.close()
    base = statistics.fmean(times["fixed"])
    return base, statistics.fmean(times["scheduled"]) / base


def quietly(fn):
    with redirect_stdout(StringIO()), redirect_stderr(StringIO()):
        return fn()


def branch_ratio(config: Path, overrides: list[str], folder: Path, steps: int) -> tuple[float, float]:
    """(from-scratch seconds, branch / from scratch) for ``steps // 2`` steps each, on the tokens
    synthetic_trainer wrote under ``folder``."""
    from configs import load_config
    from study import cbs

    half = steps // 2
    data = folder / "data" / Path(load_config(config, overrides).tokenizer).name  # (a tokenizer may be a folder)
    common = [str(config), *overrides, f"--data_dir={data}", f"--out_dir={folder}", "--wandb_mode=disabled",
              "--sample_tokens=0", "--warmup_steps=2", "--val_tokens=1"]  # (validation: one micro-batch)
    if not (folder / "parent").is_dir():
        quietly(lambda: train.main([*common, "--run_name=parent", f"--max_steps={steps}",
                                    f"--permanent_checkpoint_interval={half}", f"--checkpoint_interval={half}"]))
    shutil.rmtree(folder / "parent" / cbs.BRANCHES, ignore_errors=True)
    parent = folder / "parent"
    start = time.perf_counter()
    branches = cbs.plan(parent, [half], [1.0], half * train_tokens(parent), "sqrt", (), [0])
    cbs.write(branches, parent, "bench")
    quietly(lambda: cbs.launch_local(branches, nproc=1, main=train.main))
    branch = time.perf_counter() - start
    shutil.rmtree(folder / "scratch", ignore_errors=True)
    start = time.perf_counter()
    quietly(lambda: train.main([*common, "--run_name=scratch", f"--max_steps={steps}", f"--stop_at_step={half}",
                                "--log_interval=1", f"--eval_interval={10 ** 12}"]))
    scratch = time.perf_counter() - start
    return scratch, branch / scratch


def train_tokens(run: Path) -> int:
    """The tokens a step of ``run`` (its config's batch x block)."""
    from configs import load_config
    config = load_config(str(run / "config.json"))
    return config.batch_size * config.model_config(1).block_size


def mini_study_shape() -> list[str]:
    """The mini-study's model and training settings (``SHAPE_KEYS`` of study/mini_study.BASE) as
    overrides: not its data (random tokens here) nor its evaluation sizes."""
    return [f"--{key}={BASE[key]}" for key in SHAPE_KEYS]


class Setting(NamedTuple):
    """A global batch of ``batch`` sequences in micro-batches of ``micro`` (batch // micro accumulated)."""

    optimizer: str
    batch: int
    micro: int

    @property
    def label(self) -> str:
        return f"{self.batch} = {self.micro} x {self.batch // self.micro}"


def small_batches(config: Path, overrides: list[str], folder: Path, optimizers: list[str], batches: list[int],
                  accumulated: int, rounds: int) -> tuple[dict, dict, list]:
    """({setting: [(us per token, its ratio to the largest batch's in one micro-batch, ms per step)
    per round]}, {optimizer: ``loop_overhead`` at the smallest batch, with that batch and the step's
    parts}, the trainers' descriptions): each round every trainer trains the largest batch's
    sequences, the trainers taking turns."""
    largest = max(batches)
    settings = [Setting(name, batch, batch) for name in optimizers for batch in batches]
    settings += [Setting(name, accumulated, 1) for name in optimizers if accumulated]
    trainers = {}
    try:
        for i, s in enumerate(settings):
            trainers[s] = synthetic_trainer(config, [*overrides, f"--optimizer={s.optimizer}", "--optimizer_options={}",
                                                     f"--batch_size={s.batch}", f"--micro_batch_size={s.micro}",
                                                     f"--max_steps={10 ** 9}"], folder, run_name=f"small{i}",
                                            trainer_class=train.Trainer)
        block = trainers[settings[0]].model_config.block_size
        for trainer in trainers.values():
            loop_step(trainer)  # warm-up
        per_token = {s: [] for s in settings}
        for i in range(rounds):
            step_ms = {}
            for s in settings[i % len(settings):] + settings[:i % len(settings)]:  # (who goes first rotates)
                trainer, steps = trainers[s], max(1, largest // s.batch)
                step_ms[s] = timed_ms(lambda: [loop_step(trainer) for _ in range(steps)], trainer.device) / steps
            us = {s: 1e3 * ms / (s.batch * block) for s, ms in step_ms.items()}
            for s in settings:
                per_token[s].append((us[s], us[s] / us[Setting(s.optimizer, largest, largest)], step_ms[s]))
        smallest = {name: trainers[Setting(name, min(batches), min(batches))] for name in optimizers}
        overhead = loop_overhead(smallest, 2 * rounds)
        for name, trainer in smallest.items():
            overhead[name].update(batch=min(batches), parts_ms=breakdown(trainer, 10 * rounds, train.SECTIONS)[0])
        described = [describe(trainer) for trainer in smallest.values()]
    finally:
        for trainer in trainers.values():
            trainer.close()
    return per_token, overhead, described


def checkpoint_file(path: Path) -> Path:
    """The checkpoint ``--checkpoint`` names: a run folder's newest (RUN/ckpt.pt), else ``path``
    (a sharded checkpoint's folder is one)."""
    from training.checkpoint import CHECKPOINT_NAME
    return path / CHECKPOINT_NAME if path.is_dir() and (path / CHECKPOINT_NAME).exists() else path


def subnormal_cost(checkpoint: Path, steps: int, rounds: int, saved=None) -> dict:
    """{"ieee_ms", "flushed_ms": medians over ``rounds`` of a forward and backward's ms (``steps``
    a round, the modes in turn), "ratio": theirs, "subnormal_grads": subnormal gradient entries
    after one step with IEEE floats, "grads": all of them} on ``checkpoint``'s model, one thread
    (the flush mode is a thread's own: one thread has all of it). ``saved``: the Checkpoint, if read already."""
    import torch
    from model import GPT
    from training.checkpoint import Checkpoint
    torch.set_num_threads(1)
    saved = saved or Checkpoint.load(checkpoint)
    model = GPT(saved.model_config(checkpoint))
    model.load_state_dict(saved.model)
    generator = torch.Generator().manual_seed(0)
    shape = (1, model.config.block_size)
    batches = [torch.randint(model.config.vocab_size, shape, generator=generator) for _ in range(2 * steps)]

    def step(x, y):
        model.zero_grad(set_to_none=True)
        model(x, y)[1].backward()

    step(batches[0], batches[1])
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    tiny = torch.finfo(torch.float32).tiny
    subnormal = sum(int(((g != 0) & (g.abs() < tiny)).sum()) for g in grads)
    times = {True: [], False: []}
    try:
        for _ in range(rounds):
            for flush in (False, True):
                torch.set_flush_denormal(flush)
                times[flush].append(timed_ms(lambda: [step(batches[i], batches[i + 1])
                                                      for i in range(0, 2 * steps, 2)], torch.device("cpu")) / steps)
    finally:
        torch.set_flush_denormal(False)
    ieee, flushed = statistics.median(times[False]), statistics.median(times[True])
    return {"ieee_ms": ieee, "flushed_ms": flushed, "ratio": ieee / flushed, "subnormal_grads": subnormal,
            "grads": sum(g.numel() for g in grads)}


def loop_overhead(trainers: dict, rounds: int, block: int = 10) -> dict[str, dict[str, float]]:
    """{name: medians in ms over ``rounds`` rounds} for the trainers ``{name: trainer}``: a trainer's
    loop step ("loop"); its model's forward and backward plus the optimizer step and zero_grad alone
    ("bare", with its model and optimizer, on batches of its tokens read beforehand, a new one each
    step: one batch over and over is learnt by heart, and AdamW's step on it slowed down by 10%);
    "bare" plus the gradient clip of the config ("clipped", the loop's own: training/clipping.py, as
    a step that logs nothing takes it); and the differences of a round's, "loop - bare" (what the
    loop adds) and "loop - clipped" (what it adds beyond the clip). Each round every trainer's three
    run ``block`` steps each in turn, the order rotating each round, and a block's value is the
    median of its steps but the first: a run steps one trainer over and over, its code and data in
    the caches, which the first step after another's finds cold (taking turns step by step measured
    the loop's own bookkeeping at twice what it costs in a run)."""
    variants = {}  # {(name, variant): fn(step index)}
    for name, trainer in trainers.items():
        model, optimizer, config = trainer.model, trainer.optimizer, trainer.config
        batches = [[t.to(trainer.device) for t in trainer.train_loader.next_batch()] for _ in range(rounds * block)]

        def bare(i: int, clip: bool, model=model, optimizer=optimizer, config=config, batches=batches,
                 gradient_clip=trainer.clip):
            x, y = batches[i]
            model(x, y, z_loss=config.z_loss, logits=False)[1].backward()
            if clip:
                gradient_clip(exact=False)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        variants.update({(name, "loop"): lambda i, trainer=trainer: loop_step(trainer),
                         (name, "bare"): functools.partial(bare, clip=False),
                         (name, "clipped"): functools.partial(bare, clip=True)})
    order, times = list(variants), {key: [] for key in variants}
    for i in range(rounds):
        for key in order[i % len(order):] + order[:i % len(order)]:
            device = trainers[key[0]].device
            steps = [timed_ms(lambda j=j: variants[key](i * block + j), device) for j in range(block)]
            times[key].append(statistics.median(steps[1:]))
    results = {}
    for name in trainers:
        loop = times[name, "loop"]
        results[name] = {variant: statistics.median(times[name, variant]) for variant in ("loop", "bare", "clipped")}
        for variant in ("bare", "clipped"):
            results[name][f"loop - {variant}"] = statistics.median(a - b for a, b in zip(loop, times[name, variant]))
    return results


def describe(trainer) -> str:
    """The trainer's model in one line."""
    m = trainer.model_config
    return (f"{m.n_layer} layers, {m.n_head} heads, {m.n_embd} dims, block {m.block_size}, vocab {m.vocab_size} "
            f"({trainer.model.num_params() / 1e6:.2f}M parameters), {trainer.dtype}, grad_clip "
            f"{trainer.config.grad_clip}")


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; else what platform says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def print_small(per_token: dict, overhead: dict, described: list[str], rounds: int) -> dict:
    """The per-token tables and the loop's overhead at the smallest batch, printed; returned as a dict (--json)."""
    results = {"per_token": [], "overhead": overhead}
    print(f"small batches: {described[0]}; each setting trains the largest batch's sequences a round, "
          f"{rounds} rounds interleaved, medians")
    for name in dict.fromkeys(s.optimizer for s in per_token):
        print(f"  {name}:  batch = micro x accumulation   ms/step   us/token    tokens/s   vs the largest in one")
        for s, measured in per_token.items():
            if s.optimizer != name:
                continue
            us, ratio, step_ms = (statistics.median(v) for v in zip(*measured))
            print(f"    {s.label:>26s}  {step_ms:8.2f}  {us:9.2f}  {1e6 / us:10,.0f}   {ratio:6.2f}x")
            results["per_token"].append({"optimizer": name, "batch": s.batch, "micro_batch": s.micro,
                                         "step_ms": step_ms, "us_per_token": us, "tokens_per_s": 1e6 / us,
                                         "vs_largest": ratio})
    for name, o in overhead.items():
        added, beyond = o["loop - bare"], o["loop - clipped"]
        print(f"  {name} at batch {o['batch']}: loop step {o['loop']:.3f} ms; forward+backward+optimizer alone "
              f"{o['bare']:.3f} ms, with the clip {o['clipped']:.3f} ms: the loop adds {1e3 * added:.0f} us a step "
              f"({100 * added / o['loop']:.1f}% of it), {1e3 * beyond:.0f} us beyond the clip (medians of a round's "
              f"differences)")
        print("    its parts (ms, phase clock): " + ", ".join(f"{k} {v:.3f}" for k, v in o["parts_ms"].items()))
    return results


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("measurements", nargs="*", choices=MEASUREMENTS, default=list(DEFAULT_MEASUREMENTS),
                        metavar="MEASUREMENT", help=f"of {', '.join(MEASUREMENTS)} "
                                                    f"(default: {', '.join(DEFAULT_MEASUREMENTS)})")
    parser.add_argument("--checkpoint", type=Path, help="subnormal: the checkpoint whose model is measured (a run "
                                                         "folder: its newest checkpoint, RUN/ckpt.pt)")
    parser.add_argument("--config", type=Path,
                        help="default: configs/default.py, with the mini-study's shape for small")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override, as train.py's --key=value")
    parser.add_argument("--steps", type=int, default=40, help="timed steps (schedule); the parent's steps (branch)")
    parser.add_argument("--repeats", type=int, default=3, help="of schedule and branch")
    parser.add_argument("--optimizers", nargs="+", default=["adamw", "merit"], help="small: each one's table")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64],
                        help="small: global batches in one micro-batch")
    parser.add_argument("--accumulated", type=int, default=64,
                        help="small: a batch of this many micro-batches of one (0: none)")
    parser.add_argument("--rounds", type=int, default=10, help="small, subnormal: rounds of every setting")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    if "subnormal" in args.measurements and not args.checkpoint:
        parser.error("subnormal measures a checkpoint's model: give --checkpoint RUN/ckpt.pt")
    saved = None
    if "subnormal" in args.measurements:  # (read before any measurement: a wrong path is told at once)
        from training.checkpoint import Checkpoint
        args.checkpoint = checkpoint_file(args.checkpoint)
        try:
            saved = Checkpoint.load(args.checkpoint)
        except (OSError, ValueError) as error:  # missing, a config.json, a text file, a run folder without one
            sys.exit(f"bench_batch: --checkpoint {args.checkpoint}: {error}")
    overrides = [f"--{item}" for item in args.set]
    import torch
    trained = [m for m in args.measurements if m != "subnormal"]  # (subnormal reads a checkpoint, no config)
    print(f"{' '.join(args.measurements)}: " + (f"config {args.config or DEFAULT_CONFIG} {' '.join(overrides)}; "
                                                 if trained else "") +
          f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    results = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = args.config or DEFAULT_CONFIG
        if "schedule" in args.measurements:
            schedule = [schedule_ratio(config, overrides, folder, args.steps) for _ in range(args.repeats)]
            ratios = [r for _, r in schedule]
            print(f"schedule: a step {statistics.fmean(ms for ms, _ in schedule):.1f} ms at the fixed batch; "
                  f"scheduled / fixed {statistics.fmean(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}, "
                  f"{args.repeats} repeats of {args.steps} interleaved steps)")
            results["schedule"] = schedule
        if "branch" in args.measurements:
            branch = [branch_ratio(config, overrides, folder, args.steps) for _ in range(args.repeats)]
            ratios = [r for _, r in branch]
            print(f"branch: {args.steps // 2} steps from scratch {statistics.fmean(s for s, _ in branch):.2f} s; a "
                  f"k=1 branch of the same steps / from scratch {statistics.fmean(ratios):.2f} (range "
                  f"{min(ratios):.2f}-{max(ratios):.2f}, {args.repeats} repeats)")
            results["branch"] = branch
        if "small" in args.measurements:
            shape = [] if args.config else mini_study_shape()
            measured = small_batches(config, [*shape, *overrides], folder, args.optimizers, args.batches,
                                     args.accumulated, args.rounds)
            results["small"] = print_small(*measured, args.rounds)
        if "subnormal" in args.measurements:
            cost = subnormal_cost(args.checkpoint, args.steps, args.rounds, saved)
            print(f"subnormal: {args.checkpoint}: a forward and backward of one sequence {cost['ieee_ms']:.2f} ms with "
                  f"IEEE floats, {cost['flushed_ms']:.2f} ms with subnormals flushed: {cost['ratio']:.2f}x (one thread, "
                  f"medians of {args.rounds} rounds of {args.steps}); {cost['subnormal_grads']} of {cost['grads']:,} "
                  f"gradient entries subnormal")
            results["subnormal"] = cost
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
