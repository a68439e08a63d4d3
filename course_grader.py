"""
The course kit's grader (instructor only: never in a handout, never in a sandbox). COURSE.md, "How
grading works", is the page for instructors; course.py is the command.

Marks are decided here, by a process that never runs student code. The student's answer runs in a
sandbox (course_worker.py, in a copy of the project that holds the student's marked lines and nothing
else of theirs), one for all the concepts of an assignment, each concept with CPU time of its own; it
receives inputs and returns what the student's functions computed, as safetensors. This process runs
the same probes on the instructor's own project and compares: a concept's marks are earned when every
one of its probes matches. The inputs, the expected values and these checks stay on this side.

The sandbox is bubblewrap (Debian: apt-get install bubblewrap), chosen because it is a standard,
unprivileged-capable, single-binary mechanism that needs no daemon: new mount, PID, network, IPC and UTS
namespaces, the grading tree read-only, a private /tmp, nothing else of the machine but the system's
and Python's own read-only files; run as root, the worker drops to an unprivileged user of its own before
it reads anything; resource limits on memory, CPU time, processes, file size; its whole process tree
ends with it (a PID namespace). Without bubblewrap, grading refuses unless told the submissions are
trusted (--trusted): then the worker runs as a plain process with the same limits.
"""

import itertools
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import course_worker

FIRST_UID = 2_000_000     # each sandbox runs as a user of its own (no account needed): its process limit is its own
MEMORY = 4 * 2 ** 30      # address space of a sandboxed process
FILE_SIZE = 64 * 2 ** 20  # the largest file it may write (answers, its printed output, /tmp)
PROCESSES = 64            # processes and threads of the sandbox's user


@dataclass(frozen=True)
class Concept:
    name: str
    marks: int
    hint: str          # what to look at when it fails
    probes: tuple      # (description, probe name, args, tensors, compare, reference (args, tensors) or None)


# -----------------------------------------------------------------------------
# Inputs (made here, sent to the sandbox) and comparisons (said in words, never with an expected value)

def generator(seed):
    import torch
    return torch.Generator().manual_seed(seed)


def sources(seed, n, d=8, dtype=None):
    """n sources of very different scales (so that normalised keys matter), (2, 3, d)."""
    import torch
    g = generator(seed)
    return {f'x{i}': torch.randn(2, 3, d, generator=g, dtype=dtype or torch.float64) * (1 + 3 * i) for i in range(n)}


def model_weights(config, seed):
    """A small model of the instructor's code with every pseudo-query, key gain and pre-norm gain random,
    so that no read is uniform and the two pre-norms differ; as tensors 'w.<name>'."""
    import warnings
    import torch
    import model
    torch.manual_seed(seed)
    with warnings.catch_warnings():   # (attnres_block_size past the sublayers, on purpose)
        warnings.simplefilter('ignore')
        gpt = model.GPT(model.GPTConfig(**config)).double()
    g = generator(seed + 1)
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            if name.endswith('_query'):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif name.endswith(('key_gain', 'input_gain', 'norm_attn.weight', 'norm_mlp.weight')):
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return {f'w.{k}': v for k, v in gpt.state_dict().items()}


def config(mode, S=2, n_layer=2):
    return dict(block_size=16, vocab_size=64, n_layer=n_layer, n_head=2, n_embd=16, residual=mode, attnres_block_size=S)


def same_tensors(*names, rtol=1e-9, atol=1e-12, dtype=None):
    """A comparison of the named tensors (shape, dtype if given, values)."""
    def compare(got, ref):
        import torch
        for name in names:
            a, b = got[0].get(name), ref[0][name]
            if a is None:
                return f"{name} is missing"
            if tuple(a.shape) != tuple(b.shape):
                return f"{name} has shape {tuple(a.shape)}, not the shape asked for ({tuple(b.shape)})"
            if dtype is not None and a.dtype != dtype:
                return f"{name} is {str(a.dtype).replace('torch.', '')}, not {str(dtype).replace('torch.', '')}"
            wrong = ~torch.isclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True)
            if wrong.any():
                return f"{name} differs from the expected values at {int(wrong.sum())} of {wrong.numel()} entries"
        return None
    return compare


def same_values(*keys):
    def compare(got, ref):
        for key in keys:
            if got[1].get(key) != ref[1][key]:
                return f"{key} differ{'s' if not key.endswith('s') else ''} from what is expected"
        return None
    return compare


