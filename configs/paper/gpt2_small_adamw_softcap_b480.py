# The MERIT paper's study: GPT-2 Small, adamw with soft-capped logits (Gemma 2's), global batch 480 x 1024 tokens.
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
from configs.gpt2_small_owt import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "gpt2_small_adamw_softcap_b480"
optimizer = "adamw"
batch_size = 480
max_steps = 0
max_tokens = 2_480_000_000  # 20 tokens per parameter
warmup_steps = 101  # 2% of the steps, at least 30 (a sweep axis: --grid warmup_steps=...)
lr = 0.0006  # published for batch 480; the paper grid-searches it per batch
min_lr = 3e-05
attn_logit_softcap = 50.0  # Gemma 2's
final_logit_softcap = 30.0  # Gemma 2's
