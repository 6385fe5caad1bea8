"""Checkpoints: one file per run folder, written atomically, read with weights_only=True.

A checkpoint holds everything a run needs to continue exactly where it stopped: the unwrapped
model, the optimizer, the grad scaler, the step, tokens seen, every rank's RNG states, the data
loader position, the resolved config, and the code version that wrote it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import torch

from model import GPT, GPTConfig

CHECKPOINT_NAME = "ckpt.pt"
FORMAT_VERSION = 1

def code_version() -> str:
    """The git commit of the sources (with '-dirty' for local edits), or 'unknown'."""
    here = Path(__file__).resolve().parent
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=here, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def save(state: dict, path: Path):
    """Write `state` to `path` so that a crash at any moment leaves the previous file intact."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save({"format_version": FORMAT_VERSION, **state}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic on POSIX: readers see the old or the new file, never a mix


def load(path: Path, map_location="cpu") -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: start without --resume, or point out_dir/run_name "
                                f"at the run folder that holds {CHECKPOINT_NAME}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # a truncated or foreign file
        raise ValueError(f"checkpoint {path} cannot be read ({e}); it is corrupt or not a nanoMERIT checkpoint") from e
    version = state.get("format_version") if isinstance(state, dict) else None
    if version != FORMAT_VERSION:
        raise ValueError(f"checkpoint {path} has format version {version}, this code reads {FORMAT_VERSION}")
    return state


def check_compatible(saved: dict, model_args: dict, config: dict, path: Path):
    """Refuse to resume a run whose model, tokenizer or optimizer differs from the checkpoint's."""
    mismatches = [f"{key}: checkpoint {saved['model_args'].get(key)!r}, now {value!r}"
                  for key, value in model_args.items() if saved["model_args"].get(key) != value]
    mismatches += [f"{key}: checkpoint {saved['config'].get(key)!r}, now {config[key]!r}"
                   for key in ("tokenizer", "optimizer") if saved["config"].get(key) != config[key]]
    if mismatches:
        raise ValueError(f"checkpoint {path} does not match this config ({'; '.join(mismatches)}): "
                         f"resume with the checkpoint's settings or start a new run_name")


def load_model(path, map_location="cpu") -> tuple[GPT, dict]:
    """(GPT, checkpoint state): the model a checkpoint holds, in eval mode, and the whole state
    (step, config, ...). A model saved from a torch.compile'd or DDP module loads too."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    state = load(path, map_location=map_location)
    if not isinstance(state.get("model"), dict) or not isinstance(state.get("model_args"), dict):
        raise ValueError(f"checkpoint {path} holds no model (no 'model' and 'model_args' entries)")
    try:
        config = GPTConfig(**state["model_args"])
    except TypeError as e:
        raise ValueError(f"checkpoint {path} has model_args this code does not know ({e})") from e
    weights = {}
    for key, tensor in state["model"].items():
        while key.startswith(("_orig_mod.", "module.")):
            key = key.split(".", 1)[1]
        weights[key] = tensor
    model = GPT(config)
    model.load_state_dict(weights)
    if isinstance(map_location, (str, torch.device)):
        model.to(map_location)
    return model.eval(), state
