"""Finished and running training runs read back from their folders, for the study's report and plots.

A run folder is what train.py writes (``config.json``, ``metrics.jsonl``; ``hessian.json`` if
scripts/hessian.py analysed its checkpoint). Runs are found under the given paths (a run folder,
a sweep folder, any folder above them) and grouped by optimizer label and batch size; seeds of
the same point are one group.
"""
from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from configs import TrainConfig
from training.instruments import is_layer_key

# The MERIT options whose non-default values name an ablation (its label in plots and tables).
ABLATIONS = {("maxlamb", True): "maxLAMB", ("norm", "l2"): "l2", ("elementwise_clip", False): "no clip",
             ("weightwise_lower_bound", False): "no lower bound"}


@dataclass
class Run:
    folder: Path
    config: dict
    records: list[dict] = field(repr=False)
    hessian: dict | None = None

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def label(self) -> str:
        """The optimizer, with its ablation and QK-Norm if any: "merit (maxLAMB)", "adamw + qk_norm"."""
        options = self.config.get("optimizer_options") or {}
        ablations = [name for (key, value), name in ABLATIONS.items() if options.get(key) == value]
        label = self.config["optimizer"] + (f" ({', '.join(ablations)})" if ablations else "")
        return label + (" + qk_norm" if self.config.get("qk_norm") else "")

    @property
    def batch_size(self) -> int:
        return self.config["batch_size"]

    @property
    def lr(self) -> float:
        return self.config["lr"]

    @property
    def seed(self) -> int:
        return self.config["seed"]

    @functools.cached_property
    def total_steps(self) -> int:
        config = TrainConfig(**self.config)
        return config.steps(config.model_config(1).block_size)[0]

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

    def tokens_per_step(self) -> int:
        steps, tokens = self.series("tokens")
        return tokens[-1] // steps[-1] if steps and steps[-1] else 0

    def final(self, key: str) -> float | None:
        _, values = self.series(key)
        return values[-1] if values else None

    def keys(self, prefix: str) -> list[str]:
        """Every logged key starting with ``prefix``, sorted."""
        return sorted({k for r in self.records for k in r if k.startswith(prefix)})

    def layer_keys(self, stat: str) -> list[str]:
        """The per-layer keys of ``stat`` (``max_logit/layer_03``, not the per-head ones), sorted."""
        return [k for k in self.keys(f"{stat}/") if is_layer_key(k, stat)]

    def first_step_below(self, key: str, target: float) -> int | None:
        steps, values = self.series(key)
        return next((s for s, v in zip(steps, values) if v <= target), None)


def read_records(path: Path) -> list[dict]:
    """The records of a metrics.jsonl ([] if there is none yet), a torn last line (a killed run's) left out."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return records


def find_runs(paths: list[Path]) -> list[Run]:
    """Every run folder (one with config.json and metrics.jsonl) at or under ``paths``."""
    folders = sorted({m.parent for path in map(Path, paths)
                      for m in ([path / "metrics.jsonl"] if (path / "metrics.jsonl").is_file()
                                else path.rglob("metrics.jsonl"))
                      if (m.parent / "config.json").is_file()})
    runs = []
    for folder in folders:
        records = read_records(folder / "metrics.jsonl")
        hessian = folder / "hessian.json"
        runs.append(Run(folder, json.loads((folder / "config.json").read_text()), records,
                        json.loads(hessian.read_text()) if hessian.is_file() else None))
    return runs


def group(runs: list[Run], *attributes: str) -> dict[tuple, list[Run]]:
    """Runs by the values of ``attributes`` (e.g. "label", "batch_size", "lr"), keys sorted."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault(tuple(getattr(run, a) for a in attributes), []).append(run)
    # Numbers sort as numbers (batch 4 before batch 16), anything else by its text.
    return dict(sorted(groups.items(), key=lambda item: tuple(v if isinstance(v, (int, float)) else str(v)
                                                              for v in item[0])))


def best_lr(runs: list[Run]) -> dict[tuple[str, int], list[Run]]:
    """Per (label, batch): the finished seeds of the lr with the lowest mean final validation loss
    (a point some of whose seeds did not finish competes with the seeds that did)."""
    best = {}
    for key, members in group([r for r in runs if r.finished], "label", "batch_size").items():
        by_lr = {lr: seeds for (lr,), seeds in group(members, "lr").items()}
        scores = {lr: mean_std([r.final("val/loss") for r in seeds])[0] for lr, seeds in by_lr.items()}
        finite = [lr for lr, score in scores.items() if math.isfinite(score)]
        if finite:
            best[key] = by_lr[min(finite, key=scores.get)]
    return best


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value); NaN for none."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0
