# GPT-2 Large (774M) on OpenWebText.
from configs.gpt2_small_owt import *  # noqa: F401,F403 - inherit, then change what differs

run_name = "gpt2-large-owt"
model = "gpt2-large"
scale_attn_by_inverse_layer_idx = True
micro_batch_size = 4  # 480 / (4 x 8 GPUs) = 15 accumulation steps
lr = 2e-4
min_lr = 1e-5
