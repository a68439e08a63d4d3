"""
The GPU check: one command that measures, on the machine it runs on, what the project says about the paper's
runs, and fails where a claim does not hold. It fits the window a GPU is lent for (--budget), and it cannot
pass what it did not check. Offline: its data is made from this repository's own bytes.

    python scripts/gpu_check.py                       # bench_343m then train, every visible GPU, within 9 minutes
    python scripts/gpu_check.py --only train,eager,resume,checkpoint --budget 12   # the rest, a second lease
    python scripts/gpu_check.py --only bench_120m     # all ten modes at 120m
    python scripts/gpu_check.py --steps 12 --shape 120m   # a shorter, smaller train path
    python scripts/gpu_check.py --preflight           # only the preflight: what this machine lacks
    python scripts/gpu_check.py --tiny                # the plumbing, at a tiny shape on the CPU (CI): no verdict

First a preflight (seconds): torch and CUDA, the packages, a C compiler and Python's headers (Triton builds
its kernels with them), free disk for the checkpoints, the data. Each missing piece is one line saying what
to do, and the checks that need it are skipped, named. Then the checks, in the order a user asks them (the
default plan: bench_343m, then train; the rest named with the command of a second lease); each one's result
is written to OUT/gpu_check.{json,md} as it ends, and the running child's output goes straight to its file
(OUT/<run>.out), so a run cut short keeps what it saw:
  bench_343m  bench.py at 343m, micro-batch 16: standard and rd_attnres with the fused and the plain read, compiled;
              peak memory, graphs per mode asserted, and the verdict: which read the paper configs should use
  train       train.py at the rd_343m shape (--shape), compiled, under torchrun on every GPU, also on one
              (--nproc_per_node=1: NCCL, DDP and compile-with-DDP's graph splitting run as in the paper's runs),
              gradient accumulation of 2 micro-steps: the graphs dynamo compiled, asserted (train and eval: one
              each for the whole model, 2 + one per pattern of sublayers for the two-phase read; none means it
              ran eager, and fails); the depth reads in float32 under bf16 (their dtypes recorded on the device);
              the ranks' parameters equal at the last step (train.py checks it at every checkpoint); step time,
              tokens/s and MFU; where the compile went (compile_seconds: torch's timers, recompiles and why);
              no checkpoint file (the checkpoint check measures saving)
  eager       the same run eager: its training losses and its evaluation losses (the compiled evaluation graph
              produces val_loss) within LOSS_TOL of the compiled run's at every logged step, the same windows
  resume      the eager run again, SIGTERM at a log step, then --init_from=auto: the same data order (the
              windows' fingerprints, exactly) and losses within LOSS_TOL of the uninterrupted eager run
  checkpoint  the save of a checkpoint of the shape (model + AdamW, from the device): its size, seconds, the
              host memory it takes above what the built model holds, its load; the preemption lead time
  bench_120m  bench.py, all ten modes compiled in one process at 120m (the longest: last, or --only)

Before each check its predicted time is set against what is left of the budget: a check that would not fit is
left, named, and a child still running when the budget ends is stopped (its whole process tree), the check
marked cut. Exit status: 0 when every check asked for ran and passed; 1 when one failed or was cut; 2 when
those that ran passed but some were not run (the budget, the preflight).

--tiny runs train.py with dynamo's graphs run by the eager backend (inductor's CPU compile of even the tiny
model takes minutes; tests/test_compiled_read.py covers it), on two gloo processes by default: it checks the
check's plumbing, its numbers are not measurements and it gives no verdict.
"""

import argparse
import ctypes
import functools
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time

STARTED = time.time()   # the budget counts from here, before torch is imported
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
from run_kit.run_files import CHECKPOINT, LOG, RunFileError, read_config, read_log   # noqa: E402  (the run's files, by their owner)

# |compiled - eager| (nats) of a logged training or evaluation loss, bf16 on a GPU: set for the rounding of two
# correct runs, not to catch reads in bf16, which no loss tolerance separates from that rounding in a few dozen
# steps; the reads' dtype is asserted instead (read_dtypes). Why this value: docs/gpus.md, "The loss tolerance".
LOSS_TOL = 0.01
TINY_TOL = 1e-4
SHAPES = {   # the paper's two shapes, and the tiny one of --tiny
    '343m': ['--n_layer=24', '--n_head=16', '--n_embd=1024', '--block_size=1024', '--attnres_block_size=6'],
    '120m': ['--n_layer=12', '--n_head=12', '--n_embd=768', '--block_size=1024', '--attnres_block_size=4'],
    'tiny': ['--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--attnres_block_size=2'],
}
ALL_MODES = 'standard,attnres,rd_attnres,attnres+two_phase,rd_attnres+two_phase,rd_attnres+fused,ctrl_params,ctrl_dup,ctrl_fixed_v,ctrl_heads'
CHECKS = ('bench_343m', 'train', 'eager', 'resume', 'checkpoint', 'bench_120m')   # in the order they run
DEFAULT_PLAN = ('bench_343m', 'train')   # what a user asks first; the rest: SECOND_LEASE
SECOND_LEASE = "python scripts/gpu_check.py --only train,eager,resume,checkpoint --budget 12"   # (eager needs train's run)
# interleaved in one process; the two-phase read (measured at 343m on 2026-12-04: 2.87x standard) is in bench_120m
BENCH_343M_MODES = 'standard,rd_attnres+fused,rd_attnres'
READS = ('fused', 'two_phase')   # the depth reads the verdict weighs against the plain read, where the bench ran them

# Predicted seconds of each check, its cold compile included: (fixed, per training step). GPU: set from what
# one H200 measured (PLANNED_FROM; docs/gpus.md, "Measured" and "The GPU check"). tiny: about 1.5x what the
# CPU plumbing run measured (docs/gpus.md), so that a loaded CI machine does not flake.
PLANNED_FROM = 'one NVIDIA H200, torch 2.11.0+cu130, 2026-12-04'
PREDICTED = {
    'gpu': dict(bench_343m=(400, 0), train=(425, 0.27), eager=(60, 0.6), resume=(90, 1.2), checkpoint=(60, 0),
                bench_120m=(1000, 0)),
    'tiny': dict(bench_343m=(25, 0), train=(20, 0.3), eager=(15, 0.3), resume=(30, 0.6), checkpoint=(10, 0),
                 bench_120m=(40, 0)),
}
STOP_MARGIN = dict(gpu=30, tiny=5)   # seconds kept at the budget's end: stopping the running child (> GRACE), the table
GRACE = dict(gpu=20, tiny=3)         # seconds a child has after SIGTERM (a checkpoint may be in flight) before SIGKILL


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
    """A run's log, read by its owner (run_files.read_log: a torn last line of a cut run dropped, a bad line
    CheckFailed): (training rows, evaluation rows), each by step."""
    try:
        rows = read_log(os.path.join(out_dir, LOG))
    except SystemExit as e:   # (run_files' message: the file, the line, what to do)
        raise CheckFailed(str(e)) from None
    return ({r['step']: r for r in rows if 'train_loss' in r}, {r['step']: r for r in rows if 'val_loss' in r})


def read_rows_safely(out_dir):
    try:
        return read_rows(out_dir)[0]
    except (OSError, CheckFailed):
        return {}


# -----------------------------------------------------------------------------
# Children: each in a session of its own, its output straight into a file, its whole tree ended with it

