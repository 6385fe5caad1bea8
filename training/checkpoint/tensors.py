"""A checkpoint's model and optimizer tensors, wherever they are: in the checkpoint itself
(inline) or in the DCP files of its folder (sharded). ``load_model`` is how the tools read a
checkpoint's model (the evaluator, the lm-eval adapter, the HF export, the Hessian script, the
study's reports); a resume reads through its layout's writer (writers.py)."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from model import GPT
from training.checkpoint.format import Checkpoint


def load_model(path, map_location="cpu") -> tuple[GPT, Checkpoint]:
    """(GPT in eval mode on ``map_location``, the checkpoint it came from: step, config, ...), from
    a checkpoint file or a sharded checkpoint's folder."""
    path = Path(path)
    checkpoint = Checkpoint.load(path, map_location=map_location)
    model = GPT(checkpoint.model_config(path))
    load_tensors(checkpoint, path, model)
    model.eval()
    if isinstance(map_location, (str, torch.device)):
        model.to(map_location)
    return model, checkpoint


def load_tensors(checkpoint: Checkpoint, path: Path, model: nn.Module,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
    """Load ``checkpoint``'s model (and optimizer) state into ``model`` (``optimizer``): from the
    checkpoint itself, or from the DCP files of its folder (``path``) where it is sharded."""
    if checkpoint.tensors == "dcp":
        from training.checkpoint.sharded import load_sharded_state  # (DCP: imported where a checkpoint needs it)
        load_sharded_state(path, checkpoint, model, optimizer)
    else:
        model.load_state_dict(checkpoint.model)
        if optimizer is not None:
            optimizer.load_state_dict(checkpoint.optimizer)
