"""Every optimizer's options are type-checked once, where its settings are resolved (``optim.settings``),
against the types its constructor declares: a wrong type is a TypeError that names the optimizer, the
option, the expected type and the value, and through train.py a one-line failure before anything is
written. The types below are written out by hand from each constructor, not read from it."""
import json

import pytest

import optim
from helpers import TINY_RUN, train_here

FLOAT, INT, BOOL, STR = "float", "int", "bool", "str"
PAIR, TRIPLE = "tuple (float, float)", "tuple (float, float, float)"
FLOAT_OR_NONE, INT_OR_NONE = "float or None", "int or None"

ADAMW = {"lr": FLOAT, "weight_decay": FLOAT, "betas": PAIR, "eps": FLOAT}
MUON = {**ADAMW, "momentum": FLOAT, "nesterov": BOOL, "ns_steps": INT, "ns_coefficients": TRIPLE, "ns_eps": FLOAT,
        "adjust_lr": STR, "ns_dtype": STR, "adamw_lr": FLOAT_OR_NONE, "adamw_weight_decay": FLOAT_OR_NONE}
TYPES = {  # every hyper-parameter a config or a library call sets, as each constructor declares it
    "adamw": ADAMW,
    "adamw_schedulefree": {**ADAMW, "r": FLOAT, "weight_lr_power": FLOAT},
    "ademamix": {**ADAMW, "beta3": FLOAT, "alpha": FLOAT, "alpha_warmup": INT_OR_NONE, "beta3_warmup": INT_OR_NONE},
    "lamb": {**ADAMW, "bias_correction": BOOL, "ratio_only_with_decay": BOOL},
    "lion": {"lr": FLOAT, "weight_decay": FLOAT, "betas": PAIR},
    "mars": {**ADAMW, "gamma": FLOAT, "adamw_lr": FLOAT_OR_NONE, "adamw_betas": PAIR,
             "adamw_weight_decay": FLOAT_OR_NONE},
    "merit": {**ADAMW, "maxlamb": BOOL, "elementwise_clip": BOOL, "weightwise_lower_bound": BOOL, "norm": STR},
    "muon": MUON,
    "dmuon": MUON,
    "soap": {**ADAMW, "shampoo_beta": FLOAT, "precondition_frequency": INT, "max_precond_dim": INT,
             "correct_bias": BOOL},
    "sophiag": {**ADAMW, "rho": FLOAT, "hessian_interval": INT},
    "sgd": {"lr": FLOAT, "weight_decay": FLOAT, "momentum": FLOAT},  # (no betas, no eps)
    "adafactor": {"lr": FLOAT, "weight_decay": FLOAT, "decay_rate": FLOAT, "min_dim_size_to_factor": INT,
                  "clipping_threshold": FLOAT_OR_NONE, "param_rms_floor": FLOAT},
}
# Per type: values of other types, the words the error gives for it, and values it takes (a float an
# int, a tuple a list: a config recorded as JSON keeps its tuples as lists).
WRONG = {FLOAT: ["big", True, [1.0]], INT: [2.5, True, "3"], BOOL: [1, "yes", 0.0], STR: [3, b"max"],
         PAIR: [0.9, (0.9,), (0.9, 0.95, 0.99), ("a", 0.9), (0.9, True)], TRIPLE: [(1.0, 2.0), "abc", (1, 2, "c")],
         FLOAT_OR_NONE: ["x", False], INT_OR_NONE: [1.5, True]}
WORDS = {FLOAT: "a float", INT: "an int", BOOL: "True or False", STR: "a str", PAIR: "a tuple (float, float)",
         TRIPLE: "a tuple (float, float, float)", FLOAT_OR_NONE: "a float or None", INT_OR_NONE: "an int or None"}
RIGHT = {FLOAT: [1, 0.5], INT: [3], BOOL: [False], STR: ["any"], PAIR: [(0.5, 0.9), [0, 0.9]],
         TRIPLE: [[3, -4.5, 2.0]], FLOAT_OR_NONE: [0, 1e-3], INT_OR_NONE: [0, 7]}
