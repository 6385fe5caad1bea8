# The MERIT paper's study: GPT-2 Large, lion, global batch 6144 x 1024 tokens.
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
from configs.gpt2_large_owt import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "gpt2_large_lion_b6k"
optimizer = "lion"
batch_size = 6144
micro_batch_size = 4  # x 8 GPUs divides batch_size
max_steps = 0
max_tokens = 15_480_000_000  # 20 tokens per parameter
warmup_steps = 49  # 2% of the steps, at least 30 (a sweep axis: --grid warmup_steps=...)
lr = 8e-05  # published for batch 480; the paper grid-searches it per batch
min_lr = 8e-06
