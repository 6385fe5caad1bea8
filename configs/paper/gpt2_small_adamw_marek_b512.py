# Marek et al. 2025, "Small Batch Size Training for Language Models": GPT-2 Small, adamw, batch 512 x 1024 tokens,
# the authors' tuned setting (martin-marek/batch-size, runs/gpt2s/optimizer_comp/final_configs.sh); OpenWebText here.
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
from configs.gpt2_small_owt import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "gpt2_small_adamw_marek_b512"
optimizer = "adamw"
batch_size = 512
micro_batch_size = 16  # the authors'; x 8 GPUs divides batch_size
max_steps = 0
max_tokens = 2_480_000_000  # 20 tokens per parameter, the authors' budget
warmup_steps = 236  # 5% of the 4,730 steps, the authors' linear warmup
lr = 0.0048  # the authors' tuned lr at this batch
min_lr = 0.0  # cosine to 0, the authors'
grad_clip = 0.0  # the authors clip no gradient
