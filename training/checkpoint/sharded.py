"""The sharded checkpoint layout (``ckpt_<step>.dcp/``, FSDP2), written and read with
``torch.distributed.checkpoint`` (DCP); format.py has the format, files.py the run folder.

Every rank writes its shards of the model and of the optimizer state; rank 0 adds the
``Checkpoint`` as ``checkpoint.pt`` with the optimizer's param groups (``tensors="dcp"``). DCP
reshards on load, so the folder resumes on any number of ranks, FSDP2 or one process. Only
tensors go into DCP files (DCP unpickles any other value without weights_only), and DCP's
metadata is read by an unpickler that builds nothing but DCP's own metadata classes.

A module of its own because importing DCP (and the DTensor it brings) costs every process half a
second of start-up: only the runs and tools that meet a sharded checkpoint import it (through
``ShardedWriter`` and ``load_tensors``, which tell the layouts apart; nothing else imports it).
"""
from __future__ import annotations

import dataclasses
import pickle
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict, set_model_state_dict,
                                                     set_state_dict)

from atomic import publish
from training.checkpoint.files import make_latest
from training.checkpoint.format import SHARDED_CHECKPOINT, Checkpoint


def save_sharded_in(run_dir: Path, checkpoint: Checkpoint | None, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, step: int) -> Path:
    """Every rank: write this rank's shards of ``model`` and ``optimizer`` (FSDP2) into
    run_dir/ckpt_<step>.dcp/ with DCP; rank 0, which passes ``checkpoint`` (None elsewhere),
    adds the checkpoint, publishes the folder and points ckpt.pt at it."""
    path = run_dir / f"ckpt_{step:08d}.dcp"
    partial = run_dir / f".{path.name}.partial"  # one name every rank knows; only ever complete when renamed
    if checkpoint is not None:
        shutil.rmtree(partial, ignore_errors=True)  # left by a crash during an earlier save
        partial.mkdir()
    _barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    # Returns once every rank's files and the metadata are written (and fsynced).
    dcp.save({"model": model_state, "optimizer": optimizer_state["state"]}, checkpoint_id=partial,
             no_dist=not dist.is_initialized())
    if checkpoint is not None:
        checkpoint = dataclasses.replace(checkpoint, model={}, tensors="dcp",
                                         optimizer={"param_groups": optimizer_state["param_groups"]})
        checkpoint.save(partial / SHARDED_CHECKPOINT)
        if path.exists():  # a step saved again (a resumed run that stopped at the same step)
            shutil.rmtree(path)
        publish(partial, path)
        make_latest(run_dir, path)
    _barrier()
    return path


def load_sharded_state(path: Path, checkpoint: Checkpoint, model: torch.nn.Module,
                       optimizer: torch.optim.Optimizer | None = None) -> None:
    """Load a sharded checkpoint's model (and optimizer) state into ``model`` (``optimizer``), on
    any number of ranks: FSDP2-sharded, DDP-replicated or one plain process (every rank calls it)."""
    if optimizer is None:
        state = {"model": get_model_state_dict(model)}
    else:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state["state"]}
    try:
        with warnings.catch_warnings():  # (one process, on purpose: DCP warns that it assumes so)
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load(state, storage_reader=_MetadataCheckedReader(path), no_dist=not dist.is_initialized())
    except (Exception, CheckpointException) as e:  # a missing or truncated shard, another model (DCP's
        # CheckpointException is a BaseException)
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__  # (not DCP's traceback)
        raise ValueError(f"checkpoint {path}: its DCP files cannot be loaded ({reason}); it is corrupt or of "
                         f"another model") from e
    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict={"state": state["optimizer"], **checkpoint.optimizer})


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class _MetadataCheckedReader(FileSystemReader):
    """DCP's file reader, whose metadata (a pickle) is read by an unpickler that builds DCP's
    metadata classes, torch sizes, dtypes and layouts, and nothing else."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as file:
            metadata = _MetadataUnpickler(file).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _MetadataUnpickler(pickle.Unpickler):
    _MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
    _NAMES = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
              ("pathlib", "WindowsPath"), ("collections", "OrderedDict")}

    def find_class(self, module: str, name: str):
        # Decided before anything is imported or looked up.
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if module in self._MODULES or (module, name) in self._NAMES or dtype:
            found = super().find_class(module, name)
            if module not in self._MODULES or isinstance(found, type):
                return found
        raise pickle.UnpicklingError(f"a DCP checkpoint's metadata names {module}.{name}, which is not DCP "
                                     f"metadata: refusing to load it")
