"""One torch thread against two for the quickstart's model on a CPU: 200 tokens sampled from a trained
checkpoint (model.generate, top_k 200, a one-token prompt) and training steps at the quickstart's shape
(rd_attnres 4 x 128, batch 16 x 128, float32, eager: forward + backward + AdamW). 1 and 2 threads alternate
in one process, round by round, the order swapped every round, so that drifting load favours neither; the
medians are printed. Behind docs/performance.md, "Threads for small models on a CPU" (2026-12-03).
    python scripts/cpu_threads.py out/quickstart 3 4     # checkpoint folder, sampling rounds, training rounds"""
import argparse
import os
import statistics
import sys
import time
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument('out_dir', help="a run folder with a checkpoint, e.g. the quickstart's out/quickstart")
ap.add_argument('sample_rounds', type=int, help='rounds of 200 sampled tokens with 1 and with 2 threads')
ap.add_argument('train_rounds', type=int, help='rounds of training steps with 1 and with 2 threads')
args = ap.parse_args()   # (before torch loads: --help answers at once)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
import torch
from model import GPT, GPTConfig
from prepare import VOCAB_SIZE
from run_kit.run_control import tune_cpu_allocator
from sample import load_model

out_dir, sample_rounds, train_rounds = args.out_dir, args.sample_rounds, args.train_rounds
tune_cpu_allocator()   # as train.py does on a CPU


def rounds(n, work):
    times = {1: [], 2: []}
    for r in range(n):
        for threads in ((1, 2) if r % 2 == 0 else (2, 1)):
            torch.set_num_threads(threads)
            times[threads] += work()
            print(f"round {r}, {threads} thread(s): {[round(t, 2) for t in times[threads][-2:]]}", flush=True)
    return {k: round(statistics.median(v), 3) for k, v in times.items()}


model, _, origin = load_model(dict(weights='', out_dir=out_dir))
model.eval()
prompt = torch.zeros((1, 1), dtype=torch.long)


def sample_200():
    torch.manual_seed(0)
    t = time.time()
    model.generate(prompt, 200, temperature=0.8, top_k=200)
    return [time.time() - t]


print(f"{origin}: 200 sampled tokens, median seconds by threads:", rounds(sample_rounds, sample_200), flush=True)
torch.manual_seed(0)
net = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=128, residual='rd_attnres',
                    attnres_block_size=2))
opt = net.configure_optimizers(0.1, 2e-3, (0.9, 0.95), 'cpu')
x, y = torch.randint(0, VOCAB_SIZE, (16, 128)), torch.randint(0, VOCAB_SIZE, (16, 128))


def three_steps():   # the first of the three warms the new thread count up and is not counted
    times = []
    for _ in range(3):
        t = time.time()
        _, loss = net(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.time() - t)
    return times[1:]


print("quickstart training step, median seconds by threads:", rounds(train_rounds, three_steps), flush=True)