def close_stats(got, ref):
    a, b = got[1].get('stats') or {}, ref[1]['stats']
    for key, want in b.items():
        have = a.get(key)
        pairs = list(zip(have, want)) if isinstance(want, list) and isinstance(have, list) and len(have) == len(want) \
            else [(have, want)]
        for x, y in pairs:
            if not isinstance(x, (int, float)) or not (math.isnan(y) and math.isnan(x) or
                                                      not math.isnan(y) and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)):
                return f"{key} is not what it should be"
    return None


def all_of(*compares):
    def compare(got, ref):
        return next((r for r in (c(got, ref) for c in compares) if r), None)
    return compare


def no_matmul(got, ref):
    used = set(got[1].get('ops') or [])
    if not used:
        return "no operation was recorded"
    found = sorted(used & course_worker.MATMULS)
    return f"the read uses {', '.join(found)}: a matmul, which TF32 rounds on GPUs" if found else None


# -----------------------------------------------------------------------------
# The concepts of each assignment (the statements: COURSE.md; titles and tasks: course.py)

def assignment1():
    import torch
    eq = [(f"the read over {n} sources with {r} routes, float64", 'depth_read', dict(n_sources=n),
           {**sources(10 + n, n), 'queries': torch.randn(r, 8, generator=generator(20 + n), dtype=torch.float64)},
           same_tensors('h', 'alpha', dtype=torch.float64), None) for n, r in ((1, 1), (2, 1), (3, 2), (5, 3))]
    f32 = {**sources(31, 4, dtype=torch.float32), 'queries': torch.randn(2, 8, generator=generator(32))}
    f64 = {k: v.double() for k, v in f32.items()}
    spec = [("the read under bf16 autocast, float32 sources", 'depth_read', dict(n_sources=4, autocast=True), f32,
             same_tensors('h', 'alpha', rtol=1e-5, atol=1e-6, dtype=torch.float32), (dict(n_sources=4), f64)),
            ("the operations of the read", 'depth_read_ops', dict(n_sources=4), f32, no_matmul, None)]
    return (
        Concept("the read's equations: normalised keys, raw values, a softmax over the sources", 2,
                "keys are x_s / rms(x_s) (already folded: x_s * q times 1/rms), no 1/sqrt(d) or temperature; the "
                "softmax runs over the sources; the values are the sources as they are", tuple(eq)),
        Concept("the read as specified: elementwise logits (no matmul), float32 under autocast", 3,
                "compute each logit as (x * w).sum(-1): a matmul (@, einsum, mm) is rounded to TF32 on GPUs; turn "
                "autocast off and keep float32 (float64 inputs stay float64)", tuple(spec)))


MODES = ('attnres', 'rd_attnres', 'ctrl_dup', 'ctrl_fixed_v', 'ctrl_params', 'ctrl_heads')


def assignment2():
    read = [(f"the attention read point of an {mode} model over 3 sources", 'read_point',
             dict(config=config(mode), layer=1, n_sources=3), {**model_weights(config(mode), 40 + i), **sources(50 + i, 3, d=16)},
             all_of(same_tensors('h', rtol=1e-10), same_values('routes')), None) for i, mode in enumerate(MODES)]
    inputs = [(f"the attention inputs of an {mode} model over 4 sources", 'attn_inputs',
               dict(config=config(mode), layer=1, n_sources=4), {**model_weights(config(mode), 60 + i), **sources(70 + i, 4, d=16)},
               all_of(same_values('routes'), same_tensors('x_qk', 'x_v', rtol=1e-10)), None) for i, mode in enumerate(MODES)]
    return (
        Concept("one query per route, the key gain folded in", 2,
                "stack getattr(self, name) for every route in self.routes (ctrl_dup's two routes share one name and "
                "are still two reads), times self.key_gain", tuple(read)),
        Concept("the attention inputs: Q/K from the first route, V from the last, through norm_attn", 5,
                "x = self.norm_attn(h) for all routes at once (the same pre-norm for both, not norm_mlp), then x[0] "
                "for queries and keys and x[-1] for values", tuple(inputs)))


