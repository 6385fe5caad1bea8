"""ZeRO-1 and FSDP2 give the parameters of one unsharded process, for every optimizer and MERIT
ablation on GPT-2, and DDP, ZeRO-1 and FSDP2 for every optimizer on the Llama family (MuonClip and
soft-capped logits among them); the optimizer state per rank is the partition's share (DDP: the
whole, on every rank alike; what is whole with its parameter, on every rank that holds some of it); a
sharded (DCP) checkpoint saved on 4 ranks resumes on 2 and on 1 and continues exactly as the
uninterrupted run (Adafactor's to float32's rounding: its statistics sum over the ranks).

Real gloo processes under torchrun. Every rank computes the same global batch's gradient, so
the comparison isolates the layout: under DDP and FSDP2 rank 0 alone contributes the gradient (its
loss scaled by the world size, the others' by 0), so DDP's average and FSDP2's reduce-scatter are
exact and the gradient is bitwise the one-process gradient on 1, 2 and 4 ranks alike. The main
rank also steps an unsharded copy in-process (no collectives), the one-process reference."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from contextlib import contextmanager, nullcontext
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
# The Llama family: model.py's llama_nano preset cut to the same width: head_dim 2 (one rotary pair a
# head), q, k, v and o of 6 rows, the SwiGLU's gate and up of 9 (5/4 on 2 ranks), the untied LM head of
# 61. One block, which holds every kind of its parameters (a second one cost 40% more time here).
LLAMA = dict(n_layer=1, n_head=3, n_embd=6, intermediate_size=9, block_size=8, vocab_size=61)
# QK-Clip's tau amid these models' largest attention logits (4e-3 to 2e-2 over the 10 steps): some heads
# clipped, some not (the test checks both, and that no logit came near tau, where rounding could decide).
# Soft-caps at the logits' own scale (attention 1e-2, output 0.2), where tanh bends them: Gemma 2's 50
# and 30 would leave them within 1e-8 of uncapped, below the tolerance, so a layout that lost a cap passed.
QK_CLIP_TAU = 8e-3
SOFTCAPS = dict(attn_logit_softcap=1e-2, final_logit_softcap=0.1)
# Adafactor with every matrix factored (each has a side of 6: GPT-2's 61 x 6 and 18 x 6 with the columns the
# shorter side, 6 x 24 with the rows, 6 x 6 a tie; the Llama family's 9 x 6 and 6 x 9 too), so that FSDP2's
# row shards meet its row and column statistics; the vectors unfactored.
ADAFACTOR = {"min_dim_size_to_factor": 6}
# Sharded (DCP) checkpoints saved on 4 ranks and resumed on 2 and 1: MERIT's row shards, SOAP's state
# whole on every rank (refreshed before and after the save), and Adafactor's both: its vectors' second
# moments in row shards, its matrices' row and column statistics whole on every rank.
CHECKPOINTED = [("merit", {}), ("soap", {"precondition_frequency": 3}), ("adafactor", ADAFACTOR)]
# Muon's and D-Muon's Newton-Schulz: in float32 wherever the case checks the layout to float32's
# rounding (and QK-Clip's decisions, which a bfloat16 run's rounding could move); GPT-2's plain
# ("muon", {}) keeps the default ("auto": bfloat16 on CPUs with bfloat16 units), held to bfloat16's
# rounding under FSDP2 (test below).
CONFIGS = [("adamw", {}), ("lamb", {}), ("lamb", {"bias_correction": True, "ratio_only_with_decay": True}),
           ("merit", {}), ("merit", {"norm": "l2"}), ("merit", {"weightwise_lower_bound": False}),
           ("merit", {"elementwise_clip": False}), ("merit", {"maxlamb": True}), ("lion", {}),
           ("sophiag", {"hessian_interval": 3}), ("muon", {}), ("dmuon", {"ns_dtype": "float32"}),
           ("ademamix", {}), ("mars", {}), ("adamw_schedulefree", {}),
           ("soap", {"precondition_frequency": 3}),  # (refreshes at t = 3, 6, 9 of the 10 steps)
           ("muon", {"adjust_lr": "original", "ns_dtype": "float32", "nesterov": False}),
           ("sgd", {"momentum": 0.9}), ("adafactor", ADAFACTOR)]
# Every optimizer on the Llama family, with what its case adds to the model or the loop: MuonClip (Muon
# with QK-Clip, Kimi K2's pair) and AdamW with both soft-caps.
LLAMA_CONFIGS = [("adamw", {}, SOFTCAPS), ("lamb", {}, {}), ("merit", {}, {}), ("lion", {}, {}),
                 ("sophiag", {"hessian_interval": 3}, {}),
                 ("muon", {"ns_dtype": "float32"}, {"qk_clip_tau": QK_CLIP_TAU}),
                 ("dmuon", {"ns_dtype": "float32"}, {}), ("ademamix", {}, {}), ("mars", {}, {}),
                 ("adamw_schedulefree", {}, {}),
                 ("soap", {"precondition_frequency": 3}, {}), ("sgd", {"momentum": 0.9}, {}),
                 ("adafactor", ADAFACTOR, {})]
# The torchrun launches: (GPT-2's layout, then the Llama family's in the same processes, ranks). DDP on
# 2 ranks (rank 0's gradient x 2 and rank 1's zero average exactly), ZeRO-1 on 3 (partitions that do
# not divide), FSDP2 on 2; the 4 processes on 4 ranks run GPT-2 alone (on 2 cores they cost twice as much).
LAUNCHES = [("zero1", "ddp", 2), ("zero1", "zero1", 3), ("fsdp", "fsdp", 2), ("fsdp", "none", 4)]


def torchrun(nproc: int, *args: str) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    result = subprocess.run([*launcher, __file__, *args] if nproc > 1 else [sys.executable, __file__, *args],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("mode,llama_mode,nproc", LAUNCHES)
def test_sharded_optimizers_give_the_unsharded_parameters(mode, llama_mode, nproc):
    lines = torchrun(nproc, "exact", mode, llama_mode)
    llama = [["llama", llama_mode, name, options] for name, options, _ in LLAMA_CONFIGS] if llama_mode != "none" else []
    assert [[line["model"], line["mode"], line["optimizer"], line["options"]] for line in lines] == \
        [["gpt2", mode, *c] for c in CONFIGS] + llama
    for line in lines:
        label = (line["model"], line["mode"], line["optimizer"], line["options"])
        # Muon (and D-Muon) under FSDP2: torch's fused AdamW kernel of its AdamW part rounds an embedding
        # element differently at a shard boundary (1e-9 after 3 steps, as AdamW's own above), so the
        # gathered matrices Newton-Schulz orthogonalises differ from one process's in their last bits.
        # A float32 iteration carries that on to 1e-5 at most (2e-6 and 3e-6 on 2 and 4 ranks). A
        # bfloat16 one rounds every product of its five iterations to 2^-8 relative: where those last
        # bits move one rounding (or the CPU's bfloat16 kernels sum in another order: AVX512-BF16's do,
        # AMX's did not), the runs' updates part by bfloat16's rounding, which the iteration and the next
        # steps carry on. The bound is that rounding carried through this very run, on this CPU: the
        # one-process run with a float32 iteration differs from the bfloat16 one by bfloat16's rounding
        # alone (float32's is 2^16 times finer), carried through the same steps ("bf16_rounding"); two
        # bfloat16 runs whose roundings fall apart are each about that far from the float32 one, so within
        # twice it of each other (the triangle inequality), and twice again for how much further one
        # order's roundings may carry than another's (the same bfloat16 work reordered here, its products
        # summed in 1 to 3 parts or transposed, moved GPT-2's parameters by 0.7 to 1.8 times the distance).
        bf16 = line["bf16_rounding"]
        allowed = 4 * bf16["params"] if bf16 else 1e-5 if line["ns_dtype"] == "float32" and line["mode"] == "fsdp" \
            else 1e-6
        assert line["max_rel"] <= allowed, (label, line["max_rel"], allowed)
        assert line["diagnostic_keys_equal"], label
        assert line["diagnostics_max_rel"] <= max(1e-5, 4 * bf16["diagnostics"] if bf16 else 0), label
        assert line["diagnostics"] > 0 or line["optimizer"] in ("adamw", "lion", "ademamix", "adamw_schedulefree",
                                                               "sgd", "adafactor"), label  # (they record none)
        # QK-Clip clipped the same heads as one process, some of its heads x steps and not all, no logit
        # within 1e-3 of tau; the soft-caps bend the reference's largest logits by 5% or more.
        clipped, expected_clipped = line["heads_clipped"]
        clipping = "qk_clip_tau" in line["extra"]
        assert clipped == expected_clipped and (0 < clipped < LLAMA["n_layer"] * LLAMA["n_head"] * STEPS if clipping
                                                else clipped == 0), label
        assert not clipping or line["clip_margin"] > 1e-3, label
        ratios = line["softcap_ratios"]
        assert len(ratios) == len(SOFTCAPS.keys() & line["extra"].keys()) and all(r < 0.95 for r in ratios), label
        if line["mode"] == "ddp":
            # Every rank keeps one process's whole state and steps its replica to rank 0's, bitwise.
            assert line["replicas_equal"] and line["state"] == [line["replicated_state"]] * nproc, label
            continue
        assert line["replicas_equal"] in (True, None), label  # (ZeRO-1's replicas; FSDP2 has none)
        # The optimizer state per rank: exactly the state one process keeps of the elements it holds
        # (nothing replicated but the 0-d step counters), the shares adding up to the whole.
        shares = line["shares"]
        if line["optimizer"] == "soap" and line["mode"] == "fsdp":
            # But SOAP's under FSDP2: one process's whole state on every rank, which computes every whole
            # update and applies its rows (optim/soap.py).
            assert line["state"] == [line["replicated_state"]] * nproc, label
        else:
            # State of another shape than its parameter (Adafactor's row and column statistics of a factored
            # matrix) is whole with its parameter: under FSDP2, on every rank (optim/adafactor.py).
            assert line["state"] == line["expected_state"], label
            copies = nproc if line["mode"] == "fsdp" else 1
            assert sum(line["state"]) == line["replicated_state"] + (copies - 1) * line["whole_state"], label
            assert (line["whole_state"] > 0) == (line["optimizer"] in ("adafactor", "soap")), label
        assert sum(shares) == pytest.approx(1.0) and max(shares) <= line["max_share"], label
        # ZeRO's greedy partition gives each parameter to the least-loaded rank, which holds at most the
        # mean: no rank exceeds 1/world by more than the largest parameter (the embedding here).
        # FSDP2's row shards: at most one row per matrix above 1/world.
        bound = 1 / nproc + (line["largest_share"] if line["mode"] == "zero1" else line["rows_share"])
        assert 1 / nproc <= line["max_share"] <= bound, label


def test_a_sharded_checkpoint_of_4_ranks_resumes_on_2_and_on_1_exactly(tmp_path):
    saved = torchrun(4, "save", str(tmp_path))
    # The uninterrupted 4-rank run is the one-process run: bitwise, but Adafactor's, whose column statistics
    # and rms sum over the ranks (the summation order alone: float32's rounding, as in the test above).
    # MERIT's state is in row shards, SOAP's whole on every rank, Adafactor's both.
    layouts = {"merit": ["rows"], "soap": ["whole"], "adafactor": ["rows", "whole"]}
    assert [(line["optimizer"], line["state_layouts"]) for line in saved] == [
        (name, layouts[name]) for name, _ in CHECKPOINTED]
    bound = {"adafactor": 1e-6}
    assert all(line["unsharded_max_rel"] <= bound.get(line["optimizer"], 0.0) for line in saved), saved
    for name, _ in CHECKPOINTED:
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == ["ckpt.pt", f"ckpt_{SAVE_AT:08d}.dcp",
                                                                        "uninterrupted.pt"]
    for nproc in (2, 1):
        resumed = torchrun(nproc, "resume", str(tmp_path))
        assert [(line["optimizer"], line["world"], line["restored_step"]) for line in resumed] == [
            (name, nproc, SAVE_AT) for name, _ in CHECKPOINTED]
        assert all(line["max_rel"] <= bound.get(line["optimizer"], 0.0) for line in resumed), resumed


# --- the workers ---
def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(SHAPES["vocab_size"], (4, SHAPES["block_size"] + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


class Loop:
    """The training loop of these runs: ``train_model`` (DDP's wrapper, else ``model``) computes the
    losses, scaled by ``weight``; ``clip`` (a QKClip, or None) measures the training passes and clips
    after each step; Sophia-G's Hessian pass takes its gradients from ``gradients`` (an
    ``optim.GradientFn``)."""

    def __init__(self, model, optimizer, weight: float, train_model=None, clip=None):
        self.model, self.optimizer, self.weight, self.clip = model, optimizer, weight, clip
        self.train_model = train_model or model
        self.heads_clipped, self.clip_margin = 0, math.inf  # QK-Clip's: and the nearest logit to tau, relative

    def backward(self, loss_fn, step: int):
        x, y = batch(step)
        (loss_fn(self.train_model, x, y, step) * self.weight).backward()

    def clip_after_step(self):
        """QK-Clip after the optimizer step, counting the heads it clipped and the nearest miss of tau."""
        self.clip.apply(torch.tensor(True))
        maxima = self.clip.max_logits  # (every rank's forward saw the same batch: its maxima are the global ones)
        self.heads_clipped += int((maxima > self.clip.tau).sum())
        self.clip_margin = min(self.clip_margin, ((maxima - self.clip.tau).abs() / self.clip.tau).min().item())

    @contextmanager
    def gradients(self, loss_fn):
        self.backward(loss_fn, 10_000 + self.step)
        yield list(self.model.parameters())
        self.optimizer.zero_grad(set_to_none=True)


def train(loop: Loop, start: int, stop: int) -> dict:
    diagnostics = {}
    for step in range(start, stop):
        loop.step = step
        with loop.clip.measuring() if loop.clip else nullcontext():
            loop.backward(lambda model, x, y, _: model(x, y)[1], step)
        if (step + 1) % 5 == 0:
            loop.optimizer.request_diagnostics()
        loop.optimizer.step()
        if loop.clip:
            loop.clip_after_step()
        diagnostics.update(loop.optimizer.pop_diagnostics())
        loop.optimizer.zero_grad(set_to_none=True)
        if loop.optimizer.extra_pass_due(step + 1):
            loop.optimizer.extra_pass(loop.gradients, seed=0)
    return diagnostics


def build(name, options, ctx, mode, family="gpt2", extra=None) -> Loop:
    """This rank's Loop for ``mode`` ("single", "ddp", "zero1", "fsdp"): GPT-2 (SHAPES) or the Llama
    family (LLAMA, with ``extra``'s soft-caps), optimizer ``name`` and, with ``extra``'s qk_clip_tau, QK-Clip."""
    import optim
    from model import GPT, GPTConfig
    from training.distributed import Distributed
    from training.parallel import DataParallel, FullyShardedDataParallel
    from training.qk_clip import QKClip
    caps = {key: value for key, value in (extra or {}).items() if key != "qk_clip_tau"}
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPES) if family == "gpt2" else GPTConfig.preset("llama_nano", **LLAMA, **caps))
    train_model, weight = model, 1.0
    if mode in ("ddp", "fsdp"):
        weight = float(ctx.world_size) if ctx.is_main else 0.0
    if mode == "fsdp":
        FullyShardedDataParallel(ctx).shard_model(model, torch.float32)
    if mode == "ddp":
        train_model = DataParallel(ctx).wrap(model)
    hyper = {"lr": 3e-3, "weight_decay": 0.0 if name == "adafactor" else 0.1}  # (Adafactor refuses a decay)
    optimizer = optim.build(name, model, **hyper, **options, batch_tokens=32, run_steps=STEPS,
                            zero_redundancy=mode == "zero1")
    tau = (extra or {}).get("qk_clip_tau")
    # (the one-process reference's clip reduces over no ranks: it runs on the main rank alone)
    clip_ctx = ctx if mode != "single" else Distributed(0, 0, 1, ctx.device)
    return Loop(model, optimizer, weight, train_model, QKClip(model, tau, clip_ctx) if tau is not None else None)


def full(model) -> dict[str, torch.Tensor]:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in model.state_dict().items()}


def max_rel(a: dict, b: dict) -> float:
    return max(((a[k] - b[k]).norm() / b[k].norm().clamp(min=1e-30)).item() for k in b)


def max_rel_diagnostics(got: dict, expected: dict) -> float:
    return max((abs(got[k] - v) / max(abs(v), 1e-30) for k, v in expected.items()), default=0.0)


def newton_schulz_dtype(optimizer) -> torch.dtype | None:
    """A Muon's Newton-Schulz dtype on this CPU ("auto" resolved), None for another optimizer."""
    hidden = [group for group in optimizer.param_groups if group.get("hidden_matrix")]
    return optimizer.ns_dtype(hidden[0], torch.device("cpu")) if hasattr(optimizer, "ns_dtype") and hidden else None


def exact(ctx, mode, llama_mode="none"):
    """GPT-2 with every CONFIGS case in ``mode``, then the Llama family with every LLAMA_CONFIGS case in
    ``llama_mode`` ("none": not)."""
    from optim.sharding import local
    from training.memory import optimizer_state_bytes, tensor_bytes
    cases = [("gpt2", mode, name, options, {}) for name, options in CONFIGS]
    if llama_mode != "none":
        cases += [("llama", llama_mode, *case) for case in LLAMA_CONFIGS]
    for family, layout, name, options, extra in cases:
        loop = build(name, options, ctx, layout, family, extra)
        model, optimizer = loop.model, loop.optimizer
        diagnostics = train(loop, 0, STEPS)
        optimizer.eval()  # the evaluated point (Schedule-Free's x; the weights for the rest)
        # The one-process reference, on the main rank (the others would train the same copy): what it
        # keeps per element of each parameter in state of the parameter's shape (Muon: 1 for a matrix, 2
        # for the rest), and in state of another shape (Adafactor's row and column statistics, SOAP's
        # statistics and eigenbases) per parameter, goes to every rank.
        per_element, whole = [None], [None]
        if ctx.is_main:
            reference_loop = build(name, options, ctx, "single", family, extra)
            reference, reference_opt = reference_loop.model, reference_loop.optimizer
            expected = train(reference_loop, 0, STEPS)
            reference_opt.eval()
            ns_dtype = newton_schulz_dtype(reference_opt)
            bf16_rounding = None
            if ns_dtype == torch.bfloat16 and layout == "fsdp":  # (the test's bound: bfloat16's rounding, carried)
                float32_loop = build(name, {**options, "ns_dtype": "float32"}, ctx, "single", family, extra)
                float32_diagnostics = train(float32_loop, 0, STEPS)
                bf16_rounding = {"params": max_rel(full(reference), full(float32_loop.model)),
                                 "diagnostics": max_rel_diagnostics(expected, float32_diagnostics)}
            per_element = [{name: sum(t.nbytes for t in reference_opt.state[p].values() if t.shape == p.shape)
                            / p.numel() for name, p in reference.named_parameters()}]
            whole = [{name: sum(t.nbytes for t in reference_opt.state[p].values() if t.ndim and t.shape != p.shape)
                      for name, p in reference.named_parameters()}]
        torch.distributed.broadcast_object_list(per_element, src=0)
        torch.distributed.broadcast_object_list(whole, src=0)
        per_element, whole = per_element[0], whole[0]
        counters = lambda opt: sum(t.nbytes for s in getattr(opt, "optim", opt).state.values()  # noqa: E731
                                   for t in s.values() if t.ndim == 0)
        state = torch.tensor([optimizer_state_bytes(optimizer) - counters(optimizer)])
        if layout == "zero1":
            owned = optimizer.partition_numel()
        else:  # (DDP: every rank the whole)
            owned = [0] * ctx.world_size
            owned[ctx.rank] = tensor_bytes(model.parameters()) // 4
            owned = torch.tensor(owned)
            torch.distributed.all_reduce(owned)
            owned = owned.tolist()
        if layout == "zero1":
            names = {id(p): name for name, p in model.named_parameters()}
            held = {names[id(p)]: p.numel() for group in optimizer._partition_parameters()[ctx.rank]
                    for p in group["params"]}
        else:
            held = {name: local(p).numel() for name, p in model.named_parameters()}
        # (FSDP2: every rank holds every parameter's rows, some none: whole state on every rank)
        expected_state = torch.tensor([round(sum(per_element[name] * n + whole[name] for name, n in held.items()))])
        states, expected_states = ([torch.zeros_like(state) for _ in range(ctx.world_size)] for _ in range(2))
        torch.distributed.all_gather(states, state)
        torch.distributed.all_gather(expected_states, expected_state)
        result = full(model)
        replicas_equal = None if layout == "fsdp" else all_replicas_equal(model, ctx)
        if ctx.is_main:
            numel = sum(p.numel() for p in reference.parameters())
            print(json.dumps({
                "model": family, "mode": layout, "optimizer": name, "options": options, "extra": extra,
                "max_rel": max_rel(result, full(reference)), "replicas_equal": replicas_equal,
                "heads_clipped": [loop.heads_clipped, reference_loop.heads_clipped],
                "clip_margin": reference_loop.clip_margin if reference_loop.clip else None,
                "softcap_ratios": softcap_ratios(reference),
                "diagnostic_keys_equal": sorted(diagnostics) == sorted(expected), "diagnostics": len(expected),
                "diagnostics_max_rel": max_rel_diagnostics(diagnostics, expected),
                "ns_dtype": ns_dtype and str(ns_dtype).removeprefix("torch."), "bf16_rounding": bf16_rounding,
                "state": [s.item() for s in states], "expected_state": [s.item() for s in expected_states],
                "replicated_state": optimizer_state_bytes(reference_opt) - counters(reference_opt),
                "whole_state": sum(whole.values()), "numel": numel, "shares": [n / numel for n in owned],
                "max_share": max(owned) / numel,
                "largest_share": max(p.numel() for p in reference.parameters()) / numel,
                "rows_share": sum(p[0].numel() for p in reference.parameters()) / numel}), flush=True)


def all_replicas_equal(model, ctx) -> bool:
    """Whether every rank's (replicated) parameters are bitwise rank 0's; every rank calls it."""
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    replicas = [torch.empty_like(flat) for _ in range(ctx.world_size)]
    torch.distributed.all_gather(replicas, flat)
    return all(torch.equal(replica, flat) for replica in replicas)


def softcap_ratios(model) -> list[float]:
    """For each soft-cap the model has, its capped largest logit over the raw one on the first batch
    (the probe's; attention: the most bent head)."""
    stats = model.probe(batch(0)[0])
    return [(stats[capped] / stats[raw]).min().item() for capped, raw in
            (("max_logit_capped", "max_logit"), ("max_abs_logit_capped", "max_abs_logit")) if capped in stats]


def save(ctx, folder):
    from torch.distributed.tensor import DTensor

    from training.checkpoint import Checkpoint
    from training.checkpoint.sharded import save_sharded_in
    for name, options in CHECKPOINTED:
        loop = build(name, options, ctx, "fsdp")
        model, optimizer = loop.model, loop.optimizer
        train(loop, 0, SAVE_AT)
        checkpoint = Checkpoint(model={}, model_args=SHAPES, optimizer={}, scaler={}, step=SAVE_AT, tokens=0, rng=[],
                                train_loader={}, config={}) if ctx.is_main else None
        (folder / name).mkdir(exist_ok=True)  # (the run folder, which the trainer makes)
        save_sharded_in(folder / name, checkpoint, model, optimizer, SAVE_AT)
        train(loop, SAVE_AT, STEPS)
        result = full(model)
        # Row shards (DTensors, as their parameters) or whole on every rank (plain tensors), besides the counters.
        layouts = sorted({"rows" if isinstance(t, DTensor) else "whole" for state in optimizer.state.values()
                          for t in state.values() if t.ndim})
        if ctx.is_main:
            reference_loop = build(name, options, ctx, "single")
            train(reference_loop, 0, STEPS)
            torch.save(result, folder / name / "uninterrupted.pt")
            print(json.dumps({"optimizer": name, "unsharded_max_rel": max_rel(result, full(reference_loop.model)),
                              "state_layouts": layouts}), flush=True)


def resume(ctx, folder):
    from training.checkpoint import CHECKPOINT_NAME, Checkpoint
    from training.checkpoint.sharded import load_sharded_state
    for name, options in CHECKPOINTED:
        loop = build(name, options, ctx, "fsdp" if ctx.enabled else "single")
        path = (folder / name / CHECKPOINT_NAME).resolve()
        checkpoint = Checkpoint.load(path)
        load_sharded_state(path, checkpoint, loop.model, loop.optimizer)
        train(loop, checkpoint.step, STEPS)
        result, expected = full(loop.model), torch.load(folder / name / "uninterrupted.pt", weights_only=True)
        if ctx.is_main:
            print(json.dumps({"optimizer": name, "world": ctx.world_size, "restored_step": checkpoint.step,
                              "max_rel": max_rel(result, expected)}), flush=True)


if __name__ == "__main__":
    from training import distributed
    context = distributed.setup("cpu")
    command, *arguments = sys.argv[1:]
    if command == "exact":
        exact(context, *arguments)
    else:
        {"save": save, "resume": resume}[command](context, Path(arguments[0]))
    distributed.teardown(context)
