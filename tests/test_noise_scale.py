"""training/noise_scale.py on linear regression with Gaussian noise, whose gradient mean and
covariance are known in closed form: the live estimate of B_simple = tr(Sigma) / |G|^2 on one rank
with accumulation, and on 2 gloo ranks (real processes) with and without accumulation.

Model: y = W* x + eps, x ~ N(0, I_d), eps ~ N(0, sigma^2 I), loss 0.5 |W x - y|^2 per example, at a
fixed W = W* + R (no step is taken, so the truth stays put). Per example and output row r, the
gradient is g = x (x . R_r - eps_r): its mean is R_r, and for Gaussian x
E[g g^T] = |R_r|^2 I + 2 R_r R_r^T + sigma^2 I, so tr(Sigma_r) = (d + 1) |R_r|^2 + d sigma^2.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from training import distributed
from training.noise_scale import GradientNoiseScale

ROOT = Path(__file__).resolve().parents[1]  # (the torchrun workers below get it as their PYTHONPATH)

D, OUT, SIGMA, MICRO = 10, 2, 1.0, 8


def problem(seed=0):
    """The model at W* + R, W*, and the true B_simple overall and for output row 0."""
    g = torch.Generator().manual_seed(seed)
    w_star = torch.randn(OUT, D, generator=g, dtype=torch.float64)
    residual = torch.randn(OUT, D, generator=g, dtype=torch.float64) * 0.3
    model = nn.Linear(D, OUT, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(w_star + residual)
    norms = residual.square().sum(1)
    traces = (D + 1) * norms + D * SIGMA ** 2
    return model, w_star, {"all": (traces.sum() / norms.sum()).item(), "row0": (traces[0] / norms[0]).item()}


def measure(model, w_star, grad_accum, ctx, steps, ddp=None, seed=0):
    """Run the training loop's measuring calls (train.py's forward_backward) for ``steps`` steps."""
    groups = {"all": [(model.weight, slice(None))], "row0": [(model.weight, slice(0, 1))]}
    noise = GradientNoiseScale(groups, MICRO, grad_accum, ctx.world_size, ema=0.9999)  # ~ the ratio of the means over all steps
    net = model
    if ddp:
        net = nn.parallel.DistributedDataParallel(model)
        if noise.in_comm_hook:
            net.register_comm_hook(None, noise.comm_hook)
    g = torch.Generator().manual_seed(seed * 1000 + ctx.rank)
    record = {}
    for _ in range(steps):
        noise.begin()
        for micro_step in range(grad_accum):
            x = torch.randn(MICRO, D, generator=g, dtype=torch.float64)
            y = x @ w_star.T + SIGMA * torch.randn(MICRO, OUT, generator=g, dtype=torch.float64)
            last = micro_step == grad_accum - 1
            with net.no_sync() if ddp and not last else torch.enable_grad():  # (no_sync covers the forward)
                loss = 0.5 * (net(x) - y).square().sum(1).mean() / grad_accum
                loss.backward()
            noise.after_backward(micro_step)
        noise.after_reduce()
        record = noise.estimate(ctx)
        model.weight.grad = None
    return noise, record


def check(record, truth, batch):
    assert record["noise_scale/batch_tokens"] == batch
    for key, suffix in (("all", ""), ("row0", "_row0")):
        estimate = record[f"noise_scale/b_simple{suffix}"]
        assert abs(estimate / truth[key] - 1) < 0.1, (key, estimate, truth[key])


def test_one_rank_with_accumulation_recovers_b_simple():
    model, w_star, truth = problem()
    ctx = distributed.Distributed(0, 0, 1, torch.device("cpu"))
    noise, record = measure(model, w_star, grad_accum=2, ctx=ctx, steps=2000)
    assert not noise.in_comm_hook and noise.big_tokens == 2 * MICRO
    check(record, truth, 2 * MICRO)


def test_one_micro_batch_on_one_rank_is_not_a_measurement():
    assert not GradientNoiseScale.possible(grad_accum=1, world_size=1)
    assert GradientNoiseScale.possible(grad_accum=2, world_size=1) and GradientNoiseScale.possible(1, 2)


@pytest.mark.slow  # torchrun, 2 gloo ranks
def test_two_gloo_ranks_recover_b_simple_in_the_comm_hook_and_over_micro_steps():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             __file__], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [line["grad_accum"] for line in lines] == [1, 2]
    for line in lines:
        check(line["record"], line["truth"], line["grad_accum"] * 2 * MICRO)
        # the hook read each rank's own micro-batch gradient: as computed without DDP
        assert line["first_small"] == pytest.approx(line["first_local"], rel=1e-12)


def worker():
    ctx = distributed.setup("cpu")
    for grad_accum in (1, 2):
        model, w_star, truth = problem()
        # The first step's micro-batch gradient on this rank, computed by hand: what must be measured.
        g = torch.Generator().manual_seed(ctx.rank)
        x = torch.randn(MICRO, D, generator=g, dtype=torch.float64)
        y = x @ w_star.T + SIGMA * torch.randn(MICRO, OUT, generator=g, dtype=torch.float64)
        local = (x.T @ (x @ model.weight.detach().T - y)).T / MICRO
        first, _ = measure(model, w_star, grad_accum, ctx, steps=1, ddp=True)
        small = first._small.tolist()  # this rank's, before the all-reduce of the estimate
        model, _, _ = problem()  # a fresh module: the first one's DDP hooks stay on its parameters
        # (Two ranks: as many micro-batches as the one-rank test above in half its steps.)
        _, record = measure(model, w_star, grad_accum, ctx, steps=1000, ddp=True)
        if ctx.is_main:
            print(json.dumps({"grad_accum": grad_accum, "record": record, "truth": truth,
                              "first_small": small[0], "first_local": local.square().sum().item()}), flush=True)
    distributed.teardown(ctx)


if __name__ == "__main__":
    worker()