def die_with_parent():
    """In the child, before exec: SIGTERM when this process dies, even by SIGKILL (Linux; elsewhere nothing).
    torchrun forwards it to its workers."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def descendants(pid):
    """Every live process below pid (children, their children, ...), read from /proc. torchrun starts each worker
    in a session of its own, so a process group does not hold them: the tree does."""
    parents = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open(f'/proc/{entry}/stat') as f:
                    parents.setdefault(int(f.read().rsplit(')', 1)[1].split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                pass   # (gone meanwhile)
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def kill_tree(proc, grace):
    """SIGTERM to proc and everything below it (train.py checkpoints and exits, torchrun forwards it), then
    SIGKILL to whatever is left after `grace` seconds. Returns once proc has exited."""
    tree = [proc.pid] + descendants(proc.pid)
    for pid in tree:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + grace
    while time.time() < deadline and (proc.poll() is None or any(alive(p) for p in tree[1:])):
        time.sleep(0.05)
    for pid in set(tree + descendants(proc.pid)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def alive(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


class CheckFailed(Exception):
    pass


class Skipped(Exception):
    """A check that could not run here: what it needs is missing (said in the table)."""


class OutOfTime(Exception):
    """The budget ended while a child ran: it was stopped, its output kept."""


class Interrupted(Exception):
    """SIGTERM or SIGHUP to the check itself."""


def tail(text, n=3):
    return ' | '.join(line.strip() for line in text.strip().splitlines()[-n:])


# -----------------------------------------------------------------------------
# The run of the check: the machine, its budget, its children

class Check:

    def __init__(self, args, gpus):
        self.args, self.tiny, self.out = args, args.tiny, os.path.abspath(args.out)
        self.kind = 'tiny' if self.tiny else 'gpu'
        self.gpus = gpus
        self.world = args.nproc or (2 if self.tiny else max(gpus, 1))   # --tiny: two gloo processes, as two GPUs
        self.device = 'cpu' if self.tiny else 'cuda'
        self.shape = 'tiny' if self.tiny else args.shape
        self.steps = args.steps or (16 if self.tiny else 24)
        self.batch = args.batch_size or (4 if self.tiny else 16)
        self.backend = args.backend or ('eager' if self.tiny else 'inductor')
        self.tol = TINY_TOL if self.tiny else LOSS_TOL
        self.started = STARTED
        self.deadline = self.started + 60 * args.budget - STOP_MARGIN[self.kind]
        self.children = []     # the running ones
        self.results = dict(machine=None, tiny=self.tiny, budget_min=args.budget, preflight=[], checks={})
        self.env = dict(os.environ, PYTHONUNBUFFERED='1',
                        OMP_NUM_THREADS='1' if self.tiny else os.environ.get('OMP_NUM_THREADS', '8'),
                        TORCHINDUCTOR_CACHE_DIR=os.environ.get('TORCHINDUCTOR_CACHE_DIR', os.path.join(self.out, 'inductor_cache')))

    def predicted(self, name):
        if name in self.args.predicted:
            return self.args.predicted[name]
        fixed, per_step = PREDICTED[self.kind][name]
        return fixed + per_step * self.steps

    def train_args(self, out_dir, compiled, *extra):
        """The command of a training run: train.py (under this script's child wrapper, which counts the graphs
        dynamo compiles) through torchrun on self.world processes, gradient accumulation of 2 micro-steps."""
        T = int(SHAPES[self.shape][3].split('=')[1])
        launcher = [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={self.world}']
        save = 'save' if os.path.basename(out_dir) == 'resume' else 'nosave'   # (the checkpoint check measures saving)
        return [*launcher, os.path.abspath(__file__), '--train_child', out_dir + '.graphs', self.backend, save,
                os.path.join(HERE, 'config', 'rd_343m.py'), *SHAPES[self.shape],
                f'--batch_size={self.batch}', f'--total_batch_size={self.batch * T * self.world * 2}',
                f'--max_iters={self.steps}', f'--lr_decay_iters={self.steps}', '--warmup_iters=4',
                f'--eval_interval={self.steps}', '--log_interval=4', f'--eval_tokens={self.batch * T * self.world}',
                f'--eval_batch_size={self.batch}', '--dataset=gpu_check', f'--data_dir={self.out}/data',
                f'--out_dir={out_dir}', f'--device={self.device}', '--dtype=float32' if self.tiny else '--dtype=bfloat16',
                '--cpu_malloc_tuning=False', f'--compile={compiled}',
                *([f'--depth_read={self.args.depth_read}'] if self.args.depth_read else []), *extra]

    def spawn(self, args, out_path, mode='w'):
        """A child in a session of its own (Ctrl-C reaches this script, which ends the tree), writing straight
        into out_path: what it printed is there even if it is killed."""
        with open(out_path, mode) as f:
            proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=self.env, cwd=HERE,
                                    start_new_session=True, preexec_fn=die_with_parent)
        self.children.append(proc)
        return proc

    def wait(self, proc, until=None):
        """Wait for proc to end: its exit status; or None as soon as until() holds. At the budget's end the
        whole tree is stopped and OutOfTime raised."""
        while proc.poll() is None:
            if until is not None and until():
                return None
            if time.time() > self.deadline:
                kill_tree(proc, GRACE[self.kind])
                self.children.remove(proc)
                raise OutOfTime()
            time.sleep(0.1)
        self.children.remove(proc)
        return proc.returncode

    def run(self, args, out_path, what):
        code = self.wait(self.spawn(args, out_path))
        if code != 0:
            raise CheckFailed(f"{what} ended with exit status {code}: {tail(open(out_path).read())} (all of it: {out_path})")

    def end_children(self):
        for proc in list(self.children):
            kill_tree(proc, GRACE[self.kind])
            self.children.remove(proc)

    def train(self, out_dir, compiled, *extra):
        """A training run from scratch: its rows, and the graphs and DDP its ranks reported."""
        remove_run(out_dir)   # (a log or graph count of an earlier check would be read as this run's)
        self.run(self.train_args(out_dir, compiled, '--overwrite=True', *extra), out_dir + '.out', 'train.py')
        return read_rows(out_dir), read_stats(out_dir + '.graphs')

    def save(self):
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, 'gpu_check.json'), 'w') as f:
            json.dump(self.results, f, indent=1)
        with open(os.path.join(self.out, 'gpu_check.md'), 'w') as f:
            f.write(markdown(self.results))


def remove_run(out_dir):
    """What an earlier run into out_dir left: its folder, its ranks' graph counts."""
    shutil.rmtree(out_dir, ignore_errors=True)
    folder, base = os.path.split(out_dir)
    for name in os.listdir(folder):
        if name.startswith(base + '.graphs.rank'):
            os.remove(os.path.join(folder, name))


def remove_weights(c):
    """Every checkpoint the checks write, once a check has ended however it ended."""
    for run in ('train_compiled', 'train_eager', 'resume'):
        remove_checkpoints(os.path.join(c.out, run))
    for name in os.listdir(c.out):
        if name.startswith('checkpoint_probe.pt'):
            os.remove(os.path.join(c.out, name))


def remove_checkpoints(out_dir):
    """A run's checkpoints once compared (4.24 GB each at 343m): the check leaves its logs, not its weights."""
    if os.path.isdir(out_dir):
        for name in os.listdir(out_dir):
            if name.startswith(CHECKPOINT):   # (and the temporary file of a write that was killed)
                os.remove(os.path.join(out_dir, name))


# -----------------------------------------------------------------------------
# The training child: train.py under torchrun, with dynamo's graphs counted

