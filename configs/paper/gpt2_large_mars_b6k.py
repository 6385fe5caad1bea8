# The MERIT paper's study: GPT-2 Large, mars, global batch 6144 x 1024 tokens.
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
from configs.gpt2_large_owt import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "gpt2_large_mars_b6k"
optimizer = "mars"
batch_size = 6144
micro_batch_size = 4  # x 8 GPUs divides batch_size
max_steps = 0
max_tokens = 15_480_000_000  # 20 tokens per parameter
warmup_steps = 49  # 2% of the steps, at least 30 (a sweep axis: --grid warmup_steps=...)
lr = 0.003  # the 2025 benchmark's (at its batch of 256 x 512 tokens); grid-search it per batch
min_lr = 3e-05
