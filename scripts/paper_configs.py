"""Write configs/paper/: one small config file per point of the MERIT paper's study.

    python -m scripts.paper_configs           # (re)write configs/paper/*.py
    python -m scripts.paper_configs --check   # exit 1 if a file differs from what this writes

Points: GPT-2 Small / Medium / Large on OpenWebText x AdamW, LAMB, MERIT, Lion, Sophia-G and the
2025 optimizer benchmark's AdEMAMix, MARS, SOAP, Schedule-Free AdamW and D-Muon x the paper's
global batches (480, 1k, 2k, 4k, 6k, 8k sequences of 1024 tokens); MERIT's four
ablations (maxLAMB, l2 norms, no element-wise clip, no weight-wise lower bound) at GPT-2 Small
batch 1k; the QK-Norm baseline (AdamW, LayerNorm on each head's q and k) for GPT-2 Small at
every batch; Muon and MuonClip (Muon with QK-Clip at tau 100, Kimi K2's) at every size and batch;
AdamW, LAMB and MERIT for GPT-2 Medium over 48B tokens at every batch (the paper's headline);
AdamW and MERIT with QK-Clip (tau 100) for GPT-2 Small at every batch: with MERIT, QK-Norm and
z-loss (``--z_loss=1e-4`` on any point), the cures of runaway attention logits side by side; the
batch axis as 2025 measures it (docs/batch.md): GPT-2 Small at batch 480 keeping a checkpoint
every tenth of its run, for a CBS measurement by branching across the paper's batches with
AdamW, LAMB, MERIT and Muon (``gpt2_small_*_cbs_b480.py``), and GPT-2 Medium over the 48B tokens
with AdamW and MERIT ramping its batch up to the paper's 6k (``gpt2_medium_*_ramp_b6k.py``);
AdamW with Gemma 2's soft-caps of the attention and output logits for GPT-2 Small at every batch
(``gpt2_small_adamw_softcap_b*.py``), the fifth cure beside QK-Clip, QK-Norm, z-loss and MERIT; and
the paper's second family, Llama-130M and Llama-350M on C4 x AdamW, LAMB, MERIT and Muon x global
batches 512, 1k, 2k, 4k, 6k, 8k sequences of 256 tokens (``llama_350m_merit_b4k.py``; the paper's
Llama-130M at 1k and Llama-350M at 4k among them); and, beside the MERIT paper's, the small-batch end
as Marek et al. 2025 ran it ("Small Batch Size Training for Language Models"), GPT-2 Small with the
authors' tuned settings: SGD, Adafactor and AdamW at batch 1 and AdamW at batch 512
(``gpt2_small_{sgd,adafactor,adamw}_marek_b1.py``, ``gpt2_small_adamw_marek_b512.py``); and local steps
beside the large batch, DiLoCo (Douillard et al. 2023) with 8 replica groups for GPT-2 Small and Medium,
AdamW and MERIT inside, meeting every 100 and 500 steps (``gpt2_small_merit_diloco_h500_b1k.py``); and the
data side's cure, sequence-length warmup, as Li, Zhang and He 2022 ran GPT-2 117M, at their baseline and at 8x
its batch and 4x its lr, with AdamW and MERIT (``gpt2_small_adamw_li_slw_b4k.py``). Each file
inherits its model's base config (configs/gpt2_*_owt.py, configs/llama_*_c4.py) and sets only what
differs, so a user opens, edits or copies one point.

What each point sets, and why (every value checked against its source; where this project
chose, it says so):
* tokens: 20 per parameter (the paper's "Chinchilla" budget for its main table: 2.48B / 7.1B /
  15.48B). The paper's batch-scaling headline (GPT-2 Medium at batch 6k matching batch 480) runs
  48B tokens: ``gpt2_medium_{adamw,lamb,merit}_48b_b*.py``, with their own warmup.
* warmup: this project's choice, in steps, set as ``warmup_steps`` so that a sweep can take it as
  an axis (``--grid warmup_steps=30,300,2000``): 2% of the steps, the share of the source's 2,000
  of 100,000 (the GPT-2 scripts of Sophia and nanoGPT use a fixed 2,000 steps, which at batch 8k
  would be most of a 20-tokens-per-parameter run), but never fewer than ``WARMUP_FLOOR`` = 30
  steps: 1 / (1 - beta2) = 20 steps is Adam's second-moment timescale, and Sophia-G's first
  Hessian estimate comes at step 10, its steps before it being sign steps, so a warmup of 30 holds
  the lr low for the first three estimates. (At batch 480 over 48B tokens, 2% is 1,953 steps: the
  source's 2,000.)
* then cosine to min_lr; gradient clipping 1.0, no dropout, no biases, GPT-2 Medium and Large with
  the inverse-layer logit scaling (inherited from configs/gpt2_*_owt.py, as the source has them).
* lr: each optimizer's published GPT-2 peak lr for the model size, for batch 480 (the paper
  grid-searches every optimizer's lr per batch: a study should too, an lr grid per point):
  AdamW 6e-4 / 3e-4 / 2e-4 and Sophia-G 6e-4 / 7e-4 / 3e-4 (Sophia's config/train_gpt2_*.py),
  Lion 1e-4 / 1e-4 / 8e-5 (the Lion authors' GPT-2 guidance), MERIT and LAMB 2e-4 at every size
  (the MERIT authors' default; the paper gives no per-size value), Muon AdamW's (its published
  recipe, Moonlight's lr rule "match_rms_adamw", is made to reuse AdamW's lr). The 2025
  benchmark's five take its scripts' lr, the same at 124M, 210M and 720M (scripts/{124m,210m,
  720m}/*.sh of epfml/llm-optimizer-benchmark): 1e-3, MARS 3e-3 on its matrices (its AdamW part's
  1e-3 is its published ``adamw_lr``), tuned at the benchmark's batch of 256 x 512 tokens (a
  quarter of batch 480's tokens); at GPT-2 Large, SOAP's betas (0.95, 0.95) and D-Muon's (0.9,
  0.99), its 720M scripts' (elsewhere the published, its 124M ones).
* min_lr: the source's where it has one: AdamW 3e-5 / 6e-5 / 1e-5 (Muon the same), Sophia-G 1.5e-5
  / 1e-5 / 1e-5 (Sophia's configs: 1/40, 1/70 and 1/30 of the peak); for Lion, LAMB and MERIT,
  which publish none, this project's lr / 10; for the 2025 benchmark's five, its lr / 100 (its
  cosine's end, and its finding: decay to 0.01x the peak or lower). Schedule-Free AdamW has no
  schedule (``lr_schedule = "constant"``: the warmup, then the peak).
* every other optimizer hyper-parameter is left unset: the optimizer's published GPT-2 value
  applies (optim/published.py), except Sophia-G's rho 0.08 for GPT-2 Medium (its config).
  Weight decay falls on matrices only, as in the nanoGPT and Sophia scripts; the MERIT authors'
  code decays every parameter (docs/optimizers.md says what that changes).
* micro_batch_size: the base config's for batch 480; for the power-of-two batches one that,
  times 8 GPUs, divides them (16 / 8 / 4 sequences for Small / Medium / Large).
* the CBS parents: a kept checkpoint every tenth of the run (``permanent_checkpoint_interval``),
  the nine before the end branchable. Their comment gives the ``scripts.cbs`` command: k = 1/4
  to 16, so the branches' batches (120 to 7,680) span the paper's 480 to 8k, 3 seeds, and branch
  tokens of 4 steps of the largest branch, 4 x 7,680 x 1,024 = 31,457,280 tokens: the least
  amount that is a whole number of steps of every branch and gives the largest batch more than
  one or two steps to show its loss (the smallest, 120 sequences, takes 256), 1.3% of the
  2.48B-token run. Merrill et al. branch 2B tokens of OLMo's ~600B (0.3%); this project chose a
  larger share because a GPT-2 Small run is short: less would leave the large batches 1 step.
  Four steps are fewer than beta2 0.95 remembers (20), which scripts.cbs refuses (a branch would
  measure its optimizer state's transient): the command holds each branch's decays at their
  half-life in tokens (``--beta-scaling half-life``, Marek et al. 2025: beta ** k; beta1 and beta2,
  and Muon's momentum), so the k = 16 branch's beta2 is 0.95 ** 16 = 0.44 (2 steps' memory) and the
  k = 1/4 branch's 0.987 (78 of its 256 steps).
* the ramp: ``batch_schedule`` 768 -> 1,536 -> 3,072 -> 6,144 sequences (each doubling Merrill
  et al.'s, lr x sqrt(2) by ``batch_lr_scaling``), from 0, 2.4B, 7.2B and 16.8B tokens (5%,
  15% and 35% of the 48B): this project's placeholder until the CBS of GPT-2 Medium is measured
  (a CBS run of it, then a ramp that doubles where B* passes twice the batch, as
  scripts/cbs_study.py does on a CPU). It starts at 768 = 6,144 / 8 because a ramp doubles and
  the paper's 480 does not double into 6k; its lr is the published batch-480 lr at that first
  batch, the warmup 2% of the steps at it.
* the soft-cap points: ``attn_logit_softcap = 50.0`` and ``final_logit_softcap = 30.0``, Gemma 2's
  (cap * tanh(x / cap) of the attention logits and of the LM head's), on AdamW's GPT-2 Small points.
* the Llama points, on configs/llama_{130m,350m}_c4.py (GaLore's shapes, C4, the t5-base tokenizer,
  sequences of 256; the recipe of GaLore's and C-Optim's scripts, which those files cite value by
  value: github.com/jiaweizzhao/GaLore scripts/benchmark_c4/llama_130m.sh and torchrun_main.py,
  github.com/kyleliang919/C-Optim README.md and torchrun_main.py). Tokens: the paper trains its
  Llama models on about 2.6B tokens of C4 with the C-Optim code base (GaLore's); GaLore's Llama-130M
  run, 20,000 steps of 512 x 256 tokens, is 2,621,440,000 tokens, which every Llama point trains,
  so that the paper's batch 1k is 10,000 steps and its 4k 2,500 (an inference from those two facts:
  the paper's notes give neither steps nor a budget per size; GaLore's own Llama-350M run is three
  times as long). Batches: the GPT-2 grid's as sequences of 256 tokens (the paper's Llama batches
  count sequences, as GaLore's ``total_batch_size`` does), 480 (the GPT-2 scripts' batch) replaced
  by GaLore's 512, at which its recipe was set; the base configs' micro-batches (64 and 32) times 8
  GPUs divide every one. Warmup 10% of the steps, cosine to lr / 10 (GaLore's 2,000 of 20,000 and
  C-Optim's 1,000 of 10,000; GaLore's ``min_lr_ratio`` 0.1), clip 1.0 (C-Optim's), no dropout. lr:
  AdamW 1e-3 (C-Optim's for AdamW on C4; GaLore tuned every method over 1e-2 to 1e-4 without
  publishing the winners), Muon AdamW's (Moonlight's rule, as on GPT-2), LAMB and MERIT 2e-4 (the
  MERIT authors' default: no Llama lr is published); the paper tunes each: grid-search it per
  batch. AdamW takes the sources' betas (0.9, 0.999) and no weight decay, from the base config;
  LAMB, MERIT and Muon, for which the sources publish none, their published settings as on the
  GPT-2 points (``beta2 = None`` and ``weight_decay = None`` undo the base config's: this project's
  choice). The published final validation losses (Llama-130M at 1k: AdamW 3.277, LAMB 3.265, MERIT
  3.199; Llama-350M at 4k: LAMB 3.001, MERIT 2.957; from notes on the paper) are in those points'
  comments.
* the Marek et al. points, on configs/gpt2_small_owt.py (OpenWebText; the authors train on FineWeb), with
  the authors' recipe (github.com/martin-marek/batch-size: pretraining/configs/base.yaml, optimizer.py,
  runs/gpt2s/optimizer_comp/final_configs.sh): 20 tokens per parameter (their budget; 124M here, this
  project's count), a linear warmup over 5% of the steps (``int(0.05 x steps)``, theirs; theirs starts
  at lr 0, this project's at lr / warmup_steps: one step apart), cosine to 0 (``min_lr = 0``), no
  gradient clipping (``grad_clip = 0``), and their tuned peak lr per optimizer and batch: SGD 0.2 (no
  momentum, no weight decay: its published settings), Adafactor 0.005 (decay_rate 0.9999 and the rest:
  its published settings), AdamW at batch 1 0.0024 with beta2 0.9999 (their "fixed t2" run: batch
  512's beta2 0.95 at its half-life in tokens, 0.95 ** (1/512) = 0.9999) and no weight decay (their
  default: that run sets none), AdamW at batch 512 0.0048 with its published betas (0.9, 0.95) and
  weight decay 0.1 (theirs).
  A batch of 1 sequence runs on one GPU (``micro_batch_size = 1``: nothing to split); batch 512 takes
  their micro-batch of 16 (x 8 GPUs divides it). Batch 1 is 2.4M steps, so its points log about every
  1M tokens (1,000 steps: the authors' train-loss interval) and validate and checkpoint every 100M
  tokens (100,000 steps: 24 validations of 4M tokens, 4% of the training tokens), this project's
  choice; the authors validate once, at the end, on 20M tokens.
* the DiLoCo points, on configs/gpt2_{small,medium}_owt.py: the paper's setting of 8 replica groups
  (``replica_groups = 8``, one SLURM array task each: ``scripts/slurm/train.sbatch``), the global
  batch 1k split 128 a group (16 / 8 sequences a GPU: x 8 GPUs a group), the inner optimizer at its
  published batch-480 lr (as the paper's points; grid-search it), the outer SGD with Nesterov
  momentum at DiLoCo's published lr 0.7 and momentum 0.9, meetings every H = 500 steps (the paper's)
  and 100; the 20 tokens per parameter rounded down to whole rounds of H steps (``max_steps``: a
  run's last steps must meet).
* the sequence-length warmup points (Li, Zhang and He 2022, "The Stability-Efficiency Dilemma"), GPT-2
  Small (their 117M) on configs/gpt2_small_owt.py (OpenWebText; theirs is Megatron-LM's corpus of
  Wikipedia, CC-Stories, RealNews and OpenWebText), with the recipe of the first author's scripts
  (github.com/microsoft/DeepSpeedExamples, Megatron-LM-v1.1.5-ZeRO3/curriculum_learning/ds_train.sh of
  2021-08-14 for 117M and of 2021-10-29 for the batch-4K point; ds_pretrain_gpt2.sh and the DeepSpeed
  configs beside them): 157,286,400,000 tokens trained (300,000 steps of 512 x 1,024), a warmup of
  3,000 steps, cosine to 1e-5 over every token, weight decay 0.01, clip 1.0, Adam's betas (0.9, 0.95),
  fp16 with a dynamic loss scale, and Megatron-LM's GPT-2 (dropout 0.1, biases: its defaults, which the
  scripts keep). The baseline is batch 512 at lr 1.5e-4 (``gpt2_small_adamw_li_b512``), with the
  warmup its 117M script sets: from 8 tokens over 40,000 steps, fixed_linear, lengths multiples of 8
  (``gpt2_small_adamw_li_slw_b512``); the stability-efficiency point is 8x the batch and 4x the lr,
  4,096 at 6e-4 (their batch-4K script's), plain (the baseline that struggles) and with the warmup from
  8 tokens (117M's start) over 45,000 steps: their batch-4K script's duration, set for their 1.5B model:
  the duration of their 117M batch-4K runs is in none of their scripts, and the paper tunes it per
  model (the largest that keeps the validation loss smooth over the first few lr warmups); a sweep
  should too (``--grid seq_len_warmup_steps=...``). The same batch-4K pair with MERIT at its
  published lr 2e-4 (``gpt2_small_merit_li_{,slw_}b4k``), MERIT's weight decay being the recipe's.
  Their lr warmup counts steps; here it counts tokens trained and ends at the same step
  (docs/configs.md).
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "configs" / "paper"

MODELS = {  # name: (base config module, parameters in the paper, micro batch for the k-batches)
    "small": ("gpt2_small_owt", 124e6, 16),
    "medium": ("gpt2_medium_owt", 355e6, 8),
    "large": ("gpt2_large_owt", 774e6, 4),
}
BATCHES = {"480": 480, "1k": 1024, "2k": 2048, "4k": 4096, "6k": 6144, "8k": 8192}
LR = {  # optimizer: peak lr for small, medium, large
    "adamw": (6e-4, 3e-4, 2e-4),
    "lamb": (2e-4, 2e-4, 2e-4),
    "merit": (2e-4, 2e-4, 2e-4),
    "lion": (1e-4, 1e-4, 8e-5),
    "sophiag": (6e-4, 7e-4, 3e-4),
    "muon": (6e-4, 3e-4, 2e-4),
    "ademamix": (1e-3, 1e-3, 1e-3),
    "mars": (3e-3, 3e-3, 3e-3),
    "soap": (1e-3, 1e-3, 1e-3),
    "adamw_schedulefree": (1e-3, 1e-3, 1e-3),
    "dmuon": (1e-3, 1e-3, 1e-3),
}
MIN_LR = {"adamw": (3e-5, 6e-5, 1e-5), "muon": (3e-5, 6e-5, 1e-5), "sophiag": (1.5e-5, 1e-5, 1e-5)}
BENCHMARK = ("ademamix", "mars", "soap", "adamw_schedulefree", "dmuon")  # the 2025 benchmark's optimizers
BENCHMARK_FINAL_LR = 100  # its cosine ends at the peak / 100
BENCHMARK_LARGE_BETAS = {"soap": (0.95, 0.95), "dmuon": (0.9, 0.99)}  # its 720M scripts'
CONSTANT_LR = ("adamw_schedulefree",)  # no schedule: it averages its iterates instead
QK_CLIP_TAU = 100.0  # Kimi K2's
SOPHIA_RHO = {"medium": 0.08}  # elsewhere the published default, 0.05
ABLATIONS = {  # name: MERIT options, at GPT-2 Small batch 1k
    "maxlamb": {"maxlamb": True},
    "l2": {"norm": "l2"},
    "no_clip": {"elementwise_clip": False},
    "no_lower_bound": {"weightwise_lower_bound": False},
}
TOKENS_PER_PARAMETER = 20
SCALING_TOKENS = 48_000_000_000  # GPT-2 Medium's batch-scaling runs
SCALING_OPTIMIZERS = ("adamw", "lamb", "merit")
CBS_OPTIMIZERS = ("adamw", "lamb", "merit", "muon")
CBS_CHECKPOINTS = 10  # a kept checkpoint every tenth of the run
CBS_MULTIPLIERS = "0.25,0.5,1,2,4,8,16"
CBS_BRANCH_TOKENS = 4 * 16 * 480 * 1024  # 4 steps of the largest branch (k = 16)
CBS_SCALED_DECAYS = {"muon": "momentum,beta1,beta2"}  # the others: beta1,beta2
RAMP_OPTIMIZERS = ("adamw", "merit")
DILOCO_GROUPS = 8  # Douillard et al. 2023's replicas
DILOCO_H = (100, 500)  # inner steps between meetings: the paper's 500, and 100
DILOCO_OUTER = (0.7, 0.9)  # the outer SGD's lr and Nesterov momentum, the paper's
RAMP = [(0, 768), (2_400_000_000, 1536), (7_200_000_000, 3072), (16_800_000_000, 6144)]
LI_TOKENS = 157_286_400_000  # 300,000 steps of 512 x 1,024 tokens: the scripts' NUM_TOKEN
LI = {  # Li, Zhang and He's points: (optimizer, batch, peak lr, the warmup's (start, steps) or None)
    "adamw_li_b512": ("adamw", 512, 1.5e-4, None),
    "adamw_li_slw_b512": ("adamw", 512, 1.5e-4, (8, 40_000)),
    "adamw_li_b4k": ("adamw", 4096, 6e-4, None),
    "adamw_li_slw_b4k": ("adamw", 4096, 6e-4, (8, 45_000)),
    "merit_li_b4k": ("merit", 4096, 2e-4, None),
    "merit_li_slw_b4k": ("merit", 4096, 2e-4, (8, 45_000)),
}
WARMUP_FRACTION = 0.02
WARMUP_FLOOR = 30
BLOCK = 1024
SOFTCAPS = {"attn_logit_softcap": 50.0, "final_logit_softcap": 30.0}  # Gemma 2's
LLAMA_MODELS = {"130m": "llama_130m_c4", "350m": "llama_350m_c4"}  # size: base config module
LLAMA_BATCHES = {"512": 512, **{label: batch for label, batch in BATCHES.items() if batch != 480}}
LLAMA_LR = {  # optimizer: (peak lr, its source)
    "adamw": (1e-3, "C-Optim's AdamW lr on C4"),
    "lamb": (2e-4, "the MERIT authors' default (no Llama lr is published)"),
    "merit": (2e-4, "the MERIT authors' default (no Llama lr is published)"),
    "muon": (1e-3, "C-Optim's AdamW lr on C4 (Muon: AdamW's, Moonlight's rule)"),
}
LLAMA_BLOCK = 256
LLAMA_TOKENS = 20_000 * 512 * LLAMA_BLOCK  # GaLore's Llama-130M run: the paper's "about 2.6B"
LLAMA_WARMUP_FRACTION = 0.1
LLAMA_MIN_LR_RATIO = 0.1
LLAMA_PUBLISHED = {  # (size, batch): the paper's final validation loss per optimizer
    ("130m", "1k"): {"adamw": 3.277, "lamb": 3.265, "merit": 3.199},
    ("350m", "4k"): {"lamb": 3.001, "merit": 2.957},
}
MAREK = [  # Marek et al.'s GPT-2 Small points: (optimizer, batch, peak lr, {key the point sets: (value, why)})
    ("sgd", 1, 0.2, {}),
    ("adafactor", 1, 0.005, {}),
    ("adamw", 1, 0.0024, {"beta2": (0.9999, "their 'fixed t2' run: 0.95 ** (1/512), batch 512's half-life in tokens"),
                          "weight_decay": (0.0, "their default: the run sets none")}),
    ("adamw", 512, 0.0048, {}),
]
MAREK_WARMUP_FRACTION = 0.05
MAREK_MICRO = 16  # their max_microbatch_size at batch 512
MAREK_INTERVALS = {  # batch 1's bookkeeping, in steps of 1,024 tokens: (value, why)
    "log_interval": (1_000, "about the authors' 1M tokens between train-loss logs"),
    "eval_interval": (100_000, "100M tokens (and at the end)"),
    "checkpoint_interval": (100_000, "100M tokens"),
}


def points() -> dict[str, dict]:
    """{file stem: the point's settings}, in a stable order."""
    out = {}
    for size, (base, params, micro) in MODELS.items():
        i = list(MODELS).index(size)
        for optimizer, lrs in LR.items():
            for label, batch in BATCHES.items():
                final_div = BENCHMARK_FINAL_LR if optimizer in BENCHMARK else 10
                point = {"base": base, "family": "gpt2", "size": size, "optimizer": optimizer, "batch": batch,
                         "tokens": int(TOKENS_PER_PARAMETER * params), "micro": None if batch == 480 else micro,
                         "lr": lrs[i], "min_lr": MIN_LR[optimizer][i] if optimizer in MIN_LR else lrs[i] / final_div,
                         "options": {}}
                if size == "large" and optimizer in BENCHMARK_LARGE_BETAS:
                    point["betas"] = BENCHMARK_LARGE_BETAS[optimizer]
                if optimizer == "sophiag" and size in SOPHIA_RHO:
                    point["options"] = {"rho": SOPHIA_RHO[size]}
                out[f"gpt2_{size}_{optimizer}_b{label}"] = point
                if optimizer == "muon":
                    out[f"gpt2_{size}_muonclip_b{label}"] = {**point, "qk_clip_tau": QK_CLIP_TAU}
    small = out["gpt2_small_merit_b1k"]
    for name, options in ABLATIONS.items():
        out[f"gpt2_small_merit_{name}_b1k"] = {**small, "options": options, "ablation": name}
    for label in BATCHES:
        out[f"gpt2_small_adamw_qknorm_b{label}"] = {**out[f"gpt2_small_adamw_b{label}"], "qk_norm": "layernorm"}
        out[f"gpt2_small_adamw_softcap_b{label}"] = {**out[f"gpt2_small_adamw_b{label}"], "softcaps": SOFTCAPS}
        for optimizer in ("adamw", "merit"):
            out[f"gpt2_small_{optimizer}_qkclip_b{label}"] = {**out[f"gpt2_small_{optimizer}_b{label}"],
                                                              "qk_clip_tau": QK_CLIP_TAU}
        for optimizer in SCALING_OPTIMIZERS:
            out[f"gpt2_medium_{optimizer}_48b_b{label}"] = {**out[f"gpt2_medium_{optimizer}_b{label}"],
                                                            "tokens": SCALING_TOKENS}
    for optimizer in CBS_OPTIMIZERS:
        out[f"gpt2_small_{optimizer}_cbs_b480"] = {**out[f"gpt2_small_{optimizer}_b480"], "cbs": True}
    for optimizer in RAMP_OPTIMIZERS:
        out[f"gpt2_medium_{optimizer}_ramp_b6k"] = {**out[f"gpt2_medium_{optimizer}_b6k"], "tokens": SCALING_TOKENS,
                                                    "batch": RAMP[0][1], "schedule": RAMP}
    for size, base in LLAMA_MODELS.items():
        for optimizer, (lr, _) in LLAMA_LR.items():
            for label, batch in LLAMA_BATCHES.items():
                point = {"base": base, "family": "llama", "size": size, "optimizer": optimizer, "batch": batch,
                         "tokens": LLAMA_TOKENS, "lr": lr, "min_lr": lr * LLAMA_MIN_LR_RATIO}
                if optimizer in LLAMA_PUBLISHED.get((size, label), {}):
                    point["published_loss"] = LLAMA_PUBLISHED[size, label][optimizer]
                out[f"llama_{size}_{optimizer}_b{label}"] = point
    for size in ("small", "medium"):
        for optimizer in ("adamw", "merit"):
            for h in DILOCO_H:
                out[f"gpt2_{size}_{optimizer}_diloco_h{h}_b1k"] = {**out[f"gpt2_{size}_{optimizer}_b1k"],
                                                                   "family": "diloco", "local_steps": h}
    for name, (optimizer, batch, lr, warmup) in LI.items():
        out[f"gpt2_small_{name}"] = {"base": MODELS["small"][0], "family": "li", "optimizer": optimizer,
                                     "batch": batch, "lr": lr, "seq_len_warmup": warmup}
    for optimizer, batch, lr, settings in MAREK:
        out[f"gpt2_small_{optimizer}_marek_b{batch}"] = {
            "base": MODELS["small"][0], "family": "marek", "optimizer": optimizer, "batch": batch,
            "tokens": int(TOKENS_PER_PARAMETER * MODELS["small"][1]), "lr": lr, "settings": settings}
    return out


def warmup_steps(tokens: int, batch: int) -> int:
    """2% of the run's steps, at least WARMUP_FLOOR (the module docstring says why)."""
    return max(WARMUP_FLOOR, round(WARMUP_FRACTION * tokens / (batch * BLOCK)))


def render(stem: str, point: dict) -> str:
    if point["family"] == "llama":
        return render_llama(stem, point)
    if point["family"] == "marek":
        return render_marek(stem, point)
    if point["family"] == "diloco":
        return render_diloco(stem, point)
    if point["family"] == "li":
        return render_li(stem, point)
    tokens = point["tokens"]
    what = f"GPT-2 {point['size'].capitalize()}, {point['optimizer']}"
    if "ablation" in point:
        what += f" ablation {point['ablation']}"
    if "qk_norm" in point:
        what += " with QK-Norm"
    if "softcaps" in point:
        what += " with soft-capped logits (Gemma 2's)"
    if point["tokens"] == SCALING_TOKENS:
        what += ", the batch-scaling study's 48B tokens"
    if "qk_clip_tau" in point:
        what += f" with QK-Clip (tau {point['qk_clip_tau']:g}{': MuonClip' if point['optimizer'] == 'muon' else ''})"
    if "cbs" in point:
        what += ", a parent for the critical batch size by branching"
    batch = f"global batch {point['batch']} x 1024 tokens"
    if "schedule" in point:
        what += ", the batch ramped"
        batch = f"global batch {' -> '.join(str(b) for _, b in point['schedule'])} x 1024 tokens"
    lines = [f"# The MERIT paper's study: {what}, {batch}.",
             "# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.",
             f"from configs.{point['base']} import *  # noqa: F401,F403 - the model, data and run defaults",
             "",
             f'run_name = "{stem}"',
             f'optimizer = "{point["optimizer"]}"',
             f"batch_size = {point['batch']}"]
    if point["micro"] is not None:
        lines.append(f"micro_batch_size = {point['micro']}  # x 8 GPUs divides batch_size")
    budget = ("the batch-scaling study's 48B" if tokens == SCALING_TOKENS else
              f"{TOKENS_PER_PARAMETER} tokens per parameter")
    lines += ["max_steps = 0",
              f"max_tokens = {tokens:_}  # {budget}",
              f"warmup_steps = {warmup_steps(tokens, point['batch']):_}  # {WARMUP_FRACTION:.0%} of the steps, "
              f"at least {WARMUP_FLOOR} (a sweep axis: --grid warmup_steps=...)",
              f"lr = {point['lr']:g}  # " + ("the 2025 benchmark's (at its batch of 256 x 512 tokens); grid-search "
                                             "it per batch" if point["optimizer"] in BENCHMARK else
                                             "published for batch 480; the paper grid-searches it per batch")]
    if point["optimizer"] in CONSTANT_LR:
        lines.append('lr_schedule = "constant"  # Schedule-Free averages its iterates instead of decaying the lr')
    else:
        lines.append(f"min_lr = {point['min_lr']:g}")
    if "betas" in point:
        lines += [f"beta1 = {point['betas'][0]:g}  # the 2025 benchmark's 720M setting",
                  f"beta2 = {point['betas'][1]:g}"]
    if point["options"]:
        lines.append(f"optimizer_options = {point['options']!r}")
    if "qk_norm" in point:
        lines.append(f'qk_norm = "{point["qk_norm"]}"')
    if "qk_clip_tau" in point:
        lines.append(f"qk_clip_tau = {point['qk_clip_tau']:g}  # Kimi K2's")
    if "softcaps" in point:
        lines += [f"{key} = {cap!r}  # Gemma 2's" for key, cap in point["softcaps"].items()]
    if "cbs" in point:
        every = tokens // (point["batch"] * BLOCK) // CBS_CHECKPOINTS
        lines += [f"permanent_checkpoint_interval = {every:_}  # a tenth of the run: the checkpoints to branch",
                  "# Then: python -m scripts.cbs runs/" + stem + f" --multipliers {CBS_MULTIPLIERS} --seeds 0,1,2 "
                  f"--branch-tokens {CBS_BRANCH_TOKENS:_} --beta-scaling half-life --scale-betas "
                  f"{CBS_SCALED_DECAYS.get(point['optimizer'], 'beta1,beta2')} --launch slurm",
                  "# (k = 1/4 .. 16: batches 120 to 7,680; branch tokens: 4 steps of the largest, 1.3% of the run;",
                  "# each branch's decays at their half-life in tokens, so that 4 steps outlast their memory)"]
    if "schedule" in point:
        lines.insert(lines.index(f"batch_size = {point['batch']}") + 1,
                     f"batch_schedule = {point['schedule']!r}  # (tokens, batch): doublings at 5%, 15%, 35% of "
                     f"the tokens, a placeholder until measured")
    return "\n".join(lines) + "\n"


def render_llama(stem: str, point: dict) -> str:
    """A Llama point's file (the module docstring says why each value)."""
    steps = point["tokens"] // (point["batch"] * LLAMA_BLOCK)
    lines = [f"# The MERIT paper's study: Llama-{point['size'].upper()} on C4, {point['optimizer']}, global batch "
             f"{point['batch']} x {LLAMA_BLOCK} tokens.",
             "# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely."]
    if "published_loss" in point:
        lines.append(f"# The paper's final validation loss here: {point['published_loss']} (from notes on the paper).")
    lines += [f"from configs.{point['base']} import *  # noqa: F401,F403 - the model, data and run defaults",
              "",
              f'run_name = "{stem}"',
              f'optimizer = "{point["optimizer"]}"',
              f"batch_size = {point['batch']}",
              "max_steps = 0",
              f"max_tokens = {point['tokens']:_}  # about 2.6B: GaLore's Llama-130M run, 20,000 steps of 512 x 256",
              f"warmup_steps = {round(LLAMA_WARMUP_FRACTION * steps):_}  # {LLAMA_WARMUP_FRACTION:.0%} of the "
              f"{steps:,} steps, as GaLore's (a sweep axis: --grid warmup_steps=...)",
              f"lr = {point['lr']:g}  # {LLAMA_LR[point['optimizer']][1]}; the paper grid-searches it per batch",
              f"min_lr = {point['min_lr']:g}  # lr x GaLore's min_lr_ratio 0.1"]
    if point["optimizer"] != "adamw":
        lines += ["beta2 = None  # its published value (the base config's 0.999 is AdamW's)",
                  "weight_decay = None  # its published value (the base config's 0 is AdamW's)"]
    return "\n".join(lines) + "\n"


def render_diloco(stem: str, point: dict) -> str:
    """A DiLoCo point's file (the module docstring says why each value)."""
    h, batch = point["local_steps"], point["batch"]
    steps = point["tokens"] // (batch * BLOCK) // h * h
    lines = [f"# Local steps beside the MERIT paper's study: GPT-2 {point['size'].capitalize()}, DiLoCo with "
             f"{point['optimizer']} inside, {DILOCO_GROUPS} replica groups",
             f"# meeting every {h} steps, global batch {batch} x 1024 tokens ({batch // DILOCO_GROUPS} a group).",
             "# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.",
             "# torchft_lighthouse --min_replicas 1 --join_timeout_ms 60000 &   (on a host every group reaches), then",
             f"# TORCHFT_LIGHTHOUSE=http://HOST:29510 sbatch --array=0-{DILOCO_GROUPS - 1} --nodes=1 "
             f"scripts/slurm/train.sbatch configs/paper/{stem}.py",
             f"from configs.{point['base']} import *  # noqa: F401,F403 - the model, data and run defaults",
             "",
             f'run_name = "{stem}"',
             f'optimizer = "{point["optimizer"]}"',
             f"batch_size = {batch}",
             f"micro_batch_size = {point['micro']}  # x 8 GPUs a group x {DILOCO_GROUPS} groups divides batch_size",
             f"replica_groups = {DILOCO_GROUPS}",
             f"local_steps = {h}",
             'local_method = "diloco"',
             f"outer_lr = {DILOCO_OUTER[0]}  # Douillard et al. 2023's",
             f"outer_momentum = {DILOCO_OUTER[1]}  # Nesterov, theirs",
             "max_tokens = 0",
             f"max_steps = {steps:_}  # {TOKENS_PER_PARAMETER} tokens per parameter in whole rounds of {h} steps",
             f"warmup_steps = {warmup_steps(point['tokens'], batch):_}  # {WARMUP_FRACTION:.0%} of the steps, "
             f"at least {WARMUP_FLOOR}",
             f"lr = {point['lr']:g}  # the inner optimizer's, published for batch 480; grid-search it",
             f"min_lr = {point['min_lr']:g}"]
    return "\n".join(lines) + "\n"


def render_li(stem: str, point: dict) -> str:
    """A sequence-length warmup point's file (the module docstring says why each value)."""
    batch, warmup, optimizer = point["batch"], point["seq_len_warmup"], point["optimizer"]
    what = f"GPT-2 Small (their 117M), {optimizer}" + (" with the warmup" if warmup else "")
    lr_source = ("the MERIT authors' default (their recipe is Adam's)" if optimizer == "merit" else
                 "the scripts' baseline" if batch == 512 else "4x the baseline's at 8x its batch, the scripts'")
    lines = ["# Li, Zhang and He 2022, sequence-length warmup: "
             f"{what}, batch {batch} x {BLOCK} tokens,",
             "# the first author's recipe (microsoft/DeepSpeedExamples, "
             "Megatron-LM-v1.1.5-ZeRO3/curriculum_learning/); OpenWebText here.",
             "# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.",
             f"from configs.{point['base']} import *  # noqa: F401,F403 - the model, data and run defaults",
             "",
             f'run_name = "{stem}"',
             f'optimizer = "{optimizer}"',
             f"batch_size = {batch}",
             f"micro_batch_size = {MODELS['small'][2]}  # x 8 GPUs divides batch_size",
             "max_steps = 0",
             f"max_tokens = {LI_TOKENS:_}  # trained, the scripts' NUM_TOKEN (300,000 steps of 512)",
             "warmup_steps = 3_000  # the scripts'",
             f"lr = {point['lr']:g}  # {lr_source}",
             "min_lr = 1e-05  # cosine over every token to the scripts' min-lr",
             "weight_decay = 0.01  # the scripts'",
             "dtype = \"float16\"  # the scripts' fp16, with a dynamic loss scale",
             "dropout = 0.1  # Megatron-LM's GPT-2, as the scripts keep it",
             "bias = True"]
    if optimizer == "adamw":
        lines += ["beta1 = 0.9  # the scripts' Adam", "beta2 = 0.95"]
    if warmup:
        start, steps = warmup
        source = ("their 117M script's" if batch == 512 else
                  "their batch-4K script's (their 1.5B); grid-search it: --grid seq_len_warmup_steps=...")
        lines += [f"seq_len_warmup_start = {start}  # their 117M script's first length",
                  f"seq_len_warmup_steps = {steps:_}  # {source}",
                  'seq_len_warmup_pacing = "linear"  # fixed_linear, lengths multiples of 8 (difficulty_step)']
    return "\n".join(lines) + "\n"


def render_marek(stem: str, point: dict) -> str:
    """A Marek et al. point's file (the module docstring says why each value)."""
    batch, tokens = point["batch"], point["tokens"]
    steps = tokens // (batch * BLOCK)
    lines = ["# Marek et al. 2025, \"Small Batch Size Training for Language Models\": GPT-2 Small, "
             f"{point['optimizer']}, batch {batch} x {BLOCK} tokens,",
             "# the authors' tuned setting (martin-marek/batch-size, runs/gpt2s/optimizer_comp/final_configs.sh); "
             "OpenWebText here.",
             "# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely."]
    if batch == 1:
        lines.append(f"# One GPU: python train.py configs/paper/{stem}.py   (a batch of one sequence does not split)")
    lines += [f"from configs.{point['base']} import *  # noqa: F401,F403 - the model, data and run defaults",
              "",
              f'run_name = "{stem}"',
              f'optimizer = "{point["optimizer"]}"',
              f"batch_size = {batch}",
              "micro_batch_size = 1" if batch == 1 else
              f"micro_batch_size = {MAREK_MICRO}  # the authors'; x 8 GPUs divides batch_size",
              "max_steps = 0",
              f"max_tokens = {tokens:_}  # {TOKENS_PER_PARAMETER} tokens per parameter, the authors' budget",
              f"warmup_steps = {int(MAREK_WARMUP_FRACTION * steps):_}  # {MAREK_WARMUP_FRACTION:.0%} of the "
              f"{steps:,} steps, the authors' linear warmup",
              f"lr = {point['lr']:g}  # the authors' tuned lr at this batch",
              "min_lr = 0.0  # cosine to 0, the authors'",
              "grad_clip = 0.0  # the authors clip no gradient"]
    lines += [f"{key} = {value!r}  # {why}" for key, (value, why) in point["settings"].items()]
    if batch == 1:
        lines += [f"{key} = {value:_}  # {why}" for key, (value, why) in MAREK_INTERVALS.items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare the files with what would be written")
    args = parser.parse_args(argv)
    expected = {OUT / f"{stem}.py": render(stem, point) for stem, point in points().items()}
    if args.check:
        stale = [path.name for path, text in expected.items() if not path.is_file() or path.read_text() != text]
        extra = sorted(p.name for p in OUT.glob("*.py") if p not in expected)
        if stale or extra:
            sys.exit(f"paper_configs: configs/paper/ is not what this script writes (differs or missing: "
                     f"{stale[:5]}{'...' if len(stale) > 5 else ''}; not written by it: {extra}): run "
                     f"python -m scripts.paper_configs")
        print(f"configs/paper/: {len(expected)} files, as written")
        return
    OUT.mkdir(exist_ok=True)
    for path, text in expected.items():
        path.write_text(text)
    print(f"wrote {len(expected)} configs to {OUT.relative_to(ROOT)}/")


if __name__ == "__main__":
    main()
