"""Each optimizer's published GPT-2 hyper-parameters (``optim.settings`` reads them).

A training config leaves a hyper-parameter unset (None) unless the user chooses it; unset, the
optimizer gets its published GPT-2 setting from ``GPT2`` below, or else its constructor's default.
A global default (say betas (0.9, 0.95) for everyone) would silently hand Sophia-G or Lion
AdamW's settings: a reproduction bug. Sources (docs/optimizers.md):

* AdamW: GPT-2 / nanoGPT, as in the Sophia GPT-2 scripts the paper builds on.
* MERIT: the MERIT authors' README (lr 2e-4, wd 1e-2, betas (0.9, 0.95), eps 1e-6).
* LAMB: the paper's LAMB baseline runs from the MERIT authors' code (a pytorch-lamb fork) with
  MERIT's settings; no separate GPT-2 setting is published.
* Lion: the authors' betas (0.9, 0.99); their guidance is a weight decay 3-10x AdamW's with an
  lr 3-10x smaller, so that lr * wd, the decay per step, stays about AdamW's: wd 1.0 with AdamW's
  0.1 and the 6x smaller GPT-2 Small lr (1e-4 against 6e-4).
* Sophia-G: the authors' GPT-2 Small (125M) settings; Medium (355M) uses rho 0.08, which the
  paper configs (configs/paper/) set.
* Muon: two published recipes, chosen by its ``adjust_lr`` option (``VARIANTS``). Unset, Moonlight's
  (Liu et al. 2025, "Muon is Scalable for LLM Training"; MoonshotAI/Moonlight examples/toy_train.py):
  ``adjust_lr="match_rms_adamw"``, so that Muon and its AdamW part share AdamW's lr and weight
  decay 0.1, AdamW betas (0.9, 0.95) and eps 1e-8, momentum 0.95 with Nesterov, 5 Newton-Schulz
  steps. With ``adjust_lr="original"``, Keller Jordan's (KellerJordan/Muon README, the
  ``MuonWithAuxAdam`` recipe for GPT-2-scale transformers): Muon lr 0.02 (the config's lr) and
  weight decay 0.01, the AdamW part lr 3e-4, betas (0.9, 0.95) and eps 1e-10 (its default).
  Both recipes decay every auxiliary parameter; here the shared group builder decays none of
  the embeddings, norms and biases unless ``decay_embeddings`` (docs/optimizers.md).
* D-Muon: the 2025 benchmark's (Semenov et al., epfml/llm-optimizer-benchmark, scripts/124m/d-muon.sh):
  weight decay 0.1 on every parameter, momentum 0.95 with Nesterov, 5 Newton-Schulz steps, its AdamW
  part at Muon's lr with betas (0.8, 0.999) and eps 1e-8 (lr 1e-3 at 124M, in the configs). Moonlight's
  own AdamW betas are (0.9, 0.95), the ``muon`` recipe's; a config gets the benchmark's.
* AdEMAMix: the 2025 benchmark's (Semenov et al., epfml/llm-optimizer-benchmark, scripts/124m/ademamix.sh;
  the same at 210M and 720M): betas (0.9, 0.999), beta3 0.999, alpha 8, both warmups over the run's
  steps (None: T_alpha = T_b3 = its iterations), weight decay 0.1, eps 1e-8 (the constructor's; the
  script does not set it); lr 1e-3 in the configs. The authors' constructor defaults differ: beta3
  0.9999, alpha 2, no warmups, no weight decay (pytorch_optimizer's: alpha 5, one warmup for both).
* MARS: the 2025 benchmark's (scripts/124m/mars.sh; the same at 210M and 720M): MARS-AdamW lr 3e-3 (in
  the configs), betas (0.95, 0.99), gamma 0.025, weight decay 0.1, eps 1e-8 (the constructor's); its
  AdamW part lr 1e-3, betas (0.8, 0.999), weight decay 0.1 (the script's --lr, --beta1/--beta2; the
  benchmark's main.py fixes weight_decay_1d 0.1). The authors' GPT-2 small recipe (AGI-Arena/MARS
  README) differs: lr 6e-3, weight decay 1e-2, AdamW part lr 3e-3 and betas (0.9, 0.95).
* SOAP: the 2025 benchmark's (scripts/124m/soap.sh, also 210M; 720M takes betas (0.95, 0.95); main.py's
  defaults for the rest): betas (0.9, 0.999), weight decay 0.1, eps 1e-8, shampoo_beta -1 (= beta2), precondition
  frequency 10, max_precond_dim 10,000; lr 1e-3 in the configs. The authors' defaults (nikhilvyas/SOAP
  soap.py, the constructor's) differ: lr 3e-3, betas (0.95, 0.95), weight decay 0.01; a config gets the
  benchmark's.
* Schedule-Free AdamW: the 2025 benchmark's (scripts/124m/sf-adamw.sh): betas (0.9, 0.9999), weight
  decay 0.1, r 0 and weight_lr_power 2 (its defaults), eps 1e-8 (the package's; the script does not
  set it). The paper configs (configs/paper/) take its lr 1e-3 and no lr decay (lr_schedule
  "constant"), with the warmup and grad clip of every paper point: 2% of the steps (at least 30) and
  1.0 (scripts/paper_configs.py says why). The authors' defaults (``schedulefree`` 1.4.1) differ: lr
  0.0025, betas (0.9, 0.999), no weight decay, no warmup; their README recommends a warmup and beta1
  0.95 or 0.98 for very long runs.
* SGD and Adafactor: Marek et al. 2025 ("Small Batch Size Training for Language Models: When
  Vanilla SGD Works, and Why Gradient Accumulation is Wasteful", NeurIPS 2025; martin-marek/batch-size,
  pretraining/optimizer.py, configs/base.yaml and runs/gpt2s/optimizer_comp/final_configs.sh): GPT-2
  Small (124M) on FineWeb at 20 tokens per parameter, tuned per optimizer at batch 1 (and AdamW at
  512), a linear warmup from 0 over 5% of the steps, then cosine to 0, no gradient clipping, weight
  decay 0 unless set. SGD: no momentum, no weight decay (lr 0.2). Adafactor: decay_rate 0.9999 (their
  "b2"), factored where both sides are >= 128, updates clipped at block RMS 1.0, scaled by the
  parameter's RMS with floor 1e-3 (optax's scale_by_param_block_rms), no weight decay (lr 0.005). Their
  AdamW: batch 512 lr 0.0048, betas (0.9, 0.95), weight decay 0.1 (AdamW's published settings here);
  batch 1 lr 0.0024 with betas (0.9, 0.9999) ("fixed t2"; with beta2 0.95 kept, lr 0.00015), no weight
  decay. Their small models hold beta2's half-life at 10M tokens for batches 1 to 256 (20M for 1024 to
  4096). The configs/paper/gpt2_small_*_marek_b*.py points take these on OpenWebText.

The learning rate is not here: it depends on the model size, and every config sets it (but for
the separate lr of an AdamW part: Muon's in Keller Jordan's recipe, a fixed 3e-4, and MARS's, 1e-3).
"""
GPT2: dict[str, dict] = {
    "adamw": {"betas": (0.9, 0.95), "weight_decay": 0.1, "eps": 1e-8},
    "adamw_schedulefree": {"betas": (0.9, 0.9999), "weight_decay": 0.1, "eps": 1e-8, "r": 0.0, "weight_lr_power": 2.0},
    "ademamix": {"betas": (0.9, 0.999), "beta3": 0.999, "alpha": 8.0, "alpha_warmup": None, "beta3_warmup": None,
                 "weight_decay": 0.1, "eps": 1e-8},
    "merit": {"betas": (0.9, 0.95), "weight_decay": 1e-2, "eps": 1e-6},
    "lamb": {"betas": (0.9, 0.95), "weight_decay": 1e-2, "eps": 1e-6},
    "lion": {"betas": (0.9, 0.99), "weight_decay": 1.0},
    "mars": {"betas": (0.95, 0.99), "gamma": 0.025, "weight_decay": 0.1, "eps": 1e-8, "adamw_lr": 1e-3,
             "adamw_betas": (0.8, 0.999), "adamw_weight_decay": 0.1},
    "soap": {"betas": (0.9, 0.999), "weight_decay": 0.1, "eps": 1e-8, "shampoo_beta": -1.0,
             "precondition_frequency": 10, "max_precond_dim": 10000},
    "sophiag": {"betas": (0.965, 0.99), "weight_decay": 0.2, "rho": 0.05},
    "dmuon": {"adjust_lr": "match_rms_adamw", "weight_decay": 0.1, "momentum": 0.95, "nesterov": True, "ns_steps": 5,
              "betas": (0.8, 0.999), "eps": 1e-8},
    "muon": {"adjust_lr": "match_rms_adamw", "weight_decay": 0.1, "momentum": 0.95, "nesterov": True, "ns_steps": 5,
             "betas": (0.9, 0.95), "eps": 1e-8},
    "sgd": {"momentum": 0.0, "weight_decay": 0.0},
    "adafactor": {"decay_rate": 0.9999, "min_dim_size_to_factor": 128, "clipping_threshold": 1.0,
                  "param_rms_floor": 1e-3, "weight_decay": 0.0},
}

# Recipes an option picks: {optimizer: (option, {its value: the settings that replace GPT2's})}.
VARIANTS: dict[str, tuple[str, dict[object, dict]]] = {
    "muon": ("adjust_lr", {"original": {"weight_decay": 0.01, "adamw_lr": 3e-4, "eps": 1e-10}}),
}


def gpt2_settings(name: str, chosen: dict) -> dict:
    """Optimizer ``name``'s published GPT-2 settings, of the recipe ``chosen``'s values pick."""
    settings = dict(GPT2.get(name, {}))
    if name in VARIANTS:
        option, recipes = VARIANTS[name]
        variant = chosen.get(option) if chosen.get(option) is not None else settings.get(option)
        settings.update(recipes.get(variant, {}))
    return settings

# Where a resolved value came from (optim.settings).
SET, PUBLISHED, DEFAULT = "set", "published", "default"
