"""The batch schedule (training/batch_schedule.py): where each batch begins, the lr schedule in
tokens (the step-counted one's floats with a fixed batch), the config's checks, and the
acceptance: a scheduled run equals, bitwise, a run stopped at the change and resumed by hand with
the new batch, lr and decays (every optimizer in one process; DDP and FSDP2 on 2 gloo ranks), and
a run killed after the change and resumed from a checkpoint before it equals the uninterrupted one."""
import json
import math
import os
import shutil
import signal

import pytest
import torch

from configs import ConfigError, TrainConfig, load_config
from helpers import ROOT, TINY_RUN, read_metrics, run_train, train_here
from training.batch_schedule import BatchSchedule, Phase, half_life_betas
from training.checkpoint import CHECKPOINT_NAME, Checkpoint
from training.parts import Part, Step
from training.run_config import resolve_config
from training.schedule import LrSchedule, decay_steps

BLOCK = 32  # TINY_RUN's


def schedule_of(pairs, block=4, history=(), at_step=0, **config):
    config = TrainConfig(max_steps=1, batch_size=pairs[0][1], batch_schedule=pairs, **config)
    return BatchSchedule.of(config, block, history, at_step)


# --- where each batch begins ---
def test_each_change_begins_at_the_first_step_at_or_after_its_tokens():
    # Batch 8 of 4 tokens: 32 tokens a step; 100 tokens are passed after 4 steps (128); then 64 a
    # step: 300 after 3 more (320); then 16 a step.
    schedule = schedule_of([(0, 8), (100, 16), (300, 4)])
    assert schedule.phases == [Phase(0, 0, 8), Phase(4, 128, 16), Phase(7, 320, 4)]
    assert [schedule.tokens(n) for n in (0, 3, 4, 5, 7, 10)] == [0, 96, 128, 192, 320, 368]
    assert [schedule.phase_index(n) for n in (0, 3, 4, 6, 7, 100)] == [0, 0, 1, 1, 2, 2]
    assert [schedule.steps_within(t) for t in (0, 31, 32, 128, 191, 192, 320, 335, 336)] == [0, 0, 1, 4, 4, 5, 7, 7, 8]
    assert schedule.ratio(5) == 2.0 and schedule.ratio(7) == 0.5 and schedule.tokens_per_step(5) == 64
    # A change at a step boundary begins there; two changes within one step: the later one.
    assert schedule_of([(0, 8), (64, 16)]).phases == [Phase(0, 0, 8), Phase(2, 64, 16)]
    assert schedule_of([(0, 8), (40, 16), (50, 32)]).phases == [Phase(0, 0, 8), Phase(2, 64, 32)]
    assert schedule_of([(0, 8), (40, 16), (50, 8)]).phases == [Phase(0, 0, 8)]


def test_a_resume_keeps_the_recorded_phases_and_plans_the_rest_from_the_config():
    pairs = [(0, 8), (100, 16), (300, 4)]
    whole = schedule_of(pairs)
    for step in range(12):  # the same config resumed anywhere: the same phases
        assert schedule_of(pairs, history=whole.phases, at_step=step).phases == whole.phases
    # batch_size changed by hand at step 5 (the config has no schedule): its batch from there, the
    # lr and decays set for it (ratio 1)
    by_hand = BatchSchedule.of(TrainConfig(max_steps=1, batch_size=32), 4, whole.phases, at_step=5)
    assert by_hand.phases == [Phase(0, 0, 8), Phase(4, 128, 16), Phase(5, 192, 32)]
    assert by_hand.ratio(5) == 1.0 and by_hand.tokens(6) == 192 + 128
    # a new schedule from step 5: the recorded phases up to it, the new one's after
    renewed = schedule_of([(0, 8), (100, 16), (500, 64)], history=whole.phases, at_step=5)
    assert renewed.phases == [Phase(0, 0, 8), Phase(4, 128, 16), Phase(10, 512, 64)]
    # recorded: the checkpoint's lists
    assert BatchSchedule.recorded(whole.state_dict()) == whole.phases