def train_child(stats_path, backend, save, argv):
    """train.py's main(argv) in this process (a torchrun worker), torch.compile given a backend that counts the
    graphs handed to it, and dynamo's own count of the graphs it captured. Writes stats_path.rank<R>.json:
    the graphs, the graph breaks, and what the model was wrapped in (DDP, its process group's backend).
    Unless save, no checkpoint file is written (4.24 GB at 343m, with its copy to the host); the ranks still
    compare their parameters at the last step, as before every save."""
    import torch
    import torch._dynamo
    from torch._dynamo import lookup_backend
    from torch._dynamo.utils import counters
    import train
    from run_kit import run_control, run_dir   # (train.py wraps the model in DDP through run_control.wrap_ddp)
    if not save:
        run_dir.save_checkpoint = lambda state, path: None
    calls = [0]

    def counting(gm, example_inputs):   # under DDP, once per bucket of the split graph
        calls[0] += 1
        return lookup_backend(backend)(gm, example_inputs)
    torch.compile = functools.partial(torch.compile, backend=counting)
    torch._dynamo.config.fail_on_recompile_limit_hit = True   # a recompile past the limit would run eager: an error
    wrapped = {}
    wrap_ddp = run_control.wrap_ddp

    def wrap(model, proc):
        m = wrap_ddp(model, proc)
        wrapped.update(wrapper=type(m).__name__, world=proc.world, pg_backend=(
            torch.distributed.get_backend() if torch.distributed.is_initialized() else None))
        return m
    run_control.wrap_ddp = wrap
    code, reads = 1, None
    try:
        code = train.main(argv)
        if os.environ.get('RANK', '0') == '0':   # the reads' dtypes under bf16, on this device (after the run: a
            from configurator import configure    # second model for a moment, not beside the run's)
            cfg = configure(train.DEFAULTS, argv)
            reads = read_dtypes(cfg, 'cpu' if cfg['device'] == 'cpu' else f"cuda:{os.environ.get('LOCAL_RANK', 0)}")
    finally:
        rank = os.environ.get('RANK', '0')
        with open(f'{stats_path}.rank{rank}.json', 'w') as f:
            json.dump(dict(graphs=counters['stats']['unique_graphs'], backend_calls=calls[0],
                           graph_breaks=sum(counters['graph_break'].values()), exit=code, read_dtypes=reads,
                           compile=compile_seconds(), **wrapped), f)
    return code


# Where a cold compile goes, by torch's own timers (torch._dynamo.utils.compilation_time_metrics: seconds summed over
# every frame compiled in the process). Their names are torch's internals: one a torch version no longer has reads
# None, and the check goes on.
COMPILE_PHASES = {'total': '_compile.compile_inner',             # dynamo's whole compile of a frame, backend included
                  'backend': 'OutputGraph.call_user_compiler',   # AOT autograd and inductor (or the eager backend)
                  'inductor': 'compile_fx.<locals>.fw_compiler_base',   # inductor's forward graph (backward: below)
                  'inductor_backward': 'compile_fx.<locals>.bw_compiler',
                  'kernels': 'async_compile.wait'}                # waiting on the kernels' builds (Triton, C++)


def compile_seconds():
    """{phase: seconds} of this process's compiles (COMPILE_PHASES, and dynamo's own: total less backend), the
    frames dynamo compiled, and its recompiles with why (torch's guard failures)."""
    from torch._dynamo import utils
    metrics = getattr(utils, 'compilation_time_metrics', {})
    out = {k: round(math.fsum(metrics[v]), 2) if metrics.get(v) else None for k, v in COMPILE_PHASES.items()}
    out['dynamo'] = (round(out['total'] - out['backend'], 2) if out['total'] is not None and out['backend'] is not None
                     else None)
    # a guard failure is "F/E: why": frame F's cache entry E did not fit the call. A call that fits none fails
    # against every entry there is, then compiles one more, so the entries that ever failed are the recompiles
    failed = {}
    for reasons in getattr(utils, 'guard_failures', {}).values():
        for r in reasons:
            failed.setdefault(str(r).partition(':')[0], str(r)[:200])
    out.update(frames=utils.counters['frames'].get('total', 0), recompiles=len(failed),
               recompile_reasons=list(failed.values())[:5])
    return out


def read_dtypes(cfg, device, dtype='bfloat16'):
    """The dtypes the depth reads compute in, on `device` under `dtype` autocast, for the model of a run's config
    (its shape and read), one forward of a short batch, eager: what reaches and leaves each read (model.read_sources,
    or the two-phase read's phase1 and phase2). model.py keeps them float32; a read in bf16 blurs the mixture of
    sources of very different scales, and no loss tolerance sees it in a few dozen steps (docs/gpus.md)."""
    import torch
    import model as model_py
    from fast_read import two_phase_read
    from run_kit.common import build_model
    seen = set()

    def recorded(module, name):
        fn = getattr(module, name)

        def wrapper(*args):
            out = fn(*args)
            seen.update(str(t.dtype) for t in flatten((args, out)) if t.is_floating_point())
            return out
        return fn, wrapper
    patched = [(module, name, *recorded(module, name)) for module, name in
               ((model_py, 'read_sources'), (two_phase_read, 'phase1'), (two_phase_read, 'phase2'))]
    try:
        for module, name, _, wrapper in patched:
            setattr(module, name, wrapper)
        keys = ('n_layer', 'n_head', 'n_embd', 'block_size', 'attnres_block_size', 'residual', 'depth_read')
        model = build_model({k: cfg[k] for k in keys}).to(device)
        x = torch.zeros(1, min(64, cfg['block_size']), dtype=torch.long, device=device)
        with torch.no_grad(), torch.autocast(device_type=torch.device(device).type, dtype=getattr(torch, dtype)):
            model(x, x)
    finally:
        for module, name, fn, _ in patched:
            setattr(module, name, fn)
    return sorted(seen)


def flatten(x):
    """The tensors in nested lists and tuples."""
    import torch
    if isinstance(x, torch.Tensor):
        return [x]
    return [t for item in x for t in flatten(item)] if isinstance(x, (list, tuple)) else []


def read_stats(stats_path):
    """The ranks' stats files, rank 0's first."""
    folder, base = os.path.split(stats_path)
    names = sorted((f for f in os.listdir(folder) if f.startswith(base + '.rank')), key=lambda f: int(f.split('rank')[1][:-5]))
    return [json.load(open(os.path.join(folder, f))) for f in names]


def graphs_per_shape(depth_read, n_layer, S):
    """The graphs one input shape and grad mode compile to, as designed: the whole model one; the two-phase read
    (fast_read/two_phase_read.py, compile_blocks) the embedding, the head with the loss, and one region per
    pattern of sublayers in an AttnRes block (a block opening on an MLP, a short last block: another pattern)."""
    from fast_read.two_phase_read import TWO_PHASE
    if depth_read != 'two_phase' or not TWO_PHASE:
        return 1
    L = 2 * n_layer
    return 2 + len({tuple(l % 2 == 0 for l in range(first, min(first + S, L))) for first in range(0, L, S)})


def graph_problem(stats, expected, world):
    """What is wrong with a compiled run's graphs and DDP (None: nothing): every rank under DDP on world
    processes, every rank with exactly the expected graphs (0: it ran eager; more: graph breaks or recompiles)."""
    if len(stats) != world:
        return f"{len(stats)} of {world} ranks reported their graphs"
    for rank, s in enumerate(stats):
        if s.get('wrapper') != 'DistributedDataParallel':
            return f"rank {rank} trained without DDP ({s.get('wrapper')})"
        if s['graphs'] == 0:
            return f"rank {rank} compiled no graph: the compiled run ran eager"
        if s['graphs'] != expected:
            return (f"rank {rank} compiled {s['graphs']} graphs, {expected} expected (train and eval); "
                    f"{s['graph_breaks']} graph breaks")
    return None


