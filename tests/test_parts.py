"""A part of a run defined here, outside train.py (training/parts.py): a config adds it
(``extra_parts``), the loop tells it about every step, its metric is logged and its state is
checkpointed, so a run stopped and resumed logs and saves what an uninterrupted one does; a run
without it in its config has none of it. The parts' metric keys: two parts that declare one key are
refused when the run is built, and a part that logs a key it did not declare when it logs it. What
a part may read of the run is ``training.parts.Run``: the Trainer has every name of it, and no part
of the project reaches for another. A step a part drops at ``commit`` enters no record as trained."""
import ast
import math
import re

import pytest
import torch

import train
from helpers import ROOT, TINY_RUN, read_metrics, train_here
from training.checkpoint import CHECKPOINT_NAME, Checkpoint
from training.parts import Part, Parts, Run, Step


class GradNormEMA(Part):
    """An exponential moving average of the clipped step's gradient norm (a metric with state),
    kept on the device: no host sync on an ordinary step."""

    name = "grad_norm_ema"
    metric_keys = ("test/",)
    decay = 0.75

    def __init__(self, run):
        self.run = run
        self.ema = torch.zeros((), dtype=torch.float64)
        self.steps = 0

    def after_step(self, step: Step) -> None:
        self.ema = self.decay * self.ema + (1 - self.decay) * step.grad_norm.double()
        self.steps += 1

    def measure(self, step: Step) -> dict[str, float]:
        return {"test/grad_norm_ema": self.ema.item(), "test/steps_seen": self.steps}

    def state_dict(self) -> dict:
        return {"ema": self.ema.clone(), "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.ema, self.steps = state["ema"].clone(), state["steps"]


def run_args(byte_shards, out, *extra):
    return [*TINY_RUN, f"--data_dir={byte_shards}", f"--out_dir={out}", "--run_name=run", "--max_steps=8",
            "--batch_size=4", "--micro_batch_size=2", "--log_interval=1", "--lr=1e-2",
            f"--extra_parts={__name__}:GradNormEMA", *extra]


def test_a_part_defined_here_is_trained_logged_and_resumed_bitwise(byte_shards, tmp_path):
    train_here(*run_args(byte_shards, tmp_path / "whole"))
    train_here(*run_args(byte_shards, tmp_path / "halves", "--stop_at_step=4"))
    train_here(*run_args(byte_shards, tmp_path / "halves", "--resume"))

    whole = [r for r in read_metrics(tmp_path / "whole" / "run") if "train/loss" in r]
    # Its metric, at every log step, is the EMA of the logged gradient norms (float64, written out).
    expected = 0.0
    for record in whole:
        expected = GradNormEMA.decay * expected + (1 - GradNormEMA.decay) * record["grad_norm"]
        assert record["test/steps_seen"] == record["step"]
        assert math.isclose(record["test/grad_norm_ema"], expected, rel_tol=1e-6)
    assert len(whole) == 8

    # Resumed from its state: the same records (but the speed; each invocation writes its run_info)
    # and the same checkpoint, bitwise.
    def series(run):
        return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "memory/peak")}
                for r in read_metrics(run) if "step" in r]
    assert series(tmp_path / "halves" / "run") == series(tmp_path / "whole" / "run")
    saved, resumed = (Checkpoint.load(tmp_path / run / "run" / CHECKPOINT_NAME) for run in ("whole", "halves"))
    assert saved.parts["grad_norm_ema"]["steps"] == 8
    assert torch.equal(saved.parts["grad_norm_ema"]["ema"], resumed.parts["grad_norm_ema"]["ema"])
    assert all(torch.equal(saved.model[k], resumed.model[k]) for k in saved.model)


def test_a_run_without_the_part_in_its_config_has_none_of_it(byte_shards, tmp_path):
    """Defining a part adds it to no run: only a config's ``extra_parts`` does (GradNormEMA is defined
    above, and imported, in this process)."""
    train_here(*run_args(byte_shards, tmp_path, "--max_steps=2", "--extra_parts="))
    records = [r for r in read_metrics(tmp_path / "run") if "train/loss" in r]
    assert len(records) == 2 and not any(key.startswith("test/") for r in records for key in r)
    assert "grad_norm_ema" not in Checkpoint.load(tmp_path / "run" / CHECKPOINT_NAME).parts


