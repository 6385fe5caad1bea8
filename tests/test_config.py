"""Config schema and loader: files, inheritance, literal overrides, and the errors users see."""

import dataclasses
import json
import math
import subprocess
import sys
import typing
import warnings

import pytest
import torch

from configs import ROLES, ConfigError, TrainConfig, keys_with_role, load_config, save_config
from helpers import ROOT
from model import GPTConfig
from study.runs import Run
from training.run_config import resolve_config
from training.batch_schedule import BatchSchedule
from training.schedule import LrSchedule, decay_steps


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_file_and_overrides_are_literals(tmp_path):
    path = write(tmp_path, "c.py", "import math\nmax_steps = 10\nlr = 1\n_private = 3\n"
                                   "def helper():\n    return 1\n")
    config = load_config(path, ["--optimizer=merit", "--beta2=0.99", "--resume",
                                "--optimizer_options={'norm': 'l2', 'maxlamb': True}", "--wandb_entity=None"])
    assert config.lr == 1.0 and isinstance(config.lr, float)  # ints are accepted where floats are declared
    assert config.optimizer == "merit" and config.beta2 == 0.99 and config.resume is True
    assert config.optimizer_options == {"norm": "l2", "maxlamb": True} and config.wandb_entity is None


def test_overrides_are_never_evaluated(tmp_path):
    marker = tmp_path / "evaluated"
    with pytest.raises(ConfigError, match="'lr'.*must be float"):
        load_config(None, ["--max_steps=1", f"--lr=open('{marker}', 'w')"])
    assert not marker.exists()


def test_inheritance_from_another_config():
    config = load_config("configs/gpt2_medium_owt.py")
    assert config.model == "gpt2-medium" and config.scale_attn_by_inverse_layer_idx is True
    assert config.batch_size == 480 and config.max_steps == 100_000  # inherited from the Small config
    assert config.lr == 3e-4


def test_unknown_key_names_it_and_suggests(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown config key 'learning_rat'.*did you mean 'lr'|'learning_rat'"):
        load_config(write(tmp_path, "c.py", "max_steps = 1\nlearning_rat = 3\n"))
    with pytest.raises(ConfigError, match=r"'micro_batch'.*did you mean 'micro_batch_size'"):
        load_config(None, ["--max_steps=1", "--micro_batch=4"])


def test_wrong_type_names_key_and_types(tmp_path):
    with pytest.raises(ConfigError, match=r"'batch_size'.*must be int, got str '64'"):
        load_config(write(tmp_path, "c.py", "max_steps = 1\nbatch_size = '64'\n"))
    with pytest.raises(ConfigError, match=r"'compile'.*must be bool, got int"):
        load_config(None, ["--max_steps=1", "--compile=1"])
    with pytest.raises(ConfigError, match=r"'batch_size'.*must be int, got float"):
        load_config(None, ["--max_steps=1", "--batch_size=64.0"])


def test_non_divisible_batch_names_the_numbers():
    schedule = BatchSchedule.of(TrainConfig(max_steps=1, batch_size=480, micro_batch_size=12), 1024)
    schedule.check_divisible(12, 8)
    assert schedule.accumulation(0, 12, 8) == 5
    with pytest.raises(ConfigError, match=r"batch_size=480 .*micro_batch_size=12 x world_size=7 = 84"):
        schedule.check_divisible(12, 7)


def test_invalid_values_are_rejected():
    with pytest.raises(ConfigError, match="exactly one of max_steps"):
        TrainConfig()
    with pytest.raises(ConfigError, match="lr_schedule='linear'"):
        TrainConfig(max_steps=1, lr_schedule="linear")
    with pytest.raises(ConfigError, match="max_tokens=10 is less than one step"):
        config = TrainConfig(max_tokens=10)
        BatchSchedule.of(config, 128).lengths(config)


def test_derived_model_and_schedule_lengths():
    config = TrainConfig(max_tokens=10 * 480 * 1024, warmup_tokens=2 * 480 * 1024, batch_size=480, model="gpt2")
    assert BatchSchedule.of(config, 1024).lengths(config) == (10, 2)
    assert config.model_config(50257).vocab_size == 50304  # GPT-2's 50257 padded to a multiple of 64
    assert TrainConfig(max_steps=1).model_config(257).vocab_size == 320
    assert TrainConfig(max_steps=1, model="gpt2", n_layer=2).model_config(50257).n_layer == 2


def test_resolved_config_round_trips_through_json(tmp_path):
    config = load_config(None, ["--max_steps=7", "--optimizer_options={'norm': 'l2'}"])
    save_config(config, tmp_path / "config.json")
    assert TrainConfig(**json.loads((tmp_path / "config.json").read_text())) == config


def test_schedules_against_hand_computed_values():
    # 110 steps of 5 tokens, 10 of them warmup; the lr of step n (0-based) is at 5n tokens.
    cosine = LrSchedule(total=550, warmup=50, decay_start=0, lr=1.0, min_lr=0.1)
    assert cosine(0, 5) == pytest.approx(0.1)  # warmup: (step + 1) / warmup
    assert cosine(45, 5) == pytest.approx(1.0)
    assert cosine(300, 5) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))
    assert cosine(550, 5) == pytest.approx(0.1)
    assert cosine(300, 5, scale=2.0) == pytest.approx(0.2 + 0.9 * (1 + math.cos(math.pi * 0.5)))
    wsd = LrSchedule(total=550, warmup=50, decay_start=5 * (110 - decay_steps(110, 0.2)), lr=1.0, min_lr=0.1,
                     kind="wsd")  # decay over the last 22 steps: 88..109
    assert wsd(5 * 87, 5) == 1.0
    assert wsd(5 * 88, 5) == pytest.approx(1.0 - 0.9 / 22)
    assert wsd(5 * 109, 5) == pytest.approx(0.1)


