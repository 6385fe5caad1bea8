"""The one parameter-group builder every optimizer uses (docs/optimizers.md, "Parameter groups").

As in nanoGPT and the Sophia GPT-2 scripts: weight decay on matrices (Linear weights), none on
biases, LayerNorm parameters and embeddings unless ``decay_embeddings``. The tied token-embedding /
LM-head matrix appears once.
"""
from torch import nn


def param_groups(model: nn.Module, weight_decay: float,
                 decay_embeddings: bool = False) -> list[dict]:
    """Return ``[decay_group, no_decay_group]``, always both (possibly empty) so indices are stable.

    Each group is ``{"params": [...], "names": [...], "weight_decay": float}``; "names" is kept for
    per-layer diagnostics (torch optimizers keep unknown group keys and save them in state_dict).
    Frozen parameters (``requires_grad=False``) are left out, as in nanoGPT.
    """
    # Embeddings are recognised by identity, not by the name named_parameters() reports: a tied
    # weight is reported under the module that registered it first (maybe the LM head's Linear).
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay = {"params": [], "names": [], "weight_decay": weight_decay}
    no_decay = {"params": [], "names": [], "weight_decay": 0.0}
    # named_parameters() yields each tensor once, so the tied wte/lm_head weight is not duplicated.
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_matrix = p.ndim >= 2 and (decay_embeddings or id(p) not in embeddings)
        group = decay if is_matrix else no_decay
        group["params"].append(p)
        group["names"].append(name)
    return [decay, no_decay]
