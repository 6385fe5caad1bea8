# The MERIT paper's study: GPT-2 Small, merit, a parent for the critical batch size by branching, global batch 480 x 1024 tokens.
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
from configs.gpt2_small_owt import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "gpt2_small_merit_cbs_b480"
optimizer = "merit"
batch_size = 480
max_steps = 0
max_tokens = 2_480_000_000  # 20 tokens per parameter
warmup_steps = 101  # 2% of the steps, at least 30 (a sweep axis: --grid warmup_steps=...)
lr = 0.0002  # published for batch 480; the paper grid-searches it per batch
min_lr = 2e-05
permanent_checkpoint_interval = 504  # a tenth of the run: the checkpoints to branch
# Then: python -m scripts.cbs runs/gpt2_small_merit_cbs_b480 --multipliers 0.25,0.5,1,2,4,8,16 --seeds 0,1,2 --branch-tokens 31_457_280 --beta-scaling half-life --scale-betas beta1,beta2 --launch slurm
# (k = 1/4 .. 16: batches 120 to 7,680; branch tokens: 4 steps of the largest, 1.3% of the run;
# each branch's decays at their half-life in tokens, so that 4 steps outlast their memory)
