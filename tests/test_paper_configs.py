"""configs/paper/: every point of the MERIT paper's study loads and resolves to the published
settings, transcribed here from docs/optimizers.md, the paper's setup and (the Llama points) GaLore's
and C-Optim's scripts independently of scripts/paper_configs.py, and builds its model on the meta
device (no memory); so do Marek et al.'s small-batch points, transcribed from the authors' code."""
import re
import subprocess
import sys

import pytest
import torch

from configs import load_config
from helpers import ROOT
from model import GPT
from training.batch_schedule import BatchSchedule
from training.run_config import resolve_config
from training.seq_len_warmup import SeqLenWarmup

PAPER = ROOT / "configs" / "paper"
FILES = sorted(PAPER.glob("*.py"))
MAREK_FILES = [path for path in FILES if "_marek_" in path.stem]
DILOCO_FILES = [path for path in FILES if "_diloco_" in path.stem]
LI_FILES = [path for path in FILES if "_li_" in path.stem]
GPT2_FILES, LLAMA_FILES = ([path for path in FILES if path.stem.startswith(family)
                            and path not in MAREK_FILES + DILOCO_FILES + LI_FILES] for family in ("gpt2_", "llama_"))
NAME = re.compile(r"gpt2_(small|medium|large)_(adamw_schedulefree|adamw|lamb|merit|lion|sophiag|muon|muonclip|"
                  r"ademamix|mars|soap|dmuon)(?:_(\w+?))?_b(480|1k|2k|4k|6k|8k)$")

PARAMETERS = {"small": 124e6, "medium": 355e6, "large": 774e6}
LAYERS = {"small": (12, 12, 768), "medium": (24, 16, 1024), "large": (36, 20, 1280)}
BATCH = {"480": 480, "1k": 1024, "2k": 2048, "4k": 4096, "6k": 6144, "8k": 8192}
PEAK_LR = {"adamw": (6e-4, 3e-4, 2e-4), "lion": (1e-4, 1e-4, 8e-5), "sophiag": (6e-4, 7e-4, 3e-4),
           "merit": (2e-4,) * 3, "lamb": (2e-4,) * 3, "muon": (6e-4, 3e-4, 2e-4),  # (Muon: AdamW's, Moonlight's rule)
           # The 2025 benchmark's scripts (124M, 210M, 720M alike): MARS 3e-3 on its matrices, the others 1e-3.
           "ademamix": (1e-3,) * 3, "mars": (3e-3,) * 3, "soap": (1e-3,) * 3, "adamw_schedulefree": (1e-3,) * 3,
           "dmuon": (1e-3,) * 3}
HYPER = {  # betas, weight decay, eps (None: the optimizer has none)
    "adamw": ((0.9, 0.95), 0.1, 1e-8), "merit": ((0.9, 0.95), 1e-2, 1e-6), "lamb": ((0.9, 0.95), 1e-2, 1e-6),
    "lion": ((0.9, 0.99), 1.0, None), "sophiag": ((0.965, 0.99), 0.2, 1e-15), "muon": ((0.9, 0.95), 0.1, 1e-8),
    "ademamix": ((0.9, 0.999), 0.1, 1e-8), "mars": ((0.95, 0.99), 0.1, 1e-8), "soap": ((0.9, 0.999), 0.1, 1e-8),
    "adamw_schedulefree": ((0.9, 0.9999), 0.1, 1e-8), "dmuon": ((0.8, 0.999), 0.1, 1e-8),
}
LARGE_BETAS = {"soap": (0.95, 0.95), "dmuon": (0.9, 0.99)}  # the benchmark's 720M scripts
BENCHMARK = ("ademamix", "mars", "soap", "adamw_schedulefree", "dmuon")  # min_lr: the peak / 100, its cosine's end
MIN_LR = {"adamw": (3e-5, 6e-5, 1e-5), "muon": (3e-5, 6e-5, 1e-5), "sophiag": (1.5e-5, 1e-5, 1e-5)}
ABLATION = {"maxlamb": {"maxlamb": True}, "l2": {"norm": "l2"}, "no_clip": {"elementwise_clip": False},
            "no_lower_bound": {"weightwise_lower_bound": False}}

