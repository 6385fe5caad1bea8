"""configs/paper/: every point of the MERIT paper's study loads and resolves to the published
settings, transcribed here from docs/optimizers.md and the paper's setup independently of
scripts/paper_configs.py, and builds its model on the meta device (no memory)."""
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

PAPER = ROOT / "configs" / "paper"
FILES = sorted(PAPER.glob("*.py"))
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


def test_the_files_are_what_the_generator_writes():
    result = subprocess.run([sys.executable, "-m", "scripts.paper_configs", "--check"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    # 3 sizes x 11 optimizers (MuonClip one) x 6 batches, MERIT's 4 ablations, AdamW with QK-Norm and
    # AdamW and MERIT with QK-Clip at GPT-2 Small's 6 batches.
    # GPT-2 Medium over 48B tokens with AdamW, LAMB and MERIT at the 6 batches. The CBS parents
    # (AdamW, LAMB, MERIT, Muon at Small batch 480) and the ramps (AdamW and MERIT, Medium to 6k).
    assert len(FILES) == 3 * 12 * 6 + 4 + 3 * 6 + 3 * 6 + 4 + 2 and f"{len(FILES)} files, as written" in result.stdout


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
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
    with torch.device("meta"):
        model = GPT(model_config)
    assert all(p.is_meta for p in model.parameters())
    assert abs(model.num_params(non_embedding=False) / PARAMETERS[size] - 1) < 0.01
