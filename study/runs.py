"""Finished and running training runs read back from their folders, grouped into the study's points.

A run folder is what train.py writes (``config.json``, ``metrics.jsonl``; ``hessian.json`` if
scripts/hessian.py analysed its checkpoint). Runs are found under the given paths (a run folder,
a sweep folder, any folder above them). A hessian.json is the run's only if the model it records
(its step and ``model_sha256``) is the run folder's checkpoint of that step: one left by an earlier
run in the folder, or written after the checkpoint it measured was replaced, is set aside with
the reason (``Run.set_aside``), and so is one whose checkpoint is gone; an archive of runs holds
only the ones found to be their run's when it was packed.

A point is everything a run's config says but its learning rate and its seeds: every key except
those whose role in the schema (``configs.ROLES``) is ``lr`` (``lr``, and ``min_lr``, which moves
with it: the point keeps their ratio), ``seed`` (``seed``, ``data_seed``) or ``bookkeeping`` (how a
run was run or recorded, not what it trained: names, folders, intervals, the layout, the backend,
the logging). Runs of one point differ only in lr and seeds, so a point's seeds at one lr are a
sample of one thing; runs of different points are never averaged. ``Study`` groups runs into points,
names each by what varies across the runs shown (the optimizer, its ablation, and any other key that
differs: "merit, n_layer=24"), and selects each point's lr: the one with the lowest mean validation
loss among the lrs all of whose seeds finished.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import io
import json
import math
import os
import statistics
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from atomic import atomic_write
from configs import TrainConfig, keys_with_role
from training.batch_schedule import run_lengths
from training.checkpoint import NUMBERED, load_model, numbered
from training.instruments import is_layer_key
from training.run_folder import model_sha256

# The keys a point leaves out, by their role in the schema: how a run was run or recorded, and what
# varies within a point.
BOOKKEEPING, LR_KEYS, SEED_KEYS = keys_with_role("bookkeeping"), keys_with_role("lr"), keys_with_role("seed")
# The MERIT options whose non-default values name an ablation (its label in plots and tables).
ABLATIONS = {("maxlamb", True): "maxLAMB", ("norm", "l2"): "l2", ("elementwise_clip", False): "no clip",
             ("weightwise_lower_bound", False): "no lower bound"}
# An optimizer's own hyper-parameters and its options: compared only among the runs of that
# optimizer (each resolves its own published values).
OPTIMIZER_KEYS = keys_with_role("optimizer")
# Schedule keys a batch sweep at a fixed token budget derives from the batch: where each batch has
# one value of such a key, it goes with the batch (the table's columns), not into the labels.
BATCH_SCHEDULE_KEYS = ("warmup_steps", "warmup_tokens", "max_steps")
# Keys an optimizer may fix for itself (Schedule-Free AdamW takes lr_schedule "constant"): where each
# optimizer's runs have one value, it goes with the optimizer (the report's notes), not into the labels.
OPTIMIZER_FIXED_KEYS = ("lr_schedule",)
# An optimizer's decays a sweep may scale with the batch (--beta-scaling half-life), and its weight
# decay, which a study may set by the batch (the small-batch authors' 0.1 at batch 512, 0 below):
# where each of that optimizer's batches has one value, they go with the batch too.
BATCH_DECAY_KEYS = ("beta1", "beta2", "optimizer_options.momentum")
BATCH_OPTIMIZER_KEYS = (*BATCH_DECAY_KEYS, "weight_decay")
# A sequence-length warmup's keys (training/seq_len_warmup.py), which its label says.
SEQ_LEN_WARMUP_KEYS = tuple(f"seq_len_warmup_{key}" for key in ("start", "steps", "tokens", "pacing", "root_degree",
                                                                  "multiple", "reshape"))
# Keys a label already says through the optimizer's name (its ablations, QK-Norm, QK-Clip, the
# warmup), and the batch, a column of its own.
LABELLED = ("optimizer", "qk_norm", "qk_clip_tau", "z_loss", "attn_logit_softcap", "final_logit_softcap", "batch_size",
            "batch_half_life_betas", *SEQ_LEN_WARMUP_KEYS, *(f"optimizer_options.{key}" for key, _ in ABLATIONS))
# A run recorded before a key existed trained with its default (as a resume reads an older
# checkpoint): its point has that value, so that old and new records of one point stay one point.
DEFAULTS = {f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
            for f in dataclasses.fields(TrainConfig)}


@dataclass
class Run:
    folder: Path
    config: dict
    records: list[dict] = field(repr=False)
    hessian: dict | None = None  # its hessian.json, if of one of its checkpoints
    set_aside: list[str] = field(default_factory=list)  # what its folder holds of another model, and why
    branch_stop: int | None = None  # a CBS branch's: the step its config file (BRANCH_FILE) stops it at

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def optimizer_label(self) -> str:
        """The optimizer with its ablation, the decays it holds at their half-life in tokens and its
        logit cures if any: "merit (maxLAMB)", "adamw (beta2 by half-life)", "adamw + qk_norm", "muon +
        qk_clip 100", "adamw + z_loss 0.0001", "adamw + softcap 50/30" (attention / output), "adamw +
        seq_len_warmup 8 over 64 steps" (its first length and duration; then its pacing, multiple and
        reshape where not the defaults)."""
        options = self.config.get("optimizer_options") or {}
        ablations = [name for (key, value), name in ABLATIONS.items() if options.get(key) == value]
        if self.config.get("batch_half_life_betas"):  # (the batch study's rule: each batch has its decays)
            ablations.append(f"{self.config['batch_half_life_betas']} by half-life")
        label = self.config["optimizer"] + (f" ({', '.join(ablations)})" if ablations else "")
        label += " + qk_norm" if self.config.get("qk_norm") else ""
        tau = self.config.get("qk_clip_tau")
        label += f" + qk_clip {tau:g}" if tau is not None else ""
        label += f" + z_loss {self.config['z_loss']:g}" if self.config.get("z_loss") else ""
        caps = [self.config.get("attn_logit_softcap"), self.config.get("final_logit_softcap")]
        label += (" + softcap " + "/".join("-" if cap is None else f"{cap:g}" for cap in caps)
                  if any(cap is not None for cap in caps) else "")
        return label + self.seq_len_warmup_label

    @property
    def seq_len_warmup_label(self) -> str:
        """The label's warmup: " + seq_len_warmup 8 over 64 steps", with ", root 2", ", multiple 16" and
        ", reshaped" where they are not the defaults; "" without a warmup."""
        warmup = {key.removeprefix("seq_len_warmup_"): self.config.get(key, DEFAULTS[key])
                  for key in SEQ_LEN_WARMUP_KEYS}
        if not warmup["start"]:
            return ""
        duration = f"{warmup['steps']} steps" if warmup["steps"] else f"{warmup['tokens']:,} tokens"
        return (f" + seq_len_warmup {warmup['start']} over {duration}"
                + (f", root {warmup['root_degree']:g}" if warmup["pacing"] == "root" else "")
                + (f", multiple {warmup['multiple']}" if warmup["multiple"] != DEFAULTS["seq_len_warmup_multiple"]
                   else "") + (", reshaped" if warmup["reshape"] else ""))

    @functools.cached_property
    def point(self) -> tuple[tuple[str, object], ...]:
        """Every config key that is not lr, a seed or bookkeeping, as sorted (key, value) pairs
        (optimizer options one by one; min_lr as its ratio to lr)."""
        items = {}
        for key, value in {**DEFAULTS, **self.config}.items():
            if key in BOOKKEEPING or key in LR_KEYS or key in SEED_KEYS:
                continue
            if key == "optimizer_options":
                items.update({f"optimizer_options.{k}": _hashable(v) for k, v in (value or {}).items()})
            else:
                items[key] = _hashable(value)
        lr = self.config.get("lr")
        items["min_lr / lr"] = round(self.config["min_lr"] / lr, 12) if lr and "min_lr" in self.config else None
        return tuple(sorted(items.items()))

    @property
    def batch_size(self) -> int:
        return self.config["batch_size"]

    @property
    def effective_batch(self) -> float:
        """The sequences its steps averaged, over the run: its batch, but for a replica group
        (training/replicas.py) that trained some steps without some groups, the batch times the
        share of its tokens whose gradients reached its weights."""
        trained, lost = self.final("replicas/tokens_trained"), self.final("replicas/tokens_lost")
        if trained is None or not trained + lost:
            return self.batch_size
        return self.batch_size * trained / (trained + lost)

    @property
    def lr(self) -> float:
        return self.config["lr"]

    @property
    def seed(self) -> int:
        return self.config.get("seed", 0)

    @functools.cached_property
    def total_steps(self) -> int:
        return run_lengths(TrainConfig(**self.config))[0]

    @property
    def finished(self) -> bool:
        """Whether the run logged its final validation loss (not: diverged, interrupted, running)."""
        total = self.total_steps
        return any(r.get("step") == total and r.get("val/loss") is not None for r in self.records)

    @property
    def last_step(self) -> int:
        return max((r["step"] for r in self.records if "step" in r), default=0)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of ``key`` over the run, non-finite values (logged as null) left out."""
        points = [(r["step"], r[key]) for r in self.records if r.get(key) is not None and "step" in r]
        return [s for s, _ in points], [v for _, v in points]

    def tokens_at(self, step: float) -> float:
        """The training tokens after ``step`` steps, interpolated between the logged ones (a batch
        schedule changes the tokens a step)."""
        steps, tokens = self.series("tokens")
        if not steps:
            return 0.0
        points = [(0, 0), *zip(steps, tokens)]
        for (s0, t0), (s1, t1) in zip(points, points[1:]):
            if step <= s1:
                return t0 + (t1 - t0) * (step - s0) / max(1, s1 - s0)
        (s0, t0), (s1, t1) = points[-2], points[-1]  # beyond the last: at the last step's rate
        return t1 + (t1 - t0) / max(1, s1 - s0) * (step - s1)

    def final(self, key: str) -> float | None:
        _, values = self.series(key)
        return values[-1] if values else None

    def peak(self, key: str) -> float | None:
        _, values = self.series(key)
        return max(values) if values else None

    def keys(self, prefix: str) -> list[str]:
        """Every logged key starting with ``prefix``, sorted."""
        return sorted({k for r in self.records for k in r if k.startswith(prefix)})

    def layer_keys(self, stat: str) -> list[str]:
        """The per-layer keys of ``stat`` (``max_logit/layer_03``, not the per-head ones), sorted."""
        return [k for k in self.keys(f"{stat}/") if is_layer_key(k, stat)]

    def steps_to(self, key: str, target: float) -> float | None:
        """The step at which ``key`` first reaches ``target`` or below, interpolated linearly
        between the two evaluations around it (None if it never does)."""
        steps, values = self.series(key)
        for i, (step, value) in enumerate(zip(steps, values)):
            if value <= target:
                if i == 0:
                    return float(step)
                (s0, v0) = steps[i - 1], values[i - 1]
                return s0 + (step - s0) * (v0 - target) / (v0 - value)
        return None