def reads_problem(dtypes):
    if not dtypes:
        return "the depth reads' dtypes were not recorded"
    if dtypes != ['torch.float32']:
        return f"the depth reads compute in {', '.join(dtypes)} under bf16 autocast, not float32 alone"
    return None


def compare_runs(a, b, tol, what):
    """The logged steps' losses of two runs (by step), and the largest difference; CheckFailed where they part by
    more than tol, or where their windows' fingerprints differ (another data order). what: 'train' or 'val'."""
    key, fingerprint = ('train_loss', 'data_hash') if what == 'train' else ('val_loss', 'data_digest')
    if sorted(a) != sorted(b):
        raise CheckFailed(f"the runs logged different {what} steps: {sorted(a)} vs {sorted(b)}")
    if not a:
        raise CheckFailed(f"no {what} rows to compare")
    moved = [s for s in a if a[s][fingerprint] != b[s][fingerprint]]
    if moved:
        raise CheckFailed(f"the data order differs at steps {moved}")
    worst = max(abs(a[s][key] - b[s][key]) for s in a)
    if not worst <= tol:
        raise CheckFailed(f"{what} losses part by {worst:.4f} nats, more than {tol}")
    return worst


def compare_losses(a, b, tol):   # (the training rows)
    return compare_runs(a, b, tol, 'train')


# -----------------------------------------------------------------------------
# The checks

def check_train(c):
    out_dir = os.path.join(c.out, 'train_compiled')
    (rows, val), stats = c.train(out_dir, True)
    remove_checkpoints(out_dir)
    cfg = read_config(out_dir)
    expected = 2 * graphs_per_shape(cfg['depth_read'], cfg['n_layer'], cfg['attnres_block_size'])
    problem = graph_problem(stats, expected, c.world) or reads_problem(stats[0]['read_dtypes'])
    if problem:
        raise CheckFailed(problem)
    timed = [r for s, r in sorted(rows.items()) if s > 4]   # (the first interval holds the compilation)
    if not timed:
        raise CheckFailed(f"no logged step after step 4 to time: run more --steps than {c.steps}")
    mfu = [r['mfu'] for r in timed if r.get('mfu')]
    return dict(launcher=f'torchrun --nproc_per_node={c.world}', processes=c.world, ddp=stats[0]['pg_backend'],
                grad_accum=2, steps=c.steps, depth_read=cfg['depth_read'], backend=c.backend,
                graphs=stats[0]['graphs'], graphs_expected=expected, backend_calls=stats[0]['backend_calls'],
                read_dtypes=stats[0]['read_dtypes'], compile=stats[0].get('compile'),
                loss=rows[c.steps]['train_loss'], val_loss=val[c.steps]['val_loss'],
                step_s=sorted(r['dt'] for r in timed)[len(timed) // 2], tok_per_s=timed[-1]['tok_per_s'],
                mfu=mfu[-1] if mfu else None, ranks_equal='checked by train.py at the last step')


def finished_rows(c, run, compiled):
    """A run of this check's command (OUT/<run>, compiled or not), from this run of the check or an earlier one
    into the same --out, its log complete: (training rows, evaluation rows), or None."""
    out_dir = os.path.join(c.out, run)
    try:
        cfg = read_config(out_dir)
        rows, val = read_rows(out_dir)
    except (OSError, CheckFailed, RunFileError):
        return None
    same = all(cfg.get(k) == v for k, v in (('max_iters', c.steps), ('batch_size', c.batch), ('world_size', c.world),
                                            ('compile', compiled), ('n_layer', int(SHAPES[c.shape][0].split('=')[1]))))
    return (rows, val) if same and c.steps in rows and c.steps in val else None


def check_eager(c):
    reference = finished_rows(c, 'train_compiled', True)
    if reference is None:
        raise Skipped("needs the train check's compiled run (run train first)")
    out_dir = os.path.join(c.out, 'train_eager')
    (rows, val), stats = c.train(out_dir, False)
    remove_checkpoints(out_dir)
    if any(s['graphs'] for s in stats):
        raise CheckFailed(f"the eager run compiled {stats[0]['graphs']} graphs")
    worst_train = compare_runs(reference[0], rows, c.tol, 'train')
    worst_val = compare_runs(reference[1], val, c.tol, 'val')
    return dict(processes=c.world, steps=c.steps, train_steps_compared=len(rows), val_steps_compared=len(val),
                max_train_difference=worst_train, max_val_difference=worst_val, tolerance=c.tol,
                loss=rows[c.steps]['train_loss'], val_loss=val[c.steps]['val_loss'])


def check_resume(c):
    whole = finished_rows(c, 'train_eager', False)
    if whole is None:
        raise Skipped("needs the eager check's run (run eager first)")
    whole = whole[0]
    out_dir = os.path.join(c.out, 'resume')
    remove_run(out_dir)
    args = c.train_args(out_dir, False)
    proc = c.spawn(args, out_dir + '.out')
    if c.wait(proc, until=lambda: any(s >= 4 for s in read_rows_safely(out_dir))) is not None:
        raise CheckFailed(f"the run to be stopped ended before step 4: {tail(open(out_dir + '.out').read())}")
    t0 = time.time()
    os.kill(proc.pid, signal.SIGTERM)   # (torchrun forwards it to every rank)
    c.wait(proc)
    stop_s = time.time() - t0
    first = open(out_dir + '.out').read()
    found = re.search(r'stopped by \S+ at step (\d+)', first)
    if not found:
        raise CheckFailed(f"SIGTERM did not stop the run with a checkpoint: {tail(first)}")
    stopped_at = int(found.group(1))
    with open(out_dir + '.out', 'a') as f:
        f.write('\n---- resumed with --init_from=auto\n')
    code = c.wait(c.spawn(args + ['--init_from=auto'], out_dir + '.out', mode='a'))
    second = open(out_dir + '.out').read()[len(first):]
    remove_checkpoints(out_dir)
    if code != 0 or f'resumed at step {stopped_at}' not in second:
        raise CheckFailed(f"--init_from=auto did not resume at step {stopped_at}: {tail(second)}")
    worst = compare_runs(read_rows(out_dir)[0], whole, c.tol, 'train')
    return dict(stopped_at=stopped_at, signal_to_exit_s=stop_s, max_loss_difference=worst, same_data_order=True,
                tolerance=c.tol)


CHECKPOINT_PROBE = r"""
import gc, json, os, sys, time, torch
sys.path.insert(0, sys.argv[1])
from model import GPT, GPTConfig
from run_kit.run_files import load_checkpoint, save_checkpoint
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith(key + ':'))
shape, device, path = json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
model = GPT(GPTConfig(residual='rd_attnres', **shape)).to(device)
opt = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), device)
x = torch.zeros(1, 8, dtype=torch.long, device=device)
model(x, x)[1].backward(); opt.step(); opt.zero_grad(set_to_none=True)   # AdamW's state exists, as in a run
del x; gc.collect()
state = dict(model=model.state_dict(), optimizer=opt.state_dict(), scaler=torch.amp.GradScaler(enabled=False).state_dict(),
             step=1, best_val_loss=1.0, config={}, rng={})
# the baseline: what this process holds with the model built (on a CPU, the model itself), its high-water mark
# reset to it ('5' > clear_refs), so that the peak below is the save's alone
with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')
baseline = status('VmRSS')
print(f"built: {baseline / 1e9:.2f} GB resident, high-water mark reset to it", flush=True)
t0 = time.time(); save_checkpoint(state, path); save_s = time.time() - t0
saved_peak = status('VmHWM') - baseline
print(f"saved in {save_s:.1f} s", flush=True)
t0 = time.time(); load_checkpoint(path); load_s = time.time() - t0
print(json.dumps(dict(bytes=os.path.getsize(path), save_s=save_s, load_s=load_s, host_baseline_bytes=baseline,
                      host_peak_bytes=saved_peak)))
"""


def check_checkpoint(c):
    shape = {k.lstrip('-'): int(v) for k, v in (a.split('=') for a in SHAPES[c.shape])}
    path = os.path.join(c.out, 'checkpoint_probe.pt')
    try:
        c.run([sys.executable, '-c', CHECKPOINT_PROBE, HERE, json.dumps(shape), c.device, path],
              os.path.join(c.out, 'checkpoint.out'), 'the checkpoint probe')
    finally:
        for p in (path, path + '.tmp'):
            if os.path.exists(p):
                os.remove(p)
    r = json.loads(open(os.path.join(c.out, 'checkpoint.out')).read().strip().splitlines()[-1])
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
    common = (['--device=cpu', '--dtype=float32', '--memory=False', '--batch_size=2']
              if c.tiny else ['--device=cuda', '--dtype=bfloat16', '--batch_size=16'])
    shape_args = SHAPES['tiny' if c.tiny else shape]
    c.run([sys.executable, os.path.join(HERE, 'bench.py'), *shape_args, *common, '--compile=True',
           f'--backend={c.backend}', f'--modes={modes}', f'--rounds={rounds}', '--warmup=2', f'--json={jsonl}'],
          os.path.join(c.out, f'{name}.out'), 'bench.py')
    rows = [json.loads(line) for line in open(jsonl)]
    S = {k.lstrip('-'): int(v) for k, v in (a.split('=') for a in shape_args)}
    wrong = []
    for r in rows:   # one training step's shape: the graphs of one shape, as designed
        expected = graphs_per_shape(r['mode'].partition('+')[2] or 'plain', S['n_layer'], S['attnres_block_size'])
        if r['graphs'] != expected:
            wrong.append(f"{r['mode']} compiled {r['graphs']} graphs, {expected} expected")
    if wrong:
        raise CheckFailed('; '.join(wrong))
    return {r['mode']: dict(step_ms=r['step_ms'], tok_per_s=r['tok_per_s'], mfu=r['mfu'], peak_mem_gb=(
        r['peak_mem_mb'] / 1024 if r['peak_mem_mb'] else None), x_standard=r['time_vs_standard'],
        x_plain=r['time_vs_plain'], graphs=r['graphs'], first_step_s=r['first_step_s']) for r in rows}


def check_bench_343m(c):
    rows = bench(c, '343m', BENCH_343M_MODES, 1 if c.tiny else 3)
    if c.tiny:   # CPU timings of a tiny model say nothing about which read a GPU should use
        return dict(modes=rows, verdict=None)
    return dict(modes=rows, verdict=read_verdict({r: rows[f'rd_attnres+{r}']['x_plain'] for r in READS
                                                   if f'rd_attnres+{r}' in rows}))


def read_verdict(x_plain):
    """Which depth read the paper configs should use, from each read's step as a multiple of the plain read's:
    the fastest, if it is at least 2% shorter (within noise: the plain read, the lesson's)."""
    fastest = min(x_plain, key=x_plain.get)
    read = fastest if x_plain[fastest] < 0.98 else 'plain'
    return dict(depth_read=read, **{f'{r}_x_plain': x for r, x in x_plain.items()}, reason=(
        "at the 343m shape the step of " + ", ".join(f"the {r.replace('_', '-')} read is {x:.3f}x"
                                                      for r, x in x_plain.items())
        + f" the plain read's: the paper configs should use depth_read='{read}'"))


def check_bench_120m(c):
    return dict(modes=bench(c, '120m', ALL_MODES, 1 if c.tiny else 3))


# -----------------------------------------------------------------------------
# What a check that did not end (cut, failed, interrupted) had measured: every number its output holds

RUN_OF = dict(train='train_compiled', eager='train_eager', resume='resume')


def lines_that_parse(path):
    """The JSON rows of a file a killed child may have left half-written: the whole lines only."""
    rows = []
    try:
        with open(path, errors='replace') as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict):
                    rows.append(row)
    except OSError:
        pass
    return rows


