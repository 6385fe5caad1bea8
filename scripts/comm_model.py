"""What goes over the wire between replica groups, projected: DDP, PowerSGD and DiLoCo by link.

    python -m scripts.comm_model [--groups 8] [--gpus-per-group 8] [--batch 512] [--mfu 0.4]
                                 [--peak-flops 989e12] [--powersgd-rank 4] [--measured RUN_DIR] [--json FILE]

The model (docs/scaling_out.md, "What goes over the wire"): G replica groups, each of --gpus-per-group
accelerators that split a global batch of --batch sequences; a step computes for
``flops_per_token x tokens per group / (gpus x peak x MFU)`` seconds (model.py's 6N + attention);
between the groups only one collective a step crosses the link that joins them, a ring
all-reduce of ``bytes`` taking ``2 (G - 1) / G x bytes / bandwidth + 2 (G - 1) x latency``, not
overlapped with compute (an upper bound: DDP overlaps its buckets with the backward, DiLoCo's
meeting blocks). What each method sends:

- DDP: the gradient in float32, 4N bytes, every step;
- PowerSGD at rank r: each matrix that compresses by more than 2x as its two rank-r factors,
  (rows + columns) x r float32 numbers, the rest whole (torch's powerSGD_hook's rule), every step,
  in three all-reduces (three latencies);
- DiLoCo every H steps (10, 50, 100): the pseudo-gradient in float32, 4N bytes, once per H steps.

Links: an in-cluster one (400 Gbit/s, 10 us latency) and cross-datacenter ones (10 and 1 Gbit/s,
10 ms). Models: GPT-2 Small, Medium and Large and Llama-350M (model.py's presets at their
context). Prints, per model, each method's step time on each link and the share of it computing.

With ``--measured RUN_DIR`` it also projects from a run's own record: its median tokens_per_s
(its step time at its batch, taken as compute) and the bytes it sent across groups per step
(``replicas/bytes_allreduced``, else the bytes of its gradient reductions, ``comm/gradient_bytes``)
sent once a step over each link.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from model import GPT, GPTConfig

MODELS = {"GPT-2 Small": "gpt2", "GPT-2 Medium": "gpt2-medium", "GPT-2 Large": "gpt2-large",
          "Llama-350M": "llama_350m"}
LINKS = {"400 Gbit/s in-cluster": (400e9, 10e-6), "10 Gbit/s cross-DC": (10e9, 10e-3),
         "1 Gbit/s cross-DC": (1e9, 10e-3)}  # (bits per second, latency in seconds)
DILOCO_H = (10, 50, 100)
FLOAT32 = 4


def allreduce_seconds(nbytes: float, groups: int, link: tuple[float, float], collectives: int = 1) -> float:
    """Ring all-reduces of ``nbytes`` in all, ``collectives`` of them, over ``groups`` members joined by
    ``link`` (bandwidth, latency)."""
    bandwidth, latency = link
    return 2 * (groups - 1) / groups * nbytes * 8 / bandwidth + collectives * 2 * (groups - 1) * latency


def powersgd_numbers(model: GPT, rank: int) -> int:
    """The numbers PowerSGD at ``rank`` sends for ``model``'s gradient (torch's rule: a matrix, as
    rows x the rest, that compresses by more than 2x goes as (rows + columns) x rank)."""
    numbers = 0
    for p in model.parameters():
        rows, columns = (p.shape[0], p.numel() // p.shape[0]) if p.ndim > 1 else (0, 0)
        numbers += (rows + columns) * rank if p.ndim > 1 and 2 * (rows + columns) * rank < rows * columns else p.numel()
    return numbers


def methods(parameters: int, powersgd: int, rank: int) -> dict[str, tuple[float, int, int]]:
    """{method: (bytes it sends, every how many steps, in how many all-reduces)}: PowerSGD's are three
    (the P factors, the Q factors, the tensors sent whole)."""
    return {"DDP": (FLOAT32 * parameters, 1, 1), f"PowerSGD r={rank}": (FLOAT32 * powersgd, 1, 3),
            **{f"DiLoCo H={h}": (FLOAT32 * parameters, h, 1) for h in DILOCO_H}}


def project(compute_s: float, sent: dict[str, tuple[float, int]], groups: int) -> dict:
    """Each method's step on each link: its bytes per step, communication and step seconds, and the
    share of the step spent computing."""
    out = {}
    for method, (nbytes, every, collectives) in sent.items():
        out[method] = {}
        for link_name, link in LINKS.items():
            comm = allreduce_seconds(nbytes, groups, link, collectives) / every
            out[method][link_name] = {"bytes_per_step": nbytes / every, "comm_s": comm, "step_s": compute_s + comm,
                                      "computing": compute_s / (compute_s + comm)}
    return out


def model_projection(preset: str, args) -> dict:
    with torch.device("meta"):
        model = GPT(GPTConfig.preset(preset))
    tokens_per_group = args.batch * model.config.block_size / args.groups
    compute_s = model.flops_per_token() * tokens_per_group / (args.gpus_per_group * args.peak_flops * args.mfu)
    parameters = sum(p.numel() for p in model.parameters())
    return {"parameters": parameters, "block_size": model.config.block_size, "compute_s": compute_s,
            "methods": project(compute_s, methods(parameters, powersgd_numbers(model, args.powersgd_rank),
                                                  args.powersgd_rank), args.groups)}


def measured_projection(run_dir: Path, groups: int) -> dict:
    """The projection from a run's record: its compute per step and the bytes it sent per step."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "tokens_per_s" in r]
    if not logged:
        raise SystemExit(f"{run_dir}/metrics.jsonl has no tokens_per_s: point --measured at a run that logged steps")
    last = logged[-1]
    key = next((k for k in ("replicas/bytes_allreduced", "comm/gradient_bytes") if k in last), None)
    if key is None:
        raise SystemExit(f"{run_dir} logged no bytes (replicas/bytes_allreduced, comm/gradient_bytes): measure a "
                         f"run of several ranks or replica groups")
    compute_s = last["batch/tokens_per_step"] / statistics.median(r["tokens_per_s"] for r in logged)
    nbytes = last[key] / last["step"]
    return {"run": str(run_dir), "bytes_key": key, "compute_s": compute_s, "bytes_per_step": nbytes,
            "methods": project(compute_s, {"as measured": (nbytes, 1, 1)}, groups)}