COMMON = ("lr", "weight_decay", "betas", "eps")
CASES = [(name, option, kind) for name, types in TYPES.items() for option, kind in types.items()]


def resolve(name: str, option: str, value) -> optim.Settings:
    """``optim.settings`` with ``option`` set to ``value``, as a config (or a library call) sets it."""
    if option in COMMON:
        return optim.settings(name, **{"lr": 1e-3, option: value})
    return optim.settings(name, options={option: value}, lr=1e-3)


def test_the_table_covers_every_option_of_every_registered_optimizer():
    assert sorted(TYPES) == optim.available() and len(TYPES) == 13
    for name, types in TYPES.items():
        assert set(optim.settings(name, lr=1e-3).entries) == set(types), name


@pytest.mark.parametrize("name, option, kind", CASES, ids=[f"{name}-{option}" for name, option, _ in CASES])
def test_a_wrong_type_names_the_optimizer_the_option_the_type_and_the_value(name, option, kind):
    for value in WRONG[kind]:
        with pytest.raises(TypeError) as error:
            resolve(name, option, value)
        assert str(error.value) == (f"option {option!r} of optimizer {name!r} must be {WORDS[kind]}, "
                                    f"got {type(value).__name__} {value!r}")


@pytest.mark.parametrize("name, option, kind", CASES, ids=[f"{name}-{option}" for name, option, _ in CASES])
def test_values_of_the_declared_type_are_taken_as_they_are(name, option, kind):
    for value in RIGHT[kind]:
        assert resolve(name, option, value)[option] == (value, "set")


@pytest.mark.parametrize("name", sorted(TYPES))
def test_settings_recorded_as_json_resolve_again(name):
    """A run's config.json keeps its optimizer's settings with the tuples as lists; a resume resolves them."""
    recorded = json.loads(json.dumps(optim.settings(name, lr=1e-3).kwargs))
    common = {key: value for key, value in recorded.items() if key in COMMON}
    options = {key: value for key, value in recorded.items() if key not in COMMON}
    assert optim.settings(name, options=options, **common).kwargs == recorded


@pytest.mark.parametrize("optimizer, options, words", [
    ("ademamix", {"alpha": "big"}, "option 'alpha' of optimizer 'ademamix' must be a float, got str 'big'"),
    ("sophiag", {"hessian_interval": True}, "option 'hessian_interval' of optimizer 'sophiag' must be an int, "
                                            "got bool True"),
    ("mars", {"adamw_betas": 0.9}, "option 'adamw_betas' of optimizer 'mars' must be a tuple (float, float), "
                                   "got float 0.9"),
], ids=["ademamix-alpha", "sophiag-hessian_interval", "mars-adamw_betas"])
def test_through_train_py_a_wrong_type_is_one_line_before_anything_is_written(byte_shards, tmp_path, optimizer,
                                                                              options, words):
    out = tmp_path / "out"
    result = train_here(*TINY_RUN, "--batch_size=2", "--micro_batch_size=2", "--max_steps=2",
                        f"--data_dir={byte_shards}", f"--out_dir={out}", f"--optimizer={optimizer}",
                        f"--optimizer_options={options!r}", check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("train.py: "), result.stderr
    assert words in lines[0]
    assert not out.exists()


def test_an_option_without_annotation_or_type_is_the_optimizer_s_to_check(monkeypatch):
    """A factory registered from elsewhere may declare no type (or no class: Literal, Any): its values pass."""
    from typing import Any, Literal
    monkeypatch.setattr(optim, "_REGISTRY", dict(optim._REGISTRY))  # the registration ends with the test
    monkeypatch.setattr(optim.published, "GPT2", dict(optim.published.GPT2))

    def loose(params, lr, weight_decay=0.0, *, mode: Literal["a", "b"] = "a", extra: Any = None, plain=1,
              backend="auto"):
        raise AssertionError("settings builds nothing")

    optim.register("loose", loose)
    settings = optim.settings("loose", options={"mode": "c", "extra": [1], "plain": "two"}, lr="any")
    assert settings.kwargs == {"lr": "any", "weight_decay": 0.0, "mode": "c", "extra": [1], "plain": "two"}
