# Li, Zhang and He 2022, sequence-length warmup: GPT-2 Small (their 117M), merit, batch 4096 x 1024 tokens,
# the first author's recipe (microsoft/DeepSpeedExamples, Megatron-LM-v1.1.5-ZeRO3/curriculum_learning/); OpenWebText here.
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
from configs.gpt2_small_owt import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "gpt2_small_merit_li_b4k"
optimizer = "merit"
batch_size = 4096
micro_batch_size = 16  # x 8 GPUs divides batch_size
max_steps = 0
max_tokens = 157_286_400_000  # trained, the scripts' NUM_TOKEN (300,000 steps of 512)
warmup_steps = 3_000  # the scripts'
lr = 0.0002  # the MERIT authors' default (their recipe is Adam's)
min_lr = 1e-05  # cosine over every token to the scripts' min-lr
weight_decay = 0.01  # the scripts'
dtype = "float16"  # the scripts' fp16, with a dynamic loss scale
dropout = 0.1  # Megatron-LM's GPT-2, as the scripts keep it
bias = True
