"""The checkpoint format, defined once: what a checkpoint holds, its version, how it is validated.

The file is a dict of ``Checkpoint``'s fields plus ``format_version``, written atomically and read
with ``weights_only=True``. Older files are read as well: version 1 before ``optim_backends`` and
``train_window``, 2 before ``noise_scale``, 3 before ``tensors``, 4 with the noise scale's state
in a field of its own instead of ``parts``, 5 before ``batch_phases``, 6 with the step of a
pending evaluation (``evaluating``) where 7 keeps ``evaluation_pending``.

``tensors`` says where the model's and optimizer's tensors are: "inline" in the fields
themselves (``ckpt_<step>.pt``), "dcp" in the DCP files of the checkpoint's folder
(``ckpt_<step>.dcp/``, this file beside them as ``checkpoint.pt``; sharded.py).
"""

from __future__ import annotations

import dataclasses
import subprocess
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from atomic import atomic_write
from configs import keys_with_role, listed
from model import GPT, GPTConfig

CHECKPOINT_NAME = "ckpt.pt"  # in a run folder: the link to its newest checkpoint (files.py)
SHARDED_CHECKPOINT = "checkpoint.pt"  # in a sharded checkpoint's folder: the Checkpoint beside the DCP files
FORMAT_VERSION = 7
# Fields a version lacks, with the value its files are read with.
_ADDED_IN = {2: {"optim_backends": {}, "train_window": {}}, 3: {"noise_scale": {}}, 4: {"tensors": "inline"},
             5: {"changes": [], "evaluating": 0}}  # (6: batch_phases, from the config; 7: _upgraded)
# What a resume compares: the keys that define what is trained. Of those, the ones that cannot
# change on resume at all (the checkpoint's tensors, data position and RNG would not fit them).
RECORDED = keys_with_role("experiment") | keys_with_role("optimizer") | keys_with_role("lr") | keys_with_role("seed")
FIXED = frozenset({f.name for f in dataclasses.fields(GPTConfig)} - {"dropout"}
                  | {"model", "tokenizer", "optimizer", "seed", "data_seed", "align_documents"})


def _upgraded(state: dict, version: int) -> dict:
    """The fields of a file of format ``version`` as the current version's."""
    for newer in range(version + 1, FORMAT_VERSION + 1):
        state = {**_ADDED_IN.get(newer, {}), **state}
    if version < 6:  # one batch throughout (version 6 records the batch schedule's phases)
        state = {**state, "batch_phases": [[0, 0, state["config"]["batch_size"]]] if "batch_size" in state["config"]
                 else []}
    if version < 7:  # a pending evaluation was recorded by its step, which is the checkpoint's own
        state = dict(state)
        state["evaluation_pending"] = bool(state.pop("evaluating"))
    if version < 5:  # version 5 keeps the state of every part of the run in ``parts``
        noise_scale = state.pop("noise_scale", {})
        state = {**state, "parts": {"noise_scale": noise_scale} if noise_scale else {}}
    return state