def test_run_lengths_and_divisibility_follow_every_phase():
    config = TrainConfig(max_tokens=400, warmup_tokens=100, batch_size=8, batch_schedule=[(0, 8), (100, 16)])
    schedule = BatchSchedule.of(config, 4)
    assert schedule.lengths(config) == (4 + 4, 3)  # 128 tokens in 4 steps, then 4 of 64 (384 <= 400 < 448)
    schedule.check_divisible(micro_batch_size=4, world_size=2)
    with pytest.raises(ConfigError, match=r"phase 1 \(batch 8 from step 2\).*micro_batch_size=4 x world_size=3"):
        schedule_of([(0, 24), (100, 8)]).check_divisible(micro_batch_size=4, world_size=3)
    schedule.check_divisible(micro_batch_size=16, world_size=1, from_step=4)  # (phase 0 is past)


@pytest.mark.parametrize("pairs, error", [
    ([(0, 16), (100, 32)], r"batch_schedule starts with \(0, 16\): .*\(0, 8\)"),
    ([(10, 8)], r"starts with \(10, 8\)"),
    ([(0, 8), (100, 12)], r"batch 8 -> 12 at 100 tokens: each change multiplies or divides"),
    ([(0, 8), (100, 8)], r"8 -> 8"),
    ([(0, 8), (100, 16), (100, 32)], r"token counts must increase \(100, then 100\)"),
    ([(0, 8), (100,)], r"entry \(100,\): each entry is \(tokens, global batch\)"),
    ([(0, 8), (100.5, 16)], r"two whole numbers"),
])
def test_a_bad_schedule_is_refused_with_its_fix(pairs, error):
    with pytest.raises(ConfigError, match=error):
        TrainConfig(max_steps=1, batch_size=8, batch_schedule=pairs)


def test_the_schedule_keys_parse_and_are_checked():
    config = load_config(None, ["--max_steps=1", "--batch_size=8", "--batch_schedule=[(0, 8), (2e6, 32)]"])
    assert config.batch_schedule == [[0, 8], [2_000_000, 32]]  # as config.json keeps it
    assert TrainConfig(**json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ConfigError, match=r"batch_lr_scaling='cubic': use 'sqrt', 'linear', 'none'"):
        TrainConfig(max_steps=1, batch_lr_scaling="cubic")
    with pytest.raises(ConfigError, match=r"batch_half_life_betas='beta2;gamma': give decay names, comma-separated"):
        TrainConfig(max_steps=1, batch_half_life_betas="beta2;gamma")


@pytest.mark.parametrize("optimizer, names, error", [
    ("adamw", "beta2,gamma", r"gamma: optimizer 'adamw' has no such decay .*its decays are beta1, beta2$"),
    ("adamw", "beta3", r"beta3: optimizer 'adamw' has no such decay"),
    ("mars", "momentum", r"momentum: optimizer 'mars' has no such decay .*beta1, beta2, adamw_beta1, adamw_beta2$"),
    ("sgd", "beta2", r"beta2: optimizer 'sgd' has no such decay .*its decays are momentum$"),
    ("adafactor", "beta2", r"beta2: optimizer 'adafactor' has no such decay .*its decays are none$"),
])
def test_a_decay_its_optimizer_does_not_declare_is_refused_at_resolution(optimizer, names, error):
    config = TrainConfig(max_steps=1, optimizer=optimizer, batch_half_life_betas=names)
    with pytest.raises(ConfigError, match=error):
        resolve_config(config)


def test_betas_for_an_optimizer_without_betas_are_refused_naming_what_it_takes():
    # (SGD keeps its momentum in optimizer_options: a --beta1 meant for it must not vanish, nor crash resolution.)
    with pytest.raises(ConfigError, match=r"beta1=0.9: optimizer 'sgd' takes no betas; drop beta1 \(sgd takes lr "
                                          r"and weight_decay, and in optimizer_options momentum\)"):
        resolve_config(TrainConfig(max_steps=1, optimizer="sgd", beta1=0.9))
    sgd = resolve_config(TrainConfig(max_steps=1, optimizer="sgd", optimizer_options={"momentum": 0.9})).config
    assert half_life_betas(sgd, 2.0, ("momentum",)) == {"optimizer_options": {**sgd.optimizer_options,
                                                                              "momentum": 0.9 ** 2.0}}


