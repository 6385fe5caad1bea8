# Marek et al. 2025, "Small Batch Size Training for Language Models": GPT-2 Small, adafactor, batch 1 x 1024 tokens,
# the authors' tuned setting (martin-marek/batch-size, runs/gpt2s/optimizer_comp/final_configs.sh); OpenWebText here.
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
# One GPU: python train.py configs/paper/gpt2_small_adafactor_marek_b1.py   (a batch of one sequence does not split)
from configs.gpt2_small_owt import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "gpt2_small_adafactor_marek_b1"
optimizer = "adafactor"
batch_size = 1
micro_batch_size = 1
max_steps = 0
max_tokens = 2_480_000_000  # 20 tokens per parameter, the authors' budget
warmup_steps = 121_093  # 5% of the 2,421,875 steps, the authors' linear warmup
lr = 0.005  # the authors' tuned lr at this batch
min_lr = 0.0  # cosine to 0, the authors'
grad_clip = 0.0  # the authors clip no gradient
log_interval = 1_000  # about the authors' 1M tokens between train-loss logs
eval_interval = 100_000  # 100M tokens (and at the end)
checkpoint_interval = 100_000  # 100M tokens
