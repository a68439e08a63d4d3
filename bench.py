"""
The cost of depth routing: step time, tokens/s, MFU and peak memory of every residual mode at one
shape, measured side by side in one run.

    python bench.py                                   # the CPU shape: 8 x 256, context 256, batch 16
    python bench.py --compile=True                    # the same under torch.compile
    python bench.py --n_layer=12 --n_embd=768 --n_head=12 --block_size=1024 --batch_size=1 --modes=standard,attnres,rd_attnres
    python bench.py --modes=standard,rd_attnres,rd_attnres+two_phase,rd_attnres+fused --compile=True   # the reads side by side
    python bench.py --device=cuda --dtype=bfloat16 --compile=True --json=bench.jsonl
    python bench.py --compile_cost=True --modes=standard,rd_attnres --n_layer=12   # what a cold compile consists of
    python bench.py --data=True --block_size=1024     # host time of one step's data work at the 120m shape
    python bench.py --checkpoint=True --n_layer=24 --n_head=16 --n_embd=1024 --block_size=1024   # checksum cost, 343m

A timed step is forward + backward + AdamW step on a fixed random batch. Modes are interleaved in
rounds (the order rotates every round) so that drifting machine load does not favour one; the
reported time is the median over all timed steps, and a ratio between two modes is the median over
rounds of their per-round ratio (load that changes between rounds cancels out). Peak memory: on CPU
the peak resident set size (VmHWM, which includes ~0.3 GB of libraries) of a fresh subprocess per
mode; on CUDA the allocator's peak during the mode's warm-up, less what other modes hold.
"first step s" is the first warm-up step, which includes compilation under --compile.
"""

import json
import math
import os
import statistics
import subprocess
import sys
import time

from configurator import configure, exit_on_help
exit_on_help(__name__, __file__, 'docs/performance.md (what was measured, and how)')   # before torch loads
import torch

from fast_read.two_phase_read import compile_model
from model import RESIDUAL_MODES
from prepare import VOCAB_SIZE
from run_kit.common import H100_PEAK_FLOPS, build_model
from run_kit.run_control import detect_peak_flops, resolve_device, resolve_dtype, tune_cpu_allocator

DEFAULTS = dict(
    modes=','.join(RESIDUAL_MODES),   # the modes to measure, comma-separated: every mode of model.py
    n_layer=8, n_head=8, n_embd=256, block_size=256, batch_size=16, attnres_block_size=4,
    device='auto', dtype='float32', compile=False,
    backend='inductor',           # with compile: torch.compile's backend ('eager': dynamo's graphs run as they are,
                                  # no kernels built: the graph counts of every mode in seconds, e.g. on a CPU)
    recompile_limit=64,           # with compile: dynamo's graphs per function; every mode compiles GPT.forward
                                  # once more, and past the limit (torch's default: 8) a mode would run eager
    rounds=12, steps=1, warmup=2,  # per mode: warmup steps, then rounds x steps timed steps
    memory=True, peak_flops=0.0, seed=0,
    cpu_malloc_tuning=True,       # as train.py: keep big freed buffers in the heap (compare with False)
    json='',                      # append one JSON object per mode to this file
    probe='',                     # internal: measure the peak memory of this one mode and exit
    compile_cost=False,           # instead: compile each mode cold (a fresh process and compile cache) and
                                  # report what the compile consists of: graph nodes, kernels, seconds
    compile_probe='',             # internal: compile this one mode cold and print its numbers as JSON
    data=False,                   # instead: time train.py's host-side data work per step (no model)
    data_windows=2_050_000,       # --data: windows of training data: FineWeb-Edu's 2.1B tokens at T=1024
    data_ranks=8,                 # --data: processes that split a step (rank 0's share is timed)
    data_steps=400,               # --data: steps timed
    checkpoint=False,             # instead: time the checksum of a checkpoint of this shape (model + AdamW)
    traffic=False,                # instead: the depth reads' memory traffic at the paper's shapes, and the
                                  # overhead it predicts on a GPU (an estimate, see traffic_model)
    bandwidth=3.35e12,            # --traffic: memory bandwidth in bytes/s (H100 SXM: 3.35 TB/s HBM3)
    bandwidth_efficiency=0.8,     # --traffic: the share of it a memory-bound kernel reaches
    mfu=0.4,                      # --traffic: the backbone's model FLOPs utilisation
)


