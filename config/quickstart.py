# The README quickstart: a small RD-AttnRes model on the built-in tiny corpus (how long it takes:
# docs/training.md, "How long the README's commands take"). First: python prepare.py --dataset tiny
out_dir = 'out/quickstart'
dataset = 'tiny'
residual = 'rd_attnres'
n_layer = 4
n_head = 4
n_embd = 128
attnres_block_size = 2      # 8 sublayers in 4 blocks
block_size = 128
batch_size = 16
total_batch_size = 16 * 128
max_iters = 300
warmup_iters = 20
learning_rate = 2e-3
eval_interval = 100
eval_tokens = 16384
log_interval = 20
device = 'auto'            # the best there is: a GPU, Apple's MPS, or the CPU
cpu_threads = 1            # torch's threads on a CPU: 1 is faster for a model this small (docs/performance.md)