def assignment3():
    import torch
    cases = [('attnres', 1), ('attnres', 2), ('attnres', 3), ('attnres', 50), ('rd_attnres', 3), ('ctrl_heads', 4)]
    g = generator(80)
    idx = torch.randint(0, 64, (2, 13), generator=g)

    def probes(compare):
        return tuple((f"a forward pass of a 3-layer {mode} model, attnres_block_size {S}", 'forward',
                      dict(config=config(mode, S, n_layer=3)),
                      {**model_weights(config(mode, S, n_layer=3), 90 + S), 'idx': idx[:, :-1], 'targets': idx[:, 1:]},
                      compare, None) for mode, S in cases)
    n_reads = 3 * 2 + 1
    alphas = same_tensors(*[f'alpha{i}' for i in range(n_reads)], rtol=1e-9)
    return (
        Concept("sources are increments: the embedding, finished blocks, the partial", 5,
                "b_0 is the embedding alone; a block's source is the sum of its sublayers' outputs (not a running "
                "sum of everything so far); it closes after its S-th sublayer; the last, shorter block is closed "
                "before the final read", probes(same_tensors('logits', rtol=1e-9, atol=1e-10))),
        Concept("every read point reads its sources and is recorded", 2,
                "sublayer l reads 1 + l // S + (l % S != 0) sources; pass `log` to every read",
                probes(all_of(same_values('reads'), alphas))),
        Concept("every pseudo-query learns", 1, "every read must take part in the forward pass (the final read too)",
                probes(lambda got, ref: same_tensors(*[k for k in ref[0] if k.startswith('grad.')], rtol=1e-7,
                                                     atol=1e-10)(got, ref))))


def assignment4():
    def probes(env, cases):
        return tuple((f"the windows of step {step} ({w} per step, {n} windows, seed {seed})"
                      + (f", asked by rank {env['RANK']} of {env['WORLD_SIZE']}" if env['WORLD_SIZE'] > 1 else ''),
                      'step_windows', dict(step=step, n_windows=n, windows_per_step=w, seed=seed, env=env), {},
                      same_values('windows'), None) for step, n, w, seed in cases)
    one = dict(RANK=0, LOCAL_RANK=0, WORLD_SIZE=1)
    return (
        Concept("the exact order: each epoch a seed-keyed permutation, steps crossing epochs", 2,
                "epoch e is window_order(n_windows, seed, e); step s takes positions [s*W, (s+1)*W) of the endless "
                "sequence of epochs",
                probes(one, [(0, 1000, 64, 5), (15, 1000, 64, 5), (16, 1000, 64, 5), (47, 1000, 64, 5),
                             (3, 100, 250, 2), (7, 4096, 512, 1)])),
        Concept("the same order on any number of processes", 4,
                "return the whole step's W windows, whoever asks: train.py splits them between the ranks; nothing "
                "may depend on RANK or WORLD_SIZE",
                probes(dict(RANK=1, LOCAL_RANK=1, WORLD_SIZE=2), [(15, 1000, 64, 5), (3, 100, 250, 2)])
                + probes(dict(RANK=3, LOCAL_RANK=3, WORLD_SIZE=4), [(31, 1000, 64, 7), (2, 4096, 512, 1)])))


def assignment5():
    def probes(*cases):
        return tuple((f"paired_stats of {len(d)} differences", 'paired_stats', dict(deltas=d), {}, close_stats, None)
                     for d in cases)
    return (
        Concept("the paired table", 2, "sample sd over n - 1; half-width t(0.975, n-1) * sd / sqrt(n)",
                probes([-0.03, -0.02, -0.04, -0.01, -0.05], [0.011, -0.023, 0.031, -0.047, 0.002])),
        Concept("the statistics on other values", 2,
                "a tie (delta = 0) is not a win; p = min(1, 2 * sum_{i <= k} C(n, i) / 2^n)",
                probes([0.01, -0.03], [-0.01] * 9 + [0.0], [0.02, 0.05, -0.01], [-0.1, 0.2, -0.3, 0.05, -0.07, 0.0, 0.4])),
        Concept("one pair (n = 1)", 2,
                "with one pair there is no spread: sd and the interval are NaN (no division by n - 1 = 0), the sign "
                "test gives p = 1", probes([0.02], [-0.015])))


CONCEPTS = {1: assignment1, 2: assignment2, 3: assignment3, 4: assignment4, 5: assignment5}
_built = {}


def concepts(n):
    """The concepts of assignment n, their probes' inputs made once."""
    if n not in _built:
        _built[n] = CONCEPTS[n]()
    return _built[n]


# -----------------------------------------------------------------------------
# The sandbox