def build(cfg, mode, device):
    """A mode's model, optimizer and what runs it. 'rd_attnres+two_phase', 'rd_attnres+fused': its reads computed
    in two phases or by the fused op (fast_read/) instead of the plain read."""
    torch.manual_seed(cfg['seed'])
    residual, _, variant = mode.partition('+')
    model = build_model(dict(cfg, residual=residual, depth_read=variant or 'plain')).to(device)
    optimizer = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), device.split(':')[0])
    options = dict(backend=counted(cfg['backend'], mode))
    runner = compile_model(model, **options) if cfg['compile'] else model   # as train.py
    return model, runner, optimizer


GRAPHS = {}   # mode -> the graphs dynamo has handed to the backend for it so far


def counted(backend, mode):
    """torch.compile's backend, counting each graph it is given under the mode's name: a mode that fell back to
    eager (no graph) or compiled again while it was timed is a failed measurement, said and not reported."""
    from torch._dynamo import lookup_backend

    def compile_graph(gm, example_inputs):
        GRAPHS[mode] = GRAPHS.get(mode, 0) + 1
        return lookup_backend(backend)(gm, example_inputs)
    return compile_graph


def make_step(runner, optimizer, x, y, device, ptdtype):
    def step():
        with torch.autocast(device.split(':')[0], dtype=ptdtype, enabled=ptdtype != torch.float32):
            _, loss = runner(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.startswith('cuda'):
            torch.cuda.synchronize(device)   # the device we were given, not the current one
    return step


def bench_data(cfg):
    """Host time of train.py's data work for one optimizer step: the step's windows from the seed-keyed
    order (step_windows) and this rank's micro-batches cut out of the tokens (get_windows). The tokens
    are an untouched in-memory array of data_windows windows (its pages read as zeros without any I/O),
    i.e. a token file already in the page cache: what is timed is the loop's own work, not the disk."""
    import numpy as np
    from train import get_windows
    from train import step_windows
    T, B, world = cfg['block_size'], cfg['batch_size'], cfg['data_ranks']
    windows_per_step = 2 ** 19 // T
    data = np.zeros(cfg['data_windows'] * T + 1, dtype=np.uint16)
    times, cpu_times = [], []
    for step in range(cfg['data_steps']):
        t0, c0 = time.perf_counter(), time.process_time()
        windows = step_windows(step, cfg['data_windows'], windows_per_step, seed=1)
        mine = windows[:len(windows) // world]            # rank 0's share
        for micro in range(0, len(mine), B):
            get_windows(data, mine[micro:micro + B], T)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    rest = times[1:]
    epoch_steps = cfg['data_windows'] // windows_per_step
    print(f"data work per step, rank 0 of {world}: {windows_per_step} windows per step of 2^19 tokens, "
          f"{len(mine) // B} micro-batches of {B} x {T}, {cfg['data_windows']:,} windows of data")
    print(f"first step {1000 * times[0]:.1f} ms (it builds the epoch's permutation, once per epoch); "
          f"the next {len(rest)} steps: median {1000 * statistics.median(rest):.2f} ms, "
          f"mean {1000 * statistics.mean(rest):.2f} ms, max {1000 * max(rest):.1f} ms; amortised over an epoch "
          f"({epoch_steps:,} steps): {1000 * (times[0] + (epoch_steps - 1) * statistics.mean(rest)) / epoch_steps:.2f} ms")
    print(f"CPU time of this process (what a busy machine's other work cannot inflate): first step "
          f"{1000 * cpu_times[0]:.1f} ms, then mean {1000 * statistics.mean(cpu_times[1:]):.2f} ms; amortised over "
          f"an epoch: {1000 * (cpu_times[0] + (epoch_steps - 1) * statistics.mean(cpu_times[1:])) / epoch_steps:.2f} ms")


def peak_memory_of(mode, argv):
    """Run this script for one mode in a fresh process and read back its peak memory in bytes. On CPU
    the probe keeps glibc's default allocator: the tuned one never gives memory back, so its peak
    measures fragmentation more than need."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, f'--probe={mode}',
                          '--cpu_malloc_tuning=False'], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def compile_probe(cfg, mode, device, x, y, ptdtype):
    """Child process of --compile_cost, with a fresh TORCHINDUCTOR_CACHE_DIR: the forward graphs dynamo
    captures (their nodes, summed), then the first compiled training step, the kernels inductor generated for
    it and where its compile time went (torch._dynamo.utils.compile_times: seconds summed over threads)."""
    import torch._dynamo
    from torch._dynamo.utils import compile_times
    from torch._inductor import metrics
    model, _, optimizer = build(dict(cfg, compile=False), mode, device)
    nodes = []

    def count_nodes(gm, example_inputs):
        nodes.append(len(gm.graph.nodes))
        return gm
    compile_model(model, backend=count_nodes)(x, y)
    torch._dynamo.reset()
    metrics.reset()
    step = make_step(compile_model(model), optimizer, x, y, device, ptdtype)
    t0 = time.perf_counter()
    step()
    first_step = time.perf_counter() - t0
    names, seconds = compile_times(repr='csv', aggregate=True)
    phases = dict(zip(names, (float(s) for s in seconds)))
    print(json.dumps(dict(mode=mode, n_layer=cfg['n_layer'], graph_nodes=sum(nodes), first_step_s=first_step,
                          kernels=metrics.generated_kernel_count,
                          kernel_libraries_built=kernel_libraries(os.environ['TORCHINDUCTOR_CACHE_DIR']),
                          kernel_build_s=phases.get('compile_file'), codegen_s=phases.get('Scheduler.codegen'),
                          lowering_s=phases.get('GraphLowering.run'))))


def kernel_libraries(cache_dir):
    """The kernels inductor built on CPU: one shared library (.so) each, anywhere under its cache folder."""
    return sum(f.endswith('.so') for _, _, files in os.walk(cache_dir) for f in files)


def compile_cost(cfg, argv, modes):
    """--compile_cost: each mode compiled cold in a process of its own (nothing shared through memory or
    disk), one after the other."""
    import tempfile
    print(f"cold compile, first training step: {cfg['n_layer']} layers x {cfg['n_embd']}, context {cfg['block_size']}, "
          f"batch {cfg['batch_size']}, S={cfg['attnres_block_size']}, torch {torch.__version__}")
    print("| mode | layers | first step s | forward graph nodes (all graphs) | kernels generated | kernel libraries built "
          "| kernel build s (summed over workers) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode in modes:
        with tempfile.TemporaryDirectory() as cache:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, f'--compile_probe={mode}'],
                                 capture_output=True, text=True, env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache))
        if out.returncode != 0:
            raise SystemExit(f"compiling {mode} failed:\n{out.stderr[-3000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        build_s = '-' if r['kernel_build_s'] is None else f"{r['kernel_build_s']:.1f}"
        print(f"| {mode} | {r['n_layer']} | {r['first_step_s']:.1f} | {r['graph_nodes']:,} | {r['kernels']} "
              f"| {r['kernel_libraries_built']} | {build_s} |", flush=True)
        if cfg['json']:
            append_jsonl(cfg['json'], [dict(r, config=cfg)])


def append_jsonl(path, rows):
    """--json: one JSON object per row, appended to path."""
    with open(path, 'a') as f:
        f.write(''.join(json.dumps(r) + '\n' for r in rows))


def peak_rss():
    # VmHWM: this process's peak resident set. (getrusage's ru_maxrss would not do: Linux keeps it
    # across exec, so a child would report its parent's peak.)
    with open('/proc/self/status') as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith('VmHWM:'))


def bench_checkpoint(cfg):
    """What the checkpoint checksum costs: a checkpoint of this shape (model + both AdamW moments, as
    train.py saves it), hashed as save_checkpoint and load_checkpoint do, against writing it."""
    import tempfile
    from run_kit.run_files import CHECKPOINT, content_digest
    model = build_model(dict(cfg, residual='rd_attnres', depth_read='plain'))
    state = dict(model=model.state_dict(),
                 optimizer=dict(state={i: dict(step=torch.tensor(1.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                                       for i, p in enumerate(model.parameters())}))
    size = sum(t.numel() * t.element_size() for part in (state['model'], *state['optimizer']['state'].values())
               for t in part.values())
    t0 = time.perf_counter()
    content_digest(state)
    hashed = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(dir='.') as d:
        t0 = time.perf_counter()
        torch.save(state, os.path.join(d, CHECKPOINT))
        saved = time.perf_counter() - t0
    print(f"checkpoint of {model.get_num_params() / 1e6:.1f}M parameters + AdamW: {size / 1e9:.2f} GB; "
          f"checksum {hashed:.2f} s ({size / hashed / 1e9:.2f} GB/s), torch.save to disk {saved:.2f} s")


def read_bytes_per_token(model):
    """Bytes the depth reads of one training step move per token with the plain read, if each read's
    kernels are fused as far as the math allows (what torch.compile approaches): a read of R routes over N
    float32 sources of width d reads every source twice forward (scores, weighted sum) and writes R
    outputs; backward reads every source twice (the dots with the output gradients, the pseudo-queries'
    gradient), reads the R output gradients twice per source (the dots, the source's gradient) and writes
    each source's gradient."""
    d = model.config.n_embd
    return sum(4 * d * (N * (2 + 2 + 1 + 2 * R) + R) for _, R, N in model.read_point_sizes())


def two_phase_bytes_per_token(model):
    """The same with the two-phase read (fast_read/two_phase_read.py), per phase, under the same fusion assumption:
    phase 1, once per block for its R_b routes over the padded finished sources (ceil(L / S) slots: the
    padding is read like a source), reads each source once forward (scores and weighted sum in one
    online-softmax pass) and writes the state, R_b x (d + 2) floats (u, the running max, the denominator);
    backward reads the state's gradient and each source twice (its scores again, then its gradient's dots)
    and writes each source's gradient. Phase 2, at each sublayer for its R routes, reads the partial (none
    at a block's first sublayer) and the state, writes h; backward reads h's gradient, the state and the
    partial, and writes the state's and the partial's gradients. The final read is one more phase 1 (one
    route) with the last block merged in by a phase 2. Returns (phase 1 bytes, phase 2 bytes)."""
    cfg = model.config
    d, S, L = cfg.n_embd, cfg.attnres_block_size, 2 * cfg.n_layer
    slots = math.ceil(L / S)
    routes = {l: R for l, R, _ in model.read_point_sizes()}

    def phase1(R):
        state = R * (d + 2)
        return 4 * (slots * d + state) + 4 * (state + 2 * slots * d + slots * d)

    def phase2(R, partial):
        return (4 * (partial + R * (d + 2) + R * d) +                                   # forward
                4 * (R * d + R * (d + 2) + partial + R * (d + 2) + partial))            # backward
    blocks = [range(first, min(first + S, L)) for first in range(0, L, S)]
    return (sum(phase1(sum(routes[l] for l in block)) for block in blocks) + phase1(routes[L]),
            sum(phase2(routes[l], d if l > block[0] else 0) for block in blocks for l in block) + phase2(routes[L], d))


def fused_bytes_per_token(model):
    """The same with the fused read (fast_read/fused_read.py) as its kernels are written: per AttnRes block, one
    finished_read over the block's N_b finished sources for all R_b routes of its reads. Forward: the routes
    in groups (fused_read.route_groups: 8 a program at d = 1024, all of them at d <= 256), each group reading
    every source once, writing its outputs; backward: gh . h per route (reads R_b outputs and gradients),
    then per source one read of it and of every route's output gradient (N_b R_b), its gradient written once
    (the routes summed in registers). Each later read of the block merges the partial (merge_partial,
    compiled around the op): forward reads its R outputs and the partial and writes R; backward reads R
    gradients, R outputs and the partial, writes R gradients and the partial's. The final read is one more
    finished_read (one route). Returns (finished_read bytes, merge bytes)."""
    cfg = model.config
    d, S, L = cfg.n_embd, cfg.attnres_block_size, 2 * cfg.n_layer
    routes = {l: R for l, R, _ in model.read_point_sizes()}
    per_group = max(1, 8192 // 2 ** math.ceil(math.log2(d)))   # (fused_read.route_groups without Triton)

    def finished(N, R):
        return 4 * d * (N * math.ceil(R / per_group) + R) + 4 * d * (2 * R + N * (1 + R + 1))

    def merge(R):
        return 4 * d * ((2 * R + 1) + (3 * R + 2))
    blocks = [range(first, min(first + S, L)) for first in range(0, L, S)]
    return (sum(finished(1 + k, sum(routes[l] for l in block)) for k, block in enumerate(blocks))
            + finished(1 + len(blocks), routes[L]),
            sum(merge(routes[l]) for block in blocks for l in block if l > block[0]))


def traffic_model(cfg):
    """The depth reads' predicted overhead on a GPU: their bytes at its memory bandwidth, against the
    backbone's FLOPs at its peak and an MFU. An estimate, not a measurement (scripts/gpu_check.py
    measures the real overhead beside it)."""
    shapes = {'120m': dict(n_layer=12, n_head=12, n_embd=768, attnres_block_size=4),
              '343m': dict(n_layer=24, n_head=16, n_embd=1024, attnres_block_size=6)}
    peak = cfg['peak_flops'] or H100_PEAK_FLOPS
    bw = cfg['bandwidth'] * cfg['bandwidth_efficiency']
    print(f"depth-read traffic per training token (an estimate): float32 sources, fused kernels, "
          f"{cfg['bandwidth'] / 1e12:g} TB/s x {cfg['bandwidth_efficiency']:g}, backbone at {peak / 1e12:g} TFLOP/s x "
          f"{100 * cfg['mfu']:g}% MFU, context 1024")
    print("| shape | mode | read | MB per 1,000 tokens (two-phase: phase 1 + phase 2; fused: op + merges) | backbone GFLOP/token | predicted overhead |")
    print("|---|---|---|---:|---:|---:|")
    rows = []
    for name, shape in shapes.items():
        for mode in ('attnres', 'rd_attnres'):
            with torch.device('meta'):
                model = build_model(dict(shape, block_size=1024, residual=mode))
            backbone = 6 * model.get_num_params() + 12 * shape['n_layer'] * shape['n_embd'] * 1024
            one, two = two_phase_bytes_per_token(model)
            op, merges = fused_bytes_per_token(model)
            for read, nbytes, detail in (('plain', read_bytes_per_token(model), ''),
                                         ('two_phase', one + two, f" ({one * 1000 / 1e6:,.1f} + {two * 1000 / 1e6:,.1f})"),
                                         ('fused', op + merges, f" ({op * 1000 / 1e6:,.1f} + {merges * 1000 / 1e6:,.1f})")):
                overhead = (nbytes / bw) / (backbone / (peak * cfg['mfu']))
                rows.append(dict(shape=name, mode=mode, read=read, bytes_per_token=nbytes, backbone_flops_per_token=backbone,
                                 predicted_overhead=overhead, **({'two_phase': dict(phase1=one, phase2=two),
                                                                  'fused': dict(finished_read=op, merges=merges)}.get(read, {}))))
                print(f"| {name} | {mode} | {read} | {nbytes * 1000 / 1e6:,.1f}{detail} | {backbone / 1e9:.3f} | "
                      f"{100 * overhead:.1f}% |")
    if cfg['json']:
        append_jsonl(cfg['json'], rows)
    return rows


def main(argv):
    cfg = configure(DEFAULTS, argv)
    if cfg['traffic']:
        return traffic_model(cfg)
    if cfg['data']:
        return bench_data(cfg)
    if cfg['checkpoint']:
        return bench_checkpoint(cfg)
    device = resolve_device(cfg['device'])
    if device == 'cpu' and cfg['cpu_malloc_tuning']:
        tune_cpu_allocator()
    _, ptdtype = resolve_dtype(cfg['dtype'], device.split(':')[0])
    torch.backends.cuda.matmul.allow_tf32 = True
    g = torch.Generator().manual_seed(cfg['seed'])
    data = torch.randint(0, VOCAB_SIZE, (cfg['batch_size'], cfg['block_size'] + 1), generator=g).to(device)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    if cfg['compile_probe']:
        return compile_probe(cfg, cfg['compile_probe'], device, x, y, ptdtype)
    if cfg['probe']:  # child process: warm up, a few steps, report the peak
        model, runner, optimizer = build(cfg, cfg['probe'], device)
        step = make_step(runner, optimizer, x, y, device, ptdtype)
        for _ in range(cfg['warmup'] + 1):
            step()
        if device.startswith('cuda'):
            print(torch.cuda.max_memory_allocated(device))
        else:
            print(peak_rss())
        return

    modes = cfg['modes'].split(',')
    unknown = [m for m in modes if m.partition('+')[0] not in RESIDUAL_MODES
               or m.partition('+')[2] not in ('', 'two_phase', 'fused') or m.startswith('standard+')]
    if unknown:
        raise SystemExit(f"unknown modes {unknown}; choose from {', '.join(RESIDUAL_MODES)}, a depth-routed one "
                         "optionally with +two_phase or +fused (its reads computed in two phases, or fused)")
    if cfg['compile_cost']:
        return compile_cost(cfg, argv, modes)
    tokens = cfg['batch_size'] * cfg['block_size']
    print(f"bench: {cfg['n_layer']} layers x {cfg['n_embd']}, context {cfg['block_size']}, batch {cfg['batch_size']}, "
          f"S={cfg['attnres_block_size']}, {device} {cfg['dtype']}, {'compiled' if cfg['compile'] else 'eager'}, "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs, threads {torch.get_num_threads()}"
          + (f", cpu_malloc_tuning={cfg['cpu_malloc_tuning']}" if device == 'cpu' else ''))
    cuda = device.startswith('cuda')
    # CPU: the peak RSS of a fresh process per mode. CUDA: measured here, per mode, as the peak of the
    # allocator during the mode's warm-up minus what was allocated before its model was built (no
    # fresh process, so no second compilation).
    memory = {m: peak_memory_of(m, argv) for m in modes} if cfg['memory'] and not cuda else {}
    if cfg['compile']:   # a fallback to eager is an error, not a silent slow row
        torch._dynamo.config.recompile_limit = cfg['recompile_limit']
        torch._dynamo.config.accumulated_recompile_limit = max(256, 8 * cfg['recompile_limit'])
        torch._dynamo.config.fail_on_recompile_limit_hit = True
    models, steps, first_step = {}, {}, {}
    for mode in modes:
        if cuda:
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        models[mode] = build(cfg, mode, device)
        steps[mode] = make_step(models[mode][1], models[mode][2], x, y, device, ptdtype)
        for _ in range(cfg['warmup']):       # the first one includes compilation under --compile
            t0 = time.perf_counter()
            try:
                steps[mode]()
            except torch._dynamo.exc.FailOnRecompileLimitHit:
                raise SystemExit(f"{mode}: torch.compile reached dynamo's recompile limit ({cfg['recompile_limit']} "
                                 f"graphs per function) and would run eager: raise --recompile_limit or bench fewer "
                                 "modes in one process") from None
            first_step.setdefault(mode, time.perf_counter() - t0)
        if cuda and cfg['memory']:
            memory[mode] = torch.cuda.max_memory_allocated(device) - before
    compiled = dict(GRAPHS)
    times = {m: [] for m in modes}          # times[mode][round] = the timed steps of that round
    for r in range(cfg['rounds']):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for mode in order:
            times[mode].append([])
            for _ in range(cfg['steps']):
                t0 = time.perf_counter()
                steps[mode]()
                times[mode][-1].append(time.perf_counter() - t0)
    peak = cfg['peak_flops'] or detect_peak_flops(device)
    if cfg['compile']:
        eager = [m for m in modes if not compiled.get(m)]
        again = [f"{m} ({GRAPHS[m] - compiled.get(m, 0)} graphs)" for m in modes if GRAPHS.get(m, 0) != compiled.get(m, 0)]
        if eager or again:
            raise SystemExit("not a compiled measurement: " + '; '.join(
                ([f"ran eager (no graph compiled): {', '.join(eager)}"] if eager else []) +
                ([f"compiled again while timed: {', '.join(again)}"] if again else [])))

    def ratio(mode, ref):
        # the median over rounds of the per-round ratio: load that drifts between rounds cancels out
        if ref not in times:
            return None
        return statistics.median(statistics.median(a) / statistics.median(b) for a, b in zip(times[mode], times[ref]))

    rows = []
    for mode in modes:
        model = models[mode][0]
        flat = [t for rnd in times[mode] for t in rnd]
        dt = statistics.median(flat)
        row = dict(mode=mode, step_ms=1000 * dt, tok_per_s=tokens / dt, params=model.get_num_params(),
                   flops_per_token=model.flops_per_token(cfg['block_size']),
                   mfu=model.estimate_mfu(tokens, dt, peak, cfg['block_size']) if peak else None,
                   time_vs_standard=ratio(mode, 'standard'),
                   time_vs_attnres=ratio(mode, 'attnres'), time_vs_plain=ratio(mode, mode.partition('+')[0]),
                   peak_mem_mb=memory[mode] / 2 ** 20 if memory else None,
                   mem_vs_standard=memory[mode] / memory['standard'] if memory and 'standard' in memory else None,
                   spread_ms=[1000 * min(flat), 1000 * max(flat)],
                   first_step_s=first_step.get(mode), graphs=compiled.get(mode) if cfg['compile'] else None, config=cfg)
        rows.append(row)
    fmt = lambda v, f: '-' if v is None else format(v, f)  # noqa: E731
    print("| mode | step ms (median) | min–max ms | tok/s | × standard | × attnres | GFLOP/token | MFU | peak MB "
          "| mem × standard | first step s | graphs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['step_ms']:.0f} | {r['spread_ms'][0]:.0f}–{r['spread_ms'][1]:.0f} | {r['tok_per_s']:,.0f} "
              f"| {fmt(r['time_vs_standard'], '.3f')} | {fmt(r['time_vs_attnres'], '.3f')} "
              f"| {r['flops_per_token'] / 1e9:.3f} | {fmt(r['mfu'] and 100 * r['mfu'], '.1f')}{'%' if r['mfu'] else ''} "
              f"| {fmt(r['peak_mem_mb'], ',.0f')} | {fmt(r['mem_vs_standard'], '.3f')} | {fmt(r['first_step_s'], '.1f')} "
              f"| {fmt(r['graphs'], 'd')} |")
    if cfg['json']:
        append_jsonl(cfg['json'], rows)


if __name__ == '__main__':
    main(sys.argv[1:])