@pytest.mark.parametrize("name, error", [
    ("no_such_module:Part", r"extra_parts='no_such_module:Part': 'no_such_module:Part' cannot be imported"),
    ("helpers:ROOT", r"'helpers:ROOT' is not a subclass of training.parts.Part"),
])
def test_an_extra_part_that_cannot_be_used_is_a_clear_error(byte_shards, tmp_path, name, error):
    result = train_here(*run_args(byte_shards, tmp_path), f"--extra_parts={name}", check=False)
    assert result.returncode == 1
    assert re.search(error, result.stderr), result.stderr[-2000:]
    assert not (tmp_path / "run").exists()  # refused before anything is written


class LogsTheTrainLoss(Part):
    """A part that logs a key one of train.py's parts logs (training.metrics.TrainLoss's)."""

    metric_keys = ("train/loss",)

    def __init__(self, run):
        pass

    def measure(self, step: Step) -> dict[str, float]:
        return {"train/loss": 0.0}


def test_an_extra_part_that_logs_a_built_in_key_is_refused_before_anything_is_written(byte_shards, tmp_path):
    result = train_here(*run_args(byte_shards, tmp_path), f"--extra_parts={__name__}:LogsTheTrainLoss",
                        check=False)
    assert result.returncode == 1
    assert re.search(r"the parts training\.metrics:TrainLoss and test_parts:LogsTheTrainLoss both log the metric "
                     r"key 'train/loss'", result.stderr), result.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def declaring(*keys: str, logs: dict | None = None, name: str = "Declaring") -> Part:
    """A part (of a class of its own, called ``name``) that declares ``keys`` and logs ``logs``."""
    kind = type(name, (Part,), {"metric_keys": keys, "measure": lambda self, step: dict(logs or {})})
    return kind()


@pytest.mark.parametrize("first, second, key", [
    (("lr", "val/"), ("val/loss",), "val/loss"),  # a prefix and a key under it
    (("memory/",), ("grad_norm", "memory/"), "memory/"),  # one prefix
    (("tokens_per_s",), ("tokens_per_s",), "tokens_per_s"),  # one key
])
def test_two_parts_that_declare_one_key_are_refused_when_built(first, second, key):
    with pytest.raises(ValueError, match=rf"the parts test_parts:First and test_parts:Second both log the metric key "
                                         rf"'{key}' \(First\.metric_keys {re.escape(repr(first))}, Second\.metric_keys "
                                         rf"{re.escape(repr(second))}\): give each part keys of its own"):
        Parts([declaring(*first, name="First"), declaring(*second, name="Second")])


def test_the_loops_own_keys_and_a_second_catch_all_are_refused_when_built():
    with pytest.raises(ValueError, match=r"test_parts:Declaring declares the metric key 'step', which the training "
                                         r"loop writes in every record \(step, tokens\): give the part another key"):
        Parts([declaring("step")])
    with pytest.raises(ValueError, match=r"the parts test_parts:First and test_parts:Second both declare '\*'"):
        Parts([declaring("*", name="First"), declaring("*", name="Second")])
    with pytest.raises(ValueError, match=r"test_parts:Declaring\.metric_keys is the string 'val/': make it a tuple, "
                                         r"\('val/',\)"):
        Parts([type("Declaring", (Part,), {"metric_keys": "val/"})()])  # ("val/") without its comma
    # Keys that share a beginning but not a prefix ending in "/" are apart.
    Parts([declaring("max_logit/", "lr"), declaring("max_logit_capped/", "lr_scale", name="Other")])


def test_a_key_a_part_did_not_declare_is_refused_when_it_is_logged():
    step = Step(1, log=True)
    parts = Parts([declaring("test/", "lr", logs={"test/a": 1.0, "lr": 2.0}),
                   declaring("*", logs={"trust_ratio_min/w": 3.0}, name="CatchAll")])
    assert parts.collect("measure", step) == {"test/a": 1.0, "lr": 2.0, "trust_ratio_min/w": 3.0}
    with pytest.raises(ValueError, match=r"test_parts:Declaring logged the metric key 'testing', outside its "
                                         r"metric_keys \('test/', 'lr'\): declare it there"):
        Parts([declaring("test/", "lr", logs={"testing": 1.0})]).collect("measure", step)
    # The catch-all takes the keys no other part declares, and no other.
    with pytest.raises(ValueError, match=r"test_parts:CatchAll logged the metric key 'test/a', which "
                                         r"test_parts:Declaring declares \(its metric_keys \('test/',\)\)"):
        Parts([declaring("test/"), declaring("*", logs={"test/a": 1.0}, name="CatchAll")]).collect("measure", step)
    with pytest.raises(ValueError, match=r"logged the metric key 'tokens', which the training loop"):
        Parts([declaring("*", logs={"tokens": 1.0})]).collect("measure", step)


