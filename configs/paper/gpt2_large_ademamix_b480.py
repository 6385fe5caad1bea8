# The MERIT paper's study: GPT-2 Large, ademamix, global batch 480 x 1024 tokens.
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
from configs.gpt2_large_owt import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "gpt2_large_ademamix_b480"
optimizer = "ademamix"
batch_size = 480
max_steps = 0
max_tokens = 15_480_000_000  # 20 tokens per parameter
warmup_steps = 630  # 2% of the steps, at least 30 (a sweep axis: --grid warmup_steps=...)
lr = 0.001  # the 2025 benchmark's (at its batch of 256 x 512 tokens); grid-search it per batch
min_lr = 1e-05