def numbers_so_far(c, name):
    """The numbers in what a check's child wrote before it ended: for a training run its log's rows (the last
    step, median step seconds after the first interval, tokens/s, MFU, the last losses, and the first interval's
    seconds: the cold compile); for a bench the modes its JSON lines hold. {} when there are none."""
    if name in RUN_OF:
        rows = [r for r in lines_that_parse(os.path.join(c.out, RUN_OF[name], LOG)) if isinstance(r.get('step'), int)]
        train = [r for r in rows if isinstance(r.get('train_loss'), (int, float))]
        val = [r for r in rows if isinstance(r.get('val_loss'), (int, float))]
        out = {}
        if train:
            first, timed = train[0], [r for r in train[1:] if isinstance(r.get('dt'), (int, float))]
            out.update(last_step=train[-1]['step'], loss=train[-1]['train_loss'])
            if isinstance(first.get('dt'), (int, float)):   # (the first interval holds the compile)
                out['first_interval_s'] = first['dt'] * first['step']
            if timed:
                out['step_s'] = sorted(r['dt'] for r in timed)[len(timed) // 2]
                out['tok_per_s'] = timed[-1].get('tok_per_s')
                mfu = [r['mfu'] for r in timed if isinstance(r.get('mfu'), (int, float))]
                out['mfu'] = mfu[-1] if mfu else None
        if val:
            out.update(val_loss=val[-1]['val_loss'], val_step=val[-1]['step'])
        return out
    if name.startswith('bench_'):
        modes = {r['mode']: dict(step_ms=r.get('step_ms'), mfu=r.get('mfu'), first_step_s=r.get('first_step_s'),
                                 x_standard=r.get('time_vs_standard'))
                 for r in lines_that_parse(os.path.join(c.out, f'{name}.jsonl')) if isinstance(r.get('mode'), str)}
        return dict(modes=modes) if modes else {}
    return {}


def numbers_line(n):
    """numbers_so_far's numbers in one table cell."""
    f = lambda v, fmt: '-' if not isinstance(v, (int, float)) else format(v, fmt)  # noqa: E731
    if 'modes' in n:
        return '; '.join(f"{escape(mode)}: {f(v['step_ms'], '.0f')} ms, MFU {f(v['mfu'] and 100 * v['mfu'], '.1f')}%, "
                         f"first step {f(v['first_step_s'], '.1f')} s" for mode, v in n['modes'].items())
    parts = []
    if 'last_step' in n:
        parts.append(f"reached step {n['last_step']}, loss {f(n['loss'], '.4f')}")
    if 'first_interval_s' in n:
        parts.append(f"first interval (the compile) {f(n['first_interval_s'], '.0f')} s")
    if 'step_s' in n:
        parts.append(f"step {f(n['step_s'], '.3f')} s, {f(n.get('tok_per_s'), ',.0f')} tok/s, "
                     f"MFU {f(n.get('mfu') and 100 * n['mfu'], '.1f')}%")
    if 'val_loss' in n:
        parts.append(f"val loss {f(n['val_loss'], '.4f')} at step {n['val_step']}")
    return '; '.join(parts)


def escape(text):
    """A name from a child's file, safe in a markdown table cell and a terminal."""
    return ''.join(ch if ch.isprintable() and ch != '|' else '?' for ch in str(text))[:80]


# -----------------------------------------------------------------------------
# The loss tolerance, measured: what LOSS_TOL must pass and what it must catch

def read_gap(out, steps=24, device='cpu'):
    """bf16 autocast training of a small rd_attnres model on the check's data, three ways from one initialisation
    and the same batches: the reference (depth reads in float32, as model.py computes them); the same with each
    step's batch in two micro-steps (the same sum in another order: the rounding noise two correct runs show,
    as compiled and eager kernels do); and the reads silently in bf16 (model.fp32 made a bf16 cast: the bug the
    tolerance must catch). Prints and returns the largest difference of each from the reference over the steps."""
    import numpy as np
    import torch
    import model as model_py
    from run_kit.common import build_model
    make_data(os.path.join(out, 'data'))
    tokens = np.fromfile(os.path.join(out, 'data', 'gpu_check', 'train.bin'), dtype=np.uint16)
    shape = dict(n_layer=4, n_head=4, n_embd=128, block_size=128, attnres_block_size=2)
    B, T = 8, shape['block_size']
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(tokens) - T - 1, size=(steps, B))
    batches = [torch.from_numpy(np.stack([tokens[s:s + T + 1] for s in row]).astype(np.int64)) for row in starts]
    fp32 = model_py.fp32

    def run(micro, reads_bf16):
        model_py.fp32 = (lambda x: x.to(torch.bfloat16)) if reads_bf16 else fp32
        try:
            torch.manual_seed(1)
            m = build_model(dict(shape, residual='rd_attnres', depth_read='plain')).to(device)
            opt = m.configure_optimizers(0.1, 3e-4, (0.9, 0.95), device)
            losses = []
            for step, batch in enumerate(batches):
                for g in opt.param_groups:
                    g['lr'] = 3e-4 * min(1.0, (step + 1) / 4)
                batch = batch.to(device)
                total = 0.0
                for part in batch.chunk(micro):
                    with torch.autocast(device_type=device, dtype=torch.bfloat16):
                        _, loss = m(part[:, :-1], part[:, 1:])
                    (loss / micro).backward()
                    total += loss.item() / micro
                torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(total)
            return losses
        finally:
            model_py.fp32 = fp32
    reference, reordered, bf16_reads = run(1, False), run(2, False), run(1, True)
    noise = max(abs(a - b) for a, b in zip(reference, reordered))
    gap = max(abs(a - b) for a, b in zip(reference, bf16_reads))
    print(f"read gap, {shape} batch {B}, {steps} steps, bf16 autocast on {device}, torch {torch.__version__}")
    print(f"losses (reference): first {reference[0]:.4f}, last {reference[-1]:.4f}")
    print(f"reordered sum (noise): max |difference| {noise:.5f} nats; per step: "
          + ' '.join(f"{abs(a - b):.4f}" for a, b in zip(reference, reordered)))
    print(f"reads in bf16 (the bug): max |difference| {gap:.5f} nats; per step: "
          + ' '.join(f"{abs(a - b):.4f}" for a, b in zip(reference, bf16_reads)))
    print(f"LOSS_TOL {LOSS_TOL}: passes the noise {'yes' if noise <= LOSS_TOL else 'NO'}, "
          f"catches the bf16 reads {'yes' if gap > LOSS_TOL else 'NO'}")
    return dict(noise=noise, gap=gap)


