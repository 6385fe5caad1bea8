"""Sequence-length warmup (training/seq_len_warmup.py): the pacing is DeepSpeed's formula computed by
hand; a step's gradient is the one of the hand-truncated (or hand-reshaped) batch; every count
follows the tokens trained; a warmup that ends before its first step is the ordinary run bitwise, and
a run resumed in the middle of the warmup is the run trained straight; what it cannot be combined
with is refused with the reason."""
import math

import pytest
import torch

from configs import ConfigError, load_config
from helpers import TINY_RUN, read_metrics, run_train, train_here
from train import Trainer
from training.checkpoint import CHECKPOINT_NAME, Checkpoint
from training.parts import Step
from training.run_config import resolve_config
from training.seq_len_warmup import SeqLenWarmup

# (start, full, steps, pacing, degree, multiple) -> the lengths of steps 1, 2, ... computed by hand from
# DeepSpeed's fixed_root: floor((k / steps) ** (1 / degree) * (full - start) + start), less its remainder
# by the multiple, at most full.
HAND = [
    # linear: k / 10 * 56 + 8 = 13.6, 19.2, 24.8, 30.4, 36, 41.6, 47.2, 52.8, 58.4, 64, then the block
    ((8, 64, 10, "linear", 2.0, 8), [8, 16, 24, 24, 32, 40, 40, 48, 56, 64, 64]),
    # root 2: k = 1: 0.1 * 960 + 64 = 160; 25: 0.5 -> 544; 50: 0.7071 -> 742.8 -> 736; 99: 0.99499 -> 1019.2 -> 1016
    ((64, 1024, 100, "root", 2.0, 8), {1: 160, 25: 544, 50: 736, 99: 1016, 100: 1024, 101: 1024}),
    # a multiple of 16: k = 1: 1 / 3 * 96 + 32 = 64; 2: 96; 3: 128
    ((32, 128, 3, "linear", 2.0, 16), [64, 96, 128, 128]),
]


@pytest.mark.parametrize("settings,lengths", HAND)
def test_the_pacing_is_deepspeed_s_formula(settings, lengths):
    start, full, steps, pacing, degree, multiple = settings
    warmup = SeqLenWarmup(start, full, steps, pacing, degree, multiple)
    expected = dict(enumerate(lengths, 1)) if isinstance(lengths, list) else lengths
    assert {k: warmup.length(k - 1) for k in expected} == expected


