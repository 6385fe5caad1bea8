"""ZeRO-1 and FSDP2 give the parameters of one unsharded process, for every optimizer and MERIT
ablation; the optimizer state per rank is the partition's share; a sharded (DCP) checkpoint saved
on 4 ranks resumes on 2 and on 1 and continues exactly as the uninterrupted run.

Real gloo processes under torchrun. Every rank computes the same global batch's gradient, so
the comparison isolates the sharding: under FSDP2 rank 0 alone contributes the gradient (its loss
scaled by the world size, the others' by 0), so the reduce-scatter's sum is exact and the
gradient is bitwise the one-process gradient on 1, 2 and 4 ranks alike. The main rank also steps
an unsharded copy in-process (no collectives), the one-process reference."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]  # (the torchrun workers below get it as their PYTHONPATH)
pytestmark = pytest.mark.slow  # torchrun, 2 to 4 gloo ranks
STEPS, SAVE_AT = 10, 5
# Rows that do not divide by 2, 3 or 4 ranks: c_attn 18, vocabulary 61 (16/16/16/13 on 4 ranks),
# c_proj and every vector 6 (2/2/2/0 on 4 ranks: an empty shard). No biases, as in GPT-2's reference
# training code: a key bias's gradient is zero but for rounding noise, which AdamW turns into
# lr-sized steps, and torch's fused AdamW kernel rounds an element differently at a different
# place in its vectorised loop (a shard boundary moves it): 1e-5 apart after 10 steps, 7e-8 without.
SHAPES = dict(n_layer=2, n_head=2, n_embd=6, block_size=8, vocab_size=61, dropout=0.0, bias=False)
# Sharded (DCP) checkpoints saved on 4 ranks and resumed on 2 and 1: MERIT's row shards, and SOAP's state
# whole on every rank (refreshed before and after the save).
CHECKPOINTED = [("merit", {}), ("soap", {"precondition_frequency": 3})]
CONFIGS = [("adamw", {}), ("lamb", {}), ("lamb", {"bias_correction": True, "ratio_only_with_decay": True}),
           ("merit", {}), ("merit", {"norm": "l2"}), ("merit", {"weightwise_lower_bound": False}),
           ("merit", {"elementwise_clip": False}), ("merit", {"maxlamb": True}), ("lion", {}),
           ("sophiag", {"hessian_interval": 3}), ("muon", {}), ("dmuon", {}), ("ademamix", {}),
           ("mars", {}), ("adamw_schedulefree", {}),
           ("soap", {"precondition_frequency": 3}),  # (refreshes at t = 3, 6, 9 of the 10 steps)
           ("muon", {"adjust_lr": "original", "ns_dtype": "float32", "nesterov": False})]


def torchrun(nproc: int, *args: str) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    result = subprocess.run([*launcher, __file__, *args] if nproc > 1 else [sys.executable, __file__, *args],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("mode,nproc", [("zero1", 2), ("zero1", 3), ("fsdp", 2), ("fsdp", 4)])
def test_sharded_optimizers_give_the_unsharded_parameters(mode, nproc):
    from optim.muon import NS_DTYPES, default_ns_dtype
    lines = torchrun(nproc, "exact", mode)
    assert [[line["optimizer"], line["options"]] for line in lines] == [list(c) for c in CONFIGS]
    for line in lines:
        label = (line["optimizer"], line["options"])
        # Muon (and D-Muon) with a float32 Newton-Schulz under FSDP2: torch's fused AdamW kernel of its AdamW part
        # rounds an embedding element differently at a shard boundary (1e-9 after 3 steps, as
        # AdamW's own above), and a float32 orthogonalisation carries that on more than a bfloat16
        # one, which rounds it away (measured: 2e-6 and 3e-6 on 2 and 4 ranks; bfloat16: 0 and 5e-8).
        # ns_dtype "auto" (the default) is float32 on a CPU with neither AMX nor AVX512-BF16.
        float32_muon = line["optimizer"] in ("muon", "dmuon") and (NS_DTYPES[line["options"].get("ns_dtype", "auto")]
                                                        or default_ns_dtype(torch.device("cpu"))) == torch.float32
        assert line["max_rel"] <= (1e-5 if float32_muon and mode == "fsdp" else 1e-6), label
        assert line["diagnostic_keys_equal"] and line["diagnostics_max_rel"] <= 1e-5, label
        assert line["diagnostics"] > 0 or line["optimizer"] in ("adamw", "lion", "ademamix", "adamw_schedulefree"), \
            label  # (they record none)
        # The optimizer state per rank: exactly the state one process keeps of the elements it holds
        # (nothing replicated but the 0-d step counters), the shares adding up to the whole.
        shares = line["shares"]
        if line["optimizer"] == "soap" and mode == "fsdp":
            # But SOAP's under FSDP2: one process's whole state on every rank, which computes every whole
            # update and applies its rows (optim/soap.py).
            assert line["state"] == [line["replicated_state"]] * nproc, label
        else:
            assert line["state"] == line["expected_state"], label
            assert sum(line["state"]) == line["replicated_state"], label
        assert sum(shares) == pytest.approx(1.0) and max(shares) <= line["max_share"], label
    # ZeRO's greedy partition gives each parameter to the least-loaded rank, which holds at most the
    # mean: no rank exceeds 1/world by more than the largest parameter (the embedding here).
    # FSDP2's row shards: at most one row per matrix above 1/world.
    bound = 1 / nproc + (lines[0]["largest_share"] if mode == "zero1" else lines[0]["rows_share"])
    assert 1 / nproc <= lines[0]["max_share"] <= bound


def test_a_sharded_checkpoint_of_4_ranks_resumes_on_2_and_on_1_exactly(tmp_path):
    saved = torchrun(4, "save", str(tmp_path))
    # The uninterrupted 4-rank run is the one-process run, bitwise; SOAP's state is whole on every rank.
    assert saved == [{"optimizer": name, "matches_unsharded": True, "whole_state": name == "soap"}
                     for name, _ in CHECKPOINTED]
    for name, _ in CHECKPOINTED:
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == ["ckpt.pt", f"ckpt_{SAVE_AT:08d}.dcp",
                                                                        "uninterrupted.pt"]
    for nproc in (2, 1):
        resumed = torchrun(nproc, "resume", str(tmp_path))
        assert resumed == [{"optimizer": name, "world": nproc, "restored_step": SAVE_AT, "equal": True}
                           for name, _ in CHECKPOINTED]


# --- the workers ---
def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(SHAPES["vocab_size"], (4, SHAPES["block_size"] + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


class Loop:
    """The training loop of these runs: Sophia-G's Hessian pass takes its gradients from ``gradients``
    (an ``optim.GradientFn``)."""

    def __init__(self, model, optimizer, weight: float):
        self.model, self.optimizer, self.weight = model, optimizer, weight

    def backward(self, loss_fn, step: int):
        x, y = batch(step)
        (loss_fn(self.model, x, y, step) * self.weight).backward()

    @contextmanager
    def gradients(self, loss_fn):
        self.backward(loss_fn, 10_000 + self.step)
        yield list(self.model.parameters())
        self.optimizer.zero_grad(set_to_none=True)


def train(loop: Loop, start: int, stop: int) -> dict:
    diagnostics = {}
    for step in range(start, stop):
        loop.step = step
        loop.backward(lambda model, x, y, _: model(x, y)[1], step)
        if (step + 1) % 5 == 0:
            loop.optimizer.request_diagnostics()
        loop.optimizer.step()
        diagnostics.update(loop.optimizer.pop_diagnostics())
        loop.optimizer.zero_grad(set_to_none=True)
        if loop.optimizer.extra_pass_due(step + 1):
            loop.optimizer.extra_pass(loop.gradients, seed=0)
    return diagnostics


def build(name, options, ctx, mode):
    """(model, optimizer, gradient weight) of this rank for ``mode`` ("single", "zero1", "fsdp")."""
    import optim
    from model import GPT, GPTConfig
    from training.parallel import Layout
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPES))
    weight = 1.0
    if mode == "fsdp":
        Layout("fsdp", ctx).shard(model, torch.float32)
        weight = float(ctx.world_size) if ctx.is_main else 0.0
    hyper = {"lr": 3e-3, "weight_decay": 0.1}
    optimizer = optim.build(name, model, **hyper, **options, batch_tokens=32, run_steps=STEPS,
                            zero_redundancy=mode == "zero1")
    return model, optimizer, weight


def full(model) -> dict[str, torch.Tensor]:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in model.state_dict().items()}


def max_rel(a: dict, b: dict) -> float:
    return max(((a[k] - b[k]).norm() / b[k].norm().clamp(min=1e-30)).item() for k in b)


def exact(ctx, mode):
    from optim.sharding import local
    from training.memory import optimizer_state_bytes, tensor_bytes
    for name, options in CONFIGS:
        model, optimizer, weight = build(name, options, ctx, mode)
        diagnostics = train(Loop(model, optimizer, weight), 0, STEPS)
        optimizer.eval()  # the evaluated point (Schedule-Free's x; the weights for the rest)
        # The one-process reference, on the main rank (the others would train the same copy): what it
        # keeps per element of each parameter (Muon: 1 for a matrix, 2 for the rest) goes to every rank.
        per_element = [None]
        if ctx.is_main:
            reference, reference_opt, _ = build(name, options, ctx, "single")
            expected = train(Loop(reference, reference_opt, 1.0), 0, STEPS)
            reference_opt.eval()
            per_element = [{name: sum(t.numel() * t.element_size() for t in reference_opt.state[p].values() if t.ndim)
                            / p.numel() for name, p in reference.named_parameters()}]
        torch.distributed.broadcast_object_list(per_element, src=0)
        per_element = per_element[0]
        counters = lambda opt: sum(t.nbytes for s in getattr(opt, "optim", opt).state.values()  # noqa: E731
                                   for t in s.values() if t.ndim == 0)
        state = torch.tensor([optimizer_state_bytes(optimizer) - counters(optimizer)])
        if mode == "zero1":
            owned = optimizer.partition_numel()
        else:
            owned = [0] * ctx.world_size
            owned[ctx.rank] = tensor_bytes(model.parameters()) // 4
            owned = torch.tensor(owned)
            torch.distributed.all_reduce(owned)
            owned = owned.tolist()
        if mode == "zero1":
            names = {id(p): name for name, p in model.named_parameters()}
            held = {names[id(p)]: p.numel() for group in optimizer._partition_parameters()[ctx.rank]
                    for p in group["params"]}
        else:
            held = {name: local(p).numel() for name, p in model.named_parameters()}
        expected_state = torch.tensor([round(sum(per_element[name] * n for name, n in held.items()))])
        states, expected_states = ([torch.zeros_like(state) for _ in range(ctx.world_size)] for _ in range(2))
        torch.distributed.all_gather(states, state)
        torch.distributed.all_gather(expected_states, expected_state)
        result = full(model)
        if ctx.is_main:
            numel = sum(p.numel() for p in reference.parameters())
            print(json.dumps({
                "optimizer": name, "options": options, "max_rel": max_rel(result, full(reference)),
                "diagnostic_keys_equal": sorted(diagnostics) == sorted(expected), "diagnostics": len(expected),
                "diagnostics_max_rel": max((abs(diagnostics[k] - v) / max(abs(v), 1e-30) for k, v in expected.items()),
                                           default=0.0),
                "state": [s.item() for s in states], "expected_state": [s.item() for s in expected_states],
                "replicated_state": optimizer_state_bytes(reference_opt)
                - counters(reference_opt), "numel": numel, "shares": [n / numel for n in owned],
                "max_share": max(owned) / numel,
                "largest_share": max(p.numel() for p in reference.parameters()) / numel,
                "rows_share": sum(p[0].numel() for p in reference.parameters()) / numel}), flush=True)


def save(ctx, folder):
    from torch.distributed.tensor import DTensor

    from training.checkpoint import Checkpoint
    from training.sharded_checkpoint import save_sharded_in
    for name, options in CHECKPOINTED:
        model, optimizer, weight = build(name, options, ctx, "fsdp")
        loop = Loop(model, optimizer, weight)
        train(loop, 0, SAVE_AT)
        checkpoint = Checkpoint(model={}, model_args=SHAPES, optimizer={}, scaler={}, step=SAVE_AT, tokens=0, rng=[],
                                train_loader={}, config={}) if ctx.is_main else None
        (folder / name).mkdir(exist_ok=True)  # (the run folder, which the trainer makes)
        save_sharded_in(folder / name, checkpoint, model, optimizer, SAVE_AT, keep=2)
        train(loop, SAVE_AT, STEPS)
        result = full(model)
        # SOAP keeps its state whole on every rank (plain tensors); the others shard it as their parameters.
        whole = not any(isinstance(t, DTensor) for state in optimizer.state.values() for t in state.values())
        if ctx.is_main:
            reference, reference_opt, _ = build(name, options, ctx, "single")
            train(Loop(reference, reference_opt, 1.0), 0, STEPS)
            torch.save(result, folder / name / "uninterrupted.pt")
            same = all(torch.equal(result[k], v) for k, v in full(reference).items())
            print(json.dumps({"optimizer": name, "matches_unsharded": same, "whole_state": whole}), flush=True)


def resume(ctx, folder):
    from training.checkpoint import CHECKPOINT_NAME, Checkpoint
    from training.sharded_checkpoint import load_sharded_state
    for name, options in CHECKPOINTED:
        model, optimizer, weight = build(name, options, ctx, "fsdp" if ctx.enabled else "single")
        path = (folder / name / CHECKPOINT_NAME).resolve()
        checkpoint = Checkpoint.load(path)
        load_sharded_state(path, checkpoint, model, optimizer)
        train(Loop(model, optimizer, weight), checkpoint.step, STEPS)
        result, expected = full(model), torch.load(folder / name / "uninterrupted.pt", weights_only=True)
        if ctx.is_main:
            print(json.dumps({"optimizer": name, "world": ctx.world_size, "restored_step": checkpoint.step,
                              "equal": all(torch.equal(result[k], v) for k, v in expected.items())}), flush=True)


if __name__ == "__main__":
    from training import distributed
    context = distributed.setup("cpu")
    command, argument = sys.argv[1:3]
    {"exact": exact, "save": save, "resume": resume}[command](context, Path(argument) if command != "exact"
                                                              else argument)
    distributed.teardown(context)