def _batch_only(runs: list[Run], varying: list[str], candidates: tuple[str, ...], by_rule: bool = False) -> list[str]:
    """The keys of ``varying`` among ``candidates`` that take one value at each batch of ``runs``
    (``by_rule``: of the runs that hold the same decays at their half-life in tokens, so that a
    batch may have the fixed decays of some runs and the half-life ones of others)."""
    by_batch: dict[str, dict[tuple, set]] = {}
    for run in runs:
        rule = (run.config.get("batch_half_life_betas") or "") if by_rule else None
        for key in candidates:
            by_batch.setdefault(key, {}).setdefault((rule, run.batch_size), set()).add(dict(run.point).get(key))
    return [key for key in varying if key in by_batch and all(len(values) == 1 for values in by_batch[key].values())]


def _optimizer_key(key: str) -> bool:
    return key.partition(".")[0] in OPTIMIZER_KEYS  # (an option's key is "optimizer_options.<name>")


def _hashable(value):
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


@dataclass
class Selection:
    """A point's selected lr: its seeds there and what the grid around it says."""

    runs: list[Run]           # the seeds at the selected lr (all finished)
    grid: list[float]         # every lr tried at this point, ascending
    unfinished: list[float]   # lrs left out because a seed of theirs did not finish

    @property
    def lr(self) -> float:
        return self.runs[0].lr

    @property
    def on_edge(self) -> bool:
        """Whether the selected lr is the smallest or largest tried (the best may lie beyond)."""
        return self.lr in (self.grid[0], self.grid[-1])


