"""Checkpoints, in one package: what a checkpoint holds, how a run writes and reads it, when.

==================  =============================================================================
``format.py``       ``Checkpoint``: the fields, the format version, validation, what a resume may change
``files.py``        a run folder's checkpoints: names, the ``ckpt.pt`` pointer, pruning, the latest
``writers.py``      what a layout writes and reads: inline, ZeRO-1 consolidated, or DCP shards
``sharded.py``      the DCP files (FSDP2): the one module that imports DCP, only where one is met
``tensors.py``      a checkpoint's tensors wherever they are; ``load_model`` for the tools
``checkpointer.py`` the loop's side: when to save, what to keep, what a resume loads
==================  =============================================================================

What is saved is the run's state (training/state.py: each piece saves and loads itself); the
run folder's lock (training/run_folder.py) guards every write. Writes are atomic: a crash at any
moment leaves the last good checkpoint whole and named. Files are read with ``weights_only=True``.

The names below are the package's public ones; DCP is never imported by importing it.
"""
from training.checkpoint.files import NUMBERED, load_latest, numbered, save_in
from training.checkpoint.format import CHECKPOINT_NAME, RECORDED, Checkpoint
from training.checkpoint.tensors import load_model

__all__ = ["CHECKPOINT_NAME", "NUMBERED", "RECORDED", "Checkpoint", "load_latest", "load_model", "numbered",
           "save_in"]
