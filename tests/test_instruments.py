"""training/instruments.py: the update statistics against a direct computation from the weights
saved before and after one step, for every optimizer; the probe's metric keys."""
import math

import pytest
import torch

import optim
from model import GPT, GPTConfig
from training.instruments import UpdateStatistics, is_layer_key, probe_record

C = 8
PARTS = {"attn_q": ("attn.c_attn.weight", slice(0, C)), "attn_k": ("attn.c_attn.weight", slice(C, 2 * C)),
         "attn_v": ("attn.c_attn.weight", slice(2 * C, 3 * C)), "attn_proj": ("attn.c_proj.weight", slice(None)),
         "mlp_fc": ("mlp.c_fc.weight", slice(None)), "mlp_proj": ("mlp.c_proj.weight", slice(None))}


def small_model():
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, vocab_size=40, n_layer=2, n_head=2, n_embd=C))


def one_gradient(model):
    g = torch.Generator().manual_seed(3)
    x, y = (torch.randint(0, 40, (3, 16), generator=g) for _ in range(2))
    model(x, y)[1].backward()


def stepped(name, options=None, skip=False):
    model = small_model()
    # (Adafactor, as Marek et al. run it, refuses a weight decay)
    opt = optim.build(name, model, lr=3e-2, weight_decay=0.0 if name == "adafactor" else 0.1, batch_tokens=48,
                      run_steps=4, **(options or {}))
    for _ in range(2):  # a second step: optimizer state in play, Sophia's first step is its special case
        one_gradient(model)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        statistics = UpdateStatistics(model)
        with statistics.measured():
            if skip:
                opt.step_unless(torch.ones((), dtype=torch.bool))
            else:
                opt.step()
        opt.zero_grad()
    return statistics.pop(), before, dict(model.named_parameters())


def rms(t):
    return t.double().square().mean().sqrt().item()


@pytest.mark.parametrize("name, options", [(name, None) for name in optim.available()] +
                         [("merit", {"maxlamb": True}), ("merit", {"norm": "l2"})])
def test_update_ratios_equal_a_direct_computation(name, options):
    got, before, after = stepped(name, options)
    expected = {}
    for layer in range(2):
        for part, (param, rows) in PARTS.items():
            old, new = before[f"transformer.h.{layer}.{param}"][rows], after[f"transformer.h.{layer}.{param}"][rows]
            expected[f"update_ratio/layer_{layer:02d}/{part}"] = rms(new.detach() - old) / rms(old)
            if part in ("attn_q", "attn_k"):
                expected[f"weight_max_abs/layer_{layer:02d}/{part}"] = new.detach().abs().max().item()
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-5), key
    assert all(v > 0 for v in got.values())


def test_a_skipped_step_has_update_ratio_zero():
    got, before, after = stepped("merit", skip=True)
    assert {k: v for k, v in got.items() if k.startswith("update_ratio/")} == \
        {f"update_ratio/layer_{i:02d}/{part}": 0.0 for i in range(2) for part in PARTS}


def test_probe_record_keys_and_values_are_the_probe_s():
    model = small_model()
    batch = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(1))
    record = probe_record(model, batch, chunk_size=5)
    stats = model.probe(batch)
    for layer in range(2):
        for head in range(2):
            assert record[f"max_logit/layer_{layer:02d}/head_{head:02d}"] == pytest.approx(
                stats["max_logit"][layer, head].item(), rel=1e-6)
            assert record[f"attn_entropy/layer_{layer:02d}/head_{head:02d}"] == pytest.approx(
                stats["attn_entropy"][layer, head].item(), rel=1e-6)
        assert record[f"max_logit/layer_{layer:02d}"] == pytest.approx(stats["max_logit"][layer].max().item(), rel=1e-6)
        assert record[f"attn_entropy/layer_{layer:02d}"] == pytest.approx(
            stats["attn_entropy"][layer].min().item(), rel=1e-6)
    assert record["output/log_z"] == pytest.approx(stats["log_z"].item(), rel=1e-6)
    assert record["output/max_abs_logit"] == pytest.approx(stats["max_abs_logit"].item(), rel=1e-6)
    assert len(record) == 2 * (2 + 2 * 2) + 2
    assert sorted(k for k in record if is_layer_key(k, "max_logit")) == ["max_logit/layer_00", "max_logit/layer_01"]
    assert math.isfinite(sum(record.values()))
