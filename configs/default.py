# The CPU demo: a small GPT on Shakespeare (byte-level), trained with MERIT in a few minutes on
# 2 cores. Prepare the data, then train:
#   python -m data.prepare shakespeare --tokenizer byte
#   python train.py configs/default.py

run_name = "default"
data_dir = "cache/data/shakespeare-byte"
tokenizer = "byte"

model = "nano"  # 4 layers, 4 heads, 128 dims
block_size = 256
dropout = 0.0

batch_size = 16
micro_batch_size = 16
max_steps = 1200
warmup_steps = 60
lr_schedule = "cosine"

optimizer = "merit"
lr = 6.7e-3  # the best of a factor-of-3 grid (docs/results/default_job.md); MERIT's step is relative to each weight's scale
min_lr = 6.7e-4
grad_clip = 1.0

log_interval = 100
eval_interval = 400
val_tokens = 131072
probe_batch_size = 8
sample_tokens = 300