# The published GPT-2 settings, transcribed from docs/optimizers.md (and optim/published.py's
# sources) independently of the code: what an unset hyper-parameter resolves to.
PUBLISHED_GPT2 = {
    "adamw": {"betas": (0.9, 0.95), "weight_decay": 0.1, "eps": 1e-8},
    "merit": {"betas": (0.9, 0.95), "weight_decay": 0.01, "eps": 1e-6},
    "lamb": {"betas": (0.9, 0.95), "weight_decay": 0.01, "eps": 1e-6},
    "lion": {"betas": (0.9, 0.99), "weight_decay": 1.0},
    "sophiag": {"betas": (0.965, 0.99), "weight_decay": 0.2, "rho": 0.05},
    # Moonlight's recipe: Muon's update at AdamW's RMS, so both parts share AdamW's lr and decay.
    "muon": {"adjust_lr": "match_rms_adamw", "betas": (0.9, 0.95), "weight_decay": 0.1, "eps": 1e-8,
             "momentum": 0.95, "nesterov": True, "ns_steps": 5},
    # The 2025 benchmark's 124M scripts (scripts/124m/*.sh of epfml/llm-optimizer-benchmark).
    "ademamix": {"betas": (0.9, 0.999), "beta3": 0.999, "alpha": 8.0, "alpha_warmup": None, "beta3_warmup": None,
                 "weight_decay": 0.1, "eps": 1e-8},
    "dmuon": {"adjust_lr": "match_rms_adamw", "betas": (0.8, 0.999), "weight_decay": 0.1, "eps": 1e-8,
              "momentum": 0.95, "nesterov": True, "ns_steps": 5},
    # MARS: --mars_lr 3e-3 (the config's lr) on its matrices, --lr 1e-3 its AdamW part's, 0.1 both decays.
    "mars": {"betas": (0.95, 0.99), "gamma": 0.025, "weight_decay": 0.1, "eps": 1e-8, "adamw_lr": 1e-3,
             "adamw_betas": (0.8, 0.999), "adamw_weight_decay": 0.1},
    "soap": {"betas": (0.9, 0.999), "weight_decay": 0.1, "eps": 1e-8, "shampoo_beta": -1.0,
             "precondition_frequency": 10, "max_precond_dim": 10000},
    "adamw_schedulefree": {"betas": (0.9, 0.9999), "weight_decay": 0.1, "eps": 1e-8, "r": 0.0,
                           "weight_lr_power": 2.0},
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_GPT2))
def test_an_unset_hyperparameter_is_the_optimizers_published_one(name):
    constant = ["--lr_schedule=constant"] if name == "adamw_schedulefree" else []  # (it refuses a decay)
    run = resolve_config(load_config("configs/gpt2_small_owt.py", [f"--optimizer={name}", *constant]))
    settings = run.optimizer_settings
    for key, value in PUBLISHED_GPT2[name].items():
        assert settings[key] == (value, "published"), key
    assert settings["lr"] == (6e-4, "set")
    resolved = run.config
    assert (resolved.beta1, resolved.beta2) == PUBLISHED_GPT2[name]["betas"]
    assert resolved.weight_decay == PUBLISHED_GPT2[name]["weight_decay"]
    assert resolve_config(resolved).config == resolved  # idempotent: a recorded config resolves to itself