# -----------------------------------------------------------------------------
# The preflight: what this machine lacks, in the first seconds

PACKAGES = {   # package: (needed by these checks, what it is for)
    'numpy': (CHECKS, 'the data and every run'),
    'tiktoken': ((), "prepare.py's GPT-2 tokenizer (not the check: its data is bytes)"),
    'datasets': ((), "prepare.py's FineWeb-Edu download (not the check)"),
    'wandb': ((), 'wandb_log=True only (not the check)'),
}
COMPILED = ('train', 'eager', 'bench_343m', 'bench_120m')   # eager: compared with the compiled run


def preflight(c, torch_info, have=lambda name: importlib.util.find_spec(name) is not None, path=None,
              header=os.path.join(sysconfig.get_paths()['include'], 'Python.h'), free_bytes=None):
    """What the checks need, piece by piece: a list of dicts (piece, ok, line, needed_by). torch_info: torch and
    CUDA versions, GPUs (from torch_facts). have (a package), path (PATH), header (Python.h), free_bytes: this
    machine's unless given (the tests give them)."""
    out = []

    def note(piece, ok, line, needed_by=()):
        # ok: True present, False missing and needed (its checks are skipped), None missing and optional
        out.append(dict(piece=piece, ok=ok, line=line, needed_by=list(needed_by) if ok is False else []))
    t = torch_info
    pinned = t['torch'].split('+')[0] == '2.13.0'
    note('torch', True if pinned else None, f"torch {t['torch']}, CUDA {t['cuda'] or 'none'}, {t['gpus']} GPU(s)"
         + (f": {t['device']}" if t['device'] else '') + ('' if pinned else ": not the 2.13.0 requirements.txt pins; "
         "the checks run, and measure this release (pip install torch==2.13.0 for the project's)"))
    if not c.tiny:
        if t['gpus'] < 1:
            note('gpu', False, "no CUDA GPU visible: run this on a GPU machine (or --tiny for the CPU plumbing); "
                 "check CUDA_VISIBLE_DEVICES and nvidia-smi", CHECKS)
        elif c.world > t['gpus']:
            note('gpu', False, f"--nproc {c.world} but {t['gpus']} GPU(s): use --nproc {t['gpus']} or fewer",
                 ('train', 'eager', 'resume'))
        if t['gpus'] >= 1 and not t['nccl']:
            note('nccl', False, "torch has no NCCL: install a CUDA build of torch (pip install torch==2.13.0 "
                 "--index-url https://download.pytorch.org/whl/cu12x)", ('train', 'eager', 'resume'))
    for name, (needed_by, what) in PACKAGES.items():
        if have(name):
            note(name, True, f"{name}: present")
        else:
            note(name, False if needed_by else None, f"{name}: missing ({what}): pip install {name}", needed_by)
    if c.backend == 'inductor':
        cc = os.environ.get('CC') or 'gcc'
        if not (shutil.which(cc, path=path) or shutil.which('cc', path=path)):
            note('compiler', False, f"no C compiler ({cc}, cc) on PATH: Triton and inductor build their kernels with "
                 "one: apt-get install gcc (or set CC)", COMPILED)
        if not os.path.exists(header):
            note('python_headers', False, f"no {header}: Triton's first compile needs it: apt-get install "
                 f"python{sys.version_info.major}.{sys.version_info.minor}-dev", COMPILED)
    need = checkpoint_bytes(c.shape) * 2 + 2e9   # a checkpoint and its temporary file while it is written, and logs
    free = free_bytes if free_bytes is not None else shutil.disk_usage(os.path.dirname(c.out) or '.').free
    if free < need:
        note('disk', False, f"{free / 1e9:.1f} GB free at {c.out}, {need / 1e9:.1f} GB needed (a "
             f"{checkpoint_bytes(c.shape) / 1e9:.2f} GB checkpoint and its temporary file): --out on a larger disk",
             ('train', 'eager', 'resume', 'checkpoint'))
    else:
        note('disk', True, f"{free / 1e9:.0f} GB free at {c.out}")
    return out