# The Llama family on C4 (GaLore's configs/llama_{130m,350m}.json, its and C-Optim's scripts).
LLAMA_NAME = re.compile(r"llama_(130m|350m)_(adamw|lamb|merit|muon)_b(512|1k|2k|4k|6k|8k)$")
LLAMA_SHAPES = {"130m": (12, 12, 768, 2048), "350m": (24, 16, 1024, 2736)}  # layers, heads, hidden, SwiGLU width
LLAMA_BATCH = {"512": 512, "1k": 1024, "2k": 2048, "4k": 4096, "6k": 6144, "8k": 8192}  # sequences of 256 tokens
T5_VOCAB = 32_100  # t5-base: 32,000 pieces and 100 sentinel ids
# GaLore's Llama-130M run, 20k steps of 512 x 256 tokens: the paper's about 2.6B.
LLAMA_TOKENS = 20_000 * 512 * 256
LLAMA_LR = {"adamw": 1e-3, "muon": 1e-3, "lamb": 2e-4, "merit": 2e-4}  # C-Optim's AdamW lr; MERIT's default
# betas, weight decay, eps: AdamW the sources' (torch's betas, no decay); the others their published ones
LLAMA_HYPER = {"adamw": ((0.9, 0.999), 0.0, 1e-8), "merit": HYPER["merit"], "lamb": HYPER["lamb"],
               "muon": HYPER["muon"]}
PUBLISHED = {("130m", "1k"): {"adamw": 3.277, "lamb": 3.265, "merit": 3.199},  # the paper's final val loss
             ("350m", "4k"): {"lamb": 3.001, "merit": 2.957}}

# Marek et al. 2025, GPT-2 Small (martin-marek/batch-size: pretraining/runs/gpt2s/optimizer_comp/final_configs.sh,
# configs/base.yaml, optimizer.py): peak lr, betas, weight decay and eps (None: the optimizer has none), and its
# own options, per point. AdamW's weight decay at batch 1: base.yaml's 0 (the run sets none).
MAREK_NAME = re.compile(r"gpt2_small_(sgd|adafactor|adamw)_marek_b(1|512)$")
MAREK = {
    ("sgd", "1"): (0.2, (None, None), 0.0, None, {"momentum": 0.0}),
    ("adafactor", "1"): (0.005, (None, None), 0.0, None,
                         {"decay_rate": 0.9999, "min_dim_size_to_factor": 128, "clipping_threshold": 1.0,
                          "param_rms_floor": 1e-3}),
    ("adamw", "1"): (0.0024, (0.9, 0.9999), 0.0, 1e-8, {}),
    ("adamw", "512"): (0.0048, (0.9, 0.95), 0.1, 1e-8, {}),
}


# Li, Zhang and He 2022 (sequence-length warmup), from the first author's scripts (microsoft/DeepSpeedExamples,
# Megatron-LM-v1.1.5-ZeRO3/curriculum_learning/: ds_train.sh of 2021-08-14, GPT-2 117M, and of 2021-10-29, the
# batch-4K point; ds_pretrain_gpt2.sh; ds_zero_stage_2_config_curriculum_fixed_linear.json): per point, the
# peak lr and the warmup's (first length, steps), None without one. MERIT: its published lr, 2e-4.
LI_NAME = re.compile(r"gpt2_small_(adamw|merit)_li_(slw_)?b(512|4k)$")
LI = {
    ("adamw", None, "512"): (1.5e-4, None), ("adamw", "slw_", "512"): (1.5e-4, (8, 40_000)),
    ("adamw", None, "4k"): (6e-4, None), ("adamw", "slw_", "4k"): (6e-4, (8, 45_000)),
    ("merit", None, "4k"): (2e-4, None), ("merit", "slw_", "4k"): (2e-4, (8, 45_000)),
}


