"""
The GPU check: one command that measures, on the machine it runs on, what the project says about the paper's
runs, and fails where a claim does not hold. Offline: its data is made from this repository's own bytes.

    python scripts/gpu_check.py                 # every visible GPU: about 10 minutes on 1 GPU, 15 on 8
    python scripts/gpu_check.py --only train,resume      # some of the checks
    python scripts/gpu_check.py --tiny          # the same checks at a tiny shape on the CPU: its plumbing (CI)

The checks, in this order (each one's numbers are written as soon as it ends, so a run cut short keeps them):
  train       train.py at the rd_343m shape for a few dozen steps with gradient accumulation (> 1 micro-step), on
              every GPU (torchrun when there are 2 or more), compiled and eager: their losses within LOSS_TOL at
              every logged step; the ranks' parameters equal at the last step (train.py checks it at every
              checkpoint and stops if they differ); step time, tokens/s and MFU of the compiled run
  resume      the compiled run again, SIGTERM at a log step, then --init_from=auto: the same data order (the
              windows' fingerprints, exactly) and losses within LOSS_TOL of the uninterrupted run
  checkpoint  the save of a 343m checkpoint (model + AdamW, from the device): seconds and host memory, its load;
              the lead time a preemption signal needs and the time per paper run these imply
  bench_343m  bench.py at the 343m shape, micro-batch 16: standard, rd_attnres with the plain read and with the
              two-phase read compiled per AttnRes block; peak memory (does batch_size=16 fit?), and the verdict:
              which read the paper configs should use
  bench_120m  bench.py, all nine modes compiled in one process at the 120m shape: step time, tokens/s, MFU,
              peak memory and the graphs dynamo compiled for each (a mode that ran eager or compiled again fails)

Writes OUT/gpu_check.json and OUT/gpu_check.md (the table docs/gpus.md takes); exit status 1 if a check failed.
--tiny runs train.py eager (inductor's CPU compile of the tiny model would take minutes; the compiled path on
the CPU is tested by tests/test_compiled_read.py) and bench.py with dynamo's graphs run by the eager backend.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

LOSS_TOL = 0.05   # |loss compiled - loss eager| (nats) at every logged step, bf16 on a GPU; exact on the CPU
SHAPES = {   # the paper's two shapes, and the tiny one of --tiny
    '343m': ['--n_layer=24', '--n_head=16', '--n_embd=1024', '--block_size=1024', '--attnres_block_size=6'],
    '120m': ['--n_layer=12', '--n_head=12', '--n_embd=768', '--block_size=1024', '--attnres_block_size=4'],
    'tiny': ['--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--attnres_block_size=2'],
}
ALL_MODES = 'standard,attnres,rd_attnres,attnres+two_phase,rd_attnres+two_phase,ctrl_params,ctrl_dup,ctrl_fixed_v,ctrl_heads'
CHECKS = ('train', 'resume', 'checkpoint', 'bench_343m', 'bench_120m')


def make_data(data_dir):
    """data_dir/gpu_check/{train,val}.bin from the bytes of this repository's text files, one token per byte:
    no tokenizer, no download. A loss that falls is all the check asks of it."""
    import numpy as np
    from prepare import TokenWriter, build_id
    chunks = []
    for folder, _, files in sorted(os.walk(HERE)):
        if any(part.startswith('.') or part in ('data', 'gpu_check', 'out') for part in os.path.relpath(folder, HERE).split(os.sep)):
            continue
        chunks += [open(os.path.join(folder, f), 'rb').read() for f in sorted(files) if f.endswith(('.py', '.md'))]
    tokens = np.frombuffer(b'\n'.join(chunks), dtype=np.uint8).astype(np.uint16)
    tokens = np.tile(tokens, max(1, 8_000_000 // len(tokens)))   # enough windows for 8 ranks' steps
    cut = len(tokens) * 19 // 20
    os.makedirs(os.path.join(data_dir, 'gpu_check'), exist_ok=True)
    writers = [TokenWriter(os.path.join(data_dir, 'gpu_check', f'{split}.bin')) for split in ('train', 'val')]
    for w, part in zip(writers, (tokens[:cut], tokens[cut:])):
        w.write(part)
    data_id = build_id(*(w.digest.digest() for w in writers))
    for w in writers:
        w.finish(data_id)
        w.commit()


def read_rows(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        rows = [json.loads(line) for line in f]
    return {r['step']: r for r in rows if 'train_loss' in r}


class Check:
    """The machine, the shapes and the launcher of one run of the check."""

    def __init__(self, args):
        import torch
        self.tiny, self.out = args.tiny, os.path.abspath(args.out)
        self.gpus = 0 if args.tiny else torch.cuda.device_count()
        if not self.tiny and self.gpus < 1:
            raise SystemExit("no CUDA GPU visible: run this check on a GPU machine, or --tiny for its CPU plumbing")
        self.world = 2 if self.tiny else self.gpus   # --tiny: two processes (gloo), as two GPUs would be used
        self.device = 'cpu' if self.tiny else 'cuda'
        self.results = dict(machine=self.machine(), tiny=self.tiny, checks={})
        self.env = dict(os.environ, OMP_NUM_THREADS='1' if self.tiny else os.environ.get('OMP_NUM_THREADS', '8'),
                        TORCHINDUCTOR_CACHE_DIR=os.environ.get('TORCHINDUCTOR_CACHE_DIR', os.path.join(self.out, 'inductor_cache')))

    def machine(self):
        import torch
        return dict(torch=torch.__version__, device=torch.cuda.get_device_name(0) if torch.cuda.is_available() and not self.tiny
                    else 'cpu', gpus=self.gpus, date=time.strftime('%Y-%m-%d'), host_cpus=os.cpu_count())

    def train_args(self, out_dir, steps, *extra):
        """train.py's command at the rd_343m shape (tiny: the tiny one), gradient accumulation of 2 micro-steps."""
        batch, shape = (4, SHAPES['tiny']) if self.tiny else (16, SHAPES['343m'])
        T = int(shape[3].split('=')[1])
        launcher = ([sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={self.world}']
                    if self.world > 1 else [sys.executable])
        return [*launcher, os.path.join(HERE, 'train.py'), os.path.join(HERE, 'config', 'rd_343m.py'), *shape,
                f'--batch_size={batch}', f'--total_batch_size={batch * T * self.world * 2}', f'--max_iters={steps}',
                f'--lr_decay_iters={steps}', '--warmup_iters=4', f'--eval_interval={steps}', '--log_interval=4',
                f'--eval_tokens={batch * T * self.world}', f'--eval_batch_size={batch}', '--dataset=gpu_check',
                f'--data_dir={self.out}/data', f'--out_dir={out_dir}', f'--device={self.device}',
                '--dtype=float32' if self.tiny else '--dtype=bfloat16', '--cpu_malloc_tuning=False', *extra]

    def train(self, out_dir, steps, compiled, *extra):
        p = subprocess.run(self.train_args(out_dir, steps, f'--compile={compiled and not self.tiny}', '--overwrite=True',
                                           *extra), capture_output=True, text=True, env=self.env, cwd=HERE)
        with open(out_dir + '.out', 'w') as f:
            f.write(p.stdout + p.stderr)
        if p.returncode != 0:
            raise CheckFailed(f"train.py ended with exit status {p.returncode}: {tail(p.stdout + p.stderr)} "
                              f"(all of it: {out_dir}.out)")
        return read_rows(out_dir)

    def save(self):
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, 'gpu_check.json'), 'w') as f:
            json.dump(self.results, f, indent=1)
        with open(os.path.join(self.out, 'gpu_check.md'), 'w') as f:
            f.write(markdown(self.results))


