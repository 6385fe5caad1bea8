"""Zero-shot evaluation with lm-evaluation-harness 0.4.x's scoring, on our own models.

    python -m eval --ckpt runs/NAME/ckpt.pt --tasks paper [--data-dir DIR | --samples] [--out results.json]

eval/tasks.py defines the tasks (prompts, choices, metrics as the harness's YAMLs have them),
eval/scorer.py computes log-likelihoods as the harness's HF backend does, and ``evaluate`` runs
tasks through the scorer. eval/harness.py lets the harness itself run on our checkpoints.
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # eval.tasks imports datasets: not needed to import the package
    from eval.scorer import Scorer
    from eval.tasks import Task


def evaluate(scorer: Scorer, tasks: list[Task], data_dir=None, limit: int | None = None,
             log_samples: bool = False, rank: int = 0, world_size: int = 1, gather=None) -> dict:
    """{"results": {task: {metric: value, metric_stderr: value, "n": ..., "version": ...}},
    "samples": {task: [per-example records]} if log_samples}.

    Across ranks (train.py): each rank scores examples rank, rank + world_size, ...; ``gather(obj)``
    returns every rank's obj (training.distributed.all_gather_objects), and every rank returns the
    results of all examples, in order.
    """
    results, samples = {}, {}
    for task in tasks:
        start = time.perf_counter()
        docs = task.load_docs(data_dir, limit)
        mine = list(range(rank, len(docs), world_size))
        requests = [task.requests(docs[i]) for i in mine]
        flat = [request for doc_requests in requests for request in doc_requests]
        score = scorer.loglikelihood_rolling if task.kind == "rolling" else scorer.loglikelihood
        try:
            scored, refusal = score(flat, desc=task.name), None
        except ValueError as error:  # a request the model cannot score: every rank refuses the task together
            scored, refusal = [], f"task {task.name}: {error}"
        refusals = [r for r in (gather(refusal) if world_size > 1 else [refusal]) if r]
        if refusals:
            raise ValueError(refusals[0])
        outputs = iter(scored)
        records = [{"doc_id": i, "requests": doc_requests, "results": [next(outputs) for _ in doc_requests]}
                   for i, doc_requests in zip(mine, requests)]
        for record in records:
            record["metrics"] = task.process(docs[record["doc_id"]], record["results"])
        if world_size > 1:
            records = sorted((r for rank_records in gather(records) for r in rank_records), key=lambda r: r["doc_id"])
            if [r["doc_id"] for r in records] != list(range(len(docs))):
                raise RuntimeError(f"task {task.name}: the ranks scored examples {[r['doc_id'] for r in records]}, "
                                   f"not each of the {len(docs)} once (do all ranks have the same data?)")
        summary = {"version": task.version, "n": len(docs)}
        for metric in task.metrics:
            values = [record["metrics"][metric] for record in records]
            summary[metric] = task.aggregate(metric, values)
            summary[f"{metric}_stderr"] = task.stderr(metric, values)
        summary["seconds"] = time.perf_counter() - start
        results[task.name] = summary
        if log_samples:
            samples[task.name] = records
    return {"results": results, **({"samples": samples} if log_samples else {})}


def format_table(results: dict) -> str:
    """The results as a plain-text table: task, version, n, metric, value, stderr. Values and
    stderrs are printed as the harness's make_table prints them: four decimals however large (a
    perplexity's bootstrap stderr on a few examples of a barely trained model can have twenty
    digits, in the harness too), "N/A" where it has none."""
    rows = [("task", "version", "n", "metric", "value", "stderr")]
    for name, summary in results.items():
        metrics = [k for k in summary if k not in ("version", "n", "seconds") and not k.endswith("_stderr")]
        for i, metric in enumerate(metrics):
            stderr = summary[f"{metric}_stderr"]
            rows.append((name if i == 0 else "", str(summary["version"]) if i == 0 else "",
                         str(summary["n"]) if i == 0 else "", metric, f"{summary[metric]:.4f}",
                         "N/A" if stderr is None or math.isnan(stderr) else f"{stderr:.4f}"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
