"""Where the time of a compiled training step goes, for the plain read compiled whole and the two-phase read
compiled one region per AttnRes block (rd_attnres, 8 layers, 8 heads x 256, context 256, batch 4, S = 4,
float32, CPU): torch.profiler's table of 3 steps each, after 4 warm-up steps, variants one after the other in
one process. Behind docs/performance.md, "One compiled region per AttnRes block" (2026-12-02).
    python scripts/profile_compiled_step.py plain two_phase"""
import argparse, sys, os
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument('variants', nargs='+', choices=['plain', 'two_phase'], help='the reads to profile, in this order')
args = ap.parse_args()   # (before torch loads: --help answers at once)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
import torch, torch._dynamo
from torch.profiler import profile, ProfilerActivity
import bench
from model import GPT, GPTConfig
from fast_read import two_phase_read

torch._dynamo.config.cache_size_limit = 64
cfg = GPTConfig(n_layer=8, n_head=8, n_embd=256, block_size=256, residual='rd_attnres', attnres_block_size=4)
torch.manual_seed(0)
x = torch.randint(0, cfg.vocab_size, (4, 256)); y = torch.randint(0, cfg.vocab_size, (4, 256))

for kind in args.variants:
    torch.manual_seed(1)
    model = (GPT if kind == 'plain' else two_phase_read.TwoPhaseGPT)(cfg)
    opt = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), 'cpu')
    step = bench.make_step(two_phase_read.compile_model(model), opt, x, y, 'cpu', torch.float32)
    for _ in range(4):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(3):
            step()
    print('=====', kind)
    print(p.key_averages().table(sort_by='self_cpu_time_total', row_limit=45, max_name_column_width=70))
