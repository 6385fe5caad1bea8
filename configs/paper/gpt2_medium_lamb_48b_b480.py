# The MERIT paper's study: GPT-2 Medium, lamb, the batch-scaling study's 48B tokens, global batch 480 x 1024 tokens.
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
from configs.gpt2_medium_owt import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "gpt2_medium_lamb_48b_b480"
optimizer = "lamb"
batch_size = 480
max_steps = 0
max_tokens = 48_000_000_000  # the batch-scaling study's 48B
warmup_steps = 1_953  # 2% of the steps, at least 30 (a sweep axis: --grid warmup_steps=...)
lr = 0.0002  # published for batch 480; the paper grid-searches it per batch
min_lr = 2e-05
