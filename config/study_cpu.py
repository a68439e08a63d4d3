# The paired study at CPU scale: every run of `python study.py run cpu` (study.py's cpu_plan;
# docs/results.md). Frozen before the first run. study.py gives each run its mode (--residual), seed and
# out_dir on the command line, and some sets one more override, the same for every arm of the set: the
# early budget (--max_iters=100), or float32 (--dtype=float32: the third set, which the README's results
# lead with, and the float32 noise floor; every other run keeps the bf16 below). So the arms of a pair
# differ only in `residual`.
out_dir = 'study/runs/main/{residual}_s{seed}'   # a run started by hand; study.py names each run's folder
dataset = 'study'             # Python 3.11 reST docs + King James Bible (python study.py corpus)
# model: deep enough for routing to matter (16 sublayers in 4 blocks), narrow enough for 2 cores
n_layer = 8
n_head = 4
n_embd = 128
attnres_block_size = 4
block_size = 256
# 200 steps of 16 x 256 = 4096 tokens: 0.82M training tokens per run
batch_size = 16
total_batch_size = 4096
max_iters = 200
warmup_iters = 20
learning_rate = 3e-3
min_lr_ratio = 0.1
weight_decay = 0.1
grad_clip = 1.0
# the same 131072 held-out tokens (512 windows) at every eval, for every arm
eval_interval = 50
eval_tokens = 131072
eval_batch_size = 32
log_interval = 10
device = 'cpu'
dtype = 'bfloat16'          # autocast: 1.6x faster than float32 on this CPU (avx512_bf16), as in the paper;
                            # the third set overrides it (--dtype=float32)