def code_version() -> str:
    """The git commit of the sources (with '-dirty' for local edits), or 'unknown'."""
    here = Path(__file__).resolve().parent
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=here, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclass
class Checkpoint:
    """Everything a run needs to continue exactly where it stopped."""

    model: dict            # the plain module's state dict (never a compiled or DDP wrapper's)
    model_args: dict       # GPTConfig fields
    optimizer: dict        # optimizer.state_dict()
    scaler: dict           # GradScaler.state_dict()
    step: int              # optimizer steps taken
    tokens: int            # training tokens seen
    rng: list              # per rank: {"cpu": ByteTensor, "cuda": ByteTensor or None}
    train_loader: dict     # TokenLoader.state_dict(): the data position
    config: dict           # the resolved TrainConfig.to_dict()
    code_version: str = field(default_factory=code_version)  # git describe of the sources
    optim_backends: dict = field(default_factory=dict)  # per param group: the implementation that stepped it
    train_window: dict = field(default_factory=dict)  # {"steps", "loss_sums": per rank}: train loss since the last log
    parts: dict = field(default_factory=dict)  # {name: state_dict()} of the run's parts with state (training/parts.py)
    changes: list = field(default_factory=list)  # settings changed on resume: {"step", "key", "from", "to"}, in order
    # [[step, tokens, batch], ...]: where each batch of the run's schedule begins (training/batch_schedule.py)
    batch_phases: list = field(default_factory=list)
    evaluation_pending: bool = False  # a stop interrupted this step's evaluation: a resume runs it first
    # "inline": model and optimizer above; "dcp": their tensors in the DCP files of the checkpoint's
    # folder, ``model`` {} and ``optimizer`` {"param_groups": ...} (keyed by parameter names)
    tensors: str = "inline"

    @classmethod
    def of_model(cls, model: GPT, tokenizer: str, step: int = 0, tokens: int = 0) -> Checkpoint:
        """A checkpoint of a model alone (no training state: it exports and evaluates, it does
        not resume), e.g. of a model trained elsewhere."""
        return cls(model=model.state_dict(), model_args=vars(model.config).copy(), optimizer={}, scaler={},
                   step=step, tokens=tokens, rng=[], train_loader={}, config={"tokenizer": tokenizer})

    def save(self, path: Path) -> None:
        """Write to ``path`` so that a crash at any moment leaves the previous file intact."""
        # Fields by reference (dataclasses.asdict would deep-copy every tensor).
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        size = sum(t.nbytes for t in _tensors(fields))
        with atomic_write(path, size_hint=size) as f:
            torch.save({"format_version": FORMAT_VERSION, **fields}, f)

    @classmethod
    def load(cls, path, map_location="cpu") -> Checkpoint:
        """The checkpoint at ``path`` (a file, or a sharded checkpoint's folder: its tensors stay
        in the DCP files until ``sharded.load_sharded_state``); a clear error if it is
        missing, unreadable, of another version or lacks a field."""
        path = Path(path)
        file = path / SHARDED_CHECKPOINT if path.is_dir() else path
        if path.is_dir() and not file.is_file() and (path / CHECKPOINT_NAME).exists():
            raise FileNotFoundError(f"no checkpoint at {path}: {path} is a run folder, not a checkpoint: pass "
                                    f"{path / CHECKPOINT_NAME} (its newest checkpoint)")
        if not file.is_file():
            raise FileNotFoundError(f"no checkpoint at {path}: give the path of a checkpoint train.py wrote "
                                    f"(RUN/{CHECKPOINT_NAME} is the newest of a run)")
        if not zipfile.is_zipfile(file):  # (torch.save writes a zip; torch.load's error on anything else is long)
            if file.name == "config.json":
                raise ValueError(f"{path} is a run's config, not a checkpoint: pass {path.parent / CHECKPOINT_NAME}")
            raise ValueError(f"checkpoint {path} cannot be read (not the zip file torch.save writes: truncated, or "
                             f"another kind of file); it is corrupt or not a nanoMERIT checkpoint: pass one train.py "
                             f"wrote (RUN/{CHECKPOINT_NAME} is the newest of a run)")
        try:
            state = torch.load(file, map_location=map_location, weights_only=True)
        except Exception as e:  # a truncated or foreign file (torch's first line: its advice does not apply)
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ValueError(f"checkpoint {path} cannot be read ({reason}); it is corrupt or not a nanoMERIT "
                             f"checkpoint") from e
        version = state.pop("format_version", None) if isinstance(state, dict) else None
        if version not in range(1, FORMAT_VERSION + 1):
            raise ValueError(f"checkpoint {path} has format version {version}, this code reads 1 to {FORMAT_VERSION}")
        state = _upgraded(state, version)
        names = {f.name for f in dataclasses.fields(cls)}
        missing, unknown = sorted(names - state.keys()), sorted(state.keys() - names)
        if missing or unknown:
            raise ValueError(f"checkpoint {path} does not have the fields of format version {version} "
                             f"(missing {missing}, unknown {unknown})")
        if (state["tensors"] == "dcp") != path.is_dir():
            raise ValueError(f"checkpoint {path} is corrupt: its tensors are {state['tensors']!r}, but it is a "
                             f"{'folder' if path.is_dir() else 'file'}")
        return cls(**state)

    def changes_on_resume(self, model_args: dict, config: dict, path: Path, total_steps: int) -> list[dict]:
        """The settings a resume with ``config`` (a resolved config's dict) changes from the
        checkpoint's, as records ``{"step", "key", "from", "to"}``; each must be named in the
        config's ``allow_changes``. Refused with every difference named: a change not allowed, a
        model, tokenizer, optimizer or seed of another run (a new seed would be recorded while the RNG
        continues the old one), and a ``total_steps`` or ``stop_at_step`` that leaves nothing to
        train. (A new batch or batch schedule applies from the step: the checkpoint's batch phases
        keep the tokens of the steps before.)"""
        # The checkpoint's model as this code builds it, so that a field added since it was written
        # compares at its default (else, model_args this code cannot build, as they are).
        try:
            saved = vars(self.model_config(path))
        except ValueError:
            saved = self.model_args
        fixed = [f"{key}: checkpoint {saved.get(key)!r}, now {value!r}"
                 for key, value in model_args.items() if key != "dropout" and saved.get(key) != value]
        changed = {key: (self.config[key], config[key]) for key in sorted(RECORDED)
                   if key in self.config and self.config[key] != config[key]}
        fixed += [f"{key}: checkpoint {old!r}, now {new!r}" for key, (old, new) in changed.items() if key in FIXED]
        if fixed:
            raise ValueError(f"checkpoint {path} does not match this config ({'; '.join(fixed)}): resume with the "
                             f"checkpoint's settings or start a new run_name")
        if self.step > total_steps:
            raise ValueError(f"the checkpoint {path} is at step {self.step}, past this config's {total_steps} steps: "
                             f"raise max_steps (or max_tokens) with --allow_changes=max_steps (max_tokens) to continue "
                             f"the run")
        if 0 < config["stop_at_step"] <= self.step:
            raise ValueError(f"stop_at_step={config['stop_at_step']} is not past the checkpoint's step {self.step}: "
                             f"nothing would train; raise stop_at_step or leave it out")
        allowed = set(listed(config.get("allow_changes", "")))
        refused = {key: pair for key, pair in changed.items() if key not in allowed}
        if refused:
            raise ValueError(f"resuming {path} at step {self.step} would change what the run trains ("
                             + "; ".join(f"{key}: checkpoint {old!r}, now {new!r}"
                                         for key, (old, new) in refused.items())
                             + f"): resume with the checkpoint's settings, or apply the changes from step {self.step} "
                             f"on with --allow_changes={','.join(sorted(allowed | refused.keys()))}"
                             + (" in a whole-job restart: every replica group stopped and started with it (a group "
                                "restarted alone with a change is refused by the others when it joins)"
                                if config.get("replica_groups") else ""))
        return [{"step": self.step, "key": key, "from": old, "to": new} for key, (old, new) in changed.items()]

    def model_config(self, path: Path) -> GPTConfig:
        """The config of the model this checkpoint holds (``path`` names it in the error)."""
        try:
            return GPTConfig(**self.model_args)
        except TypeError as e:
            raise ValueError(f"checkpoint {path} has model_args this code does not know ({e})") from e


def _tensors(value):
    """The tensors in nested dicts, lists and tuples."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