# --- what a part may read of the run ---
DECLARED = set(Run.__annotations__) | {name for name in vars(Run) if not name.startswith("_")}


def reaches(source: str) -> dict[str, set[str]]:
    """{part class: the names it reads of ``run`` or ``self.run``} for every class in ``source``
    that derives from a class called Part (or another part class of the same source)."""
    tree = ast.parse(source)
    parts = set()
    for node in ast.walk(tree):  # (a part class may derive from another part of its module)
        if isinstance(node, ast.ClassDef) and any(getattr(base, "id", getattr(base, "attr", None)) in {"Part", *parts}
                                                  for base in node.bases):
            parts.add(node.name)
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in parts:
            names = found.setdefault(node.name, set())
            for inner in ast.walk(node):
                if not isinstance(inner, ast.Attribute):
                    continue
                owner = inner.value
                if (isinstance(owner, ast.Name) and owner.id == "run"
                        or isinstance(owner, ast.Attribute) and owner.attr == "run"
                        and isinstance(owner.value, ast.Name) and owner.value.id == "self"):
                    names.add(inner.attr)
    return found


def test_reaches_finds_what_a_part_reads_of_the_run():
    source = ("class A(Part):\n"
              "    def build(cls, run):\n"
              "        return run.config, run.checkpoints.steps\n"
              "class B(A):\n"
              "    def start(self):\n"
              "        self.run.layout.traffic.within = 0\n"
              "class NotAPart:\n"
              "    def f(self, run):\n"
              "        return run.anything\n")
    assert reaches(source) == {"A": {"config", "checkpoints"}, "B": {"layout"}}


def test_every_part_reads_only_what_the_run_declares():
    modules = [path for folder in ("training", "eval", "study") for path in sorted((ROOT / folder).rglob("*.py"))]
    found = {f"{path.relative_to(ROOT)}:{name}": names for path in modules
             for name, names in reaches(path.read_text()).items()}
    assert len(found) >= 13  # (train.py's parts and the replica groups': they are found)
    beyond = {part: sorted(names - DECLARED) for part, names in found.items() if names - DECLARED}
    assert not beyond, (f"parts reach past training.parts.Run: {beyond}; read what Run declares, or declare "
                        f"what the part needs there (and give the Trainer it)")


def test_the_trainer_provides_every_name_the_run_declares(byte_shards, tmp_path):
    from configs import command_line_config
    from training.run_config import resolve_config
    trainer = train.Trainer(resolve_config(command_line_config(run_args(byte_shards, tmp_path, "--extra_parts="))))
    try:
        missing = sorted(name for name in DECLARED if not hasattr(trainer, name))
        assert not missing, f"training.parts.Run declares what train.Trainer lacks: {missing}"
    finally:
        trainer.close()


def test_a_config_s_parts_go_before_the_parts_that_must_be_last():
    assert train.LAST_PARTS == (train.ReplicaGroups,) and train.ReplicaGroups not in train.PARTS


class DropsStep3(Part):
    """Drops step 3 at ``commit``, as replica groups that disagree on a step do."""

    def __init__(self, run):
        pass

    def commit(self, step: Step) -> None:
        if step.number == 3:
            step.committed = False


def test_a_dropped_step_enters_no_record_as_trained(byte_shards, tmp_path):
    every = [f"--extra_parts={__name__}:DropsStep3", "--max_steps=4", "--nonfinite=skip"]
    train_here(*run_args(byte_shards, tmp_path / "each", *every, "--log_interval=1"))
    train_here(*run_args(byte_shards, tmp_path / "pairs", *every, "--log_interval=2"))
    each = {r["step"]: r for r in read_metrics(tmp_path / "each" / "run") if "train/loss" in r}
    pairs = {r["step"]: r for r in read_metrics(tmp_path / "pairs" / "run") if "train/loss" in r}
    # The train loss of steps 3 and 4 is step 4's alone; of steps 1 and 2, theirs.
    assert pairs[4]["train/loss"] == each[4]["train/loss"]
    assert math.isclose(pairs[2]["train/loss"], (each[1]["train/loss"] + each[2]["train/loss"]) / 2, rel_tol=1e-6)
    assert each[3]["train/loss"] is None  # (a window of no trained step: NaN, which the record writes as null)
    # No update measured at the dropped step (the optimizer's diagnostics, the update ratios), nor a skipped step.
    assert any(key.startswith("update_ratio/") for key in each[2]) and any(k.startswith("update_ratio/") for k in each[4])
    assert not any(key.startswith("update_ratio/") for key in each[3])
    assert all(record["skipped_steps"] == 0 for record in each.values())