def test_muon_s_original_lr_rule_resolves_to_keller_jordan_s_recipe():
    """adjust_lr="original" picks the other published recipe (KellerJordan/Muon's MuonWithAuxAdam):
    weight decay 0.01, the AdamW part at lr 3e-4 with eps 1e-10; what it does not name stays."""
    run = resolve_config(load_config("configs/gpt2_small_owt.py", ["--optimizer=muon", "--lr=0.02",
                                                                   "--optimizer_options={'adjust_lr': 'original'}"]))
    settings = run.optimizer_settings
    assert settings["adjust_lr"] == ("original", "set")
    assert settings["weight_decay"] == (0.01, "published") and settings["adamw_lr"] == (3e-4, "published")
    assert settings["eps"] == (1e-10, "published") and settings["betas"] == ((0.9, 0.95), "published")
    assert settings["momentum"] == (0.95, "published") and settings["ns_dtype"] == ("auto", "default")
    assert resolve_config(run.config).config == run.config


def test_a_set_hyperparameter_wins_and_is_recorded(tmp_path):
    run = resolve_config(load_config("configs/gpt2_small_owt.py", ["--optimizer=sophiag", "--beta2=0.95",
                                                                   "--weight_decay=0.3", "--optimizer_options={'rho': 0.03}"]))
    settings = run.optimizer_settings
    assert settings["betas"] == ((0.965, 0.95), "set")  # beta1 keeps the published value
    assert settings["weight_decay"] == (0.3, "set") and settings["rho"] == (0.03, "set")
    assert settings["hessian_interval"] == (10, "default") and settings["eps"] == (1e-15, "default")
    save_config(run.config, tmp_path / "config.json")
    recorded = json.loads((tmp_path / "config.json").read_text())
    assert (recorded["beta1"], recorded["beta2"], recorded["weight_decay"]) == (0.965, 0.95, 0.3)
    assert recorded["optimizer_options"] == {"rho": 0.03, "hessian_interval": 10}


def test_the_schema_imports_neither_the_evaluator_nor_asks_the_machine():
    # Sweeps, reports and plots load thousands of configs: the schema is cheap and machine-free.
    code = ("import sys, torch\n"
            "torch.cuda.is_available = lambda: sys.exit('the schema asked for CUDA')\n"
            "import configs\n"
            "configs.load_config('configs/gpt2_small_owt.py', ['--device=cuda', '--zero_shot_tasks=nonexistent'])\n"
            "assert 'eval' not in sys.modules and 'optim' not in sys.modules, sorted(sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("override, pattern", [
    ("--device=cuda", None),  # (only where this torch has no CUDA device)
    ("--optimizer=merti", r"unknown optimizer 'merti'"),
    ("--optim_backend=gpu", r"optim_backend='gpu': use one of"),
])
def test_what_needs_the_registries_or_the_machine_is_checked_at_start_up(override, pattern):
    config = load_config(None, ["--max_steps=1", override])  # the schema alone accepts it
    if pattern is None:
        if torch.cuda.is_available():
            pytest.skip("this machine has a CUDA device")
        pattern = r"device='cuda', but this torch sees no CUDA device"
    with pytest.raises(ConfigError, match=pattern):
        resolve_config(config)