class CheckFailed(Exception):
    pass


def tail(text, n=3):
    return ' | '.join(line.strip() for line in text.strip().splitlines()[-n:])


def compare_losses(a, b, tol):
    """The logged steps' losses of two runs, and the largest difference; CheckFailed where they part by more
    than tol, or where their windows' fingerprints differ (another data order)."""
    if sorted(a) != sorted(b):
        raise CheckFailed(f"the runs logged different steps: {sorted(a)} vs {sorted(b)}")
    moved = [s for s in a if a[s]['data_hash'] != b[s]['data_hash']]
    if moved:
        raise CheckFailed(f"the data order differs at steps {moved}")
    worst = max(abs(a[s]['train_loss'] - b[s]['train_loss']) for s in a)
    if not worst <= tol:
        raise CheckFailed(f"losses part by {worst:.4f} nats, more than {tol}")
    return worst


STEPS = 24   # of a check's runs (--tiny: 16); a SIGTERM after step 4 stops one at step 8 or 12 (log_interval 4)


def check_train(c):
    steps = 16 if c.tiny else STEPS
    compiled = c.train(os.path.join(c.out, 'train_compiled'), steps, True)
    eager = c.train(os.path.join(c.out, 'train_eager'), steps, False)
    tol = 0.0 if c.tiny else LOSS_TOL
    worst = compare_losses(compiled, eager, tol)
    timed = [r for s, r in sorted(compiled.items()) if s > 4]   # (the first interval holds the compilation)
    dt = sorted(r['dt'] for r in timed)[len(timed) // 2]
    mfu = [r['mfu'] for r in timed if r.get('mfu')]
    return dict(processes=c.world, grad_accum=2, steps=steps, loss_compiled=compiled[steps]['train_loss'],
                loss_eager=eager[steps]['train_loss'], max_loss_difference=worst, tolerance=tol,
                step_s=dt, tok_per_s=timed[-1]['tok_per_s'], mfu=mfu[-1] if mfu else None,
                ranks_equal='checked by train.py at the last step' if c.world > 1 else 'one process')


def check_resume(c):
    steps = 16 if c.tiny else STEPS
    whole = (read_rows(os.path.join(c.out, 'train_compiled')) if 'loss_compiled' in c.results['checks'].get('train', {})
             else c.train(os.path.join(c.out, 'train_compiled'), steps, True))   # (the uninterrupted run, on this data)
    out_dir = os.path.join(c.out, 'resume')
    shutil.rmtree(out_dir, ignore_errors=True)   # (a log of an earlier check would be read as this run's)
    args = c.train_args(out_dir, steps, f'--compile={not c.tiny}')
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=c.env, cwd=HERE,
                            start_new_session=True)
    deadline = time.time() + 900
    while not os.path.exists(os.path.join(out_dir, 'log.jsonl')) or not any(
            s >= 4 for s in read_rows_safely(out_dir)):
        if proc.poll() is not None or time.time() > deadline:
            raise CheckFailed(f"the run to be stopped ended or stalled before step 4: {tail(proc.communicate()[0])}")
        time.sleep(0.2)
    t0 = time.time()
    os.kill(proc.pid, signal.SIGTERM)   # (torchrun forwards it to every rank)
    first = proc.communicate()[0]
    stop_s = time.time() - t0
    with open(out_dir + '.out', 'w') as f:
        f.write(first)
    if 'stopped by' not in first:
        raise CheckFailed(f"SIGTERM did not stop the run with a checkpoint: {tail(first)}")
    stopped_at = int(re.search(r'stopped by \S+ at step (\d+)', first).group(1))
    p = subprocess.run(args + ['--init_from=auto'], capture_output=True,
                       text=True, env=c.env, cwd=HERE)
    with open(out_dir + '.out', 'w') as f:
        f.write(first + '\n---- resumed with --init_from=auto\n' + p.stdout + p.stderr)
    if p.returncode != 0 or f'resumed at step {stopped_at}' not in p.stdout:
        raise CheckFailed(f"--init_from=auto did not resume at step {stopped_at}: {tail(p.stdout + p.stderr)}")
    worst = compare_losses(read_rows(out_dir), whole, 0.0 if c.tiny else LOSS_TOL)
    return dict(stopped_at=stopped_at, signal_to_exit_s=stop_s, max_loss_difference=worst,
                same_data_order=True, tolerance=0.0 if c.tiny else LOSS_TOL)


