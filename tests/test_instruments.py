"""training/instruments.py: the update statistics against a direct computation from the weights
saved before and after one step, for every optimizer; the probe's metric keys."""
import math

import pytest
import torch

import optim
from helpers import TINY_RUN, read_metrics, run_train, train_here
from model import GPT, GPTConfig
from training.checkpoint import CHECKPOINT_NAME, Checkpoint
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


def _second_moment_by_hand(optimizer_state: dict) -> dict[str, float]:
    v = torch.cat([s["exp_avg_sq"].double().flatten() for s in optimizer_state["state"].values()])
    return {"second_moment/l1": v.abs().sum().item(), "second_moment/l2": v.norm().item(),
            "second_moment/max": v.abs().max().item(), "second_moment/sqrt_l1": v.sqrt().sum().item(),
            "second_moment/sqrt_l2": v.sqrt().norm().item(), "second_moment/sqrt_max": v.sqrt().max().item()}


@pytest.mark.parametrize("name,options", [  # (AdamW in the quick tier, the others in the full suite)
    ("adamw", {}), pytest.param("merit", {}, marks=pytest.mark.slow),
    pytest.param("adafactor", {}, marks=pytest.mark.slow), pytest.param("sgd", {}, marks=pytest.mark.slow),
    pytest.param("adafactor", {"min_dim_size_to_factor": 8}, marks=pytest.mark.slow)])
def test_the_second_moment_is_recorded_as_megatron_deepspeed_takes_it(byte_shards, tmp_path, name, options):
    # The last step's record against the statistics of the checkpoint's state (saved after that
    # step) computed by hand (Adafactor's unfactored v: the tiny model's matrices are under its
    # factoring size); nothing for SGD (no state) and Adafactor's factored matrices (no whole v).
    train_here(*TINY_RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--batch_size=2",
               "--micro_batch_size=2", f"--optimizer={name}", f"--optimizer_options={options}", "--max_steps=3",
               "--warmup_steps=1", "--log_interval=3")
    last = [r for r in read_metrics(tmp_path / "default") if "train/loss" in r][-1]
    recorded = {k: v for k, v in last.items() if k.startswith("second_moment/")}
    if name == "sgd" or options:
        assert recorded == {}
        return
    expected = _second_moment_by_hand(Checkpoint.load(tmp_path / "default" / CHECKPOINT_NAME).optimizer)
    assert recorded == pytest.approx(expected, rel=1e-12)


@pytest.mark.slow
def test_a_sharded_second_moment_is_summed_over_the_ranks(byte_shards, tmp_path):
    # Two ranks holding a share of the state each (ZeRO-1: whole parameters; FSDP2: rows) against
    # DDP's replicated state, the same run otherwise: the same statistics (the sums' order aside).
    common = [*TINY_RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--batch_size=4",
              "--micro_batch_size=2", "--optimizer=adamw", "--max_steps=3", "--warmup_steps=1", "--log_interval=3"]
    recorded = {}
    for name, extra in (("ddp", []), ("zero1", ["--zero_stage=1"]), ("fsdp", ["--fsdp"])):
        run_train(*common, f"--run_name={name}", *extra, nproc=2)
        last = [r for r in read_metrics(tmp_path / name) if "train/loss" in r][-1]
        recorded[name] = {k: v for k, v in last.items() if k.startswith("second_moment/")}
    assert len(recorded["ddp"]) == 6
    for name in ("zero1", "fsdp"):
        assert recorded[name] == pytest.approx(recorded["ddp"], rel=1e-6), name
