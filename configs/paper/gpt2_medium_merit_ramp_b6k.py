# The MERIT paper's study: GPT-2 Medium, merit, the batch-scaling study's 48B tokens, the batch ramped, global batch 768 -> 1536 -> 3072 -> 6144 x 1024 tokens.
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
from configs.gpt2_medium_owt import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "gpt2_medium_merit_ramp_b6k"
optimizer = "merit"
batch_size = 768
batch_schedule = [(0, 768), (2400000000, 1536), (7200000000, 3072), (16800000000, 6144)]  # (tokens, batch): doublings at 5%, 15%, 35% of the tokens, a placeholder until measured
micro_batch_size = 8  # x 8 GPUs divides batch_size
max_steps = 0
max_tokens = 48_000_000_000  # the batch-scaling study's 48B
warmup_steps = 1_221  # 2% of the steps, at least 30 (a sweep axis: --grid warmup_steps=...)
lr = 0.0002  # published for batch 480; the paper grid-searches it per batch
min_lr = 2e-05
