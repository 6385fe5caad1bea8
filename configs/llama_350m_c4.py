# Llama-350M on C4: GaLore's scripts/benchmark_c4/llama_350m.sh (60,000 steps of 512 x 256 tokens,
# 7.9B, warmup 6,000); otherwise as configs/llama_130m_c4.py, whose sources and differences apply.
# The paper's points (configs/paper/llama_350m_*) run about 2.6B tokens.
from configs.llama_130m_c4 import *  # noqa: F401,F403 - inherit, then change what differs

run_name = "llama-350m-c4"
model = "llama_350m"  # GaLore's configs/llama_350m.json: 24 layers, 16 heads, 1024 wide, SwiGLU 2736
micro_batch_size = 32  # this project's: 512 / (32 x 8 GPUs) = 2 accumulation steps
max_steps = 60_000
warmup_steps = 6_000
