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

The learning rate is not here: it depends on the model size, and every config sets it (but for
the separate lr of Muon's AdamW part in Keller Jordan's recipe, a fixed 3e-4 there).
"""
GPT2: dict[str, dict] = {
    "adamw": {"betas": (0.9, 0.95), "weight_decay": 0.1, "eps": 1e-8},
    "merit": {"betas": (0.9, 0.95), "weight_decay": 1e-2, "eps": 1e-6},
    "lamb": {"betas": (0.9, 0.95), "weight_decay": 1e-2, "eps": 1e-6},
    "lion": {"betas": (0.9, 0.99), "weight_decay": 1.0},
    "sophiag": {"betas": (0.965, 0.99), "weight_decay": 0.2, "rho": 0.05},
    "muon": {"adjust_lr": "match_rms_adamw", "weight_decay": 0.1, "momentum": 0.95, "nesterov": True, "ns_steps": 5,
             "betas": (0.9, 0.95), "eps": 1e-8},
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