def test_the_declared_decays_scale_by_the_half_life_rule_where_each_lives():
    # beta ** ratio for each named decay, in the config key its optimizer keeps it under; the rest untouched.
    mars = resolve_config(TrainConfig(max_steps=1, optimizer="mars", lr=1e-3)).config
    changes = half_life_betas(mars, 3.0, ("beta2", "adamw_beta1"))
    assert changes["beta2"] == mars.beta2 ** 3.0 and "beta1" not in changes
    adamw_betas = mars.optimizer_options["adamw_betas"]
    assert changes["optimizer_options"] == {**mars.optimizer_options,
                                            "adamw_betas": (adamw_betas[0] ** 3.0, adamw_betas[1])}
    ademamix = resolve_config(TrainConfig(max_steps=1, optimizer="ademamix", lr=1e-3)).config
    assert half_life_betas(ademamix, 0.5, ("beta3",)) == {
        "optimizer_options": {**ademamix.optimizer_options, "beta3": ademamix.optimizer_options["beta3"] ** 0.5}}


# --- the lr schedule in tokens ---
def step_counted_lr(step, *, total, warmup, lr, min_lr, schedule, decay_fraction):
    """The schedule as it is written in steps (docs/batch.md; the code's before it ran in tokens)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "cosine":
        progress = (step - warmup) / max(1, total - warmup)
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(progress, 1.0)))
    decay_start = total - int(decay_fraction * total)
    if step < decay_start:
        return lr
    progress = (step - decay_start + 1) / max(1, total - decay_start)
    return lr + (min_lr - lr) * min(progress, 1.0)


@pytest.mark.parametrize("kind", ["cosine", "wsd"])
def test_with_a_fixed_batch_the_lr_in_tokens_is_the_step_counted_float(kind):
    for total, warmup, fraction, tokens_per_step in [(110, 10, 0.2, 480 * 1024), (37, 0, 0.35, 3 * 1024),
                                                      (1000, 33, 0.1, 12_288), (7, 7, 1.0, 96)]:
        schedule = LrSchedule(total=total * tokens_per_step, warmup=warmup * tokens_per_step,
                              decay_start=(total - decay_steps(total, fraction)) * tokens_per_step,
                              lr=6e-4, min_lr=6e-5, kind=kind)
        for step in range(total):
            expected = step_counted_lr(step, total=total, warmup=warmup, lr=6e-4, min_lr=6e-5, schedule=kind,
                                       decay_fraction=fraction)
            assert schedule(step * tokens_per_step, tokens_per_step) == expected, (total, step)


def test_a_ramp_does_not_stretch_the_lr_schedule():
    # Doubling at half the tokens: the cosine is at its middle there, whatever the steps.
    config = TrainConfig(max_tokens=2048, batch_size=4, batch_schedule=[(0, 4), (1024, 8)], lr=1.0, min_lr=0.0)
    schedule = BatchSchedule.of(config, 32)
    total, warmup = schedule.lengths(config)
    lr = schedule.lr_schedule(config, total, warmup)
    assert (total, schedule.phases[1].step) == (12, 8)  # 8 steps of 128 tokens, 4 of 256
    assert lr(schedule.tokens(8), 256) == pytest.approx(0.5) and lr(schedule.tokens(4), 128) == pytest.approx(
        0.5 * (1 + math.cos(math.pi * 0.25)))


# --- the acceptance: a scheduled run is the run changed by hand at the boundary ---
# Batch 4 (128 tokens a step) until 462 tokens: 4 steps (512 tokens); then batch 8 (256 a step),
# 4 more steps to 1,536 tokens (1,600 fits no fifth); a fixed batch 4 would also end at 1,536.
BOUNDARY, RAMP = 4, 2.0
SCHEDULE = ["--batch_size=4", "--batch_schedule=[(0, 4), (462, 8)]"]


def test_the_first_half_by_hand_plans_the_scheduled_run_s_cosine_only_when_the_length_is_in_tokens():
    """docs/batch.md's caveat, on the acceptance's runs (lr 0.01 to 0.001, 2 warmup steps): the run
    by hand starts at batch 4 without the schedule. With the length in tokens (max_tokens=1600) both
    plan the cosine for 1,536 tokens; with max_steps=8 the scheduled run's 8 steps are 1,536 tokens
    (4 of 128, 4 of 256) and the run by hand's 1,024 (8 of 128), so from the first step after the
    warmup their lrs differ (by hand: cos(pi x progress), progress (tokens - 256) / (total - 256)). A
    warmup that ends after the change differs likewise, whatever the length's unit."""
    def lr(step: int, **config) -> float:
        config = TrainConfig(**{"warmup_steps": 2, "lr": 0.01, "min_lr": 0.001, **config})
        schedule = BatchSchedule.of(config, BLOCK)
        return schedule.lr_schedule(config, *schedule.lengths(config))(schedule.tokens(step),
                                                                        schedule.tokens_per_step(step))

    cosine = lambda progress: 0.001 + 0.5 * 0.009 * (1 + math.cos(math.pi * progress))  # noqa: E731
    for length in ({"max_tokens": 1600}, {"max_steps": 8}):
        scheduled = [lr(step, batch_size=4, batch_schedule=[(0, 4), (462, 8)], **length) for step in range(BOUNDARY)]
        by_hand = [lr(step, batch_size=4, **length) for step in range(BOUNDARY)]
        assert scheduled[:2] == by_hand[:2] == [0.005, 0.01]  # the warmup's: (step + 1) / 2 of lr
        assert scheduled[2:] == pytest.approx([cosine(0 / 1280), cosine(128 / 1280)], rel=1e-12)
        if "max_tokens" in length:
            assert by_hand == scheduled
        else:  # 0.0093971 against 0.0097798 at step 4
            assert by_hand[2:] == pytest.approx([cosine(0 / 768), cosine(128 / 768)], rel=1e-12)
    # A warmup that ends after the change (6 steps), even with the length in tokens: the scheduled run's
    # is 1,024 tokens (4 x 128 + 2 x 256), the first half's by hand 768 (6 x 128); at step 4, lr x 4 / 8 or 6.
    warmup = {"warmup_steps": 6, "max_tokens": 1600}
    assert lr(3, batch_size=4, batch_schedule=[(0, 4), (462, 8)], **warmup) == pytest.approx(0.01 * 4 / 8, rel=1e-12)
    assert lr(3, batch_size=4, **warmup) == pytest.approx(0.01 * 4 / 6, rel=1e-12)


