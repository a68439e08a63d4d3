# ctrl_heads_120m_early: the frozen 120m recipe (README: "Reproducing the paper"), identical for every arm of a pair except `residual`.
# Early budget for the controls: 0.5B training tokens, 954 steps of 2**19 tokens (compare each control
# with attnres_120m_early of the same seed).
#   torchrun --standalone --nproc_per_node=8 train.py config/ctrl_heads_120m_early.py --seed=1   (seeds 1..5)
out_dir = 'out/ctrl_heads_120m_early_s{seed}'
residual = 'ctrl_heads'
# data: FineWeb-Edu sample-10BT, GPT-2 BPE (python prepare.py)
dataset = 'fineweb_edu'
total_batch_size = 524288   # 2**19 tokens per optimizer step
batch_size = 16             # per GPU: 8 GPUs x 16 x 1024 = 2**17, so 4 micro-steps of accumulation
block_size = 1024
eval_tokens = 10485760      # the same ~10M held-out tokens at every eval, for every arm
eval_interval = 250
log_interval = 10
# model
n_layer = 12
n_head = 12
n_embd = 768
attnres_block_size = 4     # 24 sublayers in 6 blocks (unused by the standard residual)
# optimizer: AdamW (0.9, 0.95), decay 0.1 on matrices only, warmup then cosine to 10%, clip 1.0
learning_rate = 6e-4
max_iters = 954
warmup_iters = 100
min_lr_ratio = 0.1
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
# system: bf16 autocast on GPUs, torch.compile
dtype = 'auto'
compile = True
