"""What the test files share: the repository's folder, a tiny model's flags, runs of train.py (in a process
of their own or in this one), their logs, a corpus of documents, a run folder written by hand."""

import contextlib
import io
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time

import numpy as np
import torch

import train


HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository

TINY = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--attnres_block_size=2', '--block_size=32',
        '--batch_size=4', '--total_batch_size=256', '--eval_tokens=512', '--eval_batch_size=8',
        '--eval_interval=2', '--log_interval=1', '--max_iters=4', '--warmup_iters=2',
        '--learning_rate=3e-3', '--device=cpu', '--dataset=tiny']


def command(args, data_dir, out_dir, launcher=(sys.executable,)):
    return [*launcher, os.path.join(HERE, 'train.py'), *TINY, f'--data_dir={data_dir}', f'--out_dir={out_dir}', *args]


def default_ctrl_c():
    # A shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored across exec:
    # a suite run with `pytest &` (or from such a job) would start runs that Ctrl-C cannot reach.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(args, data_dir, out_dir, expect_ok=True, launcher=(sys.executable,)):
    env = dict(os.environ, OMP_NUM_THREADS='1')
    p = subprocess.run(command(args, data_dir, out_dir, launcher), capture_output=True, text=True, cwd=HERE, env=env,
                       timeout=600)
    if expect_ok:
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return p