def base_args(data, out, name, optimizer, *extra):
    return [*TINY_RUN, f"--data_dir={data}", f"--out_dir={out}", f"--run_name={name}", f"--optimizer={optimizer}",
            "--max_tokens=1600", "--warmup_steps=2", "--micro_batch_size=1", "--log_interval=1",
            "--eval_interval=4", "--lr=0.01", "--min_lr=0.001", *extra]


# Every decay each optimizer declares (optim.batch_decays) follows the batch in some case: Muon's AdamW's
# beta2 and its momentum, AdEMAMix's beta3, MARS's AdamW part's betas beside its own.
HALF_LIFE = {"muon": "beta2,momentum", "dmuon": "momentum", "ademamix": "beta1,beta2,beta3",
             "mars": "beta1,beta2,adamw_beta1,adamw_beta2", "sgd": "momentum", "adafactor": ""}
OPTIONS = {"sophiag": ["--optimizer_options={'hessian_interval': 2}"],  # a Hessian pass at the boundary
           # (AdEMAMix's warmups in steps: "over the run" is another length in the by-hand run's first half.)
           "ademamix": ["--optimizer_options={'alpha_warmup': 6, 'beta3_warmup': 6}"],
           "soap": ["--optimizer_options={'precondition_frequency': 3}"],  # refreshes before and after
           "adamw_schedulefree": ["--lr_schedule=constant"],
           "sgd": ["--optimizer_options={'momentum': 0.9}"]}


def by_hand_changes(first_half_config: dict, scaled: str) -> list[str]:
    """The second half's overrides: the new batch, the lr by sqrt (an AdamW part's own lr too), the
    decays by their half-life."""
    config = TrainConfig(**first_half_config)
    factor = math.sqrt(RAMP)
    changes = half_life_betas(config, RAMP, tuple(name for name in scaled.split(",") if name))
    overrides = ["--batch_size=8", f"--lr={config.lr * factor!r}", f"--min_lr={config.min_lr * factor!r}",
                 *(f"--{key}={value!r}" for key, value in changes.items())]
    if config.optimizer_options.get("adamw_lr") is not None:  # (MARS's: a ratio of lr the schedule keeps)
        options = {**changes.get("optimizer_options", config.optimizer_options),
                   "adamw_lr": config.optimizer_options["adamw_lr"] * factor}
        overrides.append(f"--optimizer_options={options!r}")
        changes = {**changes, "optimizer_options": options}
    return [*overrides, f"--allow_changes=batch_size,lr,min_lr,{','.join(changes)}"]


def series(run_dir) -> list[dict]:
    """Every logged record but the speed and the memory (which differ between invocations)."""
    return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "memory/peak")}
            for r in read_metrics(run_dir) if "step" in r]


def assert_same_state(got: Checkpoint, expected: Checkpoint) -> None:
    assert got.step == expected.step and got.tokens == expected.tokens
    assert got.batch_phases == expected.batch_phases
    assert all(torch.equal(got.model[k], expected.model[k]) for k in expected.model)
    for key, state in expected.optimizer["state"].items():
        for name, value in state.items():
            assert torch.equal(got.optimizer["state"][key][name], value), (key, name)


def scheduled_and_by_hand(train, data, out, optimizer, *extra):
    """The scheduled run and the two-phase one (stopped at the boundary, resumed by hand with the
    new batch, lr and decays): their run folders."""
    scaled = HALF_LIFE.get(optimizer, "beta1,beta2")
    common = [*OPTIONS.get(optimizer, []), *extra]
    train(*base_args(data, out, "scheduled", optimizer, *SCHEDULE, f"--batch_half_life_betas={scaled}", *common))
    train(*base_args(data, out, "by_hand", optimizer, "--batch_size=4", f"--stop_at_step={BOUNDARY}", *common))
    first_half = json.loads((out / "by_hand" / "config.json").read_text())
    train(*base_args(data, out, "by_hand", optimizer, "--resume", *common, *by_hand_changes(first_half, scaled)))
    return out / "scheduled", out / "by_hand"


@pytest.mark.parametrize("optimizer", ["adamw", "lamb", "merit", "lion", "sophiag", "muon", "dmuon", "ademamix", "mars",
                                       "soap", "adamw_schedulefree", "sgd", "adafactor"])
def test_a_scheduled_run_is_the_run_changed_by_hand_at_the_boundary(byte_shards, tmp_path, optimizer):
    scheduled, by_hand = scheduled_and_by_hand(train_here, byte_shards, tmp_path, optimizer)
    records = series(scheduled)
    assert records == series(by_hand)
    logged = [r for r in records if "train/loss" in r]
    assert [(r["batch/size"], r["batch/phase"], r["tokens"]) for r in logged] == \
        [(4, 0, 128 * n) for n in range(1, 5)] + [(8, 1, 512 + 256 * n) for n in range(1, 5)]
    assert logged[4]["batch/tokens_per_step"] == 256
    saved = Checkpoint.load(scheduled / CHECKPOINT_NAME)
    assert saved.batch_phases == [[0, 0, 4], [4, 512, 8]] and saved.tokens == 1536
    assert_same_state(Checkpoint.load(by_hand / CHECKPOINT_NAME), saved)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [[], ["--fsdp"]], ids=["ddp", "fsdp"])
