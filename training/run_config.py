"""A config as a run uses it, resolved once at start-up.

The schema (configs/__init__.py) checks what a config says by itself. What it cannot check
alone is checked here, before a run writes anything: the optimizer's name and options against
the registry (a top-level key it takes none of, such as SGD's eps, is refused), the lr schedule
against the optimizer (Schedule-Free AdamW takes no decay), the optimizer backend, and the device
against the machine. (The zero-shot tasks are the evaluator's, which nothing in training/ imports:
train.py checks them at start-up.) Then every hyper-parameter
of the optimizer is resolved once, with its source (``optim.Settings``): "set" by the config, its
"published" GPT-2 value (optim/published.py) or its constructor's "default"; the run builds its
optimizer from them. The resolved config is what the run trains with and records (config.json,
every checkpoint, wandb); resolving a recorded config gives it back.
"""
from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

import optim
from configs import ConfigError, TrainConfig
from optim.backends import check_setting
from training.batch_schedule import declared_decays, followed_decays


@dataclass(frozen=True)
class RunConfig:
    config: TrainConfig  # every optimizer hyper-parameter filled in: what the run trains with and records
    optimizer_settings: optim.Settings  # {hyper-parameter: (value, "set" | "published" | "default")}

    def build_optimizer(self, model, **context) -> torch.optim.Optimizer:
        """``optim.build`` of the run's settings (``context``: its layout and batch); a value the
        optimizer refuses is named with the config key that sets it."""
        try:
            return optim.build(self.optimizer_settings, model, **context)
        except ValueError as error:
            raise ValueError(f"optimizer={self.config.optimizer!r} refuses its settings ({self.optimizer_settings}): "
                             f"{error}; betas are set by beta1 and beta2, lr, weight_decay and eps by their keys, "
                             f"the others in optimizer_options") from error


def precision(name: str, device: torch.device) -> tuple[torch.dtype, AbstractContextManager, torch.amp.GradScaler]:
    """The dtype a config's ``dtype`` asks for on ``device`` ("auto": bfloat16 where the GPU has it),
    the autocast that computes in it (none for float32) and the GradScaler (enabled for float16)."""
    if name == "auto":
        use_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        dtype = torch.bfloat16 if use_bf16 else torch.float32
    else:
        dtype = getattr(torch, name)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()
    return dtype, autocast, torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)


def resolve_config(config: TrainConfig) -> RunConfig:
    """Check ``config`` against the registries and the machine (a ConfigError that names the key
    and the fix), then resolve its optimizer's hyper-parameters."""
    for key in ("lr", "weight_decay", "eps", "beta1", "beta2"):  # a key its optimizer takes none of: refused
        hyperparameter, value = "betas" if key.startswith("beta") else key, getattr(config, key)
        if (value is not None and config.optimizer.lower() in optim.available()
                and hyperparameter not in optim.takes(config.optimizer)):
            raise ConfigError(f"{key}={value!r}: {optim.refusal(config.optimizer, hyperparameter, key)}")
    try:
        settings = optim.settings(config.optimizer, options=config.optimizer_options, lr=config.lr,
                                  weight_decay=config.weight_decay, eps=config.eps)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"optimizer={config.optimizer!r}, optimizer_options={config.optimizer_options!r}: "
                          f"{error}") from error
    try:
        check_setting(config.optim_backend)
    except ValueError as error:
        raise ConfigError(str(error)) from error
    if optim.schedule_free(config.optimizer) and config.lr_schedule != "constant":
        raise ConfigError(f"optimizer={config.optimizer!r} averages its iterates instead of decaying the lr, so it "
                          f"takes no decaying lr_schedule ({config.lr_schedule!r}): set lr_schedule='constant' "
                          f"(the warmup, then lr held)")
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda', but this torch sees no CUDA device: use device='auto' or 'cpu', or "
                          "install a CUDA build of torch")

    if (config.beta1, config.beta2) != (None, None):  # one beta set: the other keeps its unset value
        unset = settings["betas"][0]
        betas = (unset[0] if config.beta1 is None else config.beta1, unset[1] if config.beta2 is None else config.beta2)
        settings = optim.Settings(settings.optimizer, {**settings.entries, "betas": (betas, "set")})
    values = settings.kwargs
    betas = values.pop("betas", (None, None))
    resolved = dataclasses.replace(config, lr=values.pop("lr"), weight_decay=values.pop("weight_decay", None),
                                   eps=values.pop("eps", None), beta1=betas[0], beta2=betas[1],
                                   optimizer_options=values)
    declared_decays(resolved, followed_decays(resolved))  # (a name its optimizer does not declare: refused)
    return RunConfig(resolved, settings)
