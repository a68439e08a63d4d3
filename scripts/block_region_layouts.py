"""Step time of two layouts of the compiled two-phase read beside the plain read compiled whole, interleaved
round by round in one process (rd_attnres, 8 heads x 256, context 256, batch 4, S = 4, float32, CPU); behind
docs/performance.md, "One compiled region per AttnRes block" (2026-12-02):
  old:        fast_read/two_phase_read.py (the first stack, the pushes and the final read eager, between the
              two graphs around the loop over the blocks)
  new:        another layout of the same file, given as a path, e.g. the one measured on 2026-12-02 (the first
              stack and the final read traced around the loop: four graphs):
                  cp fast_read/two_phase_read.py /tmp/other.py
                  patch /tmp/other.py results/two_phase_read_final_read_compiled_2026-12-02.diff
  new_nested: the same with dynamo's nested_graph_breaks on while tracing
    python scripts/block_region_layouts.py OTHER_LAYOUT.py N_LAYER ROUNDS STEPS_PER_ROUND"""
import sys, time, statistics, json
import importlib.util, os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
import torch, torch._dynamo
import bench
from model import GPT, GPTConfig
from fast_read import two_phase_read as old
spec = importlib.util.spec_from_file_location('other_layout', sys.argv.pop(1))
new = importlib.util.module_from_spec(spec)
sys.modules['other_layout'] = new   # (dynamo imports the module of what it traces)
spec.loader.exec_module(new)

n_layer, rounds, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch._dynamo.config.cache_size_limit = 64
cfg = GPTConfig(n_layer=n_layer, n_head=8, n_embd=256, block_size=256, residual='rd_attnres', attnres_block_size=4)
torch.manual_seed(0)
x = torch.randint(0, 50304, (4, 256)); y = torch.randint(0, 50304, (4, 256))

def build(kind):
    torch.manual_seed(1)
    model = {'plain': GPT, 'old': old.TwoPhaseGPT}.get(kind, new.TwoPhaseGPT)(cfg)
    opt = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), 'cpu')
    runner = model.compile_blocks() if kind != 'plain' else torch.compile(model, dynamic=False)
    step = bench.make_step(runner, opt, x, y, 'cpu', torch.float32)
    torch._dynamo.config.nested_graph_breaks = kind == 'new_nested'
    t0 = time.perf_counter(); step(); step(); print(kind, 'first two steps', round(time.perf_counter() - t0, 1), 's', flush=True)
    torch._dynamo.config.nested_graph_breaks = False
    return step

kinds = ['plain', 'old', 'new', 'new_nested']
stepfn = {k: build(k) for k in kinds}
times = {k: [] for k in kinds}
for r in range(rounds):
    order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
    for k in order:
        t0 = time.perf_counter()
        for _ in range(steps):
            stepfn[k]()
        times[k].append((time.perf_counter() - t0) / steps)
    print('round', r, {k: round(1000 * v[-1]) for k, v in times.items()}, flush=True)
for k in kinds:
    ratios = [a / p for a, p in zip(times[k], times['plain'])]
    print(f"{k:12s} median step {1000*statistics.median(times[k]):7.1f} ms  ÷ plain: median {statistics.median(ratios):.3f}  "
          f"range {min(ratios):.3f}..{max(ratios):.3f}")
print(json.dumps({k: v for k, v in times.items()}))
