"""training/qk_clip.py against a hand computation: the training forward's per-head maxima are the
fully materialised causal logits' (float64), after the clip the clipped heads' largest logit on
the same batch is tau and every other weight is bitwise untouched; a dropped step clips nothing;
tau = inf (and a tau above every logit, through train.py) is bitwise the run without it; train.py
logs it. (Under DDP, ZeRO-1 and FSDP2: tests/test_train.py and tests/test_scale_out.py.)"""
import math

import pytest
import torch
import torch.nn.functional as F

from helpers import TINY_RUN, read_metrics, train_here
from model import GPT, GPTConfig
from training.distributed import Distributed
from training.qk_clip import QKClip

ONE_PROCESS = Distributed(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
# Biases (a head's q and k bias rows scale with it) and GPT-2 Medium's inverse-layer logit scaling.
CONFIG = dict(block_size=12, vocab_size=40, n_layer=2, n_head=4, n_embd=16, bias=True,
              scale_attn_by_inverse_layer_idx=True)


def model_and_batch(seed: int = 0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**CONFIG)).double()
    with torch.no_grad():  # larger q and k weights: logits of a few units, spread over the heads
        for block in model.transformer.h:
            block.attn.c_attn.weight[: 2 * CONFIG["n_embd"]] *= 8
            block.attn.c_attn.bias.normal_(0, 0.3)
    g = torch.Generator().manual_seed(seed + 1)
    x, y = (torch.randint(0, CONFIG["vocab_size"], (3, CONFIG["block_size"]), generator=g) for _ in range(2))
    return model, x, y