class Study:
    """Runs grouped into points, each named by what varies across ``runs``; ``select_on`` is the
    validation metric an lr is chosen on."""

    def __init__(self, runs: list[Run], select_on: str = "val/loss"):
        self.runs, self.select_on = runs, select_on
        # A key differs between points if it takes two values, or is missing from some; an
        # optimizer's hyper-parameters and options are compared among the runs of that optimizer
        # only (each has its own).
        self.varying: dict[str | None, list[str]] = {}  # {optimizer (None: every run): keys}
        for optimizer in {None, *(run.config["optimizer"] for run in runs)}:
            members = [r for r in runs if optimizer in (None, r.config["optimizer"])]
            values: dict[str, set] = {}
            for run in members:
                for key, value in run.point:
                    values.setdefault(key, set()).add(value)
            self.varying[optimizer] = sorted(
                key for key in values if _optimizer_key(key) == (optimizer is not None)
                and (len(values[key]) > 1 or any(key not in dict(run.point) for run in members)))
        # The keys that vary only with the batch: said once, in the report's notes; an optimizer's
        # decays among its own runs.
        self.with_batch = _batch_only(runs, self.varying[None], BATCH_SCHEDULE_KEYS)
        self.with_optimizer = [key for key in self.varying[None] if key in OPTIMIZER_FIXED_KEYS and all(
            len({dict(r.point).get(key) for r in runs if r.config["optimizer"] == optimizer}) == 1
            for optimizer in self.varying if optimizer is not None)]
        self.with_batch_of = {optimizer: _batch_only([r for r in runs if r.config["optimizer"] == optimizer],
                                                     keys, BATCH_OPTIMIZER_KEYS, by_rule=True)
                              for optimizer, keys in self.varying.items() if optimizer is not None}

    def label(self, run: Run) -> str:
        """The run's point without its batch: the optimizer, then every other key that varies."""
        point = dict(run.point)
        keys = [*self.varying[None], *self.varying[run.config["optimizer"]]]
        with_batch = [*self.with_batch, *self.with_optimizer,  # (said once, in the report's notes)
                      *self.with_batch_of.get(run.config["optimizer"], [])]
        rest = [f"{key.removeprefix('optimizer_options.')}={point.get(key)}" for key in keys
                if key not in LABELLED and key not in with_batch]
        return ", ".join([run.optimizer_label, *rest])

    def points(self) -> dict[tuple[str, int], dict[float, list[Run]]]:
        """{(label, batch): {lr: the runs (seeds)}}, sorted by label and batch, lrs ascending."""
        points: dict[tuple[str, int], dict[float, list[Run]]] = {}
        for run in self.runs:
            points.setdefault((self.label(run), run.batch_size), {}).setdefault(run.lr, []).append(run)
        return {key: dict(sorted(by_lr.items())) for key, by_lr in sorted(points.items())}

    def best(self) -> dict[tuple[str, int], Selection]:
        """Per point, the lr with the lowest mean ``select_on`` among those whose every seed
        finished; points with no such lr are left out."""
        best = {}
        for key, by_lr in self.points().items():
            complete = {lr: seeds for lr, seeds in by_lr.items() if all(r.finished for r in seeds)}
            scores = {lr: summary([r.final(self.select_on) for r in seeds]).mean for lr, seeds in complete.items()}
            finite = [lr for lr, score in scores.items() if math.isfinite(score)]
            if finite:
                chosen = min(finite, key=scores.get)
                best[key] = Selection(complete[chosen], list(by_lr), [lr for lr in by_lr if lr not in complete])
        return best