@functools.lru_cache(maxsize=None)
def checkpoint_bytes(shape):
    """A checkpoint of the shape: float32 parameters and AdamW's two moments (the tied embedding once)."""
    import torch
    from run_kit.common import build_model
    args = {k.lstrip('-'): int(v) for k, v in (a.split('=') for a in SHAPES[shape])}
    with torch.device('meta'):
        model = build_model(dict(args, residual='rd_attnres', depth_read='plain'))
    return 3 * 4 * sum(p.numel() for p in model.parameters())


def torch_facts(tiny):
    import torch
    gpus = 0 if tiny else torch.cuda.device_count()
    return dict(torch=torch.__version__, cuda=torch.version.cuda, gpus=gpus,
                device=torch.cuda.get_device_name(0) if gpus else None,
                nccl=torch.distributed.is_available() and torch.distributed.is_nccl_available())


def blocked(items):
    """check -> the preflight line that stops it."""
    out = {}
    for item in items:
        for name in item['needed_by']:
            out.setdefault(name, item['line'])
    return out


# -----------------------------------------------------------------------------
# The budget

def plan(names, predicted, budget_s):
    """Which checks fit a budget of budget_s seconds when each takes its predicted time, in order: (to run, left).
    A check that does not fit is left and the next ones are still tried (a cheaper one may fit)."""
    run, left, t = [], [], 0.0
    for name in names:
        if t + predicted[name] <= budget_s:
            run.append(name)
            t += predicted[name]
        else:
            left.append(name)
    return run, left


# -----------------------------------------------------------------------------
# The table

def markdown(results):
    m, checks = results['machine'] or {}, results['checks']
    f = lambda v, fmt: '-' if v is None else format(v, fmt)  # noqa: E731
    head = (f"GPU check, {m.get('date')}: {m.get('device')} x {max(m.get('gpus', 0), 1)}, torch {m.get('torch')}, "
            f"CUDA {m.get('cuda') or 'none'}, budget {results['budget_min']:g} min")
    if results['tiny']:
        head += (" — **--tiny: the plumbing on the CPU (float32, dynamo's graphs run by the eager backend); its "
                 "numbers are not measurements and it gives no verdict**")
    out = [head, '']
    missing = [p['line'] for p in results['preflight'] if p['ok'] is not True]
    if missing:
        out += ['Preflight:', *[f"- {line}" for line in missing], '']
    out += ['| check | result | numbers |', '|---|---|---|']
    for name in CHECKS:
        r = checks.get(name)
        if r is None:
            if results.get('asked') is not None and name not in results['asked']:   # (the rest, for a second lease)
                out.append(f"| {name} | not in this plan | a second lease: `{second_lease(name)}` |")
            continue
        status = r.get('status', 'ok')
        if status == 'left' or (status == 'skipped' and not r.get('numbers')):
            out.append(f"| {name} | **{status}** | {r.get('why', '')} |")
        elif status != 'ok':   # (cut, failed, interrupted: what its output held, then why)
            so_far = numbers_line(r.get('numbers') or {})
            out.append(f"| {name} | **{status}** | " + (f"measured before it ended: {so_far}; " if so_far else '')
                       + f"{r.get('why', '')} |")
        elif name == 'train':
            out.append(f"| train | ok | {r['launcher']} (DDP, {r['ddp']}) x {r['grad_accum']} micro-steps, {r['steps']} "
                       f"steps, compiled (backend {r['backend']}, {r['depth_read']} read): {r['graphs']} graphs as designed "
                       f"({r['backend_calls']} after DDP's bucket splits), reads in float32 under bf16; "
                       f"step {r['step_s']:.3f} s, "
                       f"{r['tok_per_s']:,.0f} tok/s, MFU {f(r['mfu'] and 100 * r['mfu'], '.1f')}%"
                       + compile_line(r.get('compile')) + ' |')
        elif name == 'eager':
            out.append(f"| eager | ok | compiled vs eager, {r['processes']} process(es): training losses within "
                       f"{r['max_train_difference']:.4f} nats ({r['train_steps_compared']} steps), evaluation within "
                       f"{r['max_val_difference']:.4f} ({r['val_steps_compared']} evaluations), tolerance {r['tolerance']:g} |")
        elif name == 'resume':
            out.append(f"| resume | ok | SIGTERM at step {r['stopped_at']} (exit after {r['signal_to_exit_s']:.1f} s), "
                       f"resumed: same data order, losses within {r['max_loss_difference']:.4f} nats |")
        elif name == 'checkpoint':
            out.append(f"| checkpoint | ok | {r['bytes'] / 1e9:.2f} GB: save {r['save_s']:.1f} s, host memory "
                       f"+{r['host_peak_bytes'] / 1e6:,.0f} MB above the built model's {r['host_baseline_bytes'] / 1e9:.2f} GB, "
                       f"load {r['load_s']:.1f} s"
                       + (f"; paper run {r['paper_run_h']:.2f} h, preemption lead {r['preemption_lead_s']:.0f} s"
                          if 'paper_run_h' in r else '') + ' |')
        else:
            out.append(f"| {name} | ok | " + '; '.join(
                f"{mode}: {v['step_ms']:.0f} ms, {v['tok_per_s']:,.0f} tok/s, x std {f(v['x_standard'], '.3f')}, "
                f"MFU {f(v['mfu'] and 100 * v['mfu'], '.1f')}%, {f(v['peak_mem_gb'], '.1f')} GB, {v['graphs']} graphs"
                for mode, v in r['modes'].items()) + (f"; **{r['verdict']['reason']}**" if r.get('verdict') else '') + ' |')
    return '\n'.join(out) + '\n'


def compile_line(t):
    """'; compile: ... s' of a train check's rank 0 (compile_seconds), or '' where it was not recorded."""
    if not t:
        return ''
    f = lambda k: '-' if t.get(k) is None else f"{t[k]:.1f}"  # noqa: E731
    return (f"; compile {f('total')} s (dynamo {f('dynamo')}, AOT and inductor {f('backend')}: inductor's forward "
            f"{f('inductor')}, backward {f('inductor_backward')}, waiting on kernels {f('kernels')}), {t['frames']} "
            f"frames, {t['recompiles']} recompiles" + (f" ({t['recompile_reasons'][0]})" if t['recompiles'] else ''))


def second_lease(name):
    """The command that runs a check the default plan leaves out (eager and resume need train's run first)."""
    return SECOND_LEASE if name in ('eager', 'resume', 'checkpoint') else f"python scripts/gpu_check.py --only {name}"


def predicted_line(results):
    """The --predicted flag this run's own measured seconds give (the checks that ran to their end)."""
    done = [(n, r['seconds']) for n, r in results['checks'].items() if r.get('status', 'ok') == 'ok' and 'seconds' in r]
    return '--predicted ' + ','.join(f"{n}={s:.0f}" for n, s in done) if done else ''