def test_truncate_and_reshape_cut_as_by_hand():
    x = torch.arange(2 * 32).view(2, 32)
    y = x + 1000
    truncate, reshape = SeqLenWarmup(8, 32, 4), SeqLenWarmup(8, 32, 4, reshape=True)
    for steps_taken, length in ((0, 8), (1, 16), (2, 24), (3, 32)):
        assert truncate.length(steps_taken) == length
        tx, ty = truncate.cut(x, y, steps_taken)
        assert torch.equal(tx, torch.stack([x[0, :length], x[1, :length]]))
        assert torch.equal(ty, torch.stack([y[0, :length], y[1, :length]]))
        rx, ry = reshape.cut(x, y, steps_taken)
        # each sequence's 32 // length pieces in order, its last 32 % length tokens (8 at length 24) left out
        pieces = [(i, j * length) for i in range(2) for j in range(32 // length)]
        assert torch.equal(rx, torch.stack([x[i, a:a + length] for i, a in pieces]))
        assert torch.equal(ry, torch.stack([y[i, a:a + length] for i, a in pieces]))
        assert truncate.trained_per_sequence(steps_taken) == length
        assert reshape.trained_per_sequence(steps_taken) == 32 // length * length


def _config(byte_shards, tmp_path, *extra):
    return resolve_config(load_config(None, [*TINY_RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}",
                                             "--batch_size=4", "--micro_batch_size=2", "--optimizer=adamw",
                                             "--lr=0.003", "--warmup_steps=2", *extra]))


@pytest.mark.parametrize("reshape", [False, True])
def test_a_step_s_gradient_is_the_hand_cut_batch_s(byte_shards, tmp_path, reshape):
    # The second step (length 16 of 32): the loop's gradient against the model's on the same
    # micro-batches cut by hand, read from a twin loader at the same position; bitwise.
    trainer = Trainer(_config(byte_shards, tmp_path, "--max_steps=8", "--seq_len_warmup_start=8",
                              "--seq_len_warmup_steps=4", f"--seq_len_warmup_reshape={reshape}"))
    try:
        trainer.train_step(Step(1))
        trainer.state.step += 1
        position = trainer.train_loader.state_dict()
        weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.forward_backward(lambda model, x, y, offset: model(x, y, logits=False)[1])
        ours = [p.grad.clone() for p in trainer.model.parameters()]
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.train_loader.load_state_dict(position)
        trainer.model.load_state_dict(weights)
        for _ in range(2):  # two micro-batches of 2
            x, y = trainer.train_loader.next_batch()
            if reshape:
                x, y = (torch.stack([t[0, :16], t[0, 16:], t[1, :16], t[1, 16:]]) for t in (x, y))
            else:
                x, y = x[:, :16], y[:, :16]
            (trainer.model(x, y, logits=False)[1] / 2).backward()
        assert all(torch.equal(a, p.grad) for a, p in zip(ours, trainer.model.parameters()))
    finally:
        trainer.close()


def test_every_count_follows_the_tokens_trained(byte_shards, tmp_path):
    # Batch 4 of 32-token sequences, warmup from 8 over 4 steps: 8, 16, 24, then 32 tokens a sequence.
    # max_tokens=640 trained: 4 * (8 + 16 + 24) = 192 after 3 steps, + 128 a step: 3 + 3 steps = 576,
    # a 7th would reach 704. The record: tokens trained, tokens read (4 * 32 a step), the length.
    train_here(*_config_args(byte_shards, tmp_path, "--max_tokens=640", "--seq_len_warmup_start=8",
                             "--seq_len_warmup_steps=4", "--log_interval=1"))
    records = [r for r in read_metrics(tmp_path / "default") if "train/loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["batch/seq_len"] for r in records] == [8, 16, 24, 32, 32, 32]
    assert [r["tokens"] for r in records] == [32, 96, 192, 320, 448, 576]
    assert [r["batch/tokens_per_step"] for r in records] == [32, 64, 96, 128, 128, 128]
    assert [r["batch/tokens_read"] for r in records] == [128 * k for k in range(1, 7)]
    assert [r["batch/tokens_read_per_step"] for r in records] == [128] * 6
    # The lr schedule runs in tokens trained: warmup over the first 2 steps' 96 tokens, cosine to 576.
    peak, floor = 0.003, 0.0003
    expected = [peak * 32 / 96, peak * 96 / 96] + [floor + 0.5 * (peak - floor) * (1 + math.cos(
        math.pi * (t - 96) / (576 - 96))) for t in (96, 192, 320, 448)]
    assert [r["lr"] for r in records] == pytest.approx(expected, rel=1e-12)


def _config_args(byte_shards, tmp_path, *extra):
    return [*TINY_RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--batch_size=4",
            "--micro_batch_size=2", "--optimizer=adamw", "--lr=0.003", "--min_lr=0.0003", "--warmup_steps=2", *extra]


def test_a_warmup_over_before_its_first_step_is_the_ordinary_run(byte_shards, tmp_path):
    # seq_len_warmup_steps=1: the first step already trains the full block.
    for name, extra in (("plain", []), ("warmup", ["--seq_len_warmup_start=8", "--seq_len_warmup_steps=1"])):
        train_here(*_config_args(byte_shards, tmp_path, "--max_steps=4", f"--run_name={name}", *extra))
    plain, warmup = (Checkpoint.load(tmp_path / name / CHECKPOINT_NAME) for name in ("plain", "warmup"))
    assert all(torch.equal(plain.model[k], warmup.model[k]) for k in plain.model)
    losses = [[r["train/loss"] for r in read_metrics(tmp_path / name) if "train/loss" in r]
              for name in ("plain", "warmup")]
    assert losses[0] == losses[1]


@pytest.mark.parametrize("reshape", [False, True])
def test_a_run_resumed_in_the_warmup_is_the_run_trained_straight(byte_shards, tmp_path, reshape):
    common = _config_args(byte_shards, tmp_path, "--max_steps=6", "--seq_len_warmup_start=8",
                          "--seq_len_warmup_steps=5", f"--seq_len_warmup_reshape={reshape}", "--checkpoint_interval=3")
    train_here(*common, "--run_name=straight")
    train_here(*common, "--run_name=resumed", "--stop_at_step=3")
    train_here(*common, "--run_name=resumed", "--resume")
    straight, resumed = (Checkpoint.load(tmp_path / name / CHECKPOINT_NAME) for name in ("straight", "resumed"))
    assert straight.step == resumed.step == 6 and straight.tokens == resumed.tokens
    assert all(torch.equal(straight.model[k], resumed.model[k]) for k in straight.model)


@pytest.mark.slow
def test_a_run_of_two_ranks_resumed_on_one_in_the_warmup_counts_and_trains_as_the_straight_run(byte_shards, tmp_path):
    # Accumulation 1 on two ranks, 2 on one: the same cut sequences a step; the counts are equal, the
    # floats as close as the gradient's all-reduce (another order of the sum) leaves them.
    common = _config_args(byte_shards, tmp_path, "--max_steps=6", "--seq_len_warmup_start=8",
                          "--seq_len_warmup_steps=5", "--log_interval=1", "--checkpoint_interval=3")
    run_train(*common, "--run_name=straight", nproc=2)
    run_train(*common, "--run_name=split", "--stop_at_step=3", nproc=2)
    resumed = train_here(*common, "--run_name=split", "--resume")
    assert "resuming on 1 ranks from a checkpoint of 2" in resumed.stdout
    straight, split = ([r for r in read_metrics(tmp_path / name) if "train/loss" in r]
                       for name in ("straight", "split"))
    for key in ("step", "tokens", "batch/seq_len", "batch/tokens_read", "batch/tokens_per_step", "lr"):
        assert [r[key] for r in split] == [r[key] for r in straight], key
    assert [r["train/loss"] for r in split] == pytest.approx([r["train/loss"] for r in straight], abs=1e-5)
    a, b = (Checkpoint.load(tmp_path / name / CHECKPOINT_NAME) for name in ("straight", "split"))
    assert a.train_loader == b.train_loader
    for name in a.model:
        torch.testing.assert_close(a.model[name], b.model[name], atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("extra,message", [
    (["--seq_len_warmup_start=12"], "a positive multiple of seq_len_warmup_multiple=8"),
    (["--seq_len_warmup_start=8"], "needs a duration"),
    (["--seq_len_warmup_steps=4", "--seq_len_warmup_reshape=True"],
     "seq_len_warmup_steps, seq_len_warmup_reshape without seq_len_warmup_start"),
    (["--seq_len_warmup_start=8", "--seq_len_warmup_steps=4", "--seq_len_warmup_pacing=cubic"], "use 'linear' or"),
    (["--seq_len_warmup_start=8", "--seq_len_warmup_steps=4", "--batch_schedule=[(0, 4), (1000, 8)]"],
     "both warmups shrink the tokens of the early steps"),
    (["--seq_len_warmup_start=8", "--seq_len_warmup_steps=4", "--batch_half_life_betas=beta2"], "use one of them"),
    (["--seq_len_warmup_start=32", "--seq_len_warmup_steps=4"], "the first length shorter"),
    (["--seq_len_warmup_start=8", "--seq_len_warmup_steps=4", "--seq_len_warmup_multiple=8", "--block_size=36"],
     "the block \\(36 tokens\\) is a multiple"),
])
def test_what_cannot_be_done_is_refused_with_the_reason(byte_shards, tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        Trainer(_config(byte_shards, tmp_path, "--max_steps=4", *extra)).close()
