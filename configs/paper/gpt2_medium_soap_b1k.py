# The MERIT paper's study: GPT-2 Medium, soap, global batch 1024 x 1024 tokens.
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
from configs.gpt2_medium_owt import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "gpt2_medium_soap_b1k"
optimizer = "soap"
batch_size = 1024
micro_batch_size = 8  # x 8 GPUs divides batch_size
max_steps = 0
max_tokens = 7_100_000_000  # 20 tokens per parameter
warmup_steps = 135  # 2% of the steps, at least 30 (a sweep axis: --grid warmup_steps=...)
lr = 0.001  # the 2025 benchmark's (at its batch of 256 x 512 tokens); grid-search it per batch
min_lr = 1e-05
