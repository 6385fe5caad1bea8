"""A config as a run uses it, resolved once at start-up.

The schema (configs/__init__.py) checks what a config says by itself. What it cannot check
alone is checked here, before a run writes anything: the optimizer's name and options against
the registry, the optimizer backend, and the device against the machine. (The zero-shot tasks
are the evaluator's, which nothing in training/ imports: train.py checks them at start-up.) Then
every hyper-parameter of the optimizer is resolved, with its source:
"set" by the config, its "published" GPT-2 value (optim/published.py) or its constructor's
"default". The resolved config is what the run trains with and records (config.json, every
checkpoint, wandb); resolving a recorded config gives it back.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

import optim
from configs import ConfigError, TrainConfig
from optim.backends import check_setting


@dataclass(frozen=True)
class RunConfig:
    config: TrainConfig  # every optimizer hyper-parameter filled in: what the run trains with and records
    optimizer_settings: dict[str, tuple[object, str]]  # {hyper-parameter: (value, "set" | "published" | "default")}

    @property
    def optimizer_kwargs(self) -> dict[str, object]:
        """The optimizer's hyper-parameters as keyword arguments of ``optim.build``."""
        return {key: value for key, (value, _) in self.optimizer_settings.items()}


def resolve_config(config: TrainConfig) -> RunConfig:
    """Check ``config`` against the registries and the machine (a ConfigError that names the key
    and the fix), then resolve its optimizer's hyper-parameters."""
    try:
        optim.check_options(config.optimizer, config.optimizer_options)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"optimizer={config.optimizer!r}, optimizer_options={config.optimizer_options!r}: "
                          f"{error}") from error
    try:
        check_setting(config.optim_backend)
    except ValueError as error:
        raise ConfigError(str(error)) from error
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda', but this torch sees no CUDA device: use device='auto' or 'cpu', or "
                          "install a CUDA build of torch")

    chosen = {"lr": config.lr, "weight_decay": config.weight_decay, "eps": config.eps, **config.optimizer_options}
    if (config.beta1, config.beta2) != (None, None):  # one beta set: the other keeps its unset value
        unset = optim.hyperparameter_settings(config.optimizer, {"lr": config.lr})["betas"][0]
        chosen["betas"] = (unset[0] if config.beta1 is None else config.beta1,
                           unset[1] if config.beta2 is None else config.beta2)
    settings = optim.hyperparameter_settings(config.optimizer, chosen)
    values = RunConfig(config, settings).optimizer_kwargs
    betas = values.pop("betas", (None, None))
    resolved = dataclasses.replace(config, lr=values.pop("lr"), weight_decay=values.pop("weight_decay", None),
                                   eps=values.pop("eps", None), beta1=betas[0], beta2=betas[1],
                                   optimizer_options=values)
    return RunConfig(resolved, settings)
