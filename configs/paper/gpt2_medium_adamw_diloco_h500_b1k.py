# Local steps beside the MERIT paper's study: GPT-2 Medium, DiLoCo with adamw inside, 8 replica groups
# meeting every 500 steps, global batch 1024 x 1024 tokens (128 a group).
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
# torchft_lighthouse --min_replicas 1 --join_timeout_ms 60000 &   (on a host every group reaches), then
# TORCHFT_LIGHTHOUSE=http://HOST:29510 sbatch --array=0-7 --nodes=1 scripts/slurm/train.sbatch configs/paper/gpt2_medium_adamw_diloco_h500_b1k.py
from configs.gpt2_medium_owt import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "gpt2_medium_adamw_diloco_h500_b1k"
optimizer = "adamw"
batch_size = 1024
micro_batch_size = 8  # x 8 GPUs a group x 8 groups divides batch_size
replica_groups = 8
local_steps = 500
local_method = "diloco"
outer_lr = 0.7  # Douillard et al. 2023's
outer_momentum = 0.9  # Nesterov, theirs
max_tokens = 0
max_steps = 6_500  # 20 tokens per parameter in whole rounds of 500 steps
warmup_steps = 135  # 2% of the steps, at least 30
lr = 0.0003  # the inner optimizer's, published for batch 480; grid-search it
min_lr = 6e-05