def test_on_two_ranks_a_scheduled_run_is_the_run_changed_by_hand(byte_shards, tmp_path, layout):
    # (Two launches, not three: the by-hand run's first half is the scheduled run's own, its copy
    # cut back to the boundary's checkpoint; the one-process test trains an independent first half.)
    scheduled, by_hand = tmp_path / "scheduled", tmp_path / "by_hand"
    run_train(*base_args(byte_shards, tmp_path, "scheduled", "merit", *SCHEDULE, "--batch_half_life_betas=beta1,beta2",
                         f"--checkpoint_interval={BOUNDARY}", *layout), nproc=2)
    shutil.copytree(scheduled, by_hand, symlinks=True)
    for later in by_hand.glob("ckpt_00000008*"):
        shutil.rmtree(later) if later.is_dir() else later.unlink()
    (by_hand / CHECKPOINT_NAME).unlink()
    (by_hand / CHECKPOINT_NAME).symlink_to(next(by_hand.glob(f"ckpt_{BOUNDARY:08d}*")).name)
    first_half = {**json.loads((scheduled / "config.json").read_text()), "batch_schedule": [],
                  "batch_half_life_betas": ""}
    changes = by_hand_changes(first_half, "beta1,beta2")
    run_train(*base_args(byte_shards, tmp_path, "by_hand", "merit", "--resume", *layout, *changes[:-1],
                         "--batch_schedule=[]", "--batch_half_life_betas=",
                         changes[-1] + ",batch_schedule,batch_half_life_betas"), nproc=2)
    assert series(scheduled) == series(by_hand)
    if "--fsdp" not in layout:
        assert_same_state(Checkpoint.load(by_hand / CHECKPOINT_NAME), Checkpoint.load(scheduled / CHECKPOINT_NAME))
    else:  # (sharded checkpoints: the gathered weights)
        from training.checkpoint import load_model
        got, expected = (load_model(run / CHECKPOINT_NAME)[0].state_dict() for run in (by_hand, scheduled))
        assert all(torch.equal(got[k], expected[k]) for k in expected)


class KillAfterTheBoundary(Part):
    """Kills its process (SIGKILL: no checkpoint, no clean-up) after step 6, past the boundary, where
    the environment asks for it (the process the test kills, not the resumed run)."""

    def __init__(self, run):
        pass

    def after_step(self, step: Step) -> None:
        if step.number == BOUNDARY + 2 and os.environ.get("KILL_AFTER_THE_BOUNDARY"):
            os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
def test_a_run_killed_after_the_boundary_resumes_from_before_it_exactly(byte_shards, tmp_path, monkeypatch):
    args = base_args(byte_shards, tmp_path, "killed", "adamw", *SCHEDULE, "--checkpoint_interval=3",
                     f"--extra_parts={__name__}:KillAfterTheBoundary")
    train_here(*base_args(byte_shards, tmp_path, "whole", "adamw", *SCHEDULE))
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests"))
    monkeypatch.setenv("KILL_AFTER_THE_BOUNDARY", "1")
    killed = run_train(*args, check=False)
    monkeypatch.delenv("KILL_AFTER_THE_BOUNDARY")
    assert killed.returncode == -signal.SIGKILL
    assert Checkpoint.load(tmp_path / "killed" / CHECKPOINT_NAME).step == 3  # before the boundary at 4
    train_here(*args, "--resume")
    assert series(tmp_path / "killed") == series(tmp_path / "whole")
    assert_same_state(Checkpoint.load(tmp_path / "killed" / CHECKPOINT_NAME),
                      Checkpoint.load(tmp_path / "whole" / CHECKPOINT_NAME))