class NoSandbox(Exception):
    pass


def limits(cpu_seconds):
    def apply():
        os.setsid()
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
        resource.setrlimit(resource.RLIMIT_CPU, (int(cpu_seconds), int(cpu_seconds) + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE, FILE_SIZE))
        resource.setrlimit(resource.RLIMIT_NPROC, (PROCESSES, PROCESSES))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def python_paths():
    """The folders Python and its packages live in: read-only in the sandbox."""
    import site
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             *site.getsitepackages()}
    return sorted(p for p in paths if os.path.isdir(p))


_uids = itertools.count(FIRST_UID + (os.getpid() % 1000) * 100_000)
_uid_lock = threading.Lock()


def next_uid():
    with _uid_lock:
        return next(_uids)


def sandbox_command(tree):
    """bubblewrap's command line for a worker in `tree` (read-only at /grade), or NoSandbox."""
    bwrap = shutil.which('bwrap')
    if not bwrap:
        raise NoSandbox("grading runs each submission in a sandbox and needs bubblewrap, which is not installed "
                        "(Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap). Only if every "
                        "submission is trusted (your own, say), grade with --trusted instead.")
    cmd = [bwrap, '--die-with-parent', '--new-session', '--unshare-pid', '--unshare-net', '--unshare-ipc',
           '--unshare-uts', '--unshare-cgroup-try']
    if os.geteuid() != 0:
        cmd += ['--unshare-user']   # unprivileged: a user namespace; as root the worker drops to a user of its own
    for path in ('/usr', '/lib', '/lib32', '/lib64', '/bin', '/sbin', '/etc'):
        if os.path.islink(path):
            cmd += ['--symlink', os.readlink(path), path]
        elif os.path.isdir(path):
            cmd += ['--ro-bind', path, path]
    cmd += ['--perms', '1777', '--size', str(FILE_SIZE), '--tmpfs', '/tmp']   # (first: Python may live under /tmp)
    made = {'/tmp'}
    for path in python_paths():   # (the folders above them made readable: bubblewrap makes them 0700)
        parents = [p for p in (os.path.dirname(path[:i]) for i in range(len(path) + 1) if path[i:i + 1] in ('/', ''))
                   if p not in ('/', '') and not any(p == x or p.startswith(x + '/') for x in ('/usr', '/lib', '/etc'))]
        for parent in sorted(set(parents) - made, key=len):
            cmd += ['--perms', '0755', '--dir', parent]
            made.add(parent)
        cmd += ['--ro-bind', path, path]
    cmd += ['--ro-bind', tree, '/grade', '--proc', '/proc', '--dev', '/dev',
            '--chdir', '/grade', '--clearenv', '--setenv', 'PATH', '/usr/bin:/bin', '--setenv', 'HOME', '/tmp',
            '--setenv', 'OMP_NUM_THREADS', '1', '--setenv', 'PYTHONDONTWRITEBYTECODE', '1']
    if os.geteuid() == 0:
        cmd += ['--setenv', 'COURSE_WORKER_USER', str(next_uid())]
    return cmd + [sys.executable, '-I', '-B', '/grade/course_worker.py']


def run_worker(tree, request, cpu_seconds, trusted):
    """Run the worker on `request` (bytes): (answers bytes, stderr text, timed out, seconds)."""
    if trusted:
        env = {k: v for k, v in os.environ.items() if not k.startswith('PYTHON')}
        env.update(OMP_NUM_THREADS='1', PYTHONDONTWRITEBYTECODE='1', HOME=tempfile.gettempdir())
        cmd = [sys.executable, '-I', '-B', os.path.join(tree, 'course_worker.py')]
    else:
        env, cmd = None, sandbox_command(tree)
    with tempfile.TemporaryDirectory() as work:   # outside the tree: the sandbox sees none of it
        paths = [os.path.join(work, name) for name in ('request', 'answers', 'stderr')]
        with open(paths[0], 'wb') as f:
            f.write(request)
        t0, timed_out = time.time(), False
        with open(paths[0], 'rb') as stdin, open(paths[1], 'wb') as stdout, open(paths[2], 'wb') as stderr:
            proc = subprocess.Popen(cmd, stdin=stdin, stdout=stdout, stderr=stderr, cwd=tree, env=env,
                                    preexec_fn=limits(cpu_seconds))
            try:   # the CPU limit ends a loop whatever the load; the wall clock is a backstop against sleeping
                proc.wait(timeout=10 * cpu_seconds + 60)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)   # (the sandbox's PID namespace goes with it)
                except ProcessLookupError:
                    pass
                proc.wait()
        # the CPU limit sends SIGXCPU (bubblewrap reports its child's death by a signal as 128 + the signal);
        # SIGKILL is the hard limit's, when SIGXCPU was ignored, or the kernel's when memory ran out
        timed_out = timed_out or proc.returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU)
        killed = proc.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)
        with open(paths[1], 'rb') as f:
            answers = f.read(FILE_SIZE)
        with open(paths[2], 'rb') as f:
            stderr_text = f.read(20_000).decode('utf-8', 'replace')
    if killed and not timed_out:
        stderr_text += '\nkilled: past its CPU time, or out of memory'
    return answers, stderr_text, timed_out, time.time() - t0


