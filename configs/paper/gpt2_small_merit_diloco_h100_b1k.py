# Local steps beside the MERIT paper's study: GPT-2 Small, DiLoCo with merit inside, 8 replica groups
# meeting every 100 steps, global batch 1024 x 1024 tokens (128 a group).
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
# torchft_lighthouse --min_replicas 1 --join_timeout_ms 60000 &   (on a host every group reaches), then
# TORCHFT_LIGHTHOUSE=http://HOST:29510 sbatch --array=0-7 --nodes=1 scripts/slurm/train.sbatch configs/paper/gpt2_small_merit_diloco_h100_b1k.py
from configs.gpt2_small_owt import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "gpt2_small_merit_diloco_h100_b1k"
optimizer = "merit"
batch_size = 1024
micro_batch_size = 16  # x 8 GPUs a group x 8 groups divides batch_size
replica_groups = 8
local_steps = 100
local_method = "diloco"
outer_lr = 0.7  # Douillard et al. 2023's
outer_momentum = 0.9  # Nesterov, theirs
max_tokens = 0
max_steps = 2_300  # 20 tokens per parameter in whole rounds of 100 steps
warmup_steps = 47  # 2% of the steps, at least 30
lr = 0.0002  # the inner optimizer's, published for batch 480; grid-search it
min_lr = 2e-05
