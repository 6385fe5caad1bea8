# The MERIT paper's study: Llama-130M on C4, merit, global batch 512 x 256 tokens.
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
from configs.llama_130m_c4 import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "llama_130m_merit_b512"
optimizer = "merit"
batch_size = 512
max_steps = 0
max_tokens = 2_621_440_000  # about 2.6B: GaLore's Llama-130M run, 20,000 steps of 512 x 256
warmup_steps = 2_000  # 10% of the 20,000 steps, as GaLore's (a sweep axis: --grid warmup_steps=...)
lr = 0.0002  # the MERIT authors' default (no Llama lr is published); the paper grid-searches it per batch
min_lr = 2e-05  # lr x GaLore's min_lr_ratio 0.1
beta2 = None  # its published value (the base config's 0.999 is AdamW's)
weight_decay = None  # its published value (the base config's 0 is AdamW's)
