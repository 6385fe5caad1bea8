# Li, Zhang and He 2022, sequence-length warmup: GPT-2 Small (their 117M), adamw, batch 512 x 1024 tokens,
# the first author's recipe (microsoft/DeepSpeedExamples, Megatron-LM-v1.1.5-ZeRO3/curriculum_learning/); OpenWebText here.
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
from configs.gpt2_small_owt import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "gpt2_small_adamw_li_b512"
optimizer = "adamw"
batch_size = 512
micro_batch_size = 16  # x 8 GPUs divides batch_size
max_steps = 0
max_tokens = 157_286_400_000  # trained, the scripts' NUM_TOKEN (300,000 steps of 512)
warmup_steps = 3_000  # the scripts'
lr = 0.00015  # the scripts' baseline
min_lr = 1e-05  # cosine over every token to the scripts' min-lr
weight_decay = 0.01  # the scripts'
dtype = "float16"  # the scripts' fp16, with a dynamic loss scale
dropout = 0.1  # Megatron-LM's GPT-2, as the scripts keep it
bias = True
beta1 = 0.9  # the scripts' Adam
beta2 = 0.95
