# GPT-2 Small (124M) on OpenWebText, the setup of the Sophia/nanoGPT GPT-2 scripts the MERIT paper
# builds on: 100k steps of 480 x 1024 tokens, 2000 warmup steps, cosine to min_lr, clip 1.0.
# Prepare the data first: python -m data.prepare openwebtext
# Launch: torchrun --nproc_per_node=8 train.py configs/gpt2_small_owt.py   (accumulation 480 / (12 x 8) = 5)
# Other optimizers: --optimizer=sophiag --lr=6e-4; each gets its published betas, weight decay
# (and rho) unless set (optim/published.py). configs/paper/ holds the paper's points.

run_name = "gpt2-small-owt"
model = "gpt2"
tokenizer = "gpt2"
data_dir = "cache/data/openwebtext-gpt2"

batch_size = 480
micro_batch_size = 12
max_steps = 100_000
warmup_steps = 2_000
lr_schedule = "cosine"

optimizer = "adamw"
lr = 6e-4
min_lr = 3e-5
grad_clip = 1.0

log_interval = 10
eval_interval = 1_000
val_tokens = 4_194_304  # about the whole 4.4M-token validation split
probe_batch_size = 8
checkpoint_interval = 1_000

compile = True
wandb_mode = "online"
wandb_project = "nanomerit-owt"