def table(name: str, projection: dict) -> str:
    lines = [f"{name}: compute {projection['compute_s'] * 1e3:.1f} ms a step; step ms (computing %) by link"]
    lines.append(f"  {'method':<16}" + "".join(f"{link:>26}" for link in LINKS))
    for method, by_link in projection["methods"].items():
        lines.append(f"  {method:<16}" + "".join(f"{v['step_s'] * 1e3:>17.1f} ({v['computing']:>4.0%})"
                                                 for v in by_link.values()))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=8, help="replica groups (the DiLoCo paper's 8)")
    parser.add_argument("--gpus-per-group", type=int, default=8)
    parser.add_argument("--batch", type=int, default=512, help="global sequences per step")
    parser.add_argument("--mfu", type=float, default=0.4)
    parser.add_argument("--peak-flops", type=float, default=989e12, help="per accelerator (H100 bf16: 989e12)")
    parser.add_argument("--powersgd-rank", type=int, default=4)
    parser.add_argument("--measured", type=Path, help="a run folder to project from its own record")
    parser.add_argument("--json", type=Path, help="write the projections here")
    args = parser.parse_args(argv)
    if args.groups < 2:
        parser.error(f"--groups {args.groups}: the model is of the link between groups; use 2 or more")
    result = {"assumptions": {"groups": args.groups, "gpus_per_group": args.gpus_per_group, "batch": args.batch,
                              "mfu": args.mfu, "peak_flops": args.peak_flops, "powersgd_rank": args.powersgd_rank,
                              "links": {name: {"bits_per_s": bandwidth, "latency_s": latency}
                                        for name, (bandwidth, latency) in LINKS.items()},
                              "overlap": "none"},
              "models": {name: model_projection(preset, args) for name, preset in MODELS.items()}}
    print(f"{args.groups} replica groups x {args.gpus_per_group} GPUs at {args.peak_flops:.3g} FLOP/s and MFU "
          f"{args.mfu:.0%}, global batch {args.batch} sequences; one all-reduce a step across the groups, not "
          f"overlapped")
    for name, projection in result["models"].items():
        print(f"{table(name, projection)}\n")
    if args.measured:
        result["measured"] = measured_projection(args.measured, args.groups)
        print(table(f"measured ({args.measured}, {result['measured']['bytes_per_step']:.0f} bytes a step)",
                    result["measured"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