def naive_max_logits(model: GPT, x: torch.Tensor) -> torch.Tensor:
    """(n_layer, n_head): each head's largest causal logit, from the whole T x T logit matrix of
    every layer, the forward written out (eval mode: no dropout here anyway)."""
    B, T = x.shape
    C, H = CONFIG["n_embd"], CONFIG["n_head"]
    h = model.transformer.wte(x) + model.transformer.wpe(torch.arange(T))
    maxima = []
    for layer, block in enumerate(model.transformer.h):
        a = F.layer_norm(h, (C,), block.ln_1.weight, block.ln_1.bias)
        q, k, _ = (a @ block.attn.c_attn.weight.T + block.attn.c_attn.bias).split(C, dim=-1)
        q, k = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k))
        logits = q @ k.transpose(-1, -2) / (math.sqrt(C // H) * (layer + 1))
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        maxima.append(logits.masked_fill(~causal, -math.inf).amax(dim=(0, 2, 3)))
        h = block(h)
    return torch.stack(maxima)


@pytest.mark.parametrize("T", [1, 11, 37])
@pytest.mark.parametrize("chunk", [1, 4, 16, 64])
def test_the_training_forward_s_maximum_is_the_materialised_causal_logits(T, chunk):
    from model import causal_logit_max
    g = torch.Generator().manual_seed(T * 100 + chunk)
    q, k = (torch.randn(2, 3, T, 5, generator=g, dtype=torch.float64) * 3 for _ in range(2))
    logits = (q @ k.transpose(-1, -2)) * 0.7
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    expected = logits.masked_fill(~causal, -math.inf).amax(dim=(0, 2, 3))
    # (A chunk's matmul may sum a dot product in another order than the whole one's: float64 rounding.)
    torch.testing.assert_close(causal_logit_max(q, k, 0.7, chunk), expected, rtol=1e-14, atol=0)


def test_heads_above_tau_are_clipped_to_tau_and_nothing_else_moves():
    model, x, y = model_and_batch()
    clip = QKClip(model, tau=math.inf, ctx=ONE_PROCESS)
    with clip.measuring():
        model(x, y)[1].backward()
    expected = naive_max_logits(model, x)
    torch.testing.assert_close(clip.max_logits, expected, rtol=1e-12, atol=0)
    # tau is one of QKClip's own measured maxima, so the head at it is kept on every CPU: the naive
    # reference's float64 maxima may differ from the chunked measurement in the last bit.
    measured = clip.max_logits.clone()
    clip.tau = tau = measured.flatten().sort().values[3].item()  # 4 of 8 heads above it (and one at it: kept)
    above = measured > tau
    assert 0 < above.sum() < above.numel()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}

    clip.apply(torch.tensor(True), record=True)
    C, head_dim = CONFIG["n_embd"], CONFIG["n_embd"] // CONFIG["n_head"]
    for name, p in model.named_parameters():
        if "c_attn" not in name:
            assert torch.equal(p, before[name]), name
            continue
        layer = int(name.split(".")[2])
        for head in range(CONFIG["n_head"]):
            rows = [slice(part * C + head * head_dim, part * C + (head + 1) * head_dim) for part in (0, 1)]
            factor = math.sqrt(tau / measured[layer, head].item())
            for r in rows:
                if above[layer, head]:
                    torch.testing.assert_close(p[r], before[name][r] * factor, rtol=1e-15, atol=0)
                else:
                    assert torch.equal(p[r], before[name][r]), (name, head)
        assert torch.equal(p[2 * C:], before[name][2 * C:])  # v untouched
    # Layer 0 sees the same input: its clipped heads' largest logit is now tau, the others' as before.
    after = naive_max_logits(model, x)[0]
    torch.testing.assert_close(after[above[0]], torch.full_like(after[above[0]], tau), rtol=1e-12, atol=0)
    torch.testing.assert_close(after[~above[0]], expected[0][~above[0]], rtol=0, atol=0)
    record = clip.pop()
    assert record == {**{f"qk_clip/heads_clipped/layer_{i:02d}": float(above[i].sum()) for i in range(2)},
                      **{f"qk_clip/min_factor/layer_{i:02d}": pytest.approx(min(1.0, math.sqrt(tau / expected[i].max())))
                         for i in range(2)},
                      **{f"qk_clip/max_logit/layer_{i:02d}": pytest.approx(expected[i].max().item()) for i in range(2)}}
    assert clip.pop() == {}


def test_a_dropped_step_or_an_infinite_tau_clips_nothing():
    for tau, kept in ((1e-3, False), (math.inf, True)):
        model, x, y = model_and_batch()
        clip = QKClip(model, tau=tau, ctx=ONE_PROCESS)
        with clip.measuring():
            model(x, y)[1].backward()
        before = [p.detach().clone() for p in model.parameters()]
        clip.apply(torch.tensor(kept))
        assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    # The measurement lasts the context only: later forwards (an extra pass, the probe) record nothing.
    assert all(not block.attn._logit_max_hooks for block in model.transformer.h)


def test_the_maximum_is_over_the_step_s_micro_batches():
    model, x, y = model_and_batch()
    clip = QKClip(model, tau=1.0, ctx=ONE_PROCESS)
    with clip.measuring():
        for half in (slice(0, 1), slice(1, 3)):
            model(x[half], y[half])[1].backward()
    torch.testing.assert_close(clip.max_logits, naive_max_logits(model, x), rtol=1e-12, atol=0)


def test_train_py_with_a_tau_above_every_logit_is_the_run_without_and_a_low_tau_clips(byte_shards, tmp_path):
    common = [*TINY_RUN, "--log_interval=2", "--lr=0.01", "--min_lr=0.001", "--warmup_steps=2", "--max_steps=6",
              "--batch_size=4", "--micro_batch_size=2", f"--data_dir={byte_shards}", f"--out_dir={tmp_path}",
              "--optimizer=adamw"]
    train_here(*common, "--run_name=off")
    on = train_here(*common, "--run_name=high", "--qk_clip_tau=1e30")
    assert "QK-Clip: after every step" in on.stdout
    low = train_here(*common, "--run_name=low", "--qk_clip_tau=0.02")
    from training.checkpoint import CHECKPOINT_NAME, Checkpoint
    off, high = (Checkpoint.load(tmp_path / run / CHECKPOINT_NAME).model for run in ("off", "high"))
    assert all(torch.equal(off[name], high[name]) for name in off)
    records = {run: read_metrics(tmp_path / run) for run in ("off", "high", "low")}
    losses = {run: [r["train/loss"] for r in lines if "train/loss" in r] for run, lines in records.items()}
    assert losses["off"] == losses["high"] and losses["low"] != losses["off"]
    logged = [r for r in records["low"] if "qk_clip/heads_clipped/layer_00" in r]
    assert [r["step"] for r in logged] == [2, 4, 6]
    for r in logged:  # (the initial logits are about 0.05 here)
        assert sum(r[f"qk_clip/heads_clipped/layer_{i:02d}"] for i in range(2)) >= 1
        for i in range(2):
            clipped = r[f"qk_clip/heads_clipped/layer_{i:02d}"] > 0
            assert clipped == (r[f"qk_clip/max_logit/layer_{i:02d}"] > 0.02)
            assert clipped == (r[f"qk_clip/min_factor/layer_{i:02d}"] < 1)
    # The probe's batch is not the training batch, but once clipped every step its logits stay near tau.
    assert records["low"][-2]["max_logit/layer_00"] < records["off"][-2]["max_logit/layer_00"]
