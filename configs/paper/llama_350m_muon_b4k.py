# The MERIT paper's study: Llama-350M on C4, muon, global batch 4096 x 256 tokens.
# Written by python -m scripts.paper_configs (its docstring says why each value); edit freely.
from configs.llama_350m_c4 import *  # noqa: F401,F403 - the model, data and run defaults

run_name = "llama_350m_muon_b4k"
optimizer = "muon"
batch_size = 4096
max_steps = 0
max_tokens = 2_621_440_000  # about 2.6B: GaLore's Llama-130M run, 20,000 steps of 512 x 256
warmup_steps = 250  # 10% of the 2,500 steps, as GaLore's (a sweep axis: --grid warmup_steps=...)
lr = 0.001  # C-Optim's AdamW lr on C4 (Muon: AdamW's, Moonlight's rule); the paper grid-searches it per batch
min_lr = 0.0001  # lr x GaLore's min_lr_ratio 0.1
beta2 = None  # its published value (the base config's 0.999 is AdamW's)
weight_decay = None  # its published value (the base config's 0 is AdamW's)