def test_paths_expand_the_home_folder_and_variables(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    monkeypatch.setenv("SCRATCH", "/scratch/someone")
    config = load_config(None, ["--max_steps=1", "--out_dir=~/runs", "--data_dir=$SCRATCH/owt",
                                "--zero_shot_data_dir=~/tasks"])
    assert (config.out_dir, config.data_dir, config.zero_shot_data_dir) == ("/home/someone/runs", "/scratch/someone/owt",
                                                                            "/home/someone/tasks")


def test_a_runs_config_json_is_a_config_and_helpers_are_private(tmp_path):
    config = load_config("configs/gpt2_small_owt.py", ["--run_name=42", "--optimizer='lion'"])
    assert config.run_name == "42" and config.optimizer == "lion"  # a str key takes the text as typed
    save_config(config, tmp_path / "config.json")
    assert load_config(str(tmp_path / "config.json")) == config
    path = write(tmp_path, "c.py", "from math import sqrt\n_base = 6e-4\nlr = _base * sqrt(4)\nmax_steps = 1\n")
    assert load_config(path).lr == 1.2e-3


def test_every_key_declares_a_known_role():
    # A study groups runs into points by the roles: a key without one would split points by accident.
    unplaced = {f.name: f.metadata.get("role") for f in dataclasses.fields(TrainConfig)
                if f.metadata.get("role") not in ROLES}
    assert not unplaced, f"give each key role(ROLE, default), ROLE one of {', '.join(ROLES)}: {unplaced}"


def test_a_study_point_is_every_key_but_the_lr_the_seeds_and_the_bookkeeping(tmp_path):
    """A run's point changes with each key that defines the experiment, and with no other; the lr
    keys move together (the point keeps their ratio)."""
    base = TrainConfig(max_steps=1).to_dict()
    point = Run(tmp_path, base, []).point
    for f in dataclasses.fields(TrainConfig):
        if f.metadata["role"] != "lr":
            changed = Run(tmp_path, {**base, f.name: {"changed": True}}, []).point
            assert (changed != point) == (f.metadata["role"] in ("experiment", "optimizer")), f.name
    scaled = {key: base[key] * 2 for key in keys_with_role("lr")}
    assert Run(tmp_path, {**base, **scaled}, []).point == point


def test_every_model_field_is_an_override_of_the_preset():
    # model_config takes each GPTConfig field a config sets (not None) over the model preset's.
    keys, types = {f.name: f for f in dataclasses.fields(TrainConfig)}, typing.get_type_hints(TrainConfig)
    model_types = typing.get_type_hints(GPTConfig)
    for name in (f.name for f in dataclasses.fields(GPTConfig)):
        assert name in keys, f"GPTConfig.{name} is no config key: add it to TrainConfig's model overrides"
        assert types[name] == model_types[name] | None and keys[name].default is None, name
        assert keys[name].metadata["role"] == "experiment", name


def test_the_invocation_flags_are_never_recorded_and_an_older_config_json_drops_them(tmp_path):
    flags = {"resume", "overwrite", "allow_changes", "stop_at_step"}  # what one invocation does with the folder
    config = load_config(None, ["--max_steps=3", "--overwrite", "--stop_at_step=2", "--allow_changes=lr"])
    save_config(config, tmp_path / "config.json")
    recorded = json.loads((tmp_path / "config.json").read_text())
    assert not flags & recorded.keys() and recorded["max_steps"] == 3
    assert set(recorded) == {f.name for f in dataclasses.fields(TrainConfig)} - flags

    # A config.json written before: its flags dropped, those set said in a warning; the command line sets them.
    older = tmp_path / "older.json"
    older.write_text(json.dumps({**recorded, "resume": False, "overwrite": True, "stop_at_step": 2,
                                 "allow_changes": "lr"}))
    with pytest.warns(UserWarning) as caught:
        loaded = load_config(str(older), ["--resume"])
    [message] = [str(w.message) for w in caught]
    assert message.startswith(f"{older} records how the invocation that wrote it used its run folder "
                              f"(overwrite=True, allow_changes='lr', stop_at_step=2)")
    assert "resume=" not in message and "on the command line" in message
    assert (loaded.resume, loaded.overwrite, loaded.stop_at_step, loaded.allow_changes) == (True, False, 0, "")
    older.write_text(json.dumps({**recorded, "resume": False, "overwrite": False}))  # at their defaults: quietly
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_config(str(older)) == TrainConfig(max_steps=3)
    # A Python config file is no record of an invocation: it sets them (a sweep's points resume="auto").
    assert load_config(write(tmp_path, "c.py", "max_steps = 3\nresume = 'auto'\nstop_at_step = 2\n")).stop_at_step == 2


def test_model_values_out_of_their_range_are_refused_naming_the_key_the_value_and_the_range():
    for key, value, range_ in (("rope_theta", 0.0, "> 0"), ("rope_theta", math.inf, "> 0"), ("norm_eps", -1e-6, "> 0"),
                               ("norm_eps", 0.0, "> 0")):
        with pytest.raises(ValueError, match=rf"GPTConfig.{key} must be a finite number {range_} .*got {value!r}"):
            GPTConfig(arch="llama", **{key: value})
