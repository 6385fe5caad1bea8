"""The MERIT paper's question on a CPU: what happens to each optimizer as the global batch grows at a
fixed token budget, below and above the model's critical batch.

    python -m scripts.mini_study                          # the study: about 31 minutes on 2 cores
    python -m scripts.mini_study --archive docs/mini_study/runs.tar.xz   # and pack what it read
    python -m scripts.mini_study --batches 16,256 --optimizers adamw,merit --seeds 2   # a smaller one
    python -m scripts.mini_study --preset benchmark --archive docs/mini_study/benchmark.tar.xz
    python -m scripts.mini_study --preset llama_cures --archive docs/mini_study/llama_cures.tar.xz
    python -m scripts.mini_study --preset llama_cures --dry-run   # write and print its plan, train nothing
    python -m scripts.mini_study --preset small_batch --archive docs/mini_study/small_batch.tar.xz
    python -m scripts.mini_study --preset seq_len_warmup --archive docs/mini_study/seq_len_warmup.tar.xz
    python -m scripts.mini_study --preset seq_len_warmup --optimizers adamw,adamw_slw,adamw_qkclip --lr-multiple 3 \
        --out runs/mini_study_seq_len_warmup_9x --archive docs/mini_study/seq_len_warmup_9x.tar.xz   # AdamW's at 9x

A small GPT on Shakespeare (byte tokens) trained on the same TOKENS tokens at each of BATCHES
global batches, by AdamW, LAMB, MERIT and Muon, and, at the largest batch, by MuonClip and AdamW
with QK-Clip (``EXTRAS``). Each point's lr is found before its seeds are run:

1. the lr, seed 0: a factor-of-3 grid of three lrs around the optimizer's centre, scaled from
   REFERENCE_BATCH by (batch ratio) ** exponent (``OPTIMIZERS``: centres and exponents read off a
   one-seed pilot of this study, whose best lrs moved with the batch as the square root for MERIT
   and Muon, less for LAMB and not at all for AdamW); while a point's best lr is on its grid's edge,
   the grid grows by one lr beyond that edge (by ``--extend`` lrs at most), so the best lies inside
   it or the report says it does not;
2. the seeds: seeds 1 .. ``--seeds`` - 1 (init and data order both) at each point's best lr. Their
   mean may move the best lr to another of the grid (one seed's): then 1 and 2 again, until every
   point's best lr has all its seeds. So a rerun of a finished study runs nothing.

``--preset benchmark``: the same axis for the 2025 optimizer benchmark's optimizers (Semenov et al.,
``BENCHMARK``: AdEMAMix, MARS, SOAP, Schedule-Free AdamW, D-Muon), written to its own folder
(default runs/mini_study_benchmark), where the records of AdamW, MERIT and Muon are unpacked from
the paper preset's committed archive (``BESIDE``), so that its report, figures and archive place the
five against them (its archive refers to those records in the paper's instead of copying them).
Its grid centres are not a pilot's: each is the lr its nearest relative selected here (AdamW's for
the Adam family, Muon's for D-Muon), and the grid grows where that was wrong.

``--preset llama_cures``: the five cures for runaway logits on the small Llama (``CURES``: AdamW with
QK-Norm, z-loss, QK-Clip or soft-capping, and MERIT, beside plain AdamW) at one batch, 64 sequences
(4,096 tokens a step, above the critical batch this axis found), one seed, on the same data, budget
and protocol; the grid centres are the paper preset's AdamW's and MERIT's. Written to
runs/mini_study_llama_cures.

``--preset seq_len_warmup``: sequence-length warmup (Li, Zhang and He 2022), the data side's cure, beside
the optimizer side's on the same small Llama, batch and data (``SEQ_LEN_WARMUP``: AdamW, AdamW with the
warmup, AdamW with QK-Clip, MERIT, MERIT with the warmup), at the lr where AdamW's logits run away in
the llama_cures preset (3x its best lr there: AdamW's 0.009, MERIT's 0.0636), each at that one lr (no
grid: the lr is the question's), 3 seeds, every run on the same TOKENS tokens trained (the warmup's
runs read more, and take more steps, to train as many). Written to runs/mini_study_seq_len_warmup.

``--preset small_batch``: the small-batch end (Marek et al. 2025, "Small Batch Size Training for
Language Models") at the authors' settings: no gradient clipping, weight decay 0 below batch 512,
their betas, lr grids a factor of 2 apart grown (``--extend`` 3) until each choice is interior
(``SMALL_BATCH``: AdamW with beta2 by half-life, plain SGD and Adafactor at batches 1, 2, 4, 8 and
32, AdamW with fixed (0.9, 0.95) at 1 and at 512 with weight decay 0.1, the authors' large-batch
baseline, MERIT with beta2 by half-life at 1 and 4), each step one micro-step (no accumulation: a
batch of one sequence cannot be split, and accumulation is what the claims weigh small batches
against; so no noise scale is measured), written to runs/mini_study_small_batch. beta2 keeps the
half-life in tokens of 0.95 at batch 512 (0.95 ** (B / 512): 0.9999 at batch 1). Its report and
figures add the small-batch section, as scripts/report.py and scripts/plot.py do for any runs that
reach a batch of one sequence: each point against its optimizer's largest batch and against AdamW at
the same batch, paired by seed, the range of good lrs, the wall time per token, and
``small_batch.png``. Its runs flush subnormal floats (``flush_denormals``; the comment at PRESETS).

Writes OUT/ (default runs/mini_study): a sweep folder per optimizer and batch (point.py, metrics,
checkpoint per run), ``report.md`` (scripts/report.py's tables: lrs chosen on val/loss, every
number read on heldout/loss, validation tokens the choice never saw) and ``figures/``
(scripts/plot.py's PNGs, their losses read on heldout/loss like the tables': the loss and peak
logit against the batch, B_simple over training against the batches, ...). ``--archive`` also
packs every run's config.json and metrics.jsonl into one xz-compressed tar, from which ``python -m
scripts.report ARCHIVE --report-on heldout/loss`` and ``python -m scripts.plot ARCHIVE --report-on
heldout/loss`` draw the same tables and figures without the runs. Rerunning skips finished runs
and resumes interrupted ones. The Shakespeare byte shards are prepared if missing.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import NamedTuple

from atomic import atomic_write
from study import sweep
from study.mini_study import (BASE, BLOCK, DATA, LR_FACTOR, OPTIMIZERS, REFERENCE_BATCH, TOKENS, lr_grid, round_lr,
                              schedule)
from study.plot import draw_all
from study.report import report
from study.runs import Study, find_runs, pack_runs

ROOT = Path(__file__).resolve().parents[1]
BATCHES = (8, 32, 128, 512)  # global batches in sequences of BLOCK tokens
QK_CLIP_TAU = 10.0  # a small model's logits: 5 to 40 at good lrs, where Kimi K2's 100 would never act
EXTRAS = {  # run at the largest batch only
    "muonclip": ({"optimizer": "muon", "qk_clip_tau": QK_CLIP_TAU}, 2e-2, 0.5),
    "adamw_qkclip": ({"optimizer": "adamw", "qk_clip_tau": QK_CLIP_TAU}, 3e-3, 0.0),
}
BENCHMARK = {  # the 2025 benchmark's optimizers, their published settings (optim/published.py)
    "ademamix": ({"optimizer": "ademamix"}, 3e-3, 0.0),
    # MARS's lr on its matrices 3x its AdamW part's, which is AdamW's selected lr here, as in the benchmark.
    "mars": ({"optimizer": "mars", "optimizer_options": {"adamw_lr": 3e-3}}, 1e-2, 0.0),
    "soap": ({"optimizer": "soap"}, 3e-3, 0.0),
    "adamw_schedulefree": ({"optimizer": "adamw_schedulefree", "lr_schedule": "constant"}, 3e-3, 0.0),
    "dmuon": ({"optimizer": "dmuon"}, 2e-2, 0.5),
}
# The five cures for runaway logits on the small Llama (llama_nano's shape: the base's 4 layers and 4
# heads at its own 128 dims), each beside plain AdamW, at one batch above the critical batch. Their
# thresholds bind at this scale: plain AdamW's largest attention logit peaks at 34 at its best lr
# here and its largest output logit at 10, which Kimi K2's tau 100 and Gemma 2's caps (50 on the
# attention logits, 30 on the output's) would never touch; tau and the attention cap hold the
# attention logits to about half of AdamW's peak, the output cap bends its largest logits by a quarter.
CURES_QK_CLIP_TAU = 15.0
CURES_ATTN_SOFTCAP, CURES_FINAL_SOFTCAP = 15.0, 10.0
CURES = {
    "adamw": ({"optimizer": "adamw"}, 3e-3, 0.0),
    "adamw_qknorm": ({"optimizer": "adamw", "qk_norm": "rmsnorm"}, 3e-3, 0.0),
    "adamw_zloss": ({"optimizer": "adamw", "z_loss": 1e-4}, 3e-3, 0.0),  # PaLM's weight
    "adamw_qkclip": ({"optimizer": "adamw", "qk_clip_tau": CURES_QK_CLIP_TAU}, 3e-3, 0.0),
    "adamw_softcap": ({"optimizer": "adamw", "attn_logit_softcap": CURES_ATTN_SOFTCAP,
                       "final_logit_softcap": CURES_FINAL_SOFTCAP}, 3e-3, 0.0),
    "merit": ({"optimizer": "merit"}, 3e-2, 0.5),
}
# Sequence-length warmup against the optimizer side's cures, at 3x each optimizer's best lr of the
# llama_cures preset (AdamW 3e-3, MERIT 3e-2 x sqrt(64 / 128)), where AdamW's largest attention logit
# peaked at 189 against 34 at its best lr, MERIT's at 4.7e5. The warmup is the paper's shape at this
# block: from 8 tokens (its start and DeepSpeed's difficulty_step) linearly to the block of 64 over 64
# steps, a quarter of a plain run's 256 and about 5x the lr warmup's 13, as the paper's runs are a few
# times their lr warmup. QK-Clip's tau is the cures preset's.
SEQ_LEN_WARMUP_KEYS = {"seq_len_warmup_start": 8, "seq_len_warmup_steps": 64}
SEQ_LEN_WARMUP = {
    "adamw": ({"optimizer": "adamw"}, 9e-3, 0.0),
    "adamw_slw": ({"optimizer": "adamw", **SEQ_LEN_WARMUP_KEYS}, 9e-3, 0.0),
    "adamw_qkclip": ({"optimizer": "adamw", "qk_clip_tau": CURES_QK_CLIP_TAU}, 9e-3, 0.0),
    "merit": ({"optimizer": "merit"}, 9e-2, 0.5),
    "merit_slw": ({"optimizer": "merit", **SEQ_LEN_WARMUP_KEYS}, 9e-2, 0.5),
}
# The small-batch end (Marek et al. 2025, "Small Batch Size Training for Language Models": down to
# one sequence, beta2 held at its half-life in tokens, plain SGD and Adafactor competitive, a wider
# range of good lrs, accumulation wasteful), at the authors' settings (martin-marek/batch-size,
# pretraining/configs/base.yaml and runs/gpt2s/optimizer_comp/; docs/results/batch_axis.md lists
# them): no gradient clipping, weight decay 0 but for AdamW's 0.1 at their large batch (512,
# SMALL_BATCH_CHANGES_AT), lr grids a factor of 2 apart grown until each choice is interior.
# AdamW's betas are theirs: (0.9, 0.95) at batch 512, and beta2 by half-life holds 0.95's half-life
# in tokens at 512 (half_life_batch: 0.95 ** (B / 512), 0.9999 at batch 1, the authors' batch-1
# beta2; a half-life of 443k tokens, 42% of the budget); beta1 stays 0.9 (their batch-1 Adam keeps
# it), as MERIT's. "adamw" keeps (0.9, 0.95) at every batch it runs: the authors' large-batch
# baseline at 512, and at batch 1 the control of the half-life rule. Adafactor's decay_rate (0.9999,
# the authors') is the exponent of the step count in beta2 = 1 - t ** -decay_rate, not a per-step
# decay: there is nothing to scale (optim/adafactor.py). Plain SGD: no momentum, no weight decay.
# The grid centres (at REFERENCE_BATCH, with their exponents in the batch) are read off a first run of
# this preset's settings: without clipping the best lrs fell with the batch for AdamW with beta2 by
# half-life (0.0049 at batch 1 to 0.0017 at 32) and SGD (0.23 to 0.11), and rose for Adafactor (0.03
# to 0.14), MERIT (0.0053 at 1, 0.0106 at 4) and fixed-beta AdamW (0.002 at 1, 0.009-0.019 at 512).
SMALL_BATCH = {
    "adamw": ({"optimizer": "adamw"}, 8.6e-3, 0.3),
    "adamw_halflife": ({"optimizer": "adamw", "batch_half_life_betas": "beta2"}, 1.2e-3, -0.25),
    "sgd": ({"optimizer": "sgd", "optimizer_options": {"momentum": 0.0}}, 0.086, -0.2),
    "adafactor": ({"optimizer": "adafactor", "optimizer_options": {"decay_rate": 0.9999}}, 0.128, 0.3),
    "merit_halflife": ({"optimizer": "merit", "batch_half_life_betas": "beta2"}, 6e-2, 0.5),
}
SMALL_BATCHES = (1, 2, 4, 8, 32, 512)
# Where an optimizer runs at fewer batches than the preset's: AdamW with fixed betas at the two ends,
# MERIT at 1 and 4 (its time: a batch-1 run takes 16,384 steps). Muon, whose Newton-Schulz steps
# take about 4x AdamW's here, is left to the paper preset's batches: the preset's hour holds no more.
SMALL_BATCH_ONLY_AT = {"adamw": (1, 512), "adamw_halflife": (1, 2, 4, 8, 32), "sgd": (1, 2, 4, 8, 32),
                       "adafactor": (1, 2, 4, 8, 32), "merit_halflife": (1, 4)}
SMALL_BATCH_CHANGES_AT = {512: {"weight_decay": 0.1}}  # the authors' AdamW at batch 512; 0 below
ARCHIVE = ROOT / "docs/mini_study/runs.tar.xz"  # the paper preset's committed records
BESIDE = ("adamw", "merit", "muon")  # what the benchmark preset is placed against, from ARCHIVE


class Preset(NamedTuple):
    optimizers: dict  # name: (config changes, grid centre at REFERENCE_BATCH, its exponent in the batch)
    largest_batch_only: dict  # the same, run at the largest batch only
    out: Path  # the default --out
    beside: tuple[str, ...]  # the paper preset's optimizers whose records it is placed against (ARCHIVE)
    base: dict  # changes to BASE
    batches: tuple[int, ...]  # the default --batches
    seeds: int  # the default --seeds
    micro_steps: int = 2  # accumulation micro-steps a step (2: the noise scale is measured; 1: none)
    only_at: dict = {}  # {optimizer: the only batches it runs at}
    changes_at: dict = {}  # {batch: config changes of every point at that batch}
    lr_factor: float = LR_FACTOR  # between the grid's neighbouring lrs
    extend: int = 2  # the default --extend
    lr_points: int = 3  # lrs in each point's first grid: 3 around its centre, or 1, the centre alone (then
    # no grid grows and every seed runs at once: nothing is selected)
    half_life_batch: int = REFERENCE_BATCH  # the batch whose decays a half-life rule holds in tokens


PRESETS = {
    "paper": Preset(OPTIMIZERS, EXTRAS, Path("runs/mini_study"), (), {}, BATCHES, 3),
    "benchmark": Preset(BENCHMARK, {}, Path("runs/mini_study_benchmark"), BESIDE, {}, BATCHES, 3),
    "llama_cures": Preset(CURES, {}, Path("runs/mini_study_llama_cures"), (), {"model": "llama_nano", "n_embd": 128},
                          (64,), 1),
    # (flush_denormals: MERIT's batch-1 runs at lr 0.00795 and up let their attention logits run to 1e3-1e4, and
    # their subnormal floats then made each step about 4.4x slower: scripts.bench_batch subnormal)
    "small_batch": Preset(SMALL_BATCH, {}, Path("runs/mini_study_small_batch"), (),
                          {"grad_clip": 0.0, "weight_decay": 0.0, "min_lr": 0.0, "flush_denormals": True}, SMALL_BATCHES, 3,
                          micro_steps=1, only_at=SMALL_BATCH_ONLY_AT, changes_at=SMALL_BATCH_CHANGES_AT,
                          lr_factor=2.0, extend=3, half_life_batch=512),
    "seq_len_warmup": Preset(SEQ_LEN_WARMUP, {}, Path("runs/mini_study_seq_len_warmup"), (),
                             {"model": "llama_nano", "n_embd": 128}, (64,), 3, extend=0, lr_points=1),
}


class Studied:
    """One optimizer at one batch: its sweep folder and the points run so far."""

    def __init__(self, name: str, changes: dict, batch: int, out: Path, base: Path, overrides: list[str],
                 tokens: int, block: int, preset: Preset):
        self.name, self.batch, self.preset = name, batch, preset
        self.folder = out / name / f"b{batch}"
        self.fixed = [*(f"--{k}={v!r}" for k, v in {**changes, **preset.changes_at.get(batch, {}),
                                                    **schedule(batch, tokens, block, preset.micro_steps)}.items()),
                      *overrides]
        self.base = base
        # The decays it holds at their half-life in tokens from the preset's half_life_batch's (the sweep's rule).
        self.betas = tuple(name for name in changes.get("batch_half_life_betas", "").split(",") if name)
        self.points: list[sweep.Point] = []

    def add(self, lrs: list[float], seeds: list[int]) -> list[sweep.Point]:
        """Plan (and write) the points of ``lrs`` x ``seeds`` not planned yet; a seed sets both the
        initialisation and the data order."""
        known = {p.name for p in self.points}
        planned = [point for seed in seeds for point in sweep.plan(
            str(self.base), {"lr": lrs, "seed": [seed]}, [*self.fixed, f"--data_seed={seed}"], self.folder, "none",
            "none", self.preset.half_life_batch if self.betas else None, self.betas)]
        new = [p for p in planned if p.name not in known]
        sweep.write_points(new, str(self.base), "python -m scripts.mini_study")
        self.points += new
        return new

    def state(self):
        """(The best lr so far by Study's rule, or None if none of its lrs finished; every lr run.)"""
        runs = find_runs([self.folder])
        best = Study(runs).best() if runs else {}
        return next(iter(best.values()), None), sorted({r.lr for r in runs})

    def grow(self, extend: int) -> list[sweep.Point]:
        """Seed 0 at one lr past the grid's edge where the best lr is on it (below it where none
        finished), while the grid holds fewer than 3 + ``extend`` lrs."""
        selection, grid = self.state()
        if len(grid) >= self.preset.lr_points + extend:
            return []
        if selection is None or selection.lr == grid[0]:
            return self.add([round_lr(grid[0] / self.preset.lr_factor)], [0])
        return self.add([round_lr(grid[-1] * self.preset.lr_factor)], [0]) if selection.lr == grid[-1] else []

    def seed(self, seeds: list[int]) -> list[sweep.Point]:
        """``seeds`` at the best lr, where it lacks some of them."""
        selection = self.state()[0]
        return self.add([selection.lr], seeds) if selection and len(selection.runs) < len(seeds) + 1 else []


def write_base(out: Path, preset: Preset, data_dir: str) -> Path:
    """The preset's base config, written as out/base.py (every point's file is the base with its changes)."""
    out.mkdir(parents=True, exist_ok=True)
    base = out / "base.py"
    settings = {**BASE, **preset.base, "data_dir": data_dir}
    base.write_text("# The mini-study's base config (scripts/mini_study.py writes it).\n"
                    + "".join(f"{key} = {value!r}\n" for key, value in settings.items()))
    return base


def run(points: list[sweep.Point], jobs: int) -> None:
    """The points, the longest first (the smallest batch: the most steps), so that ``jobs`` at once
    end together."""
    if points:
        sweep.launch_local(sorted(points, key=lambda p: p.config.batch_size), nproc=1, jobs=jobs)


def unpack_beside(out: Path, optimizers: tuple[str, ...]) -> None:
    """The paper preset's committed records (``ARCHIVE``) of ``optimizers``, under ``out`` where
    that study wrote them."""
    with tarfile.open(ARCHIVE, "r:xz") as tar:
        tar.extractall(out, members=[m for m in tar.getmembers() if m.name.split("/", 1)[0] in optimizers],
                       filter="data")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=PRESETS, default="paper",
                        help="paper: AdamW, LAMB, MERIT, Muon (and two at the largest batch only); benchmark: the "
                             "2025 benchmark's five, beside the paper preset's AdamW, MERIT and Muon; llama_cures: "
                             "the five logit cures on the small Llama; small_batch: batches down to one sequence "
                             "(AdamW with beta2 by half-life, SGD, Adafactor, MERIT) and AdamW at 1 and 512, at "
                             "Marek et al.'s settings; seq_len_warmup: sequence-length warmup beside QK-Clip and "
                             "MERIT at the lr where AdamW's logits run away")
    parser.add_argument("--out", type=Path, help="default: runs/mini_study, runs/mini_study_benchmark, "
                                                 "runs/mini_study_llama_cures, runs/mini_study_small_batch, "
                                                 "runs/mini_study_seq_len_warmup")
    parser.add_argument("--optimizers", help=f"comma-separated (default: the preset's), of: "
                                             f"{', '.join([*OPTIMIZERS, *EXTRAS])} (the last two at the largest "
                                             f"batch only), {', '.join(BENCHMARK)}, {', '.join(CURES)}, "
                                             f"{', '.join(SMALL_BATCH)} or {', '.join(SEQ_LEN_WARMUP)}")
    parser.add_argument("--batches", help="global batches (sequences; default: the preset's, "
                                          f"{','.join(map(str, BATCHES))}, llama_cures' and seq_len_warmup's 64 or "
                                          f"small_batch's "
                                          f"{','.join(map(str, SMALL_BATCHES))}; an optimizer the preset runs at "
                                          f"some batches only runs at those of them)")
    parser.add_argument("--seeds", type=int, help="seeds at each point's best lr (default: the preset's, 3 or "
                                                  "llama_cures' 1)")
    parser.add_argument("--lr-multiple", type=float, default=1.0,
                        help="every grid centre times this (default 1): with the seq_len_warmup preset's one lr a "
                             "point, 3 runs it at 9x the best lrs instead of 3x")
    parser.add_argument("--tokens", type=int, default=TOKENS, help=f"the token budget of every run ({TOKENS:,})")
    parser.add_argument("--extend", type=int, help="times a grid may grow past an edge (default: the preset's, 2 or "
                                                   "small_batch's 3)")
    parser.add_argument("--data-dir", default=DATA, help=f"byte-token shards (default {DATA}, prepared if missing)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, sharing the CPU threads (default 2)")
    parser.add_argument("--archive", type=Path, help="also pack the runs' configs and metrics into this .tar.xz")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a change to the base config (e.g. n_layer=2)")
    parser.add_argument("--no-figures", action="store_true",
                        help="the report and archive only (python -m scripts.plot draws the figures from either)")
    parser.add_argument("--dry-run", action="store_true",
                        help="write the base and stage 1's point files, print them, train nothing")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    every_batch, largest_batch, beside = preset.optimizers, preset.largest_batch_only, preset.beside
    known = {**every_batch, **largest_batch}
    names = args.optimizers.split(",") if args.optimizers else list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        sys.exit(f"mini_study: optimizers {unknown} are not the {args.preset} preset's: choose from "
                 f"{', '.join(known)}, or another --preset")
    batches = sorted(int(b) for b in args.batches.split(",")) if args.batches else list(preset.batches)
    n_seeds = preset.seeds if args.seeds is None else args.seeds
    extend = preset.extend if args.extend is None else args.extend
    start = time.perf_counter()
    if args.data_dir == DATA and not (ROOT / DATA / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "data.prepare", "shakespeare", "--tokenizer", "byte"], cwd=ROOT,
                       check=True)
    data_dir = args.data_dir if args.data_dir == DATA else str(Path(args.data_dir).resolve())
    out = (args.out or preset.out).resolve()
    base = write_base(out, preset, data_dir)
    overrides = [f"--{item}" for item in args.set]
    block = int(dict(item.split("=", 1) for item in args.set).get("block_size", BLOCK))
    studied = [Studied(name, known[name][0], batch, out, base, overrides, args.tokens, block, preset)
               for name in names for batch in batches if (name in every_batch or batch == batches[-1])
               and batch in preset.only_at.get(name, (batch,))]

    first_seeds = [0] if preset.lr_points > 1 else list(range(n_seeds))
    print(f"mini-study stage 1: the lr, seeds {first_seeds}, {len(studied)} points x {preset.lr_points} lrs")
    first = [p for s in studied for p in s.add(lr_grid(known[s.name][1] * args.lr_multiple, known[s.name][2], s.batch,
                                                       preset.lr_factor, preset.lr_points), first_seeds)]
    if args.dry_run:
        print(sweep.table(first))
        print(f"mini-study: a dry run: {base} and {len(first)} point files written under {out}, nothing trained")
        return
    run(first, args.jobs)
    seeds = list(range(1, n_seeds))
    while True:
        if grown := [p for s in studied for p in s.grow(extend)]:
            print(f"mini-study stage 1: {len(grown)} grids grow past an edge")
            run(grown, args.jobs)
        elif seeded := [p for s in studied for p in s.seed(seeds)]:
            print(f"mini-study stage 2: {len(seeded)} seeds at the points' best lrs")
            run(seeded, args.jobs)
        else:
            break

    unpack_beside(out, beside)
    runs = [r for r in find_runs([out]) if r.final("val/loss") is not None]
    tables = report(runs, target=None, select_on="val/loss", report_on="heldout/loss")
    with atomic_write(out / "report.md", "w") as f:
        f.write(tables)
    print(tables, end="")
    if not args.no_figures:
        draw_all(runs, out / "figures", select_on="val/loss", report_on="heldout/loss")  # the figures of the tables
    if args.archive:
        pack_runs(runs, out, args.archive, beside=(ARCHIVE, beside) if beside else None)
    minutes = (time.perf_counter() - start) / 60
    # A run that diverges (nonfinite="stop" ends it) is a result of the study, not a failure of it:
    # the report lists it, and a rerun tries it again.
    print(f"mini-study: {len(runs)} runs, {sum(not r.finished for r in runs)} did not finish, {minutes:.1f} "
          f"minutes; {out / 'report.md'}" + ("" if args.no_figures else f", {out / 'figures'}")
          + (f", {args.archive}" if args.archive else ""))


if __name__ == "__main__":
    main()