def read_rows_safely(out_dir):
    try:
        return read_rows(out_dir)
    except (OSError, ValueError):
        return {}


CHECKPOINT_PROBE = r"""
import json, os, sys, time, torch
sys.path.insert(0, sys.argv[1])
from model import GPT, GPTConfig
from run_kit.run_files import load_checkpoint, save_checkpoint
def peak():
    return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM:'))
shape, device, path = json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
model = GPT(GPTConfig(residual='rd_attnres', **shape)).to(device)
opt = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), device)
x = torch.zeros(1, 8, dtype=torch.long, device=device)
model(x, x)[1].backward(); opt.step()                      # AdamW's state exists, as in a run
state = dict(model=model.state_dict(), optimizer=opt.state_dict(), scaler=torch.amp.GradScaler(enabled=False).state_dict(),
             step=1, best_val_loss=1.0, config={}, rng={})
before = peak()
t0 = time.time(); save_checkpoint(state, path); save_s = time.time() - t0
saved_peak = peak() - before
t0 = time.time(); load_checkpoint(path); load_s = time.time() - t0
print(json.dumps(dict(bytes=os.path.getsize(path), save_s=save_s, load_s=load_s, host_peak_bytes=saved_peak)))
"""


def check_checkpoint(c):
    shape = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, attnres_block_size=2) if c.tiny else \
        dict(n_layer=24, n_head=16, n_embd=1024, block_size=1024, attnres_block_size=6)
    path = os.path.join(c.out, 'checkpoint_probe.pt')
    p = subprocess.run([sys.executable, '-c', CHECKPOINT_PROBE, HERE, json.dumps(shape), c.device, path],
                       capture_output=True, text=True, env=c.env)
    if os.path.exists(path):
        os.remove(path)
    if p.returncode != 0:
        raise CheckFailed(f"the checkpoint probe failed: {tail(p.stderr)}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    train = c.results['checks'].get('train', {})
    if train.get('tok_per_s') and not c.tiny:
        # the paper's 343m run: 3815 steps of 2**19 tokens on 8 GPUs, 16 checkpoints (config/rd_343m.py)
        # (tokens/s per GPU as measured here; the step's all-reduce over 8 GPUs is not in it)
        step_s = 2 ** 19 / (8 * train['tok_per_s'] / c.world)
        r['paper_step_s'] = step_s
        r['paper_run_h'] = (3815 * step_s + 16 * r['save_s']) / 3600
        # a signal is acted on at the next log step (log_interval = 10), which then writes a checkpoint
        r['preemption_lead_s'] = 10 * step_s + r['save_s']
    return r


def bench(c, shape, modes, rounds):
    name = f"bench_{shape}"
    jsonl = os.path.join(c.out, f'{name}.jsonl')
    if os.path.exists(jsonl):
        os.remove(jsonl)
    common = (['--device=cpu', '--dtype=float32', '--backend=eager', '--memory=False', '--batch_size=2']
              if c.tiny else ['--device=cuda', '--dtype=bfloat16', '--batch_size=16'])
    p = subprocess.run([sys.executable, os.path.join(HERE, 'bench.py'), *SHAPES['tiny' if c.tiny else shape],
                        *common, '--compile=True', f'--modes={modes}', f'--rounds={rounds}', '--warmup=2',
                        f'--json={jsonl}'], capture_output=True, text=True, env=c.env, cwd=HERE)
    with open(os.path.join(c.out, f'{name}.txt'), 'w') as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        raise CheckFailed(f"bench.py failed: {tail(p.stdout + p.stderr)}")
    rows = [json.loads(line) for line in open(jsonl)]
    return {r['mode']: dict(step_ms=r['step_ms'], tok_per_s=r['tok_per_s'], mfu=r['mfu'], peak_mem_gb=(
        r['peak_mem_mb'] / 1024 if r['peak_mem_mb'] else None), x_standard=r['time_vs_standard'],
        x_plain=r['time_vs_plain'], graphs=r['graphs'], first_step_s=r['first_step_s']) for r in rows}


def check_bench_343m(c):
    rows = bench(c, '343m', 'standard,rd_attnres,rd_attnres+two_phase', 1 if c.tiny else 3)
    two_phase = rows['rd_attnres+two_phase']['x_plain']
    read = 'two_phase' if two_phase < 0.98 else 'plain'   # (a 2% gain at least: within noise, the simpler read)
    return dict(modes=rows, verdict=dict(depth_read=read, two_phase_x_plain=two_phase, reason=(
        f"at the 343m shape the two-phase read's step is {two_phase:.3f}x the plain read's: the paper configs "
        f"should use depth_read='{read}'")))


def check_bench_120m(c):
    return dict(modes=bench(c, '120m', ALL_MODES, 1 if c.tiny else 3))


def markdown(results):
    m, checks = results['machine'], results['checks']
    f = lambda v, fmt: '-' if v is None else format(v, fmt)  # noqa: E731
    out = [f"GPU check, {m['date']}: {m['device']} x {max(m['gpus'], 1)}, torch {m['torch']}"
           + (" (--tiny: the CPU plumbing run, not a measurement)" if results['tiny'] else ''), '',
           '| check | result | numbers |', '|---|---|---|']
    for name in CHECKS:
        r = checks.get(name)
        if r is None:
            continue
        if 'failed' in r:
            out.append(f"| {name} | **failed** | {r['failed']} |")
        elif name == 'train':
            out.append(f"| train | ok | {r['processes']} process(es) x {r['grad_accum']} micro-steps, {r['steps']} steps: "
                       f"compiled vs eager within {r['max_loss_difference']:.4f} nats; step {r['step_s']:.3f} s, "
                       f"{r['tok_per_s']:,.0f} tok/s, MFU {f(r['mfu'] and 100 * r['mfu'], '.1f')}% |")
        elif name == 'resume':
            out.append(f"| resume | ok | SIGTERM at step {r['stopped_at']} (exit after {r['signal_to_exit_s']:.1f} s), "
                       f"resumed: same data order, losses within {r['max_loss_difference']:.4f} nats |")
        elif name == 'checkpoint':
            out.append(f"| checkpoint | ok | {r['bytes'] / 1e9:.2f} GB: save {r['save_s']:.1f} s, host peak "
                       f"+{r['host_peak_bytes'] / 1e9:.2f} GB, load {r['load_s']:.1f} s"
                       + (f"; paper run {r['paper_run_h']:.2f} h, preemption lead {r['preemption_lead_s']:.0f} s"
                          if 'paper_run_h' in r else '') + ' |')
        else:
            out.append(f"| {name} | ok | " + '; '.join(
                f"{mode}: {v['step_ms']:.0f} ms, {v['tok_per_s']:,.0f} tok/s, x std {f(v['x_standard'], '.3f')}, "
                f"MFU {f(v['mfu'] and 100 * v['mfu'], '.1f')}%, {f(v['peak_mem_gb'], '.1f')} GB, {v['graphs']} graphs"
                for mode, v in r['modes'].items()) + (f"; **{r['verdict']['reason']}**" if 'verdict' in r else '') + ' |')
    return '\n'.join(out) + '\n'


def main(argv):
    ap = argparse.ArgumentParser(prog='gpu_check.py', description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--tiny', action='store_true', help='the tiny shape on the CPU: the plumbing (CI)')
    ap.add_argument('--out', default='gpu_check', help='where the runs, gpu_check.json and gpu_check.md go')
    ap.add_argument('--only', default=','.join(CHECKS), help=f"some of: {', '.join(CHECKS)}")
    args = ap.parse_args(argv)
    only = args.only.split(',')
    unknown = [x for x in only if x not in CHECKS]
    if unknown:
        raise SystemExit(f"no check {unknown[0]!r}: choose from {', '.join(CHECKS)}")
    c = Check(args)
    os.makedirs(c.out, exist_ok=True)
    make_data(os.path.join(c.out, 'data'))
    for name in CHECKS:
        if name not in only:
            continue
        t0 = time.time()
        print(f"== {name}", flush=True)
        try:
            c.results['checks'][name] = globals()[f'check_{name}'](c)
        except CheckFailed as e:
            c.results['checks'][name] = dict(failed=str(e))
        c.results['checks'][name]['seconds'] = time.time() - t0
        c.save()
        print(json.dumps(c.results['checks'][name])[:2000], flush=True)
    print(markdown(c.results))
    failed = [n for n, r in c.results['checks'].items() if 'failed' in r]
    print(f"{os.path.join(c.out, 'gpu_check.json')}, {os.path.join(c.out, 'gpu_check.md')}: "
          + (f"FAILED: {', '.join(failed)}" if failed else "every check passed"))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
