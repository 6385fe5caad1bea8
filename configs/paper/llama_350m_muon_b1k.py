# The MERIT paper's study: Llama-350M on C4, muon, global batch 1024 x 256 tokens.
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
from configs.llama_350m_c4 import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "llama_350m_muon_b1k"
optimizer = "muon"
batch_size = 1024
max_steps = 0
max_tokens = 2_621_440_000  # about 2.6B: GaLore's Llama-130M run, 20,000 steps of 512 x 256
warmup_steps = 1_000  # 10% of the 10,000 steps, as GaLore's (a sweep axis: --grid warmup_steps=...)
lr = 0.001  # C-Optim's AdamW lr on C4 (Muon: AdamW's, Moonlight's rule); the paper grid-searches it per batch
min_lr = 0.0001  # lr x GaLore's min_lr_ratio 0.1
beta2 = None  # its published value (the base config's 0.999 is AdamW's)
weight_decay = None  # its published value (the base config's 0 is AdamW's)
