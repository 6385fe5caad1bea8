# GPT-2 Medium (355M) on OpenWebText; Medium and Large scale attention logits by 1/(layer+1).
from configs.gpt2_small_owt import *  # noqa: F401,F403 - inherit, then change what differs

run_name = "gpt2-medium-owt"
model = "gpt2-medium"
scale_attn_by_inverse_layer_idx = True
micro_batch_size = 6  # 480 / (6 x 8 GPUs) = 10 accumulation steps
lr = 3e-4
min_lr = 6e-5