def summary(results, asked):
    """The last line, and the exit status: 0 every check asked for passed, 1 one failed or was cut, 2 the ones
    that ran passed but others did not run."""
    by = {s: [n for n in asked if results['checks'].get(n, {}).get('status', 'ok') == s] for s in
          ('ok', 'failed', 'cut', 'interrupted', 'skipped', 'left')}
    bad = by['failed'] + by['cut'] + by['interrupted']
    unchecked = by['skipped'] + by['left']
    parts = [f"passed: {', '.join(by['ok']) or 'none'}"]
    parts += [f"{s.upper()}: {', '.join(by[s])}" for s in ('failed', 'cut', 'interrupted') if by[s]]
    parts += [f"NOT CHECKED ({s}): {', '.join(by[s])}" for s in ('skipped', 'left') if by[s]]
    if results['tiny']:
        parts.append('(--tiny: the plumbing, not a measurement)')
    return '; '.join(parts), 1 if bad else 2 if unchecked else 0


def parse_args(argv):
    ap = argparse.ArgumentParser(prog='gpu_check.py', description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--tiny', action='store_true', help='the tiny shape on the CPU: the plumbing (CI), no verdict')
    ap.add_argument('--out', default='gpu_check', help='where the runs, gpu_check.json and gpu_check.md go')
    ap.add_argument('--only', default=','.join(DEFAULT_PLAN), help=f"some of: {', '.join(CHECKS)} (run in this order; "
                    f"default {','.join(DEFAULT_PLAN)})")
    ap.add_argument('--budget', type=float, default=9.0, help='minutes: the checks that fit, then stop (default 9)')
    ap.add_argument('--preflight', action='store_true', help='only the preflight')
    ap.add_argument('--read_gap', action='store_true', help="only measure what LOSS_TOL must pass and catch (read_gap)")
    ap.add_argument('--shape', default='343m', choices=('343m', '120m'), help='of train, eager, resume, checkpoint')
    ap.add_argument('--steps', type=int, default=0, help='training steps per run (default 24; --tiny 16)')
    ap.add_argument('--batch_size', type=int, default=0, help='micro-batch per process (default 16; --tiny 4)')
    ap.add_argument('--nproc', type=int, default=0, help='torchrun processes (default: every GPU; --tiny 2)')
    ap.add_argument('--depth_read', default='', choices=('', 'plain', 'fused', 'two_phase'), help="default: the config's")
    ap.add_argument('--backend', default='', help="torch.compile's backend (default inductor; --tiny eager)")
    ap.add_argument('--predicted', default='', help="check=seconds,...: predictions to plan the budget with instead "
                    "of PREDICTED (e.g. the seconds an earlier gpu_check.json measured)")
    args = ap.parse_args(argv)
    args.predicted = {k: float(v) for k, v in (item.split('=') for item in args.predicted.split(',') if item)}
    return args


def main(argv):
    if argv[:1] == ['--train_child']:   # (a torchrun worker: see train_child)
        return train_child(argv[1], argv[2], argv[3] == 'save', argv[4:])
    args = parse_args(argv)
    if args.read_gap:
        import torch
        read_gap(os.path.abspath(args.out), device='cuda' if torch.cuda.is_available() and not args.tiny else 'cpu')
        return 0
    asked = [x for x in CHECKS if x in args.only.split(',')]
    unknown = [x for x in args.only.split(',') if x not in CHECKS]
    if unknown:
        raise SystemExit(f"no check {unknown[0]!r}: choose from {', '.join(CHECKS)}")
    facts = torch_facts(args.tiny)
    c = Check(args, facts['gpus'])
    os.makedirs(c.out, exist_ok=True)
    c.results['machine'] = dict(facts, date=time.strftime('%Y-%m-%d'), host_cpus=os.cpu_count(),
                                device=facts['device'] or 'cpu')
    items = preflight(c, facts)
    try:   # the data: made here, from this repository's files (a second)
        make_data(os.path.join(c.out, 'data'))
        items.append(dict(piece='data', ok=True, line=f"data: made from this repository's files in {c.out}/data",
                          needed_by=[]))
    except Exception as e:   # (any reason: it is said in one line, and the checks that train on it skipped)
        items.append(dict(piece='data', ok=False, line=f"data: could not be made in {c.out}/data ({type(e).__name__}: "
                          f"{e}): --out on a writable disk", needed_by=['train', 'eager', 'resume']))
    c.results['preflight'] = items
    c.results['asked'] = asked
    print('preflight:', *[('  ' if p['ok'] else '  MISSING ' if p['ok'] is False else '  NOTE ') + p['line']
                          for p in items], sep='\n', flush=True)
    stopped = blocked(items)
    for name in asked:
        if name in stopped:
            c.results['checks'][name] = dict(status='skipped', why=f"preflight: {stopped[name]}")
    todo = [n for n in asked if n not in stopped]
    planned, left = plan(todo, {n: c.predicted(n) for n in todo}, c.deadline - time.time())
    print(f"budget {args.budget:g} min: " + ', '.join(f"{n} ~{c.predicted(n):.0f} s" for n in planned)
          + (f" (predicted from {PLANNED_FROM}, cold compiles included)" if not c.tiny else '')
          + (f"; left out (predicted not to fit): {', '.join(left)}" if left else ''), flush=True)
    if args.preflight:
        c.save()
        return 0 if not stopped else 2

    def interrupted(signum, frame):
        raise Interrupted(signal.Signals(signum).name)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, interrupted)
    current = None
    try:
        for name in todo:
            current, t0 = name, time.time()
            remaining = c.deadline - t0
            if c.predicted(name) > remaining:
                c.results['checks'][name] = dict(status='left', why=f"the budget: predicted {c.predicted(name):.0f} s, "
                                                 f"{max(remaining, 0):.0f} s left (--budget, or --only {name})")
                c.save()
                continue
            print(f"== {name} (predicted {c.predicted(name):.0f} s, {remaining:.0f} s left)", flush=True)
            c.results['checks'][name] = dict(status='running', why='output so far: ' + c.out)
            c.save()
            try:
                c.results['checks'][name] = globals()[f'check_{name}'](c)
            except CheckFailed as e:
                c.results['checks'][name] = dict(status='failed', why=str(e))
            except Skipped as e:
                c.results['checks'][name] = dict(status='skipped', why=str(e))
            except OutOfTime:
                c.results['checks'][name] = dict(status='cut', why=f"stopped at the budget's end after "
                                                 f"{time.time() - t0:.0f} s; its output so far is in {c.out}")
            if c.results['checks'][name].get('status') in ('cut', 'failed'):
                c.results['checks'][name]['numbers'] = numbers_so_far(c, name)
            c.results['checks'][name]['seconds'] = time.time() - t0
            remove_weights(c)
            c.save()
            print(json.dumps(c.results['checks'][name])[:2000], flush=True)
        current = None
    except (KeyboardInterrupt, Interrupted) as e:
        if current:
            c.results['checks'][current] = dict(status='interrupted', why=f"{type(e).__name__} {e}: its output so "
                                                f"far is in {c.out}", numbers=numbers_so_far(c, current))
    finally:
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):   # (a second signal does not cut the cleanup short)
            signal.signal(s, signal.SIG_IGN)
        c.end_children()   # nothing of the check outlives it
        remove_weights(c)
        c.results['elapsed_s'] = time.time() - STARTED
        c.save()
    line, code = summary(c.results, asked)
    print(markdown(c.results))
    if predicted_line(c.results):
        print(f"this machine's seconds, to plan the next run with: {predicted_line(c.results)}")
    print(f"{os.path.join(c.out, 'gpu_check.json')}, {os.path.join(c.out, 'gpu_check.md')}: {line}")
    return code


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
