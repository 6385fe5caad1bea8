# The small Llama on the CPU: configs/default.py's job (MERIT, batch 16 x 256 byte tokens, 1200 steps,
# a few minutes on 2 cores) with the Llama family's block (RMSNorm, rotary positions, SwiGLU, no
# biases, an untied head) in place of GPT-2's. The paper trains Llama on C4 with the T5 tokenizer; C4
# cannot be fetched offline, so this runs on the offline corpus the default job uses (Shakespeare,
# byte tokens): the architecture and the path are the paper's, the data is not. Prepare, then train:
#   python -m data.prepare shakespeare --tokenizer byte
#   python train.py configs/llama_cpu.py

from configs.default import *  # noqa: F401,F403

run_name = "llama_cpu"
model = "llama_nano"  # 4 layers, 4 heads, 128 dims, SwiGLU width 352
# The default job's lr, and the best of a factor-of-3 grid on this job, one seed (docs/results/cures.md):
# val loss 1.881 at 2.2e-3, 1.730 at 6.7e-3, 1.882 at 2e-2 (where a layer's logit runs to 1e4).
lr = 6.7e-3
min_lr = 6.7e-4
