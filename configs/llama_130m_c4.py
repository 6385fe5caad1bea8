# Llama-130M on C4, the MERIT paper's second family, trained as GaLore's code base (which the paper's
# C-Optim runs build on) trains it: github.com/jiaweizzhao/GaLore scripts/benchmark_c4/llama_130m.sh and
# torchrun_main.py, and github.com/kyleliang919/C-Optim's README (its AdamW command on C4).
# Prepare the data first: python -m data.prepare c4   (C4 en, the t5-base tokenizer)
# Launch: torchrun --nproc_per_node=8 train.py configs/llama_130m_c4.py   (accumulation 512 / (64 x 8) = 1)
# configs/paper/llama_* holds the paper's points (about 2.6B tokens, AdamW, LAMB, MERIT and Muon).
# Where this project differs: bf16 autocast over float32 weights (GaLore casts the model to bf16), and
# documents packed into 256-token sequences (GaLore's loader truncates each to its first 256 and pads).

run_name = "llama-130m-c4"
model = "llama_130m"  # GaLore's configs/llama_130m.json: 12 layers, 12 heads, 768 wide, SwiGLU 2048, RMSNorm 1e-6
tokenizer = "t5-base"  # 32,100 ids, the vocabulary padded to 32,128
data_dir = "cache/data/c4-t5-base"  # what python -m data.prepare c4 writes
block_size = 256  # GaLore's --max_length
dropout = 0.0

batch_size = 512  # GaLore's --total_batch_size
micro_batch_size = 64  # this project's: 16k tokens, GPT-2 Small's micro-batch
max_steps = 20_000  # GaLore's: 20,000 x 512 x 256 = 2.6B tokens
warmup_steps = 2_000  # GaLore's: 10% of the steps (C-Optim's README: 1,000 of 10,000)
lr_schedule = "cosine"  # GaLore's, to min_lr_ratio 0.1 of the peak

optimizer = "adamw"
lr = 1e-3  # C-Optim's README for AdamW (GaLore tuned each method over 1e-2 to 1e-4, not publishing the winners)
min_lr = 1e-4
beta2 = 0.999  # torch's AdamW default, C-Optim's --betas default (the other optimizers' points reset it)
weight_decay = 0.0  # both sources' scripts (the other optimizers' points reset it to their published value)
grad_clip = 1.0  # C-Optim's README (GaLore's default is none)

log_interval = 10
eval_interval = 1_000  # GaLore's --eval_every
val_tokens = 10_000_000  # GaLore's and C-Optim's evaluation: 10M tokens of C4's validation split
probe_batch_size = 32  # 8,192 tokens, as GPT-2's 8 x 1024
checkpoint_interval = 1_000

compile = True
wandb_mode = "online"
wandb_project = "nanomerit-c4"