# Two-sided 95% quantiles of Student's t distribution by degrees of freedom (1 to 30; the normal's
# 1.96 beyond): a 95% interval of a mean of n values is mean +- t[n - 1] * std / sqrt(n).
T_95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    std: float    # the sample standard deviation (0 for one value)
    ci95: float   # half-width of the 95% interval of the mean (NaN for fewer than 2 values)


def summary(values: list[float | None]) -> Summary:
    """Mean, sample standard deviation and 95% t-interval of the finite ``values`` (NaN for none)."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    n = len(values)
    if not n:
        return Summary(0, math.nan, math.nan, math.nan)
    std = statistics.stdev(values) if n > 1 else 0.0
    ci = (T_95[n - 2] if n - 1 <= len(T_95) else 1.96) * std / math.sqrt(n) if n > 1 else math.nan
    return Summary(n, statistics.fmean(values), std, ci)


def paired(a: list[Run], b: list[Run], key: str) -> Summary:
    """The difference ``key`` of a minus b, over the seeds both have (pairs of runs with one seed)."""
    by_seed = {r.seed: r.final(key) for r in b}
    return summary([r.final(key) - by_seed[r.seed] for r in a if r.seed in by_seed
                    and r.final(key) is not None and by_seed[r.seed] is not None])


def read_records(path: Path) -> list[dict]:
    """The records of a metrics.jsonl ([] if there is none yet), a torn last line (a killed run's) left out."""
    return parse_records(path.read_text()) if path.is_file() else []


def parse_records(text: str) -> list[dict]:
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return records


# The folder of a run's branches (study/cbs.py): RUN/branches/step_<step>/k<k>_s<seed>, each a run folder.
BRANCHES = "branches"


def is_branch(run: Run) -> bool:
    """Whether ``run`` is a branch of another run (scripts/cbs.py): no study point's."""
    return run.folder.parent.parent.name == BRANCHES


BRANCH_FILE = "branch.py"  # a CBS branch's config file (study/cbs.py): what it trains, to its stop_at_step
# What a run folder holds that the study reads: all an archive of runs keeps.
RUN_FILES = ("config.json", "metrics.jsonl", "hessian.json", BRANCH_FILE)
# The member of an archive that takes runs from another archive beside it (pack_runs' ``beside``).
BESIDE = "beside.json"


def find_runs(paths: list[Path]) -> list[Run]:
    """Every run folder (one with config.json and metrics.jsonl) at or under ``paths``; a path that
    is a run archive (``pack_runs``'s .tar.xz) gives the runs packed in it."""
    runs = []
    for path in map(Path, paths):
        if path.is_file() and path.name.endswith(".tar.xz"):
            runs += _archived_runs(path)
            continue
        folders = sorted({m.parent for m in path.rglob("metrics.jsonl") if (m.parent / "config.json").is_file()})
        for folder in folders:
            files = {name: (folder / name).read_text() for name in RUN_FILES if (folder / name).is_file()}
            runs.append(_run(folder, files))
    return sorted(runs, key=lambda r: str(r.folder))


def _run(folder: Path, files: dict[str, str], packed: bool = False) -> Run:
    """The run of ``folder``'s ``files``; its hessian.json checked against the folder's checkpoints
    (``packed``: read from an archive, which holds only checked ones)."""
    run = Run(folder, json.loads(files["config.json"]), parse_records(files["metrics.jsonl"]))
    if BRANCH_FILE in files:
        run.branch_stop = assigned_literal(files[BRANCH_FILE], "stop_at_step")
    if "hessian.json" in files:
        hessian = json.loads(files["hessian.json"])
        foreign = None if packed else not_of_the_run(folder, hessian)
        if foreign:
            run.set_aside.append(f"{folder / 'hessian.json'}: {foreign}")
        else:
            run.hessian = hessian
    return run


def assigned_literal(source: str, name: str):
    """The literal a config file's ``source`` assigns to ``name`` (None if none), read without running
    it: an archive's files are data."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and [getattr(target, "id", None) for target in node.targets] == [name]:
            return ast.literal_eval(node.value)
    return None


def not_of_the_run(folder: Path, artefact: dict) -> str | None:
    """Why ``artefact`` (a record derived from a checkpoint: its step and ``model_sha256``) is not of
    one of the run folder's checkpoints, None where it is: the folder's checkpoint of that step has
    the weights it records (read and hashed here)."""
    step, sha256 = artefact.get("step"), artefact.get("model_sha256")
    if sha256 is None:
        return "it records no model_sha256, so no checkpoint of this run can be told to be its model (measure again)"
    checkpoint = next((path for path in numbered(folder) if int(NUMBERED.fullmatch(path.name).group(1)) == step), None)
    if checkpoint is None:
        return f"the run folder holds no checkpoint of its step {step} to match its model (model_sha256 {sha256[:12]})"
    try:
        model, _ = load_model(checkpoint)
    except (OSError, ValueError) as error:
        return f"its checkpoint {checkpoint.name} cannot be read ({error})"
    if model_sha256(model) != sha256:
        return (f"its model (step {step}, model_sha256 {sha256[:12]}) is not this run's checkpoint of that step, "
                f"{checkpoint.name}: another model's")
    return None


def _archived_runs(archive: Path, folders: tuple[str, ...] | None = None) -> list[Run]:
    """The runs packed in ``archive`` (those under the top ``folders`` only, if given), and those
    its BESIDE member takes from the archive it names, each as if packed in this one."""
    files: dict[str, dict[str, str]] = {}
    beside = None
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar.getmembers():
            folder, _, name = member.name.rpartition("/")
            if member.name == BESIDE:
                beside = json.loads(tar.extractfile(member).read())
            elif member.isfile() and name in RUN_FILES and (folders is None or folder.split("/")[0] in folders):
                files.setdefault(folder, {})[name] = tar.extractfile(member).read().decode()
    runs = [_run(archive / folder, found, packed=True) for folder, found in sorted(files.items())
            if {"config.json", "metrics.jsonl"} <= found.keys()]
    if beside:
        other = archive.parent / beside["archive"]
        runs += [dataclasses.replace(run, folder=archive / run.folder.relative_to(other))
                 for run in _archived_runs(other, tuple(beside["folders"]))]
    return sorted(runs, key=lambda r: str(r.folder))


def pack_runs(runs: list[Run], root: Path, archive: Path, branch_keys: tuple[str, ...] | None = None,
              beside: tuple[Path, tuple[str, ...]] | None = None) -> None:
    """Pack what the study reads of ``runs`` (each folder's RUN_FILES, as found under ``root``)
    into the xz-compressed tar ``archive``, byte for byte the same for the same runs (sorted
    members, no times or owners; a hessian.json only where it is its run's): ``find_runs([archive])``
    reads them back. ``branch_keys``: a
    branch's metrics cut to these keys (its records with a step). ``beside``: (another archive, top
    folders): the runs under those folders are not packed but read from that archive, where they
    are (a BESIDE member names it, relative to this one), so no record is committed twice."""
    buffer = io.BytesIO()
    if beside:
        runs = [r for r in runs if r.folder.relative_to(root).parts[0] not in beside[1]]
    with tarfile.open(fileobj=buffer, mode="w:xz", preset=9) as tar:
        if beside:
            where = os.path.relpath(Path(beside[0]).resolve(), Path(archive).resolve().parent)
            data = json.dumps({"archive": where, "folders": list(beside[1])}).encode()
            info = tarfile.TarInfo(BESIDE)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        for run in sorted(runs, key=lambda r: str(r.folder)):
            for name in RUN_FILES:
                path = run.folder / name
                if path.is_file() and not (name == "hessian.json" and run.hessian is None):
                    data = path.read_bytes()
                    if name == "metrics.jsonl" and branch_keys and is_branch(run):
                        data = "".join(json.dumps({k: v for k, v in record.items() if k in branch_keys}) + "\n"
                                       for record in parse_records(data.decode())
                                       if "step" in record or "nonfinite" in record.get("event", {})).encode()
                    info = tarfile.TarInfo(f"{path.relative_to(root).as_posix()}")
                    info.size, info.mode = len(data), 0o644
                    tar.addfile(info, io.BytesIO(data))
    with atomic_write(archive, "wb") as f:
        f.write(buffer.getvalue())


def study_arguments(parser: argparse.ArgumentParser, reported: str) -> None:
    """The arguments this CLI and scripts/plot.py share: the runs, --select-on (the metric each
    point's lr is chosen on) and --report-on (the metric ``reported`` says what is read on: the
    tables, the loss figures)."""
    parser.add_argument("paths", nargs="+", type=Path,
                        help="run folders (config.json and metrics.jsonl), sweep folders, folders above them, "
                             "or .tar.xz archives of runs (scripts/mini_study.py --archive writes one)")
    parser.add_argument("--select-on", default="val/loss", help="the metric each point's lr is chosen on "
                                                                "(default: val/loss)")
    parser.add_argument("--report-on", help=f"the metric {reported} (default: --select-on)")


def branch_runs(paths: list[Path]) -> list[Run]:
    """The branches of runs (study/cbs.py) at or under ``paths``."""
    return [run for run in find_runs(paths) if is_branch(run)]


def study_runs(args: argparse.Namespace, tool: str) -> list[Run]:
    """The runs at or under ``args.paths`` that logged ``--select-on``; the CLI ``tool`` exits if none did.
    A run whose settings changed on resume (its config's ``changes``) is no point's: left out, with
    a note; so is a branch of a run (its critical-batch measurement: study/cbs.py). What a run's
    folder holds of another model (``Run.set_aside``) is named in a note."""
    runs = [r for r in find_runs(args.paths) if r.final(args.select_on) is not None and not is_branch(r)]
    set_aside = [note for r in runs for note in r.set_aside]
    if set_aside:
        print(f"{tool}: not shown as their runs' (another model's, or not known to be the run's): "
              + "; ".join(set_aside), file=sys.stderr)
    changed = [r for r in runs if r.config.get("changes")]
    if changed:
        print(f"{tool}: left out {len(changed)} run(s) whose settings changed on resume, so no study point "
              f"holds them: " + "; ".join(f"{r.folder} (" + ", ".join(f"{c['key']} from step {c['step']}"
                                                                        for c in r.config["changes"]) + ")"
                                          for r in changed), file=sys.stderr)
        runs = [r for r in runs if not r.config.get("changes")]
    if not runs:
        sys.exit(f"{tool}: no runs that logged {args.select_on} under {', '.join(map(str, args.paths))} (run "
                 f"folders, each with config.json and metrics.jsonl, or .tar.xz archives of them)")
    return runs
