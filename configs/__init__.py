"""Training configuration: the schema (one dataclass) and the loader of Python config files.

A config file is plain Python that assigns names, e.g. ``configs/default.py``; it may inherit
from another config with ``from configs.gpt2_small_owt import *`` and then reassign names.
Every public name it leaves behind must be a field of ``TrainConfig`` with the field's type;
helper variables start with ``_`` (``_base_lr = 6e-4``), and imported modules, functions and
classes are not settings. A run's ``config.json`` is a config too (to rerun or vary a run).
Command-line overrides ``--key=value`` are parsed as Python literals (``ast.literal_eval``),
never evaluated as code; a key of type str takes the text as it is (``--run_name=42``). The
invocation flags (``INVOCATION_KEYS``: --resume, --overwrite, --allow_changes, --stop_at_step)
say what one invocation does with its run folder, not what the run is: a config.json never
records them, and one used as a config never carries them.

The schema checks what it can check by itself (types, ranges, combinations), so importing it is
cheap and asks nothing of the machine: sweeps, reports and plots load thousands of configs. The
checks that need the optimizer registry, the zero-shot task list or the machine, and the
resolution of the optimizer's hyper-parameters, run at start-up (training/run_config.py).

Every key declares its role (``ROLES``): it defines what is trained, or is what a study tunes (the
lr) or repeats (the seeds) at each point, or only records how the run was run; study/runs.py
groups runs into points by the roles.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib
import inspect
import json
import math
import os
import runpy
import shlex
import textwrap
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from atomic import atomic_write
from model import GPTConfig

VOCAB_MULTIPLE = 64  # pad the vocabulary so the LM head's matmul has friendly shapes (50257 -> 50304)

# What a key is to a study, which groups runs into points by it (study/runs.py). Every TrainConfig
# field declares one (tests/test_config.py checks), so that a new key is placed on purpose, never
# by omission.
ROLES = {
    "experiment": "defines what is trained (the data, the model, the batch, the schedule, the optimizer, the "
                  "precision) or the validation loss a point's lr is chosen on (val_tokens)",
    "optimizer": "an optimizer's own hyper-parameter (unset: its published value, filled in at start-up): it "
                 "defines the experiment, but only runs of the same optimizer compare on it",
    "lr": "the learning rate and where it decays to: a study tunes them at each point (keeping their ratio)",
    "seed": "a seed: a study repeats each point over them",
    "bookkeeping": "how the run was run or recorded, not what it trained: names, folders, intervals, the layout, "
                   "the backend, logging, the held-out and zero-shot evaluations",
}


# How the lr follows a batch ratio B / B0: a batch schedule's batch_lr_scaling, a sweep's --lr-scaling.
SCALINGS = {"sqrt": math.sqrt, "linear": lambda ratio: ratio, "none": lambda ratio: 1.0}
# The decays a batch change may scale by their half-life in tokens: Adam's beta2 and beta1, Muon's momentum.
BETAS = ("beta2", "beta1", "momentum")
# What one invocation of train.py does with its run folder, not what the run is: set on the command
# line (or by a Python config file), never recorded in a run's config.json, so that a recorded config
# used as a config cannot start another run over, stop it early or make it resume.
INVOCATION_KEYS = ("resume", "overwrite", "allow_changes", "stop_at_step")


def role(name: str, default=dataclasses.MISSING, default_factory=dataclasses.MISSING):
    """A TrainConfig field with the role ``name`` (one of ROLES) and its default."""
    return field(default=default, default_factory=default_factory, metadata={"role": name})


@dataclass
class TrainConfig:
    # --- run ---
    run_name: str = role("bookkeeping", "default")  # the run folder is out_dir/run_name
    out_dir: str = role("bookkeeping", "runs")  # the folder that holds run folders
    seed: int = role("seed", 1337)  # initial weights, dropout, Sophia-G's sampled labels
    data_seed: int = role("seed", 1337)  # the order of the training shards: vary seed and data_seed independently
    # True: continue out_dir/run_name's checkpoint; "auto": if it has one, else start
    resume: bool | str = role("bookkeeping", False)
    # on --resume, the keys that define what is trained (roles experiment, optimizer, lr, seed) whose
    # new values apply from the resumed step, e.g. "max_steps" or "weight_decay,beta2"; a change not
    # named is refused (docs/checkpoints.md), and so is a name that is no config key
    allow_changes: str = role("bookkeeping", "")
    # start over in a run folder that holds a run (its checkpoint, metrics and config)
    overwrite: bool = role("bookkeeping", False)

    # --- data ---
    data_dir: str = role("experiment", "cache/data/shakespeare-byte")  # shards written by data/prepare.py
    # "gpt2", "byte", or a Hugging Face tokenizer (a hub name such as "t5-base", or a folder); must be the
    # one the shards were made with
    tokenizer: str = role("experiment", "byte")
    # start every train and val sequence at a document (its end-of-text token)
    align_documents: bool = role("experiment", False)

    # --- model: a GPTConfig preset, each field overridable (None keeps the preset's value) ---
    # a shape preset of model.py (PRESETS): "nano", "mini", "gpt2", "gpt2-medium", ..., and the Llama
    # family's "llama_nano", "llama_130m", "llama_350m"
    model: str = role("experiment", "nano")
    n_layer: int | None = role("experiment", None)  # transformer blocks
    n_head: int | None = role("experiment", None)  # attention heads per block
    n_embd: int | None = role("experiment", None)  # the residual width
    block_size: int | None = role("experiment", None)  # tokens per sequence (the context length)
    dropout: float | None = role("experiment", None)  # on the attention weights and the residual branches
    bias: bool | None = role("experiment", None)  # biases in the linear layers and LayerNorms (GPT-2 has them)
    # layer i's logits divided by i + 1 (GPT-2 Medium and up in HF)
    scale_attn_by_inverse_layer_idx: bool | None = role("experiment", None)
    # "layernorm" or "rmsnorm" on each head's q and k (the QK-Norm baseline)
    qk_norm: str | None = role("experiment", None)
    # "gpt2" or "llama" (model.py's docstring): a preset's shape in another family
    arch: str | None = role("experiment", None)
    intermediate_size: int | None = role("experiment", None)  # the MLP's hidden width (4 x n_embd; Llama 8/3)
    norm_eps: float | None = role("experiment", None)  # the norms' epsilon (GPT-2 1e-5, Llama 1e-6)
    rope_theta: float | None = role("experiment", None)  # Llama's rotary base (10,000)
    # Gemma 2's soft-cap, cap * tanh(x / cap), of the attention logits (Gemma 2: 50.0; None: off): the fifth
    # logit cure beside QK-Norm, z-loss, QK-Clip and MERIT
    attn_logit_softcap: float | None = role("experiment", None)
    final_logit_softcap: float | None = role("experiment", None)  # the same of the LM head's logits (Gemma 2: 30.0)
    vocab_size: int | None = role("experiment", None)  # None: the tokenizer's vocabulary padded to a multiple of 64

    # --- batch: GLOBAL sequences per optimizer step; accumulation = batch / (micro x ranks) ---
    batch_size: int = role("experiment", 64)  # sequences per optimizer step over all ranks
    micro_batch_size: int = role("bookkeeping", 16)  # sequences per forward pass on one rank
    # [(tokens, batch), ...]: the global batch from each token count on, the first (0, batch_size),
    # each change by an integer factor, taking effect at the first step at or after its tokens
    # (docs/batch.md); []: batch_size throughout
    batch_schedule: list = role("experiment", default_factory=list)
    # how lr and min_lr follow a scheduled batch B: x sqrt(B / B0) ("sqrt"), x B / B0 ("linear") or "none"
    batch_lr_scaling: str = role("experiment", "sqrt")
    # the decays held at a fixed half-life in tokens as the batch changes, beta ** (B / B0): any of
    # "beta2", "beta1", "momentum" (Muon's), comma-separated; "": unchanged
    batch_half_life_betas: str = role("experiment", "")
    # sequence-length warmup (training/seq_len_warmup.py): the first steps train sequences cut to a
    # length growing from this to the block, by DeepSpeed's pacing (docs/configs.md); 0: off
    seq_len_warmup_start: int = role("experiment", 0)
    seq_len_warmup_steps: int = role("experiment", 0)  # the warmup's length in optimizer steps ...
    seq_len_warmup_tokens: int = role("experiment", 0)  # ... or in tokens read (the whole steps that fit in it)
    seq_len_warmup_pacing: str = role("experiment", "linear")  # "linear" or "root" (fixed_linear, fixed_root)
    seq_len_warmup_root_degree: float = role("experiment", 2.0)  # "root": the degree of the root
    seq_len_warmup_multiple: int = role("experiment", 8)  # every length a multiple of this (difficulty_step)
    # cut each sequence into block // length rows (Composer's truncate=False) instead of truncating it
    seq_len_warmup_reshape: bool = role("experiment", False)

    # --- schedule: lengths in steps or in tokens (set exactly one of each pair) ---
    max_steps: int = role("experiment", 0)  # the run's length in optimizer steps
    max_tokens: int = role("experiment", 0)  # ... or in training tokens (the whole steps that fit in it)
    warmup_steps: int = role("experiment", 0)  # linear warmup from 0 to lr, in steps
    warmup_tokens: int = role("experiment", 0)  # ... or in tokens (the whole steps that fit in it)
    # "cosine" (warmup, cosine to min_lr), "wsd" (warmup, stable, decay) or "constant" (warmup, then lr
    # held: for Schedule-Free AdamW, which refuses the others; min_lr unused)
    lr_schedule: str = role("experiment", "cosine")
    decay_fraction: float = role("experiment", 0.2)  # wsd: the last fraction of training decays linearly to min_lr
    lr: float = role("lr", 2e-4)  # the peak learning rate
    min_lr: float = role("lr", 2e-5)  # where the schedule decays to

    # --- optimizer: a hyper-parameter left None (here and in optimizer_options) gets the optimizer's
    # published GPT-2 value (optim/published.py), else its own default; filled in at start-up ---
    # a name in optim/'s registry (optim.available())
    optimizer: str = role("experiment", "merit")
    weight_decay: float | None = role("optimizer", None)  # decoupled weight decay of the matrices
    beta1: float | None = role("optimizer", None)  # the first moment's decay (Lion, Muon: their momenta)
    beta2: float | None = role("optimizer", None)  # the second moment's decay
    eps: float | None = role("optimizer", None)  # added to the second moment's root
    grad_clip: float = role("experiment", 1.0)  # global gradient-norm clip; 0 disables
    # a NaN/inf gradient: "stop" (exit non-zero, no checkpoint) or "skip" the update
    nonfinite: str = role("experiment", "stop")
    max_skipped_steps: int = role("bookkeeping", 10)  # "skip": stop after this many skipped steps in a row
    decay_embeddings: bool = role("experiment", False)  # weight decay on the embeddings too
    # PaLM's auxiliary loss z_loss * mean(log(Z)^2) on the LM head (1e-4 in PaLM); 0: off
    z_loss: float = role("experiment", 0.0)
    # QK-Clip (Kimi K2): after every step, a head whose largest attention logit on the step's batch
    # exceeded this has its W_q and W_k rows scaled so it would have been this (Kimi K2: 100); None: off
    qk_clip_tau: float | None = role("experiment", None)
    optimizer_options: dict = role("optimizer", default_factory=dict)  # extra keyword arguments of the optimizer
    # who runs the optimizer's fused operations (optim.backends.SETTINGS)
    optim_backend: str = role("bookkeeping", "auto")

    # --- evaluation, logging, checkpoints ---
    log_interval: int = role("bookkeeping", 10)  # steps between metric lines (loss, lr, grad norm, speed, max logits)
    eval_interval: int = role("bookkeeping", 100)  # steps between validation losses (and at the end)
    val_tokens: int = role("experiment", 65536)  # validation budget per evaluation, in tokens over all ranks
    # Validation tokens after those, evaluated with them and logged as heldout/loss: a study picks
    # each point's lr on val/loss and reports heldout/loss, which the choice never saw; 0: none
    heldout_tokens: int = role("bookkeeping", 0)
    # validation sequences on which attention logits and entropies are measured
    probe_batch_size: int = role("bookkeeping", 4)
    # the gradient noise scale's EMA over log steps (each estimate is noisy)
    noise_scale_ema: float = role("bookkeeping", 0.95)
    checkpoint_interval: int = role("bookkeeping", 0)  # steps between checkpoints; 0: only at the end
    # the newest checkpoints kept (ckpt_<step>.pt; ckpt.pt points at the newest)
    keep_checkpoints: int = role("bookkeeping", 2)
    # also keep every checkpoint of a step divisible by this; 0: none
    permanent_checkpoint_interval: int = role("bookkeeping", 0)
    stop_at_step: int = role("bookkeeping", 0)  # end this invocation after this step (checkpointing); 0: run to the end
    sample_tokens: int = role("bookkeeping", 0)  # print a sample of this many tokens at the end
    wandb_mode: str = role("bookkeeping", "disabled")  # "online", "offline" or "disabled"
    wandb_project: str = role("bookkeeping", "nanomerit")  # the wandb project the run logs to
    wandb_entity: str | None = role("bookkeeping", None)  # the wandb user or team; None: your default
    wandb_group: str | None = role("bookkeeping", None)  # the wandb group (a sweep sets it)

    # --- zero-shot evaluation (eval/) of the checkpoints ---
    # tasks and groups, e.g. "lambada_openai,hellaswag" or "paper"; "": none
    zero_shot_tasks: str = role("bookkeeping", "")
    # also every this many steps (where a checkpoint is saved); 0: final only
    zero_shot_interval: int = role("bookkeeping", 0)
    # local task files <dir>/<task>.jsonl|.parquet; None: the HF hub
    zero_shot_data_dir: str | None = role("bookkeeping", None)
    zero_shot_limit: int | None = role("bookkeeping", None)  # only the first N examples of each task

    # --- parts of the run (training/parts.py) beside the built-in ones ---
    # "package.module:Class" of a Part subclass, comma-separated; "": none
    extra_parts: str = role("experiment", "")

    # --- system ---
    device: str = role("bookkeeping", "auto")  # "auto", "cpu", "cuda"
    # "auto" (bf16 on capable GPUs, else fp32), "float32", "bfloat16", "float16"
    dtype: str = role("experiment", "auto")
    compile: bool = role("bookkeeping", False)  # torch.compile the model
    # CPU floats below float's normal range (subnormals) computed as zero (x86 FTZ and DAZ): a run whose
    # attention logits ran away fills its backward with them, each far slower than a normal float
    # (docs/performance.md); off: IEEE arithmetic. How the floats are computed, as compile and
    # optim_backend, not what is trained: only values below 1.2e-38 change
    flush_denormals: bool = role("bookkeeping", False)
    # --- scale-out (training/parallel.py; docs/scaling_out.md): DDP by default on several ranks ---
    # 1: ZeRO-1, each rank keeps the optimizer state of its share of whole parameters
    zero_stage: int = role("bookkeeping", 0)
    # FSDP2: parameters, gradients and optimizer state sharded by rows over the ranks
    fsdp: bool = role("bookkeeping", False)
    # torch's DDP communication hook on the gradients: "" (the exact mean), "bf16" (the mean of gradients rounded
    # to bfloat16) or "powersgd" (a rank-powersgd_rank approximation with error feedback); training/parallel.py
    comm_hook: str = role("experiment", "")
    powersgd_rank: int = role("experiment", 1)  # PowerSGD's rank r: each matrix sent as (rows + columns) x r numbers
    peak_flops: float | None = role("bookkeeping", None)  # per device, for MFU; None: looked up from the GPU's name
    # --- replica groups past one cluster (torchft; training/replicas.py, docs/scaling_out.md) ---
    # N: this run is one of N replica groups, each its own torchrun job (DDP or FSDP2 inside) that splits the global
    # batch with the others and keeps training when another fails; 0: off (torchft never imported)
    replica_groups: int = role("experiment", 0)
    replica_id: int = role("bookkeeping", 0)  # this group's number, 0 .. replica_groups - 1 (its run folder's name)
    lighthouse: str = role("bookkeeping", "")  # the torchft lighthouse, "http://HOST:PORT"; "": $TORCHFT_LIGHTHOUSE
    min_replicas: int = role("bookkeeping", 1)  # groups a step (or a sync) needs to commit
    # seconds a cross-group collective or quorum may take; a lost lighthouse back within it is survived
    replica_timeout: float = role("bookkeeping", 60.0)
    # steps between the groups' comparisons of their weights (also after a group joins or leaves, and at each meeting)
    replica_check_interval: int = role("bookkeeping", 100)
    # seconds a group resumed from its checkpoint waits to meet another group before it trains (it may be behind
    # the job); 0: it trains alone at once
    rejoin_timeout: float = role("bookkeeping", 600.0)
    # H > 0: the groups train apart and meet every H steps (local_method); 0: gradients averaged every step
    local_steps: int = role("experiment", 0)
    # "diloco" (the mean pseudo-gradient through an outer SGD with Nesterov momentum) or "localsgd" (the mean)
    local_method: str = role("experiment", "diloco")
    outer_lr: float = role("experiment", 0.7)  # DiLoCo's outer learning rate (Douillard et al. 2023: 0.7)
    outer_momentum: float = role("experiment", 0.9)  # DiLoCo's outer Nesterov momentum (0.9)

    def __post_init__(self):
        for key, value in vars(self).items():  # (1e999 parses as inf)
            _check(not isinstance(value, float) or math.isfinite(value), f"{key}={value} must be a finite number")
        _check(self.resume in (False, True, "auto"), f"resume={self.resume!r}: use --resume (a checkpoint must "
               f"exist), --resume=auto (resume if one exists, else start) or leave it out")
        _check(not (self.resume and self.overwrite), "resume and overwrite exclude each other: --resume continues "
               "the run in the run folder, --overwrite starts it over")
        for name in listed(self.allow_changes):  # (refused here, a name is never in a resume's suggested command)
            if name not in _FIELDS:
                raise ConfigError(f"allow_changes={self.allow_changes!r}: {name!r} is not a config key"
                                  f"{_suggestion(name)}")
        _check(self.run_name not in ("", ".", "..") and "/" not in self.run_name and "\\" not in self.run_name,
               f"run_name={self.run_name!r} must be one folder name (no '/', not '.' or '..'): the run folder "
               f"is out_dir/run_name; put the path in out_dir")
        self.optimizer = self.optimizer.lower()  # names are case-insensitive: one spelling in configs and checkpoints
        for key in ("out_dir", "data_dir", "zero_shot_data_dir"):  # ~ and $VARS, as a shell would expand them
            if getattr(self, key) is not None:
                setattr(self, key, os.path.expandvars(os.path.expanduser(getattr(self, key))))
        _check(self.batch_size > 0 and self.micro_batch_size > 0, "batch_size and micro_batch_size must be > 0")
        self.batch_schedule = _batch_schedule(self.batch_schedule, self.batch_size)
        _check(self.batch_lr_scaling in SCALINGS, f"batch_lr_scaling={self.batch_lr_scaling!r}: use "
                                                  f"{', '.join(map(repr, SCALINGS))}")
        # (Which decays an optimizer has is the optimizer's to say: training/run_config.py checks the names.)
        _check(all(name.isidentifier() for name in self.batch_half_life_betas.split(",") if name),
               f"batch_half_life_betas={self.batch_half_life_betas!r}: give decay names, comma-separated (e.g. "
               f"'beta1,beta2')")
        self._check_seq_len_warmup()
        for key in ("max_steps", "max_tokens", "warmup_steps", "warmup_tokens"):
            _check(getattr(self, key) >= 0, f"{key}={getattr(self, key)} is negative: a length in steps or tokens "
                                            f"is >= 0 (0 leaves it unset)")
        _check((self.max_steps > 0) != (self.max_tokens > 0),
               f"set exactly one of max_steps ({self.max_steps}) and max_tokens ({self.max_tokens})")
        _check(not (self.warmup_steps and self.warmup_tokens),
               "set at most one of warmup_steps and warmup_tokens")
        _check(self.lr_schedule in ("cosine", "wsd", "constant"),
               f"lr_schedule={self.lr_schedule!r}: use 'cosine', 'wsd' or 'constant'")
        _check(self.wandb_mode in ("online", "offline", "disabled"),
               f"wandb_mode={self.wandb_mode!r}: use 'online', 'offline' or 'disabled'")
        _check(self.nonfinite in ("stop", "skip"), f"nonfinite={self.nonfinite!r}: use 'stop' (exit at the first "
               f"non-finite gradient, keeping the last good checkpoint) or 'skip' (drop that step's update)")
        _check(self.dtype in ("auto", "float32", "bfloat16", "float16"),
               f"dtype={self.dtype!r}: use 'auto', 'float32', 'bfloat16' or 'float16'")
        _check(self.lr > 0, f"lr={self.lr} must be > 0 (the peak learning rate; min_lr is where it decays to)")
        _check(0.0 <= self.min_lr <= self.lr, f"min_lr={self.min_lr} must lie in [0, lr={self.lr}]")
        _check(0.0 <= self.decay_fraction <= 1.0, f"decay_fraction={self.decay_fraction} must lie in [0, 1]")
        for key in ("probe_batch_size", "val_tokens", "max_skipped_steps", "keep_checkpoints"):
            _check(getattr(self, key) >= 1, f"{key}={getattr(self, key)} must be >= 1")
        for key in ("checkpoint_interval", "stop_at_step", "sample_tokens", "grad_clip",
                    "permanent_checkpoint_interval", "heldout_tokens"):
            _check(getattr(self, key) >= 0, f"{key}={getattr(self, key)} must be >= 0 (0 turns it off)")
        _check(self.z_loss >= 0, f"z_loss={self.z_loss} must be >= 0 (0 turns it off; PaLM used 1e-4)")
        _check(self.qk_clip_tau is None or self.qk_clip_tau > 0,
               f"qk_clip_tau={self.qk_clip_tau} must be > 0 (the largest attention logit kept; Kimi K2 used 100) "
               f"or None (off)")
        _check(self.qk_clip_tau is None or self.qk_norm is None,
               f"qk_clip_tau with qk_norm={self.qk_norm!r}: QK-Norm's gains are one norm over head_dim that all of "
               f"a layer's heads share, so no head can be clipped alone (and scaling W_q, W_k does nothing under "
               f"the norm); QK-Norm already bounds the logits through those gains: use one of the two")
        for key in ("seed", "data_seed"):  # (numpy's generator of the data order takes no negative seed)
            _check(0 <= getattr(self, key) < 2 ** 32, f"{key}={getattr(self, key)} must lie in [0, 2**32)")
        _check(self.peak_flops is None or self.peak_flops > 0,
               f"peak_flops={self.peak_flops} must be > 0 (a device's peak FLOP/s, for MFU: an H100's bf16 is "
               f"989e12) or None (looked up from the GPU's name)")
        _check(0.0 <= self.noise_scale_ema < 1.0, f"noise_scale_ema={self.noise_scale_ema} must lie in [0, 1)")
        _check(self.weight_decay is None or self.weight_decay >= 0,
               f"weight_decay={self.weight_decay} must be >= 0 (or unset: the optimizer's published value)")
        _check(bool(self.tokenizer), "tokenizer='': use 'gpt2', 'byte' or a Hugging Face tokenizer (e.g. 't5-base')")
        _check(self.device in ("auto", "cpu", "cuda"), f"device={self.device!r}: use 'auto', 'cpu' or 'cuda'")
        _check(self.zero_stage in (0, 1), f"zero_stage={self.zero_stage}: use 0 (replicated optimizer state) or 1 "
               f"(ZeRO-1: sharded optimizer state); for sharded parameters and gradients too use fsdp=True")
        _check(not (self.fsdp and self.zero_stage), "fsdp=True already shards the optimizer state (with the "
               "parameters): set zero_stage=0 with it, or use zero_stage=1 without fsdp")
        _check(not (self.fsdp and self.dtype == "float16"), "fsdp=True with dtype='float16': FSDP2's mixed precision "
               "here is bfloat16 (no loss scaling of sharded gradients): use dtype='bfloat16' or 'float32'")
        _check(self.log_interval > 0 and self.eval_interval > 0, "log_interval and eval_interval must be > 0")
        self._check_replica_groups()
        _check(self.comm_hook in ("", "bf16", "powersgd"), f"comm_hook={self.comm_hook!r}: use '' (the exact mean), "
                                                         f"'bf16' or 'powersgd'")
        _check(self.powersgd_rank >= 1, f"powersgd_rank={self.powersgd_rank} must be >= 1")
        _check(not (self.comm_hook and (self.fsdp or self.replica_groups and not self.local_steps)),
               f"comm_hook={self.comm_hook!r} is DDP's, with fsdp=True or replica groups averaging every step: "
               f"FSDP2 reduce-scatters with its own collectives and the groups average through torchft's hook; use "
               f"DDP (or ZeRO-1), or local_steps")
        _check(self.zero_shot_interval >= 0 and (self.zero_shot_limit is None or self.zero_shot_limit > 0),
               "zero_shot_interval must be >= 0 and zero_shot_limit None or > 0")

    def _check_seq_len_warmup(self):
        """The sequence-length warmup's keys (the block they need is the model's: BatchSchedule checks it)."""
        if not self.seq_len_warmup_start:
            defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name.startswith("seq_len_warmup_")}
            stray = [key for key, default in defaults.items() if getattr(self, key) != default]
            _check(not stray, f"{', '.join(stray)} without seq_len_warmup_start: the warmup is off; set "
                              f"seq_len_warmup_start (its first length) or drop them")
            return
        _check(self.seq_len_warmup_multiple > 0 and self.seq_len_warmup_start > 0
               and self.seq_len_warmup_start % self.seq_len_warmup_multiple == 0,
               f"seq_len_warmup_start={self.seq_len_warmup_start}: the first length is a positive multiple of "
               f"seq_len_warmup_multiple={self.seq_len_warmup_multiple}")
        _check((self.seq_len_warmup_steps > 0) != (self.seq_len_warmup_tokens > 0),
               f"seq_len_warmup_start={self.seq_len_warmup_start} needs a duration: set exactly one of "
               f"seq_len_warmup_steps ({self.seq_len_warmup_steps}) and seq_len_warmup_tokens "
               f"({self.seq_len_warmup_tokens})")
        _check(self.seq_len_warmup_pacing in ("linear", "root"),
               f"seq_len_warmup_pacing={self.seq_len_warmup_pacing!r}: use 'linear' or 'root'")
        _check(self.seq_len_warmup_root_degree > 0,
               f"seq_len_warmup_root_degree={self.seq_len_warmup_root_degree} must be > 0")
        # (DeepSpeed's tutorial advises against it too: both shrink the tokens of the early steps.)
        _check(len(self.batch_schedule) <= 1 and not self.batch_half_life_betas,
               "seq_len_warmup with a batch_schedule or batch_half_life_betas: both warmups shrink the tokens of "
               "the early steps, and what one counts the other would move; use one of them")

    def _check_replica_groups(self):
        groups = self.replica_groups
        _check(groups >= 0, f"replica_groups={groups} must be >= 0 (0: one job, no torchft)")
        if not groups:
            _check(not self.local_steps, f"local_steps={self.local_steps} needs replica groups to meet: set "
                                         f"replica_groups (docs/scaling_out.md)")
            return
        _check(0 <= self.replica_id < groups, f"replica_id={self.replica_id} must lie in [0, replica_groups={groups})")
        _check(1 <= self.min_replicas <= groups, f"min_replicas={self.min_replicas} must lie in [1, replica_groups="
                                                 f"{groups}]")
        _check(self.replica_timeout > 0, f"replica_timeout={self.replica_timeout} must be > 0 seconds")
        _check(self.replica_check_interval >= 1, f"replica_check_interval={self.replica_check_interval} must be "
                                                  f">= 1 step")
        _check(self.rejoin_timeout >= 0, f"rejoin_timeout={self.rejoin_timeout} must be >= 0 seconds (0: no wait)")
        _check(self.local_steps >= 0, f"local_steps={self.local_steps} must be >= 0 (0: gradients averaged every step)")
        _check(self.local_method in ("diloco", "localsgd"), f"local_method={self.local_method!r}: use 'diloco' or "
                                                            f"'localsgd'")
        _check(self.outer_lr > 0 and 0 <= self.outer_momentum < 1, f"outer_lr={self.outer_lr} must be > 0 and "
               f"outer_momentum={self.outer_momentum} lie in [0, 1)")
        _check(not self.zero_stage, "replica_groups with zero_stage=1: ZeRO-1's state is consolidated on one rank, "
               "which a rejoining group's ranks would each need their share of; use DDP (the default) or fsdp=True "
               "inside each group")
        _check(not (self.local_steps and self.optimizer == "adamw_schedulefree"), "local_steps with optimizer="
               "'adamw_schedulefree': its evaluated weights x are optimizer state, which the groups would not meet "
               "on; use replica groups without local_steps, or another optimizer")
        _check(self.local_steps or self.qk_clip_tau is None, "qk_clip_tau with replica groups averaging every "
               "step: each group would clip its heads by its own batch's logits, and the groups' weights, equal "
               "after every step, would part; set local_steps, or leave qk_clip_tau unset")
        _check(not (self.local_steps and self.dtype == "float16"), "local_steps with dtype='float16': the "
               "GradScaler skips an overflowed step's optimizer.step, by which torchft's local methods count the "
               "steps to the next meeting, so the groups would meet at different steps; use 'bfloat16' or 'float32'")
        _check(not self.batch_schedule, "replica_groups with a batch_schedule: the groups would change their "
               "accumulation at a step a rejoining group may not know; use one batch_size")

    @property
    def run_dir(self) -> Path:
        """The run folder: out_dir/run_name, and a replica group's own under it (replica_<id>)."""
        folder = Path(self.out_dir) / self.run_name
        return folder / f"replica_{self.replica_id}" if self.replica_groups else folder

    # --- derived quantities (one place for each) ---
    def model_config(self, n_vocab: int) -> GPTConfig:
        overrides = {f.name: getattr(self, f.name) for f in dataclasses.fields(GPTConfig)
                     if getattr(self, f.name, None) is not None}
        overrides.setdefault("vocab_size", -(-n_vocab // VOCAB_MULTIPLE) * VOCAB_MULTIPLE)
        config = GPTConfig.preset(self.model, **overrides)
        _check(config.vocab_size >= n_vocab,
               f"vocab_size={config.vocab_size} is smaller than the tokenizer's {n_vocab} tokens")
        return config

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def recorded(self) -> dict:
        """What a run records of its config: every key but the invocation flags (INVOCATION_KEYS)."""
        return {key: value for key, value in self.to_dict().items() if key not in INVOCATION_KEYS}


class ConfigError(ValueError):
    """A config file or override that does not fit the schema."""


def _check(ok: bool, message: str):
    if not ok:
        raise ConfigError(message)


def _batch_schedule(entries: list, batch_size: int) -> list[list[int]]:
    """``batch_schedule`` checked, as [[tokens, batch], ...] (whole numbers: 2e6 is 2000000)."""
    if not entries:
        return []
    pairs = []
    for entry in entries:
        whole = [int(v) for v in entry if isinstance(v, (int, float)) and not isinstance(v, bool)
                 and float(v).is_integer()] if isinstance(entry, (list, tuple)) else []
        _check(len(whole) == 2 == len(entry), f"batch_schedule entry {entry!r}: each entry is (tokens, global "
                                              f"batch), two whole numbers, e.g. [(0, 64), (2_000_000, 128)]")
        pairs.append(whole)
    _check(pairs[0] == [0, batch_size], f"batch_schedule starts with {tuple(pairs[0])}: its first entry is (0, "
                                        f"batch_size) = (0, {batch_size}); set batch_size to the first batch")
    for (tokens, batch), (next_tokens, next_batch) in zip(pairs, pairs[1:]):
        _check(next_tokens > tokens, f"batch_schedule: the token counts must increase ({tokens}, then {next_tokens})")
        _check(next_batch > 0 and next_batch != batch and max(batch, next_batch) % min(batch, next_batch) == 0,
               f"batch_schedule: batch {batch} -> {next_batch} at {next_tokens} tokens: each change multiplies or "
               f"divides the batch by an integer > 1")
    return pairs


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_TYPES = typing.get_type_hints(TrainConfig)


def keys_with_role(name: str) -> frozenset[str]:
    """The config keys whose role is ``name`` (one of ROLES)."""
    if name not in ROLES:
        raise ValueError(f"unknown role {name!r}: the roles are {', '.join(ROLES)}")
    return frozenset(key for key, f in _FIELDS.items() if f.metadata["role"] == name)


# The names users of nanoGPT, Hugging Face's Trainer and torchtitan type, and what they are here.
ALIASES = {
    "learning_rate": "lr", "max_lr": "lr", "min_learning_rate": "min_lr",
    "max_iters": "max_steps", "max_steps_per_run": "max_steps", "num_train_steps": "max_steps", "steps": "max_steps",
    "lr_decay_iters": "max_steps (the schedule decays to min_lr over the whole run)",
    "warmup_iters": "warmup_steps", "warmup_ratio": "warmup_tokens (or warmup_steps)", "num_warmup_steps": "warmup_steps",
    "gradient_accumulation_steps": "batch_size (the GLOBAL batch: accumulation = batch_size / (micro_batch_size x ranks))",
    "grad_accum": "batch_size (the GLOBAL batch: accumulation = batch_size / (micro_batch_size x ranks))",
    "per_device_train_batch_size": "micro_batch_size", "local_batch_size": "micro_batch_size",
    "train_batch_size": "batch_size", "global_batch_size": "batch_size",
    "eval_iters": "val_tokens (the validation budget in tokens over all ranks)",
    "max_grad_norm": "grad_clip", "gradient_clipping": "grad_clip", "max_norm": "grad_clip",
    "adam_beta1": "beta1", "adam_beta2": "beta2", "adam_epsilon": "eps", "betas": "beta1 and beta2",
    "output_dir": "out_dir", "wandb_run_name": "run_name", "wandb_log": "wandb_mode ('online', 'offline')",
    "init_from": "resume (True or 'auto')", "always_save_checkpoint": "checkpoint_interval",
    "dataset": "data_dir (a folder prepared by python -m data.prepare)", "lr_scheduler_type": "lr_schedule",
    "decay_lr": "lr_schedule", "num_train_epochs": "max_tokens",
}


def _suggestion(key: str) -> str:
    """What ``key``, which is no config key, may mean: its name here (another framework's key), else
    the closest key."""
    if key in ALIASES:
        return f"; here it is {ALIASES[key]}"
    if close := difflib.get_close_matches(key, _FIELDS, n=1):
        return f"; did you mean '{close[0]}'?"
    return "; python train.py --help lists the valid keys"


def listed(text: str) -> list[str]:
    """The names of a comma-separated list such as allow_changes ("weight_decay, beta2"), spaces
    and empty entries dropped."""
    return [name.strip() for name in text.split(",") if name.strip()]


def _unknown_key(key: str, where: str) -> ConfigError:
    hint = _suggestion(key)
    if where != "the command line":
        hint += " (a helper variable in a config file starts with '_', e.g. _" + key + ")"
    return ConfigError(f"unknown config key '{key}' in {where}{hint}")


def _coerce(key: str, value, where: str):
    """Return value if it has the declared type of `key` (ints are accepted as floats)."""
    expected = _TYPES[key]
    allowed = typing.get_args(expected) if isinstance(expected, types.UnionType) else (expected,)
    for kind in allowed:
        if kind is type(None) and value is None:
            return None
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if kind is not float and kind is not type(None) and type(value) is kind:
            return value
        if kind is list and type(value) is tuple:  # a config file's (0, 64) pairs, as JSON keeps them
            return list(value)
    names = " or ".join("None" if k is type(None) else k.__name__ for k in allowed)
    raise ConfigError(f"config key '{key}' in {where} must be {names}, got {type(value).__name__} {value!r}")


def _parse_override(arg: str, following: str | None) -> tuple[str, object]:
    """``--key=value`` (``following``: the next argument, for the message about ``--key value``)."""
    if not arg.startswith("--"):
        raise ConfigError(f"unexpected argument {arg!r}: overrides look like --key=value")
    key, sep, text = arg[2:].partition("=")
    if not sep:  # a bare flag: --resume
        if following is not None and not following.startswith("--"):
            raise ConfigError(f"unexpected argument {following!r} after {arg}: write {arg}={following}")
        return key, True
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return key, text  # a bare word such as --optimizer=adamw is a string
    if _TYPES.get(key) in (str, str | None) and not isinstance(value, str) and text != "None":
        return key, text  # a string as typed: --run_name=42
    return key, value


def _run_config_file(path: Path) -> dict:
    """The names a Python config file (or a run's config.json, less the invocation flags an older
    one records) leaves behind."""
    if path.suffix == ".json":
        try:
            values = json.loads(path.read_text())
        except ValueError as error:
            raise ConfigError(f"config file {path} is not valid JSON ({error})") from error
        if not isinstance(values, dict):
            raise ConfigError(f"config file {path} holds no JSON object of config keys")
        flags = {key: values.pop(key) for key in INVOCATION_KEYS if key in values}
        flags_set = {key: value for key, value in flags.items() if value != _FIELDS[key].default}
        if flags_set:  # (written before config.json stopped recording them)
            warnings.warn(f"{path} records how the invocation that wrote it used its run folder ("
                          + ", ".join(f"{key}={value!r}" for key, value in flags_set.items())
                          + "): that is no setting of the run, so it is dropped; give such flags on the command line")
        changes = values.pop("changes", None)
        if changes:
            warnings.warn(f"{path} records {len(changes)} setting(s) changed when its run resumed ("
                          + ", ".join(f"{c['key']} {c['from']!r} -> {c['to']!r} from step {c['step']}" for c in changes)
                          + "): this config is the run's start; add --key=value to use a changed value")
        return values
    try:
        return runpy.run_path(str(path))
    except SyntaxError as error:
        raise ConfigError(f"config file {path}, line {error.lineno}: {error.msg} ({(error.text or '').strip()!r})") \
            from error
    except Exception as error:  # the file's own code failed: its message, with the file
        raise ConfigError(f"config file {path} fails to run: {type(error).__name__}: {error}") from error


def load_config(path: str | None = None, overrides: list[str] = ()) -> TrainConfig:
    """Build the config from a Python file (optional) and --key=value overrides."""
    values = {}
    if path is not None:
        if Path(path).is_dir():
            raise ConfigError(f"config file {path} is a folder: give a config file, e.g. configs/default.py")
        if not Path(path).is_file():
            raise ConfigError(f"config file {path} does not exist")
        for key, value in _run_config_file(Path(path)).items():
            # Imports, helper functions and classes and private names are not settings.
            if key.startswith("_") or isinstance(value, types.ModuleType) or callable(value):
                continue
            if key not in _FIELDS:
                raise _unknown_key(key, path)
            values[key] = _coerce(key, value, path)
    for arg, following in zip(overrides, [*overrides[1:], None]):
        key, value = _parse_override(arg, following)
        if key not in _FIELDS:
            raise _unknown_key(key, "the command line")
        values[key] = _coerce(key, value, "the command line")
    if path is None and not {"max_steps", "max_tokens"} & values.keys():
        raise ConfigError(f"no config file given, so nothing sets the run's length (max_steps or max_tokens): name a "
                          f"config file first, e.g. python train.py configs/default.py {shlex.join(overrides)}, or set "
                          f"--max_steps (or --max_tokens)")
    return TrainConfig(**values)


def command_line_config(argv: list[str]) -> TrainConfig:
    """train.py's arguments as a config: CONFIG [--key=value ...], or the overrides alone."""
    if not argv:
        raise ConfigError("no config given: python train.py configs/default.py (a config file), with --key=value "
                          "overrides if you like; python train.py --help lists the keys")
    path = None if argv[0].startswith("--") else argv[0]
    return load_config(path, argv[1:] if path else argv)


def save_config(config: TrainConfig, path: Path, changes: list[dict] = ()):
    """Write ``config`` as JSON, without the invocation's flags (INVOCATION_KEYS): with ``changes``
    (made on resume: step, key, from, to), the settings the run started with and the list of
    changes, each from its step on."""
    values = config.recorded()
    for change in reversed(changes):
        values[change["key"]] = change["from"]
    with atomic_write(path, "w") as f:
        f.write(json.dumps({**values, **({"changes": list(changes)} if changes else {})}, indent=2) + "\n")


def usage(doc: str) -> str:
    """train.py's ``--help``: how to run it, its ``doc`` and every key (``key_reference``)."""
    return (f"usage: python train.py CONFIG [--key=value ...]\n"
            f"       torchrun --nproc_per_node=N train.py CONFIG [--key=value ...]\n\n"
            f"{doc.strip()}\n\nThe config keys (a config file assigns them as Python names; "
            f"--key=value overrides them):\n\n{key_reference()}")


def key_reference(width: int = 100) -> str:
    """Every config key with its type, default and meaning, in the schema's sections and order
    (``python train.py --help``). The meanings are TrainConfig's own comments, read from its
    source, so the help is the schema and cannot drift from it."""
    lines, comment = [], []
    for line in (raw.strip() for raw in inspect.getsource(TrainConfig).splitlines()[1:]):
        if line.startswith("def "):  # the fields end where the methods begin
            break
        if line.startswith("#"):
            comment.append(line.removeprefix("#").strip())
            if comment[0].startswith("---") and comment[-1].endswith("---"):  # a section's title, whole
                lines += ["", *textwrap.wrap(" ".join(comment).strip("- "), width)]
                comment = []
            continue
        name, _, rest = line.partition(":")
        if name in _FIELDS:  # its meaning: the comment after it, or the comment above it
            meaning, comment = rest.partition("  # ")[2] or " ".join(comment), []
            f = _FIELDS[name]
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            meaning = f"{meaning}: {_registered(name)}" if name in REGISTERED else meaning
            lines.append(f"  --{name}={default!r}  ({f.type})")
            lines += textwrap.wrap(meaning, width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines).lstrip("\n")


# The keys whose values a registry holds: --help lists them from it (key_reference), so that the help cannot
# drift from what is registered; "module:name" of a list or of a function that returns one, imported only there
# (importing the schema stays cheap).
REGISTERED = {"optimizer": "optim:available", "optim_backend": "optim.backends:SETTINGS"}


def _registered(key: str) -> str:
    """The values key's registry holds (``REGISTERED``), quoted: '"adafactor", "adamw", ...'."""
    module, _, name = REGISTERED[key].partition(":")
    values = getattr(importlib.import_module(module), name)
    return ", ".join(f'"{value}"' for value in (values() if callable(values) else values))
