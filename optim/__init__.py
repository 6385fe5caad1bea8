"""Optimizer registry: ``build(name, model, lr=...)`` is how the framework creates optimizers.

Registering an optimizer is one entry in ``_REGISTRY`` (or one ``register`` call, for an
optimizer defined outside this package): a callable (class or function) taking
``(params, *, lr, weight_decay, betas, eps, backend, <its own options>)`` with its own defaults
for betas/eps. ``settings`` checks the options' names and types against that signature (its
annotations), so no other code changes; docs/architecture.md walks through adding one.

An optimizer's hyper-parameters are resolved once, into ``Settings``: the ones the caller set,
else the optimizer's published GPT-2 ones (optim/published.py), else its constructor's defaults,
each with its source. train.py resolves a config's (training/run_config.py) and builds from them;
a library call ``build("muon", model, lr=...)`` resolves the same way, so it gets the published
recipe too, unless it asks for the constructor's defaults (``defaults="constructor"``).
"""
import difflib
import inspect
import numbers
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from . import published
from .adafactor import Adafactor
from .adamw import adamw
from .ademamix import AdEMAMix
from .backends import SETTINGS as BACKENDS
from .base import Optimizer
from .lamb import LAMB
from .lion import Lion
from .mars import MARS
from .merit import MERIT
from .muon import DMuon, Muon
from .param_groups import param_groups
from .protocol import GradientFn, LossFn, TrainingHooks
from .schedulefree import AdamWScheduleFree
from .sgd import SGD
from .soap import SOAP
from .sophia import SophiaG

__all__ = ["AdEMAMix", "Adafactor", "AdamWScheduleFree", "BACKENDS", "DMuon", "GradientFn", "LAMB", "Lion", "LossFn",
           "MARS", "MERIT", "Muon", "Optimizer", "SGD", "SOAP", "SophiaG", "TrainingHooks", "adamw", "Settings",
           "available", "batch_decays", "build", "check_options", "param_groups", "refusal", "register",
           "schedule_free", "settings", "takes"]

_REGISTRY: dict[str, Callable] = {
    "adamw": adamw,
    "adamw_schedulefree": AdamWScheduleFree,
    "ademamix": AdEMAMix,
    "lamb": LAMB,
    "lion": Lion,
    "mars": MARS,
    "merit": MERIT,
    "muon": Muon,
    "dmuon": DMuon,  # the 2025 benchmark's Muon
    "soap": SOAP,
    "sophiag": SophiaG,
    "sgd": SGD,  # Marek et al. 2025's small-batch baselines: torch's SGD and optax's Adafactor
    "adafactor": Adafactor,
}
_COMMON = ("lr", "weight_decay", "betas", "eps", "backend")
_HYPERPARAMETERS = _COMMON[:-1]  # the common ones a config sets at its top level (betas as beta1 and beta2)
_CONTEXT = ("batch_tokens", "run_steps")  # supplied by the training loop, see build


def available() -> list[str]:
    """Names ``build`` accepts."""
    return sorted(_REGISTRY)


def takes(name: str) -> list[str]:
    """The common hyper-parameters (lr, weight_decay, betas, eps) optimizer ``name``'s constructor takes."""
    parameters = inspect.signature(_REGISTRY[name.lower()]).parameters
    return [option for option in _HYPERPARAMETERS if option in parameters]


def refusal(name: str, hyperparameter: str, drop: str, where: str = "") -> str:
    """Why a common ``hyperparameter`` (set ``where``) that optimizer ``name`` takes none of is refused, and the
    fix: ``drop`` what set it; what the optimizer takes instead, as a config sets it (betas as beta1 and beta2)."""
    key = name.lower()
    top = [word for option in takes(key) for word in (("beta1", "beta2") if option == "betas" else (option,))]
    options = _options(key)
    return (f"optimizer {key!r} takes no {hyperparameter}{where}; drop {drop} ({key} takes {_and(top)}, and "
            + (f"in optimizer_options {', '.join(options)})" if options else "no optimizer_options)"))


def _and(words: list[str]) -> str:
    return " and ".join(words) if len(words) < 3 else f"{', '.join(words[:-1])} and {words[-1]}"


def _options(key: str) -> list[str]:
    """The options of optimizer ``key`` (registered) that a config sets in optimizer_options."""
    return [n for n, prm in inspect.signature(_REGISTRY[key]).parameters.items()
            if prm.kind in (prm.POSITIONAL_OR_KEYWORD, prm.KEYWORD_ONLY) and n != "params"
            and n not in _COMMON + _CONTEXT]


def schedule_free(name: str) -> bool:
    """Whether optimizer ``name`` averages its iterates instead of decaying the lr (its factory's
    ``SCHEDULE_FREE``): a run of it holds the lr constant after the warmup."""
    return getattr(_REGISTRY[name.lower()], "SCHEDULE_FREE", False)


def batch_decays(name: str) -> dict[str, tuple[str, int | None]]:
    """The decays of optimizer ``name`` that may follow the batch (its factory's ``BATCH_DECAYS``,
    optim/protocol.py): ``{name: (param-group key, index in its tuple or None)}``."""
    return dict(getattr(_REGISTRY[name.lower()], "BATCH_DECAYS", {}))


def register(name: str, factory: Callable, gpt2_settings: dict | None = None) -> None:
    """Make ``build(name, ...)`` (and so a config's ``optimizer = name``) create ``factory``'s
    optimizer; ``gpt2_settings``: its published hyper-parameters, for ``settings``."""
    key = name.lower()
    if key in _REGISTRY:
        raise ValueError(f"an optimizer named {key!r} is already registered")
    _REGISTRY[key] = factory
    published.GPT2[key] = dict(gpt2_settings or {})


@dataclass(frozen=True)
class Settings:
    """Every hyper-parameter of one optimizer as ``{key: (value, source)}``, the source "set" (by
    the caller), "published" or "default" (its constructor's): what ``build`` takes and a run
    records. The hyper-parameters are the constructor's arguments but params, backend and the
    context the training loop supplies."""

    optimizer: str
    entries: dict[str, tuple[object, str]]

    def __getitem__(self, key: str) -> tuple[object, str]:
        return self.entries[key]

    def items(self):
        return self.entries.items()

    @property
    def kwargs(self) -> dict[str, object]:
        """The values as keyword arguments of the optimizer's constructor."""
        return {key: value for key, (value, _) in self.entries.items()}

    def __str__(self) -> str:
        return ", ".join(f"{key} {value} ({source})" for key, (value, source) in self.entries.items())


def settings(name: str, defaults: str = "published", options: dict | None = None, **common) -> Settings:
    """Optimizer ``name``'s ``Settings`` from the ``common`` hyper-parameters chosen (lr,
    weight_decay, betas, eps) and its own ``options``: each value chosen that is not None ("set"),
    else its published GPT-2 value ("published"; not with ``defaults="constructor"``), else its
    constructor's default ("default"). An unknown name or option, a common hyper-parameter chosen that the
    optimizer takes none of (SGD's eps: ``refusal``), or a value chosen of another type than the constructor
    declares, is refused here, once."""
    key = name.lower()
    if defaults not in ("published", "constructor"):
        raise ValueError(f"defaults={defaults!r}: use 'published' or 'constructor'")
    check_options(key, options or {})
    unknown = sorted(set(common) - set(_COMMON))
    if unknown:
        raise TypeError(f"{unknown} are not common hyper-parameters ({', '.join(_COMMON[:-1])}): pass them in options")
    for option, value in common.items():  # (one the optimizer takes none of is refused, never dropped)
        if value is not None and option in _HYPERPARAMETERS and option not in takes(key):
            raise TypeError(refusal(key, option, drop=option))
    chosen = {**common, **(options or {})}
    gpt2 = published.gpt2_settings(key, chosen) if defaults == "published" else {}
    entries = {}
    for option, parameter in inspect.signature(_REGISTRY[key], eval_str=True).parameters.items():
        if (parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
                or option in ("params", "backend", *_CONTEXT)):
            continue
        if chosen.get(option) is not None:
            if not _is_of(chosen[option], parameter.annotation):
                raise TypeError(f"option {option!r} of optimizer {key!r} must be {_described(parameter.annotation)}, "
                                f"got {type(chosen[option]).__name__} {chosen[option]!r}")
            entries[option] = (chosen[option], published.SET)
        elif option in gpt2:
            entries[option] = (gpt2[option], published.PUBLISHED)
        elif parameter.default is not parameter.empty:
            entries[option] = (parameter.default, published.DEFAULT)
        else:
            raise ValueError(f"optimizer {key!r} needs {option}: set it in the config")
    return Settings(key, entries)


def build(optimizer: str | Settings, model_or_named_params, *, defaults: str = "published",
          decay_embeddings: bool = False, batch_tokens: int | None = None, run_steps: int | None = None,
          backend: str = "auto", zero_redundancy: bool = False, **hyperparameters) -> torch.optim.Optimizer:
    """Create an optimizer from its ``Settings``, or from its name (case-insensitive) and the
    ``hyperparameters`` chosen (``lr`` at least), resolved by ``settings``: the unchosen ones are
    its published GPT-2 values, or with ``defaults="constructor"`` its constructor's defaults.

    ``model_or_named_params``: an ``nn.Module``, grouped by the shared ``param_groups`` (decay on
    matrices only, on every parameter for a factory whose ``DECAYS_EVERY_PARAMETER`` is True; the
    hidden matrices apart for a factory whose ``HIDDEN_MATRICES_APART`` is True); or anything torch
    optimizers accept (tensors, ``(name, tensor)`` pairs, group dicts), passed through unchanged with
    the weight decay as the default for every group. ``backend``: who runs the fused operations,
    one of ``BACKENDS`` (optim/backends/). ``batch_tokens`` (tokens per optimizer step) and
    ``run_steps`` (the run's optimizer steps) are context the training loop supplies to every
    optimizer: each is passed to the factories whose signature takes it (e.g. Sophia-G's Hessian
    scale, which then requires batch_tokens; AdEMAMix's warmups over the run) and ignored by the
    others. ``zero_redundancy``: ZeRO-1, each rank keeps the state of its share
    of whole parameters (optim/zero.py; needs a process group).
    """
    if isinstance(optimizer, Settings):
        if hyperparameters:
            raise TypeError(f"build takes Settings or hyper-parameters, not both: {sorted(hyperparameters)}")
        key, kwargs = optimizer.optimizer, optimizer.kwargs
    elif "lr" not in hyperparameters:
        raise TypeError(f"build({optimizer!r}, ...) needs lr")
    else:
        common = {k: v for k, v in hyperparameters.items() if k in _COMMON}
        options = {k: v for k, v in hyperparameters.items() if k not in _COMMON}
        key, kwargs = optimizer.lower(), settings(optimizer, defaults, options, **common).kwargs
    factory = _REGISTRY[key]
    if isinstance(model_or_named_params, nn.Module):
        # (A matrix optimizer such as Muon takes the hidden matrices in a group of their own.)
        params = param_groups(model_or_named_params, kwargs["weight_decay"], decay_embeddings,
                              hidden_matrices_apart=getattr(factory, "HIDDEN_MATRICES_APART", False),
                              decay_all=getattr(factory, "DECAYS_EVERY_PARAMETER", False))
    elif decay_embeddings:
        raise ValueError("decay_embeddings=True needs an nn.Module to find the embeddings")
    else:
        params = model_or_named_params
    kwargs = {**kwargs, "backend": backend}
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    context = {"batch_tokens": batch_tokens, "run_steps": run_steps}
    kwargs.update({key: value for key, value in context.items() if key in inspect.signature(factory).parameters})
    if zero_redundancy:
        from .zero import ZeroRedundancy  # (torch.distributed.optim: a part of start-up only ZeRO-1 pays)
        return ZeroRedundancy(list(params), factory, **kwargs)
    optimizer = factory(params, **kwargs)
    if not isinstance(optimizer, TrainingHooks):  # the training loop relies on the protocol
        raise TypeError(f"optimizer {key!r} builds a {type(optimizer).__name__}, which does not implement "
                        f"optim.TrainingHooks: subclass optim.Optimizer, or mix TrainingHooks into it")
    return optimizer


def check_options(name: str, options) -> None:
    """ValueError for an unknown optimizer name, TypeError for an option ``name`` does not take
    (a common hyper-parameter included: those are set at the top level)."""
    key = name.lower()
    if key not in _REGISTRY:
        raise ValueError(f"unknown optimizer {name!r}{_did_you_mean(key, _REGISTRY)}; "
                         f"valid names: {', '.join(available())}")
    accepted = _options(key)
    for option in options:
        if option in _HYPERPARAMETERS and option not in takes(key):  # (no top-level key takes it either)
            betas = option == "betas"
            raise TypeError(refusal(key, option, "them" if betas else "it",
                                    f", in optimizer_options or as {'beta1/beta2' if betas else option}"))
        if option in _COMMON + _CONTEXT:
            raise TypeError(f"option {option!r} of optimizer {key!r} is set by the training config, not in "
                            f"optimizer_options: use its top-level key (lr, weight_decay, beta1/beta2, eps, "
                            f"optim_backend; batch_tokens follows batch_size, run_steps the run's length)")
        if option not in accepted:
            raise TypeError(f"unknown option {option!r} for optimizer {key!r}"
                            f"{_did_you_mean(option, [*accepted, *_COMMON])}; "
                            f"accepted options: {', '.join(accepted) or 'none'}")


def _is_of(value, annotation) -> bool:
    """Whether ``value`` is of the type a constructor's ``annotation`` declares: a float takes an int,
    a bool is no number, a tuple takes a list (a config recorded as JSON keeps its tuples as lists),
    ``X | None`` takes None. No annotation, or one that is no type (``Literal``, ``Any``), checks
    nothing: which values a str option takes, and whatever else an annotation cannot say, the
    optimizer checks when it is built."""
    if annotation in (inspect.Parameter.empty, typing.Any):  # (Any is a class, and no type to check)
        return True
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        return any(_is_of(value, arg) for arg in args)
    if typing.get_origin(annotation) is tuple:
        return (isinstance(value, (tuple, list)) and len(value) == len(args)
                and all(_is_of(item, arg) for item, arg in zip(value, args)))
    if annotation is bool:
        return isinstance(value, bool)
    if annotation in (float, int):  # a bool is no number
        number = numbers.Real if annotation is float else numbers.Integral
        return isinstance(value, number) and not isinstance(value, bool)
    return isinstance(value, annotation) if isinstance(annotation, type) else True


def _described(annotation) -> str:
    """What a constructor's ``annotation`` asks for, in words: "a float", "a tuple (float, float)",
    "an int or None"."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        return " or ".join(_described(arg) for arg in args)
    if typing.get_origin(annotation) is tuple:
        return f"a tuple ({', '.join(str(getattr(arg, '__name__', arg)) for arg in args)})"
    return {bool: "True or False", int: "an int", type(None): "None"}.get(annotation, f"a {annotation.__name__}")


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