def test_the_files_are_what_the_generator_writes():
    result = subprocess.run([sys.executable, "-m", "scripts.paper_configs", "--check"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    # 3 sizes x 11 optimizers (MuonClip one) x 6 batches, MERIT's 4 ablations, AdamW with QK-Norm and
    # AdamW and MERIT with QK-Clip at GPT-2 Small's 6 batches.
    # GPT-2 Medium over 48B tokens with AdamW, LAMB and MERIT at the 6 batches. The CBS parents
    # (AdamW, LAMB, MERIT, Muon at Small batch 480) and the ramps (AdamW and MERIT, Medium to 6k).
    # AdamW with soft-caps at GPT-2 Small's 6 batches. Llama-130M and -350M x 4 optimizers x 6 batches.
    # And Marek et al.'s four.
    assert len(GPT2_FILES) == 3 * 12 * 6 + 4 + 3 * 6 + 3 * 6 + 4 + 2 + 6 and len(LLAMA_FILES) == 2 * 4 * 6
    assert sorted(MAREK_NAME.fullmatch(path.stem).groups() for path in MAREK_FILES) == sorted(MAREK)
    assert len(DILOCO_FILES) == 2 * 2 * 2  # GPT-2 Small and Medium x AdamW and MERIT x H = 100, 500
    assert {LI_NAME.fullmatch(path.stem).groups() for path in LI_FILES} == set(LI)
    assert len(FILES) == len(GPT2_FILES) + len(LLAMA_FILES) + len(MAREK_FILES) + len(DILOCO_FILES) + len(LI_FILES)
    assert f"{len(FILES)} files, as written" in result.stdout


def test_the_five_logit_cures_sit_side_by_side_at_every_gpt2_small_batch():
    # MERIT, QK-Norm, QK-Clip (with AdamW and with MERIT) and soft-caps beside plain AdamW (z-loss: --z_loss on any)
    stems = {path.stem for path in FILES}
    for batch in BATCH:
        assert {f"gpt2_small_{point}_b{batch}" for point in ("adamw", "merit", "adamw_qknorm", "adamw_qkclip",
                                                             "merit_qkclip", "adamw_softcap")} <= stems


@pytest.mark.parametrize("path", GPT2_FILES, ids=lambda p: p.stem)
def test_every_point_resolves_to_the_published_settings(path):
    size, label, variant, batch = NAME.fullmatch(path.stem).groups()
    optimizer = "muon" if label == "muonclip" else label
    config = load_config(path, [])
    resolved = resolve_config(config).config
    index = list(PARAMETERS).index(size)
    ramp = variant == "ramp"  # 768 -> 6k, doubling at 5%, 15%, 35% of the 48B tokens
    first = 768 if ramp else BATCH[batch]
    assert (config.run_name, config.optimizer, config.batch_size) == (path.stem, optimizer, first)
    assert config.batch_schedule == ([[0, 768], [2_400_000_000, 1536], [7_200_000_000, 3072],
                                      [16_800_000_000, 6144]] if ramp else [])
    assert not ramp or (size, batch, optimizer) in (("medium", "6k", "adamw"), ("medium", "6k", "merit"))
    # The CBS parents keep a checkpoint every tenth of the run.
    cbs = variant == "cbs"
    assert config.permanent_checkpoint_interval == (int(20 * PARAMETERS[size]) // (480 * 1024) // 10 if cbs else 0)
    assert not cbs or (size, batch) == ("small", "480") and optimizer in ("adamw", "lamb", "merit", "muon")
    scaling = variant in ("48b", "ramp")
    assert config.max_tokens == (48e9 if scaling else 20 * PARAMETERS[size])
    assert not scaling or (size, optimizer) in (("medium", "adamw"), ("medium", "lamb"), ("medium", "merit"))
    # Warmup: 2% of the steps, at least 30 (Adam's beta2 timescale, Sophia-G's first Hessian estimates).
    steps = config.max_tokens / (first * 1024)
    assert config.warmup_tokens == 0 and config.warmup_steps == max(30, round(0.02 * steps))
    assert config.lr == PEAK_LR[optimizer][index]
    # min_lr: the sources' (AdamW's and Sophia-G's configs; Muon AdamW's), lr / 10 where none is published,
    # the 2025 benchmark's lr / 100; Schedule-Free: no schedule.
    constant = optimizer == "adamw_schedulefree"
    assert config.lr_schedule == ("constant" if constant else "cosine")
    if not constant:
        divisor = 100 if optimizer in BENCHMARK else 10
        assert config.min_lr == pytest.approx(MIN_LR[optimizer][index] if optimizer in MIN_LR else config.lr / divisor)
    betas, weight_decay, eps = HYPER[optimizer]
    betas = LARGE_BETAS.get(optimizer, betas) if size == "large" else betas
    assert ((resolved.beta1, resolved.beta2), resolved.weight_decay, resolved.eps) == (betas, weight_decay, eps)
    options = resolved.optimizer_options
    if optimizer == "sophiag":
        assert options["rho"] == (0.08 if size == "medium" else 0.05) and options["hessian_interval"] == 10
    if optimizer == "merit":
        expected = {"maxlamb": False, "norm": "max", "elementwise_clip": True, "weightwise_lower_bound": True,
                    **ABLATION.get(variant, {})}
        assert {k: options[k] for k in expected} == expected
        assert variant in (None, "qkclip", "48b", "cbs", "ramp") or (size, batch) == ("small", "1k")
    if optimizer == "muon":
        assert options["adjust_lr"] == "match_rms_adamw" and options["momentum"] == 0.95 and options["nesterov"]
    assert config.qk_norm == ("layernorm" if variant == "qknorm" else None)
    clipped = label == "muonclip" or variant == "qkclip"
    assert config.qk_clip_tau == (100 if clipped else None)
    assert variant != "qkclip" or (size, optimizer) in (("small", "adamw"), ("small", "merit"))
    # Gemma 2's soft-caps of the attention and output logits, on AdamW's GPT-2 Small points.
    caps = (config.attn_logit_softcap, config.final_logit_softcap)
    assert caps == ((50.0, 30.0) if variant == "softcap" else (None, None))
    assert variant != "softcap" or (size, optimizer) == ("small", "adamw")
    assert config.grad_clip == 1.0 and config.tokenizer == "gpt2"
    schedule = BatchSchedule.of(config, 1024)
    total, warmup = schedule.lengths(config)
    last = schedule.tokens_per_step(total - 1)
    assert schedule.tokens(total) <= config.max_tokens < schedule.tokens(total) + last and warmup > 0
    schedule.check_divisible(config.micro_batch_size, 8)  # divides on 8 GPUs
    model_config = config.model_config(50257)
    assert (model_config.n_layer, model_config.n_head, model_config.n_embd) == LAYERS[size]
    assert model_config.scale_attn_by_inverse_layer_idx == (size != "small")
    assert model_config.vocab_size == 50304 and model_config.block_size == 1024
    assert (model_config.attn_logit_softcap, model_config.final_logit_softcap) == caps
    with torch.device("meta"):
        model = GPT(model_config)
    assert all(p.is_meta for p in model.parameters())
    assert abs(model.num_params(non_embedding=False) / PARAMETERS[size] - 1) < 0.01


@pytest.mark.parametrize("path", LLAMA_FILES, ids=lambda p: p.stem)
def test_every_llama_point_resolves_to_the_galore_recipe(path):
    size, optimizer, batch = LLAMA_NAME.fullmatch(path.stem).groups()
    config = load_config(path, [])
    resolved = resolve_config(config).config
    assert (config.run_name, config.optimizer, config.batch_size) == (path.stem, optimizer, LLAMA_BATCH[batch])
    assert (config.tokenizer, config.data_dir, config.block_size) == ("t5-base", "cache/data/c4-t5-base", 256)
    # The paper's budget, about 2.6B tokens: at its batch 1k 10,000 steps, at 4k 2,500; warmup 10% of the
    # steps and cosine to lr / 10 (GaLore's 2,000 of 20,000; its min_lr_ratio 0.1).
    assert config.max_tokens == LLAMA_TOKENS and abs(LLAMA_TOKENS / 2.6e9 - 1) < 0.01
    schedule = BatchSchedule.of(config, 256)
    total, warmup = schedule.lengths(config)
    assert total == LLAMA_TOKENS // (LLAMA_BATCH[batch] * 256)
    assert total == {"1k": 10_000, "4k": 2_500}.get(batch, total)  # (the paper's two batches)
    assert config.warmup_tokens == 0 and warmup == config.warmup_steps == round(0.1 * total)
    assert config.lr_schedule == "cosine" and config.lr == LLAMA_LR[optimizer]
    assert config.min_lr == pytest.approx(config.lr / 10)
    betas, weight_decay, eps = LLAMA_HYPER[optimizer]
    assert ((resolved.beta1, resolved.beta2), resolved.weight_decay, resolved.eps) == (betas, weight_decay, eps)
    if optimizer == "muon":
        assert resolved.optimizer_options["adjust_lr"] == "match_rms_adamw"
    assert config.grad_clip == 1.0 and config.z_loss == 0 and config.qk_clip_tau is None
    schedule.check_divisible(config.micro_batch_size, 8)  # divides on 8 GPUs
    # The paper's result where it has one, in the file's comment.
    published = PUBLISHED.get((size, batch), {}).get(optimizer)
    comment = f"# The paper's final validation loss here: {published} "
    assert (comment in path.read_text()) == (published is not None)
    # GaLore's shapes, no dropout, the T5 vocabulary padded to a multiple of 64; parameters counted from them.
    model_config = config.model_config(T5_VOCAB)
    layers, heads, hidden, width = LLAMA_SHAPES[size]
    assert (model_config.arch, model_config.n_layer, model_config.n_head, model_config.n_embd) == \
        ("llama", layers, heads, hidden)
    assert (model_config.intermediate_size, model_config.norm_eps, model_config.rope_theta) == (width, 1e-6, 10000.0)
    assert (model_config.vocab_size, model_config.block_size, model_config.dropout) == (32_128, 256, 0.0)
    assert model_config.qk_norm is None and model_config.attn_logit_softcap is model_config.final_logit_softcap is None
    with torch.device("meta"):
        model = GPT(model_config)
    # embedding and untied head, per block q/k/v/o, gate/up/down and two RMSNorms, the final RMSNorm
    expected = 2 * 32_128 * hidden + layers * (4 * hidden ** 2 + 3 * hidden * width + 2 * hidden) + hidden
    assert model.num_params(non_embedding=False) == expected


@pytest.mark.parametrize("path", MAREK_FILES, ids=lambda p: p.stem)
def test_every_marek_point_resolves_to_the_authors_settings(path):
    optimizer, batch = MAREK_NAME.fullmatch(path.stem).groups()
    lr, betas, weight_decay, eps, options = MAREK[optimizer, batch]
    config = load_config(path, [])
    resolved = resolve_config(config).config
    assert (config.run_name, config.optimizer, config.batch_size) == (path.stem, optimizer, int(batch))
    # 20 tokens per parameter; a linear warmup over 5% of the steps (int(), as theirs), cosine to 0, no clipping.
    assert config.max_tokens == 20 * 124e6 and config.grad_clip == 0
    schedule = BatchSchedule.of(config, 1024)
    total, warmup = schedule.lengths(config)
    assert total == config.max_tokens // (int(batch) * 1024) and warmup == config.warmup_steps == int(0.05 * total)
    assert (config.lr_schedule, config.lr, config.min_lr) == ("cosine", lr, 0.0)
    assert ((resolved.beta1, resolved.beta2), resolved.weight_decay, resolved.eps) == (betas, weight_decay, eps)
    assert {key: resolved.optimizer_options[key] for key in options} == options
    assert resolved.optimizer_options.keys() == options.keys()
    # Batch 1 on one GPU (nothing to split); batch 512 by micro-batches of 16, the authors', on 8 GPUs.
    schedule.check_divisible(config.micro_batch_size, 1 if batch == "1" else 8)
    assert config.micro_batch_size == (1 if batch == "1" else 16)
    # Batch 1's 2.4M steps: a log line about every 1M tokens (the authors' train-loss interval), a validation
    # and a checkpoint every 100M (this project's choice); batch 512 keeps the base config's.
    intervals = (config.log_interval, config.eval_interval, config.checkpoint_interval)
    assert intervals == ((1_000, 100_000, 100_000) if batch == "1" else (10, 1_000, 1_000))
    model_config = config.model_config(50257)
    assert (model_config.n_layer, model_config.n_head, model_config.n_embd) == LAYERS["small"]
    assert model_config.vocab_size == 50304 and model_config.block_size == 1024 and model_config.dropout == 0.0
    assert config.tokenizer == "gpt2"
    with torch.device("meta"):
        model = GPT(model_config)
    assert abs(model.num_params(non_embedding=False) / PARAMETERS["small"] - 1) < 0.01


@pytest.mark.parametrize("path", LI_FILES, ids=lambda p: p.stem)
def test_every_sequence_length_warmup_point_resolves_to_the_authors_recipe(path):
    """157,286,400,000 tokens trained (300,000 steps of 512 x 1,024), 3,000 warmup steps, cosine to 1e-5,
    weight decay 0.01, clip 1.0, Adam's betas (0.9, 0.95), fp16, Megatron-LM's GPT-2 117M (dropout 0.1,
    biases); the warmup's lengths by DeepSpeed's fixed_linear worked here by hand."""
    optimizer, slw, batch = LI_NAME.fullmatch(path.stem).groups()
    lr, warmup = LI[optimizer, slw, batch]
    config = load_config(path, [])
    resolved = resolve_config(config).config
    assert (config.run_name, config.optimizer, config.batch_size) == (path.stem, optimizer, BATCH.get(batch, 512))
    assert (config.max_steps, config.max_tokens) == (0, 300_000 * 512 * 1024)
    assert (config.warmup_steps, config.lr_schedule, config.lr, config.min_lr) == (3_000, "cosine", lr, 1e-5)
    assert (resolved.weight_decay, config.grad_clip, config.dtype) == (0.01, 1.0, "float16")
    assert (resolved.beta1, resolved.beta2) == (0.9, 0.95)
    BatchSchedule.of(config, 1024).check_divisible(config.micro_batch_size, 8)
    model_config = config.model_config(50257)
    assert (model_config.n_layer, model_config.n_head, model_config.n_embd) == LAYERS["small"]
    assert (model_config.block_size, model_config.dropout, model_config.bias) == (1024, 0.1, True)
    part = SeqLenWarmup.of(config, 1024)
    if warmup is None:
        assert part is None and config.seq_len_warmup_start == 0
        return
    start, steps = warmup
    assert (part.start, part.steps, part.pacing, part.multiple, part.reshape) == (start, steps, "linear", 8, False)
    # DeepSpeed's fixed_linear at its global_steps + 1 = k: floor(k / steps x (1024 - 8) + 8), down to a multiple of 8.
    for k in (1, steps // 4, steps // 2, steps - 1, steps, steps + 1):
        length = int(k / steps * (1024 - start) + start)
        assert part.length(k - 1) == min(length - length % 8, 1024), k


@pytest.mark.parametrize("path", DILOCO_FILES, ids=lambda p: p.stem)
def test_every_diloco_point_is_the_papers_setting_beside_the_study(path):
    """DiLoCo (Douillard et al. 2023): 8 replica groups, an outer SGD with Nesterov momentum at lr 0.7 and
    momentum 0.9, meetings every H steps; the study's batch 1k, 128 a group, on 8 GPUs a group; the inner
    optimizer at its published batch-480 lr; 20 tokens per parameter in whole rounds of H steps."""
    size, optimizer, h = re.fullmatch(r"gpt2_(small|medium)_(adamw|merit)_diloco_h(100|500)_b1k", path.stem).groups()
    config = load_config(path, [])
    resolve_config(config)
    assert (config.run_name, config.optimizer, config.batch_size) == (path.stem, optimizer, 1024)
    assert (config.replica_groups, config.local_steps, config.local_method) == (8, int(h), "diloco")
    assert (config.outer_lr, config.outer_momentum) == (0.7, 0.9)
    assert config.lr == PEAK_LR[optimizer][list(PARAMETERS).index(size)]
    rounds = int(20 * PARAMETERS[size]) // (1024 * 1024) // int(h)
    assert config.max_tokens == 0 and config.max_steps == rounds * int(h) and rounds >= 4
    BatchSchedule.of(config, 1024).check_divisible(config.micro_batch_size, 8 * 8)  # 8 GPUs x 8 groups
    assert "sbatch --array=0-7" in path.read_text()
