"""Sequence-length warmup (Li, Zhang and He, NeurIPS 2022, "The Stability-Efficiency Dilemma"):
the first steps train on short sequences, their length growing to the full block, the data-side
cure for the extreme gradient variance long sequences bring early in training.

The length of step k (1-based) is DeepSpeed's curriculum learning's (``curriculum_type: seqlen``,
its ``fixed_linear`` and ``fixed_root`` pacings) computed at its ``global_steps + 1`` = k:

    length = floor((k / steps) ** (1 / degree) * (full - start) + start)
    length = min(length - length % multiple, full)

``start`` its ``min_difficulty``, ``full`` the block (``max_difficulty``), ``steps`` its
``total_curriculum_step``, ``multiple`` its ``difficulty_step`` and ``degree`` 1 (linear) or the
root's ``root_degree``. From step ``steps`` on every step trains the full block.

A step's sequences are read from the data as ever, the full block each (the loader's position,
the data order and a resume do not change); then each is cut to the step's length:

* ``truncate`` (the paper's, DeepSpeed's): its first ``length`` tokens; the rest are read, not
  trained;
* ``reshape`` (Composer's ``truncate=False``): its ``block // length`` pieces of ``length``
  tokens, as that many rows; the last ``block % length`` tokens are not trained. Composer cuts a
  micro-batch's tokens laid end to end, dropping at most ``length - 1`` of them at its end; here
  each sequence is cut, so what a step trains does not depend on the micro-batch size.

Positions restart at 0 in every row (the model's), the loss is the mean over the rows' targets,
and evaluation (validation, the zero-shot tasks) always runs on the full block.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from configs import ConfigError, TrainConfig


@dataclass(frozen=True)
class SeqLenWarmup:
    start: int  # the first step's length (DeepSpeed's min_difficulty)
    full: int  # the block: every step's length from ``steps`` on
    steps: int  # the warmup's length in optimizer steps (total_curriculum_step)
    pacing: str = "linear"  # "linear" or "root"
    root_degree: float = 2.0  # "root": the length grows as the degree's root of the steps
    multiple: int = 8  # each length a multiple of this (difficulty_step)
    reshape: bool = False  # cut sequences into more rows instead of truncating them

    @classmethod
    def of(cls, config: TrainConfig, block_size: int) -> SeqLenWarmup | None:
        """``config``'s warmup for sequences of ``block_size`` tokens (None: off); its duration in tokens
        read is its whole steps of ``batch_size`` blocks."""
        if not config.seq_len_warmup_start:
            return None
        multiple, start = config.seq_len_warmup_multiple, config.seq_len_warmup_start
        if block_size % multiple or start >= block_size:
            raise ConfigError(f"seq_len_warmup_start={start}, seq_len_warmup_multiple={multiple}: the block "
                              f"({block_size} tokens) is a multiple of the multiple, and the first length shorter")
        steps = config.seq_len_warmup_steps or config.seq_len_warmup_tokens // (config.batch_size * block_size)
        if steps < 1:
            raise ConfigError(f"seq_len_warmup_tokens={config.seq_len_warmup_tokens} is less than one step's "
                              f"{config.batch_size * block_size} tokens read")
        return cls(start, block_size, steps, config.seq_len_warmup_pacing, config.seq_len_warmup_root_degree,
                   multiple, config.seq_len_warmup_reshape)

    def length(self, steps_taken: int) -> int:
        """The sequence length of the step taken after ``steps_taken`` steps."""
        k = steps_taken + 1
        if k >= self.steps:
            return self.full
        degree = 1.0 if self.pacing == "linear" else self.root_degree
        length = math.floor((k / self.steps) ** (1.0 / degree) * (self.full - self.start) + self.start)
        return min(length - length % self.multiple, self.full)

    def trained_per_sequence(self, steps_taken: int) -> int:
        """The tokens of one sequence that the step after ``steps_taken`` steps trains."""
        length = self.length(steps_taken)
        return self.full // length * length if self.reshape else length

    def cut(self, x: Tensor, y: Tensor, steps_taken: int) -> tuple[Tensor, Tensor]:
        """Inputs and targets of shape (rows, full) as the step after ``steps_taken`` steps trains them."""
        length = self.length(steps_taken)
        if length == x.shape[1]:
            return x, y
        if not self.reshape:
            return x[:, :length].contiguous(), y[:, :length].contiguous()
        pieces = x.shape[1] // length
        return (x[:, :pieces * length].reshape(-1, length), y[:, :pieces * length].reshape(-1, length))