def evaluate_concepts(concepts, tree, cpu_seconds, trusted):
    """[(passed, [feedback lines], timed out, seconds)] for each concept: its probes, run by the student's
    code in the sandbox and by the instructor's code here, compared. The concepts share one sandbox (one
    start of Python and torch), each with cpu_seconds of its own; a concept that ends the run (a loop, a
    crash, memory) fails alone, and the concepts after it run again in a new sandbox."""
    out = []
    while len(out) < len(concepts):
        rest = concepts[len(out):]
        output, stderr, timed_out, seconds = run_worker(tree, request_of(rest, cpu_seconds),
                                                        cpu_seconds * len(rest), trusted)
        answered = course_worker.read_answers(output)[:len(rest)]
        share = seconds / (len(answered) + (len(answered) < len(rest)))
        firsts = [sum(len(c.probes) for c in rest[:j]) for j in range(len(rest))]   # in this request
        for c, got, first in zip(rest, answered, firsts):
            out.append((*judge(c, got, first), False, share))
        if len(answered) < len(rest):   # the next concept ended the run
            what = (f"did not finish within {cpu_seconds:.0f} s of CPU time" if timed_out else
                    "ended without answering" + (f": {last_line(stderr)}" if last_line(stderr) else ''))
            out.append((False, [f"the code {what}"], timed_out, share))
    return out


def request_of(concepts, cpu_seconds):
    """The worker's request: every probe of the concepts, in order, its tensors keyed '<probe index>/<name>'
    (counted from 0 in this request), the number of probes of each concept and its CPU seconds."""
    tensors, meta = {}, {'probes': [], 'concepts': [len(c.probes) for c in concepts], 'cpu_seconds': cpu_seconds}
    for i, (_, probe, args, inputs, _, _) in enumerate(p for c in concepts for p in c.probes):
        meta['probes'].append(dict(probe=probe, args=args))
        tensors.update({f'{i}/{k}': v for k, v in inputs.items()})
    return course_worker.pack(tensors, meta)


def judge(concept, got, first):
    """(passed, [feedback lines]) of a concept from its answers (tensors, meta): meta['results'] has one
    result per probe, and probe i's tensors are keyed by its index in the request, first + i."""
    import torch
    got_tensors, got_meta = got
    results = got_meta.get('results') if isinstance(got_meta, dict) else None
    if not isinstance(results, list) or len(results) != len(concept.probes):
        return False, ["the code's answers could not be read"]
    for i, (description, probe, args, inputs, compare, reference) in enumerate(concept.probes):
        result = results[i]
        if not isinstance(result, dict) or not result.get('ok'):
            error = str(result.get('error', '?'))[:300] if isinstance(result, dict) else '?'
            where = f" ({str(result.get('where'))[:200]})" if isinstance(result, dict) and result.get('where') else ''
            return False, [f"{description}: {error}{where}"]
        mine = ({k.split('/', 1)[1]: v for k, v in got_tensors.items() if k.split('/', 1)[0] == str(first + i)},
                result.get('values') if isinstance(result.get('values'), dict) else {})
        ref_args, ref_inputs = reference or (args, inputs)
        with torch.random.fork_rng():   # (the instructor's code needs no environment: a process's env is shared)
            ref = course_worker.run_probe(probe, {k: v for k, v in ref_args.items() if k != 'env'}, ref_inputs)
        problem = compare(mine, ref)
        if problem:
            return False, [f"{description}: {problem}"]
    return True, []


def last_line(text):
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ''
