"""Optimizer registry: ``build(name, model, lr=...)`` is how the framework creates optimizers.

Registering an optimizer is one entry in ``_REGISTRY`` (or one ``register`` call, for an
optimizer defined outside this package): a callable (class or function) taking
``(params, *, lr, weight_decay, betas, eps, backend, <its own options>)`` with its own defaults
for betas/eps. ``build`` checks options against that signature, so no other code changes;
docs/architecture.md walks through adding one. ``hyperparameter_settings`` gives a run's
hyper-parameters: the ones the user set, else the optimizer's published GPT-2 ones
(optim/published.py), else its constructor's defaults.
"""
import difflib
import inspect
from collections.abc import Callable

import torch
from torch import nn

from . import published
from .adamw import adamw
from .backends import SETTINGS as BACKENDS
from .base import Optimizer
from .lamb import LAMB
from .lion import Lion
from .merit import MERIT
from .muon import Muon
from .param_groups import param_groups
from .protocol import GradientFn, LossFn, TrainingHooks
from .sophia import SophiaG

__all__ = ["BACKENDS", "GradientFn", "LAMB", "Lion", "LossFn", "MERIT", "Muon", "Optimizer", "SophiaG", "TrainingHooks", "adamw",
           "available", "build", "check_options", "hyperparameter_settings", "param_groups",
           "register"]

_REGISTRY: dict[str, Callable] = {
    "adamw": adamw,
    "lamb": LAMB,
    "lion": Lion,
    "merit": MERIT,
    "muon": Muon,
    "sophiag": SophiaG,
}
_COMMON = ("lr", "weight_decay", "betas", "eps", "backend")
_CONTEXT = ("batch_tokens",)  # supplied by the training loop, see build


def available() -> list[str]:
    """Names ``build`` accepts."""
    return sorted(_REGISTRY)


def register(name: str, factory: Callable, gpt2_settings: dict | None = None) -> None:
    """Make ``build(name, ...)`` (and so a config's ``optimizer = name``) create ``factory``'s
    optimizer; ``gpt2_settings``: its published hyper-parameters, for ``hyperparameter_settings``."""
    key = name.lower()
    if key in _REGISTRY:
        raise ValueError(f"an optimizer named {key!r} is already registered")
    _REGISTRY[key] = factory
    published.GPT2[key] = dict(gpt2_settings or {})


def hyperparameter_settings(name: str, chosen: dict) -> dict[str, tuple[object, str]]:
    """Every hyper-parameter of optimizer ``name`` as ``{key: (value, source)}``: the value in
    ``chosen`` where it is not None ("set"), else its published GPT-2 value ("published"), else its
    constructor's default ("default"). The hyper-parameters are the constructor's arguments but
    params, backend and the context the training loop supplies."""
    key = name.lower()
    check_options(key, {})
    gpt2 = published.gpt2_settings(key, chosen)
    settings = {}
    for option, parameter in inspect.signature(_REGISTRY[key]).parameters.items():
        if (parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
                or option in ("params", "backend", *_CONTEXT)):
            continue
        if chosen.get(option) is not None:
            settings[option] = (chosen[option], published.SET)
        elif option in gpt2:
            settings[option] = (gpt2[option], published.PUBLISHED)
        elif parameter.default is not parameter.empty:
            settings[option] = (parameter.default, published.DEFAULT)
        else:
            raise ValueError(f"optimizer {key!r} needs {option}: set it in the config")
    return settings


def build(name: str, model_or_named_params, *, lr: float, weight_decay: float = 0.0,
          betas: tuple[float, float] | None = None, eps: float | None = None,
          decay_embeddings: bool = False, batch_tokens: int | None = None, backend: str = "auto",
          zero_redundancy: bool = False, **options) -> torch.optim.Optimizer:
    """Create optimizer ``name`` (case-insensitive).

    ``model_or_named_params``: an ``nn.Module``, grouped by the shared ``param_groups`` (decay on
    matrices only; the hidden matrices apart for a factory whose ``HIDDEN_MATRICES_APART`` is True); or anything torch optimizers accept (tensors, ``(name, tensor)`` pairs, group
    dicts), passed through unchanged with ``weight_decay`` as the default for every group.
    ``betas``/``eps`` None keep the optimizer's own defaults. ``backend``: who runs the fused
    operations, one of ``BACKENDS`` (optim/backends/). ``options`` are optimizer-specific.
    ``batch_tokens`` (tokens per optimizer step) is context the training loop supplies to every
    optimizer: it is passed to the factories whose signature takes it (e.g. Sophia-G's Hessian
    scale, which then requires it) and ignored by the others. ``zero_redundancy``: ZeRO-1, each
    rank keeps the state of its share of whole parameters (optim/zero.py; needs a process group).
    """
    key = name.lower()
    check_options(key, options)
    factory = _REGISTRY[key]
    if isinstance(model_or_named_params, nn.Module):
        # (A matrix optimizer such as Muon takes the hidden matrices in a group of their own.)
        params = param_groups(model_or_named_params, weight_decay, decay_embeddings,
                              hidden_matrices_apart=getattr(factory, "HIDDEN_MATRICES_APART", False))
    elif decay_embeddings:
        raise ValueError("decay_embeddings=True needs an nn.Module to find the embeddings")
    else:
        params = model_or_named_params
    kwargs = {"lr": lr, "weight_decay": weight_decay, "backend": backend, **options}
    if betas is not None:
        kwargs["betas"] = tuple(betas)
    if eps is not None:
        kwargs["eps"] = eps
    if "batch_tokens" in inspect.signature(factory).parameters:
        kwargs["batch_tokens"] = batch_tokens
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
    accepted = [n for n, prm in inspect.signature(_REGISTRY[key]).parameters.items()
                if prm.kind in (prm.POSITIONAL_OR_KEYWORD, prm.KEYWORD_ONLY)
                and n != "params" and n not in _COMMON + _CONTEXT]
    for option in options:
        if option in _COMMON + _CONTEXT:
            raise TypeError(f"option {option!r} of optimizer {key!r} is set by the training config, not in "
                            f"optimizer_options: use its top-level key (lr, weight_decay, beta1/beta2, eps, "
                            f"optim_backend; batch_tokens follows batch_size)")
        if option not in accepted:
            raise TypeError(f"unknown option {option!r} for optimizer {key!r}"
                            f"{_did_you_mean(option, [*accepted, *_COMMON])}; "
                            f"accepted options: {', '.join(accepted) or 'none'}")


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
