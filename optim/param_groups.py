"""The one parameter-group builder every optimizer uses (docs/optimizers.md, "Parameter groups").

As in nanoGPT and the Sophia GPT-2 scripts: weight decay on matrices (Linear weights), none on
biases, norm parameters and embeddings unless ``decay_embeddings`` (or ``decay_all``: every
parameter, as D-Muon's recipe decays them). The tied token-embedding / LM-head matrix appears once;
an untied LM head (Llama's) counts as an embedding, as GPT-2's tied one is: no decay by default, and
never a hidden matrix (Muon's recipe steps the head with AdamW).
"""
from torch import nn


def param_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = False,
                 hidden_matrices_apart: bool = False, decay_all: bool = False) -> list[dict]:
    """Return ``[decay_group, no_decay_group]``, always both (possibly empty) so indices are stable.

    Each group is ``{"params": [...], "names": [...], "weight_decay": float}``; "names" is kept for
    per-layer diagnostics (torch optimizers keep unknown group keys and save them in state_dict).
    Frozen parameters (``requires_grad=False``) are left out, as in nanoGPT.

    ``hidden_matrices_apart`` (for a matrix optimizer such as Muon, which steps the hidden matrices
    and leaves the rest to AdamW): ``[hidden matrices, no_decay_group, decayed embeddings]``, each
    group marked ``"hidden_matrix": True`` or ``False``; the first holds the decayed matrices that
    are not embeddings, the last the other decayed parameters: the embeddings ``decay_embeddings``
    decays, and with ``decay_all`` the norms' gains and the biases too (the middle group is empty).
    """
    # Embeddings are recognised by identity, not by the name named_parameters() reports: a tied
    # weight is reported under the module that registered it first (maybe the LM head's Linear).
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head = getattr(model, "lm_head", None)
    if head is not None:
        embeddings.add(id(head.weight))
    decay = {"params": [], "names": [], "weight_decay": weight_decay}
    no_decay = {"params": [], "names": [], "weight_decay": 0.0}
    decayed_rest = {"params": [], "names": [], "weight_decay": weight_decay}
    # named_parameters() yields each tensor once, so the tied wte/lm_head weight is not duplicated.
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_embedding = id(p) in embeddings
        if p.ndim >= 2 and not is_embedding:
            group = decay
        elif (is_embedding and decay_embeddings) or decay_all:
            group = decayed_rest if hidden_matrices_apart else decay
        else:
            group = no_decay
        group["params"].append(p)
        group["names"].append(name)
    if not hidden_matrices_apart:
        return [decay, no_decay]
    return [{**decay, "hidden_matrix": True}, {**no_decay, "hidden_matrix": False},
            {**decayed_rest, "hidden_matrix": False}]