def main_here(main, argv, returns_status=True):
    """A script's command line run as its main(argv) in this process, as python would run it: its exit status
    and what it printed (a user's error is the SystemExit its message ends in), a subprocess.CompletedProcess,
    without a second or two of start-up (Python, torch, dynamo). returns_status: the script exits with what
    main returns (train.py's sys.exit(main(...)); sample.py ignores it). torch keeps one thread, as the
    processes these tests start do (OMP_NUM_THREADS=1), and the test's random states and TF32 flags are given
    back (train.py seeds and, on a resume, restores the generators)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    threads, tf32 = torch.get_num_threads(), (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    states = random.getstate(), np.random.get_state()
    torch.set_num_threads(1)   # a tiny model, and the other test workers share the cores
    try:
        with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(argv)
                code = code if returns_status else None
            except SystemExit as e:   # what the interpreter does with it: a message goes to stderr, with status 1
                code = e.code if isinstance(e.code, int) or e.code is None else 1
                if not isinstance(e.code, int) and e.code is not None:
                    print(e.code, file=sys.stderr)
    except BaseException:   # (a bug, not a message: the test fails with what the run printed before it)
        print(stdout.getvalue()[-2000:], stderr.getvalue()[-4000:], sep='\n', file=sys.stderr)
        raise
    finally:
        torch.set_num_threads(threads)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        random.setstate(states[0])
        np.random.set_state(states[1])
    return subprocess.CompletedProcess(argv, code or 0, stdout.getvalue(), stderr.getvalue())


def run_here(args, data_dir, out_dir, expect_ok=True):
    """What run() does, in this process (main_here). For runs that need no process of their own: none that is
    signalled, killed, held to a file-size limit or launched by torchrun, none whose check reads a warning
    (pytest records warnings, they never reach stderr), and none into an out_dir that a run in another
    process uses next (a process holds the out_dir it ran in for its whole life: run_files.lock_out_dir)."""
    p = main_here(lambda argv: train_here(data_dir, out_dir, *argv), args)
    if expect_ok:
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return p


def sample_here(*args):
    """python('sample.py', *args) in this process (main_here), for a checkpoint or weights file that is not
    hostile: one that runs code when read must be read in a process of its own."""
    import sample
    return main_here(sample.main, list(args), returns_status=False)


def start(args, data_dir, out_dir, launcher=(sys.executable,)):
    return subprocess.Popen(command(args, data_dir, out_dir, launcher), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=HERE, env=dict(os.environ, OMP_NUM_THREADS='1'),
                            preexec_fn=default_ctrl_c)


def train_here(data_dir, out_dir, *args):
    """train.py in this process (its errors are SystemExit with the message a user sees; any other
    exception fails the test): for runs that stop before they train, or train a few tiny steps."""
    return train.main([*TINY, f'--data_dir={data_dir}', f'--out_dir={out_dir}', '--cpu_malloc_tuning=False', *args])


def python(script, *args, **kw):
    return subprocess.run([sys.executable, os.path.join(HERE, script), *args], capture_output=True, text=True,
                          cwd=HERE, env=dict(os.environ, OMP_NUM_THREADS='1'), timeout=600, **kw)


def read_log(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        rows = [json.loads(line) for line in f]
    train_rows = {r['step']: r for r in rows if 'train_loss' in r}
    val_rows = {r['step']: r for r in rows if 'val_loss' in r}
    return train_rows, val_rows


def logged_steps(out_dir):
    """Steps with a training row in log.jsonl so far (a line being written is skipped)."""
    try:
        with open(os.path.join(out_dir, 'log.jsonl')) as f:
            lines = f.read().split('\n')[:-1]
    except OSError:
        return []
    return [r['step'] for r in map(json.loads, lines) if 'train_loss' in r]


def wait_for_step(proc, out_dir, step, timeout=300):
    deadline = time.time() + timeout
    while not any(s >= step for s in logged_steps(out_dir)):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, 'the run did not get there in time'
        time.sleep(0.01)


def assert_same_run(a, b):
    """Bit-identical runs: the losses, data fingerprints and data digests of every logged step, the final weights."""
    (ta, va), (tb, vb) = read_log(a), read_log(b)
    assert sorted(ta) == sorted(tb) and sorted(va) == sorted(vb)
    assert [(ta[s]['train_loss'], ta[s]['data_hash'], ta[s]['data_digest']) for s in sorted(ta)] == \
           [(tb[s]['train_loss'], tb[s]['data_hash'], tb[s]['data_digest']) for s in sorted(tb)]
    assert [(va[s]['val_loss'], va[s]['data_digest']) for s in sorted(va)] == \
           [(vb[s]['val_loss'], vb[s]['data_digest']) for s in sorted(vb)]
    ma = torch.load(os.path.join(a, 'ckpt.pt'), weights_only=False)['model']
    mb = torch.load(os.path.join(b, 'ckpt.pt'), weights_only=False)['model']
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


def make_run(root, name, residual, seed, final_nll, steps=(0, 50, 100), windows=None, **overrides):
    """A run folder written by hand: config.json and a log with an evaluation at each of steps and a training row
    at each but 0. windows: None, a log as written before train.py kept a data digest (each training row's
    data_hash a made-up fingerprint); or a function step -> that step's window indices, then every row carries
    the data digest of the steps before it and each training row the data_hash of its step, as train.py logs."""
    from train import DIGEST_START, windows_digest, windows_hash
    path = os.path.join(root, name)
    os.makedirs(path)
    config = dict(train.DEFAULTS, residual=residual, seed=seed, max_iters=steps[-1], out_dir=path,
                  world_size=1, git_commit='abc')
    config.update(overrides)
    rows, digests = [], [DIGEST_START]   # digests[s]: of the windows of steps 0 .. s-1
    for s in range(steps[-1] if windows else 0):
        digests.append(windows_digest(digests[-1], windows(s)))
    data = lambda s: dict(data_digest=digests[s]) if windows else {}
    for i, s in enumerate(steps):
        nll = final_nll + 0.5 * (len(steps) - 1 - i)        # decreasing curve that ends at final_nll
        routing = None
        if residual == 'rd_attnres':
            alpha = [dict(sublayer=0, layer=0, route=r, alpha=[1.0]) for r in ('qk', 'v')] + \
                    [dict(sublayer=2, layer=1, route='qk', alpha=[0.2, 0.8]),
                     dict(sublayer=2, layer=1, route='v', alpha=[0.7, 0.3])]
            routing = dict(alpha=alpha, summary=[dict(layer=0, js_qk_v=0.0), dict(layer=1, js_qk_v=0.01 * i)])
        rows.append(dict(step=s, tokens=s * 1000, val_loss=nll, routing=routing, **data(s)))
        if s > 0:
            rows.append(dict(step=s, train_loss=nll, data_hash=windows_hash(windows(s - 1)) if windows else f"{seed}-{s}",
                             **data(s)))
    with open(os.path.join(path, 'config.json'), 'w') as f:
        json.dump(config, f)
    with open(os.path.join(path, 'log.jsonl'), 'w') as f:
        f.write(''.join(json.dumps(r) + '\n' for r in rows))
    return path


DOCS = [f"Document {i}: " + " ".join(f"word{(i * j) % 31}" for j in range(5 + i % 13)) + "\nEnd." for i in range(120)]


def write_jsonl(path, docs, column='text'):
    with open(path, 'w') as f:
        for d in docs:
            f.write(json.dumps({column: d, 'other': 1}) + '\n')


def limit_file_size(limit):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # fail the write, do not kill the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply
