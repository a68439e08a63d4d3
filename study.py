"""
A study is a named plan of paired runs, run one after another by one command that can be stopped
and started again at any moment (README "Reproducing the paper"; docs/results.md).

    python study.py list                                   # the plans
    python study.py run paper --dry_run                    # the queue, what is done, a time estimate
    python study.py run paper --launcher="torchrun --standalone --nproc_per_node=8"
    python study.py report paper                           # compare.py's tables of the plan, one file
    python study.py intervene paper --device=cuda          # the route interventions of its two-route runs
    python study.py corpus                                 # the CPU study's corpus (Debian packages)
    nohup python study.py run cpu > study.log 2>&1 &       # the CPU study

A plan is a list of runs (config file, seed, overrides, out_dir), whole seeds first: seed 1 of every
arm before seed 2, so that a study stopped anywhere has complete pairs. `run` starts each run as

    LAUNCHER train.py CONFIG --seed=SEED --out_dir=DIR --init_from=auto OVERRIDES

and so skips a finished run (without starting it), continues an interrupted one from its checkpoint,
and starts a new one. A run counts as the entry's only if its config.json has the entry's configuration
(ENTRY_KEYS): a folder holding another run (an entry edited after it ran) stops the study before anything
runs, naming the entries, folders and keys (--overwrite replaces those runs). A run that diverges is a
result: recorded in its folder, kept on later runs of the study (--retrain_diverged runs it again), listed
in the report with the pairs it breaks, and the study goes on with the other entries. Any other failed
run stops the study with a message naming it and its log (DIR/train.out).
SIGTERM, SIGUSR1 or Ctrl-C stop the study: the run in progress is told (SIGTERM), writes a checkpoint at
its next log step and exits, and the study exits with code 75; the same command carries on. At the end,
compare.py's paired tables of every run of the plan are written to one report file. A plan can also be
a JSON file: a list of {"config", "seed", "out_dir", "overrides"} objects. Before anything runs, every
entry is read as train.py will read it: a key a plan entry does not have, an override train.py does not
know (or of the wrong type), one of the runner's own keys in overrides, or two entries with one out_dir
refuse the plan, naming the entry, and so do two entries whose out_dirs are one folder on this file
system (a link) or on a case-insensitive one (names that differ only in case).
"""

from run_kit.common import ctrl_c_while_starting  # first: a Ctrl-C while torch loads is one line, exit 130
ctrl_c_while_starting(__name__, 'study.py')

import argparse
import difflib
import functools
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field

from configurator import configure
from run_kit.common import FROZEN_ON_RESUME, H100_PEAK_FLOPS, MODEL_KEYS, WriteFailed, build_model, run_command
from run_kit.run_dir import existing_run, is_finished, killed_before_first_checkpoint
from run_kit.run_files import (CHECKPOINT, CONFIG, EXIT_STOPPED, FINAL, LOCK, LOG, RunFileError, atomic_write,
                               describe_divergence, divergence, read_config, read_log, schedule_length, write_failed)

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = [1, 2, 3, 4, 5]
MORE_SEEDS = [6, 7, 8, 9, 10]   # the third set's seeds 6-10: its ten pairs (docs/results.md, "Summary")
EXTRA_PAIRS = [('rd_attnres', 'ctrl_heads')]   # compared side by side beyond each arm vs its parent
PLAN_KEYS = ('config', 'seed', 'out_dir', 'overrides')   # an entry of a JSON plan
RUNNER_KEYS = ('--seed', '--out_dir', '--init_from')     # what Run.argv sets itself: not for overrides
# What a folder's run must agree on with its entry to be that entry's run: what its numbers mean (the frozen
# keys a plan can set; data_id and dtype_resolved are found when the run starts) and its budget. Not where or
# how it ran (out_dir, data_dir, device, batch_size, compile, ...), which a resume may change, nor what
# train.py adds to config.json (git_commit, torch_version, world_size, ...).
ENTRY_KEYS = tuple(k for k in FROZEN_ON_RESUME if k not in ('data_id', 'dtype_resolved')) + ('max_iters', 'dtype')


@dataclass(frozen=True)
class Run:
    config: str                    # a config file, relative to the repository
    seed: int
    out_dir: str                   # relative to the study's root (--root)
    overrides: tuple = field(default=())   # --key=value, after the config file

    def argv(self, root, extra=(), replace=False):
        """train.py's arguments for this run; replace: the run in its folder is another one, to be replaced."""
        start = ['--init_from=scratch', '--overwrite=True'] if replace else ['--init_from=auto']
        return [os.path.join(HERE, 'train.py'), os.path.join(HERE, self.config), f'--seed={self.seed}',
                f'--out_dir={os.path.join(root, self.out_dir)}', *start, *self.overrides, *extra]


# -----------------------------------------------------------------------------
# The plans

def paper_plan():
    """The paper's study: five seeds x {baseline, attnres, rd} x {120m, 343m}, then the early-budget
    controls at 120m (each with its own attnres and rd parents at that budget), five seeds each."""
    runs = []
    for seed in SEEDS:
        runs += [Run(f'config/{arm}_{size}.py', seed, f'out/{arm}_{size}_s{seed}')
                 for size in ('120m', '343m') for arm in ('baseline', 'attnres', 'rd')]
    for seed in SEEDS:
        runs += [Run(f'config/{arm}_120m_early.py', seed, f'out/{arm}_120m_early_s{seed}')
                 for arm in ('attnres', 'rd', 'ctrl_params', 'ctrl_dup', 'ctrl_fixed_v', 'ctrl_heads')]
    return runs


EARLY = ('--max_iters=100',)   # the early budget of the CPU study (its main budget: config/study_cpu.py)


def cpu_plan():
    """The paired study at CPU scale (docs/results.md), in the order it was run; every run
    is config/study_cpu.py with its mode, into study/runs/<set>/<mode>_s<seed>.
    First set: five seeds x {attnres, rd_attnres}, then standard, then attnres and the paper's three
    controls at the early budget. Second set, on a rebuilt corpus: attnres parents at the early budget
    (their ctrl_mix arms were run with a mode since removed; their logs are kept), then the noise floor,
    attnres vs ctrl_dup in bf16 (seed 1) and float32. Third set: float32 at the main budget, five seeds x
    {attnres, rd_attnres, ctrl_heads}; then the third seed of the float32 noise floor; then seeds 6-10 of the third set."""
    def run(folder, mode, seed, *budget):
        return Run('config/study_cpu.py', seed, f'study/runs/{folder}/{mode}_s{seed}', (f'--residual={mode}', *budget))
    fp32 = ('--dtype=float32',)
    runs = [run('main', mode, seed) for seed in SEEDS for mode in ('attnres', 'rd_attnres')]
    runs += [run('main', 'standard', seed) for seed in SEEDS]
    runs += [run('early', mode, seed, *EARLY) for seed in SEEDS
             for mode in ('attnres', 'ctrl_params', 'ctrl_dup', 'ctrl_fixed_v')]
    runs += [run('early2', 'attnres', seed, *EARLY) for seed in SEEDS]
    runs += [run('early2', 'ctrl_dup', 1, *EARLY)]
    runs += [run('early2_fp32', mode, seed, *EARLY, *fp32) for seed in (1, 2) for mode in ('attnres', 'ctrl_dup')]
    runs += [run('main_fp32', mode, seed, *fp32) for seed in SEEDS for mode in ('attnres', 'rd_attnres', 'ctrl_heads')]
    runs += [run('early2_fp32', mode, 3, *EARLY, *fp32) for mode in ('attnres', 'ctrl_dup')]
    runs += [run('main_fp32', mode, seed, *fp32) for seed in MORE_SEEDS for mode in ('attnres', 'rd_attnres', 'ctrl_heads')]
    return runs


# The time estimate's default assumptions per plan: (devices per run, peak FLOP/s of one, MFU). The paper's
# on 8 H100 SXM (989 TFLOP/s bf16 dense) at 40%; the CPU study's is the throughput its float32 runs reach
# on two CPU cores (docs/results.md), counted as 100% of an effective peak.
ESTIMATE = {'paper': (8, H100_PEAK_FLOPS, 0.4), 'cpu': (1, 130e9, 1.0)}
# name -> (runs, report file relative to the root, where a folder's JSON and plots go)
PLANS = {
    'paper': (paper_plan, 'out/report.md', lambda folder: ('out/results.json', 'out/plots')),
    'cpu': (cpu_plan, 'study/report.md',
            lambda folder: (f'study/results_{os.path.basename(folder)}.json',
                            'study/plots' + ('' if os.path.basename(folder) in ('main', 'early')
                                             else '/' + os.path.basename(folder)))),
}


def load_plan(name):
    """(runs, report file, outputs of a folder) of a named plan or of a JSON plan file."""
    if name in PLANS:
        runs, report_file, outputs = PLANS[name]
        return runs(), report_file, outputs
    if not name.endswith('.json'):
        raise SystemExit(f"unknown plan {name!r}: choose one of {', '.join(PLANS)}, or give a JSON plan file")
    def check(i, r):
        if not isinstance(r, dict):
            raise ValueError(f"entry {i} is not an object with config and out_dir strings")
        for key in r:   # a misspelt key would be ignored: the run would train something else than planned
            if key not in PLAN_KEYS:
                close = difflib.get_close_matches(key, PLAN_KEYS, n=1)
                hint = (f"did you mean {close[0]!r}?" if close else
                        f"train.py's keys go in overrides, as \"--{key}=...\"")
                raise ValueError(f"entry {i} has the key {key!r}, which a plan entry does not have ({hint}); an "
                                 f"entry's keys are {', '.join(PLAN_KEYS)}")
        if not all(isinstance(r.get(k), str) and r[k] for k in ('config', 'out_dir')):
            raise ValueError(f"entry {i} is not an object with config and out_dir strings")
        if not isinstance(r.get('seed'), int) or isinstance(r['seed'], bool):
            raise ValueError(f"entry {i}: seed must be an integer, got {r.get('seed')!r}")
        overrides = r.get('overrides', [])
        if not isinstance(overrides, list) or not all(isinstance(o, str) and o.startswith('--') for o in overrides):
            raise ValueError(f"entry {i}: overrides must be a list of --key=value strings, got {overrides!r}")
        # normalised: 'runs/x/../a' is runs/a, and no folder runs/x is made on the way
        return Run(r['config'], r['seed'], os.path.normpath(r['out_dir']), tuple(overrides))
    try:
        with open(name, encoding='utf-8') as f:
            rows = json.load(f)
        if not isinstance(rows, list) or not rows:
            raise ValueError(f"a {type(rows).__name__}{' with no runs' if rows == [] else ''}, not a list of runs")
        runs = [check(i, r) for i, r in enumerate(rows, 1)]
        one_run_per_out_dir(runs)
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) else str(e)
        raise SystemExit(f"{name}: not a plan file (a JSON list of objects with config, seed, out_dir and "
                         f"optionally overrides): {reason}") from None
    stem = os.path.splitext(os.path.basename(name))[0]
    return runs, f'{stem}_report.md', lambda folder: (f'{folder}/results.json', f'{folder}/plots')


def one_run_per_out_dir(runs):
    """Two entries with one out_dir would be one run: the second taken as done (or as the first, continued)."""
    first = {}
    for i, run in enumerate(runs, 1):
        j = first.setdefault(os.path.normpath(run.out_dir), i)
        if j != i:
            raise ValueError(f"entries {j} and {i} both have out_dir {run.out_dir!r}: the second would be taken as "
                             "done, or as the first continued; give each run its own out_dir")


def configs(name, runs, root, extra):
    """Every run's configuration as train.py will read it (its config file, overrides and --extra: known keys
    of the right types), before anything runs: a plan that fails at its fifth run has trained four for
    nothing. The seed, out_dir and init_from are the runner's (Run.argv): not for overrides."""
    from train import DEFAULTS
    out = []
    for i, run in enumerate(runs, 1):
        where = f"{name}, entry {i} ({run.config} seed {run.seed} -> {run.out_dir})"
        taken = [o for o in (*run.overrides, *extra) if o.split('=')[0] in RUNNER_KEYS]
        if taken:
            raise SystemExit(f"{where}: {taken[0]} is set by the plan itself (seed, out_dir; init_from=auto), not by "
                             "overrides or --extra. Nothing was run.")
        try:
            out.append(configure(DEFAULTS, run.argv(root, extra)[1:]))
        except SystemExit as e:
            raise SystemExit(f"{where}: {str(e).rstrip('.')}{'' if str(e).endswith('?') else '.'} Nothing was run.") from None
    return out


def one_folder_each(name, runs, root):
    """Two entries whose out_dirs are one folder on this file system (a link, or names that differ only in
    case: one folder on a case-insensitive file system, macOS's or Windows' by default) would be one run: the
    second "done already", never trained, and reported as a second run of the first. Refused, before anything
    runs, wherever the plan is run (a plan that works on Linux must not lose runs on a Mac).
    And a plan's folders are its own: an out_dir reached through a link (out of the root, or into a folder
    under it that another plan, or no plan, names) is refused, naming the link and where it leads: the run
    there would be reported as the entry's, and --overwrite would retrain it with the entry's configuration."""
    names, inodes = {}, {}
    for i, run in enumerate(runs, 1):
        given = os.path.join(root, run.out_dir)
        path = os.path.realpath(given)   # links resolved, also in the folders above it (which may not exist yet)
        why = None
        if os.path.exists(given):        # a folder that exists: its inode (a link, a bind mount)
            st = os.stat(given)
            j = inodes.setdefault((st.st_dev, st.st_ino), (i, given))
            why = f"{j[1]} and {given}, one folder on this file system (the same inode)" if j[0] != i else None
        if why is None:
            j = names.setdefault(path.casefold(), (i, path))
            if j[0] != i:
                why = (f"one folder ({path})" if j[1] == path else f"{j[1]} and {path}, names that differ only in "
                       "case: one folder on a case-insensitive file system (macOS, Windows)")
        if why:
            raise SystemExit(f"{name}: entries {j[0]} ({runs[j[0] - 1].out_dir}) and {i} ({run.out_dir}) resolve to "
                             f"{why}: the second would be taken as the first's run, never trained. Give each entry its "
                             "own out_dir. Nothing was run.")
    real_root = os.path.realpath(root)
    for i, run in enumerate(runs, 1):   # (after the above: two entries, one folder, is said as such)
        link = linked(root, run.out_dir)
        if link:
            target = os.path.realpath(link)
            where = (f"outside --root {root}" if os.path.commonpath([real_root, target]) != real_root else
                     "another folder under --root, which another plan (or no plan) names")
            raise SystemExit(f"{name}: entry {i} ({run.out_dir}): {link} is a link to {target}, {where}. A plan's "
                             "run folders are its own: the run there would be reported as this entry's, and "
                             "--overwrite would train it again with this plan's configuration. Remove the link "
                             f"(rm {shlex.quote(link)}: {target} stays as it is) or give the entry an out_dir of "
                             "its own. Nothing was run.")

def linked(root, out_dir):
    """The first link on the way from root to root/out_dir (out_dir itself, or a folder above it), or None."""
    path = root
    for part in os.path.normpath(out_dir).split(os.sep):
        path = os.path.join(path, part) if part else os.sep
        if os.path.islink(path):
            return path
    return None


def entry_diff(saved, cfg):
    """{key: (the folder's value, the entry's)} of the ENTRY_KEYS where a folder's config.json (a key it lacks,
    written by an older train.py: that key's default) and the entry's configuration differ."""
    from train import DEFAULTS
    want = dict(cfg, lr_decay_iters=schedule_length(cfg))
    have = {k: saved.get(k, DEFAULTS.get(k)) for k in ENTRY_KEYS}
    return {k: (have[k], want[k]) for k in ENTRY_KEYS if have[k] != want[k]}


def folder_problem(path, cfg):
    """Why the run in an entry's folder is not (the beginning of) that entry's run, or None: the folder is
    empty, or holds a run of the entry's configuration, finished or not."""
    found = existing_run(path) if os.path.isdir(path) else []
    if not found:
        return None
    try:
        saved = read_config(path)
    except RunFileError as e:
        return f"holds files of a run ({', '.join(found)}) but {e}"
    diff = entry_diff(saved, cfg)
    if not diff:
        return None
    what = 'finished run' if is_finished(path) else 'run'
    return (f"holds a {what} of another configuration: " +
            ', '.join(f"{k} {a!r} there, {b!r} in the plan" for k, (a, b) in diff.items()))


def check_folders(name, runs, cfgs, root, overwrite=False):
    """Before anything runs: one folder per entry, and every folder empty or holding its entry's run. A folder
    that holds another run (an entry edited after it ran, a folder shared with another plan) stops the study,
    naming every such entry, unless --overwrite: then those runs are replaced. Returns {entry: its folder's
    problem} of the entries to replace."""
    one_folder_each(name, runs, root)
    problems = {i: folder_problem(os.path.join(root, run.out_dir), cfg)
                for i, (run, cfg) in enumerate(zip(runs, cfgs), 1)}
    problems = {i: p for i, p in problems.items() if p}
    if problems and not overwrite:
        listing = '\n'.join(f"  entry {i} ({runs[i - 1].config} seed {runs[i - 1].seed} -> "
                            f"{os.path.join(root, runs[i - 1].out_dir)}): {p}" for i, p in problems.items())
        raise SystemExit(f"study {name}: {len(problems)} of its folders hold a run that is not their entry's; it "
                         f"would be reported as the entry's, or refused half-way through the study:\n{listing}\n"
                         "Give such an entry a new out_dir in the plan (the old run stays), or run the same command "
                         "with --overwrite to replace those runs. Nothing was run.")
    return problems


# -----------------------------------------------------------------------------
# Progress and the time estimate

def run_state(path):
    """What `train.py --init_from=auto` will do with an unfinished run's out_dir, as the dry run says it."""
    try:
        step = max((r['step'] for r in read_log(os.path.join(path, LOG))), default=None)
    except (OSError, SystemExit):
        step = None
    if step is None:
        return 'to run'
    if os.path.exists(os.path.join(path, CHECKPOINT)):
        return f'continues from its checkpoint (logged up to step {step})'
    try:
        again = killed_before_first_checkpoint(path, read_config(path))
    except RunFileError:
        again = False
    return ('starts again (killed before its first checkpoint)' if again else
            f'refused: logged up to step {step} but its {CHECKPOINT} is gone (docs/run_safety.md)')


def run_flops(cfg):
    """Training + evaluation FLOPs of a run, from its configuration (the model built on the meta device, no memory)."""
    train_tokens = cfg['max_iters'] * cfg['total_batch_size']
    eval_tokens = (cfg['max_iters'] // cfg['eval_interval'] + 1) * cfg['eval_tokens']
    per_token = flops_per_token_of_shape(tuple(cfg[k] for k in MODEL_KEYS), cfg.get('depth_read'))
    return per_token * train_tokens + per_token / 3 * eval_tokens   # an evaluation is a forward pass


@functools.lru_cache(maxsize=None)
def flops_per_token_of_shape(model_values, depth_read):
    """A model's FLOPs per training token, built once per shape (a plan's seeds and budgets share a few shapes;
    building one, even on the meta device, takes a third of a second)."""
    import torch
    from unittest import mock
    keep = lambda t, *args, **kwargs: t   # meta tensors hold no values, yet their random init takes most of a build
    with torch.device('meta'), mock.patch('torch.nn.init.normal_', keep), mock.patch('torch.nn.init.zeros_', keep):
        return build_model(dict(zip(MODEL_KEYS, model_values), depth_read=depth_read)).flops_per_token()


def format_hours(seconds):
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def dry_run(name, root, args, extra):
    runs = load_plan(name)[0]
    cfgs = configs(name, runs, root, extra)
    gpus, peak, mfu = (given if given is not None else default for given, default in
                       zip((args.gpus, args.peak_flops, args.mfu), ESTIMATE.get(name, ESTIMATE['paper'])))
    total = pending = 0.0
    print(f"{len(runs)} runs; time estimated from FLOPs at {gpus} x {peak / 1e12:g} TFLOP/s x {100 * mfu:g}% MFU "
          "(an estimate, not a measurement; --gpus, --peak_flops, --mfu change it)")
    one_folder_each(name, runs, root)
    for i, (run, cfg) in enumerate(zip(runs, cfgs), 1):
        path = os.path.join(root, run.out_dir)
        seconds = run_flops(cfg) / (gpus * peak * mfu)
        total += seconds
        problem, diverged = folder_problem(path, cfg), divergence(path)
        if problem:
            pending += seconds
            state = f"refused: {problem} (a new out_dir, or --overwrite replaces it)"
        elif is_finished(path):
            state = 'done'
        elif diverged:
            state = f"diverged ({describe_divergence(diverged)}): kept as a result (--retrain_diverged runs it again)"
        else:
            pending += seconds
            state = run_state(path)
        print(f"{i:3d}. {run.config} seed {run.seed} {' '.join(run.overrides)} -> {run.out_dir}: {state}, "
              f"~{format_hours(seconds)}")
    print(f"estimated: {format_hours(total)} in all, {format_hours(pending)} still to run")


# -----------------------------------------------------------------------------
# Running a plan

class Stop:
    """Takes note of a stop signal and passes it on, once, to the run in progress as SIGTERM. The run is
    started in a session of its own, so a signal to the terminal's process group (Ctrl-C) reaches only
    this process, which decides what the run gets; under SLURM, which signals every process of a job
    step, the run may get it twice, which train.py and torchrun both take as one."""

    def __init__(self):
        self.signal, self.child = None, None
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            signal.signal(sig, self.handle)

    def release(self):
        """Signals act as they did before (a Ctrl-C raises KeyboardInterrupt)."""
        for sig, default in ((signal.SIGTERM, signal.SIG_DFL), (signal.SIGUSR1, signal.SIG_DFL),
                             (signal.SIGINT, signal.default_int_handler)):
            signal.signal(sig, default)

    def handle(self, signum, frame):
        self.signal = self.signal or signal.Signals(signum).name
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)


def run_env(root):
    """The runs' environment: this one, with TORCHINDUCTOR_CACHE_DIR set to <root>/inductor_cache unless it is set
    already. Every run of a study then shares one compile cache: the first run of a mode and shape compiles
    its kernels, the other seeds load them (docs/gpus.md, "Compile time"). Inductor writes its cache files to a
    temporary name and renames them, so runs on several nodes may share the folder."""
    env = dict(os.environ)
    env.setdefault('TORCHINDUCTOR_CACHE_DIR', os.path.abspath(os.path.join(root, 'inductor_cache')))
    return env


def launch(run, root, launcher, extra, index, stop, replace=False):
    """Run one run to its end (or its checkpoint after a signal); its output is appended to train.out."""
    path = os.path.join(root, run.out_dir)
    cmd = shlex.split(launcher.replace('{index}', str(index))) + run.argv(root, extra, replace)
    try:
        os.makedirs(path, exist_ok=True)
        out = open(os.path.join(path, 'train.out'), 'a')
        out.write(f"\n$ {shlex.join(cmd)}\n")
        out.flush()
    except OSError as e:   # (a full disk: the run is not started)
        raise WriteFailed(write_failed(os.path.join(path, 'train.out'), e, "the run was not started",
                                       then="run the same command again").code) from None
    with out:
        try:
            stop.child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=HERE, env=run_env(root),
                                          start_new_session=True)
        except OSError as e:
            raise SystemExit(f"study stopped: the launcher cannot start ({cmd[0]}: {e.strerror}). Check --launcher "
                             "(e.g. torchrun is on PATH once its environment is active), then run the same command "
                             "again.") from None
        if stop.signal:                   # a signal that came while the run was being started
            stop.child.send_signal(signal.SIGTERM)
        code = stop.child.wait()
        stop.child = None
    return code


# What the study derives from a run, in the run's folder: the export of its final model and the route interventions
# measured on it. Derived from one run: removed when another run starts in the folder (remove_derived).
DERIVED = (FINAL, 'interventions.json')


def remove_derived(path):
    """Remove what was derived from the run in path (and the temporary files of a write of it that was killed):
    before a run starts there, new, replacing another, or continued, its numbers are no longer that run's."""
    removed = []
    for name in DERIVED:
        for f in [os.path.join(path, name)] + stale_temporaries(os.path.join(path, name)):
            if os.path.exists(f):
                os.remove(f)
                removed.append(os.path.basename(f))
    return removed


def stale_temporaries(final):
    """The temporary files of a write of `final` (run_files.atomic_write's names) that a kill left behind."""
    return sorted(set(glob.glob(glob.escape(final) + '.tmp') + glob.glob(glob.escape(final) + '.*.tmp')))


def export_source(path, digest):
    """What an export of the finished run in path is derived from, for its header: the run's configuration (a
    digest), its final step, the checksum of its final checkpoint, its final validation loss as logged, its
    evaluation set."""
    import intervene
    config = read_config(path)
    final = max((r for r in read_log(os.path.join(path, LOG)) if 'val_loss' in r and not r.get('eval_only')),
                key=lambda r: r['step'])
    return dict(config_sha256=intervene.config_hash(config), max_iters=config['max_iters'], checkpoint_sha256=digest,
                val_loss=final['val_loss'], eval_tokens=config.get('eval_tokens'))


def export_final(path):
    """A finished run's weights as path/FINAL (sample.py's export: its configuration and a digest in the header,
    and what it was derived from: export_source), from its ckpt.pt: what evaluations after the study
    (intervene.py) need when checkpoints are gone. Written again where the export there is not of this checkpoint
    (a run replaced by train.py --overwrite, say) or its content was changed since it was written; the temporary file of an export that was killed is removed.
    Done holding the folder's lock: no run writes there meanwhile. Returns a note, or ''."""
    import sample
    from run_kit.run_files import lock_folder, stored_digest
    final, ckpt = os.path.join(path, FINAL), os.path.join(path, CHECKPOINT)
    if not os.path.exists(ckpt) and not stale_temporaries(final):
        if os.path.exists(final) and export_of(final)[1] is False:
            return (f" ({FINAL} was changed after it was written and there is no {CHECKPOINT} to export it again from: "
                    "its weights cannot be told to be this run's. Train the run again in another folder to measure it)")
        return ''   # (no checkpoint: the export, if any, is all there is)
    held, holder = lock_folder(path, LOCK)
    if held is None:
        return f" (not exported: the folder is in use, {holder})"
    try:
        for tmp in stale_temporaries(final):
            os.remove(tmp)
        digest = stored_digest(ckpt) if os.path.exists(ckpt) else None
        if digest is None:
            return ''   # (no checkpoint: the export, if any, is all there is)
        source, intact = export_of(final)
        if source.get('checkpoint_sha256') == digest and intact:
            return ''
        edited = source.get('checkpoint_sha256') == digest and intact is False
        model, saved, _ = sample.load_model(dict(out_dir=path, weights=''))
        import intervene
        wrong = intervene.differences(saved, read_config(path))
        if wrong:   # (another run's checkpoint: exported, it would carry this run's name and logged loss)
            return (f" (not exported: its {CHECKPOINT} was trained with "
                    + ', '.join(f"{k}={m!r} ({CONFIG}: {r!r})" for k, m, r in wrong) + ", not this run's model)")
        try:
            sample.export(model, dict(saved, source=export_source(path, digest)), final)
        except WriteFailed as e:
            raise WriteFailed(f"{e} To export it, run the same command again: finished runs are skipped, their "
                              "exports written.") from None
        return f" ({FINAL} had been changed after it was written: exported again from {CHECKPOINT})" if edited else ''
    finally:
        held.close()


def export_of(final):
    """(what an export says it was derived from, whether its content still gives the digest in its header):
    ({}, None) where there is no readable export (or none with a digest), (source, False) where it was changed."""
    import sample
    from safetensors import safe_open
    from safetensors.torch import load_file
    try:
        with safe_open(final, framework='pt') as f:
            header = f.metadata() or {}
        source = json.loads(header.get('config', '{}')).get('source') or {}
        if 'sha256' not in header:
            return source, None
        return source, header['sha256'] == sample.weights_digest(header['config'], load_file(final))
    except Exception:   # none, or not a readable export (written again where there is a checkpoint)
        return {}, None


def tail(path, n=15):
    try:
        with open(path, errors='replace') as f:
            return ''.join(f.readlines()[-n:])
    except OSError:
        return ''


def run_plan(name, root, launcher, extra, report_after=True, overwrite=False, retrain_diverged=False):
    runs, report_file, _ = load_plan(name)
    replace = check_folders(name, runs, configs(name, runs, root, extra), root, overwrite)
    stop, diverged = Stop(), []
    for i, run in enumerate(runs, 1):
        path = os.path.join(root, run.out_dir)
        where = f"[{i}/{len(runs)}] {run.config} seed {run.seed} {' '.join(run.overrides)} -> {path}"
        if i not in replace and is_finished(path):
            print(f"{where}: done already{export_final(path)}", flush=True)
            continue
        if i not in replace and divergence(path) and not retrain_diverged:
            print(f"{where}: diverged already ({describe_divergence(divergence(path))}): kept as a result "
                  "(--retrain_diverged runs it again)", flush=True)
            diverged.append(where)
            continue
        if stop.signal:
            break
        removed = remove_derived(path)   # derived from the run there before: not the run about to train
        print(f"{where}: {f'replacing the run there (it {replace[i]})' if i in replace else 'running'} (log: "
              f"{os.path.join(path, 'train.out')})" +
              (f"; removed {' and '.join(removed)}, derived from the run there before" if removed else ''), flush=True)
        code = launch(run, root, launcher, extra, i, stop, replace=i in replace)
        if stop.signal or code == EXIT_STOPPED:
            stopped(where, stop.signal, path)
        if code != 0 and divergence(path):   # a result: recorded in its folder, the study goes on
            print(f"{where}: diverged ({describe_divergence(divergence(path))}); the study goes on", flush=True)
            diverged.append(where)
            continue
        if code != 0 or not is_finished(path):
            log = os.path.join(path, 'train.out')
            print(tail(log), file=sys.stderr)
            raise SystemExit(f"study stopped: run {where} failed (exit code {code}); its log: {log}. Fix the cause and "
                             "run the same command again: finished runs are skipped, this one continues.")
        note = export_final(path)
        if note:
            print(f"{where}:{note}", flush=True)
    if stop.signal:
        stopped(None, stop.signal, root)
    if diverged:
        print(f"study {name}: {len(runs) - len(diverged)} of {len(runs)} runs finished, {len(diverged)} diverged "
              f"(kept as results; the report lists them with the pairs they break):\n  " + '\n  '.join(diverged) +
              "\nTo run one again: change its entry in the plan (a lower learning_rate, more warmup_iters) and run "
              "with --overwrite, or give it a new out_dir; --retrain_diverged runs it again as it is.", flush=True)
    else:
        print(f"study {name}: all {len(runs)} runs finished", flush=True)
    stop.release()   # the runs are done: a Ctrl-C now stops the report (one line, nothing half-written)
    if report_after:
        try:
            report(name, root)
        except WriteFailed as e:
            raise WriteFailed(f"the study's runs are done, its report is not: {e}") from None
    return 0


def stopped(where, signal_name, path):
    """where: the run in progress, None between two runs (nothing in progress)."""
    at = (f"at {where}; the last checkpoint is in {path}" if where else
          "between two runs, none in progress")
    print(f"study stopped by {signal_name or 'a signal to the run'} {at}. Run the same command again to carry on. "
          f"Exit code {EXIT_STOPPED}.", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_STOPPED)


# -----------------------------------------------------------------------------
# The report: compare.py's paired tables of every run of the plan, in one file

def report(name, root='.', plots=True):
    """compare.py's tables of the plan's runs (its entries only: a run in the same folder that the plan does not
    name is listed apart), folder by folder, with their route interventions, into the plan's report file."""
    import compare
    import intervene
    runs, report_file, outputs = load_plan(name)
    folders = list(dict.fromkeys(os.path.dirname(r.out_dir) for r in runs))
    sections = [f"# Study `{name}`: paired results\n\n(python study.py report {name}; tables by compare.py, "
                f"Δ = NLL(arm) − NLL(parent), validation NLL at the last step)\n"]
    # what a report writes next to the runs (the results JSON, the plots, the report itself, and the
    # temporary names a report killed mid-write leaves) is not a run: passed over without a word
    own = {os.path.abspath(os.path.join(root, p)) for p in [report_file, *(q for f in folders for q in outputs(f))]}
    own |= {p + '.tmp' for p in own}
    writes = []   # (path, what writes it), once every section is read: a full disk then loses no reading
    for folder in folders:
        # the paths as the report writes them: relative to the root, wherever the command was run from
        planned = [os.path.normpath(r.out_dir) for r in runs if os.path.dirname(r.out_dir) == folder]
        others = sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, folder, '*'))
                        if os.path.abspath(p) not in own and not p.endswith('.tmp'))
        others = [p for p in others if os.path.normpath(p) not in planned]
        loaded, skipped = compare.load_runs([os.path.join(root, p) for p in planned])
        loaded = [dict(r, path=os.path.relpath(r['path'], root)) for r in loaded]
        skipped = [(os.path.relpath(p, root), why) for p, why in skipped]
        results, groups, refused = compare.compare(loaded, None, EXTRA_PAIRS) if loaded else ([], {}, [])
        sections.append(f"## {folder or '. (the root)'}\n")   # (an out_dir without a folder: never an empty heading)
        sections.append(compare.markdown(results) if results else "(no complete pair yet)\n")
        routing = compare.routing_table(loaded)
        if routing:
            sections.append(routing)
        figures = []   # (mode, its layer map's numbers): drawn beside the plots
        sections.append(intervene.report_section(root, folder, planned, intervene_command(name, root), figures))
        diverged = compare.diverged_lines(loaded, groups, EXTRA_PAIRS)
        if diverged:
            sections.append("Diverged (kept as results: no evaluation at the last step):\n" + diverged)
        if refused:
            sections.append("Refused:\n" + '\n'.join(f"- {p}: {why}" for p, why in refused) + '\n')
        unchecked = compare.unchecked_lines(results, loaded)
        if unchecked:
            sections.append("Unchecked (in the tables above, their data order not verified):\n" + unchecked)
        if skipped:
            sections.append("Not run yet (entries of the plan without a run):\n" + compare.skipped_lines(skipped))
        if others:
            sections.append("Not part of the plan (in this folder, not named by the plan, so in no table above; "
                            f"`python compare.py {shlex.quote(os.path.join(root, folder)) if os.path.abspath(root) != HERE else folder}/*` "
                            "compares every run there):\n" +
                            compare.skipped_lines([(p, not_planned(os.path.join(root, p))) for p in others]))
        json_path, plot_dir = (os.path.join(root, p) for p in outputs(folder))
        if results:
            writes.append((json_path, lambda p=json_path, r=results: compare.write_json(p, r)))
        if plots and (results or figures):
            maps = [lambda d, m=m, b=b: [intervene.layer_map_figure(m, b, os.path.join(d, f'layer_map_{m}.png'))]
                    for m, b in figures]
            writes.append((plot_dir, lambda p=plot_dir, r=results, g=groups, a=maps: compare.plot(r, g, p, a)))
    text = '\n'.join(sections)
    writes.append((os.path.join(root, report_file), lambda: atomic_write(os.path.join(root, report_file), text)))
    again = f"run the report again ({report_command(name, root)})"
    for path, write in writes:
        compare.written(path, write, "each file the report writes is whole or as it was", again)
    print(text)
    print(f"wrote {os.path.join(root, report_file)}")
    return 0


def not_planned(path):
    """What a path in a plan's folder that the plan does not name is, for the report."""
    if not os.path.isdir(path):
        return "not a run (a file)"
    try:
        config = read_config(path)
    except RunFileError as e:
        return f"not a run ({e})"
    return f"a run of {config['residual']}, seed {config['seed']}, that this plan does not name"


def plan_arguments(name, root):
    """The plan and --root as a command of study.py names them: a JSON plan by its absolute path, --root unless
    it is the repository (the named plans' root)."""
    plan = name if name in PLANS else os.path.abspath(name)
    at = '' if os.path.abspath(root) == HERE else f" --root {shlex.quote(os.path.abspath(root))}"
    return f"{shlex.quote(plan)}{at}"


def report_command(name, root):
    return f"python study.py report {plan_arguments(name, root)}"


def intervene_command(name, root):
    return f"python study.py intervene {plan_arguments(name, root)}"


# -----------------------------------------------------------------------------
# Route interventions of a plan's runs: intervene.py on every finished two-route run not yet measured

def intervene_plan(name, root, device='cpu', data_dir=''):
    """Measure every run of the plan whose mode has two routes, is finished, has its weights in its folder (ckpt.pt,
    or the export final.safetensors) and no interventions.json of its final model (intervene.report_section's
    check), writing RUN/interventions.json; then the report again."""
    import intervene
    runs = load_plan(name)[0]
    counts = {}
    for i, run in enumerate(runs, 1):
        path = os.path.normpath(run.out_dir)
        state, detail = intervene.run_state(root, path)
        run_dir = os.path.join(root, path)
        if state == 'apart' and not intervene.run_state_weights(root, path):
            state, detail = 'apart, not measured again', f"its {intervene.JSON} is set apart ({detail})"
        counts[state] = counts.get(state, 0) + 1
        if state not in ('measure', 'apart'):
            if state is not None and state != 'numbers':
                print(f"[{i}/{len(runs)}] {path}: {detail or state.replace('_', ' ')}; not measured (finished runs "
                      "with their weights here are)", flush=True)
            continue
        if state == 'apart':
            print(f"[{i}/{len(runs)}] {path}: its {intervene.JSON} is set apart ({detail}): measured again", flush=True)
        model = (f'--out_dir={run_dir}' if os.path.exists(os.path.join(run_dir, CHECKPOINT)) else
                 f'--weights={os.path.join(run_dir, FINAL)}')
        # the run's data as it trained: a relative data_dir is the repository's (study.py runs train.py there)
        data = data_dir or os.path.join(HERE, read_config(run_dir).get('data_dir') or 'data')
        args = [model, f'--json={os.path.join(run_dir, intervene.JSON)}', f'--device={device}', f'--data_dir={data}']
        print(f"[{i}/{len(runs)}] {path}: python intervene.py {shlex.join(args)}", flush=True)
        try:
            intervene.main(args)
        except SystemExit as e:
            if isinstance(e.code, str):   # (its advice in this plan's commands)
                advice = intervene.not_the_runs(shlex.quote(run_dir), f"python study.py run {plan_arguments(name, root)}",
                                                intervene_command(name, root))
                raise SystemExit(f"{path}: {e.code.replace(intervene.not_the_runs(), advice)}") from None
            raise
    measured = counts.get('measure', 0) + counts.get('apart', 0)
    print(f"study {name}: {measured} runs measured, {counts.get('numbers', 0)} measured already", flush=True)
    return report(name, root, plots=False)


# -----------------------------------------------------------------------------
# The CPU study's corpus: real English text that ships in Debian packages

PY_DOCS = '/usr/share/doc/python3.11/html/_sources'


def kjv_chapters():
    """The King James Bible from Debian's bible-kjv, one document per chapter."""
    out = subprocess.run(['bible', '-f', 'Genesis 1:1-Revelation 22:21'], capture_output=True, text=True,
                         check=True).stdout
    chapters = {}
    for line in out.splitlines():
        m = re.match(r'^(\w+?)(\d+):(\d+) (.*)$', line)  # "Ge1:1 In the beginning ..."
        if m:
            chapters.setdefault((m.group(1), int(m.group(2))), []).append(m.group(4))
    return ['\n'.join(verses) for verses in chapters.values()]


def corpus():
    if not os.path.isdir(PY_DOCS) or not shutil.which('bible'):
        raise SystemExit("the study corpus needs Debian's packages: apt-get install python3.11-doc bible-kjv")
    docs = [open(p, encoding='utf-8').read() for p in sorted(glob.glob(f'{PY_DOCS}/**/*.rst.txt', recursive=True))]
    bible = kjv_chapters()
    os.makedirs(os.path.join(HERE, 'data', 'study_src'), exist_ok=True)
    path = os.path.join(HERE, 'data', 'study_src', 'corpus.jsonl')
    atomic_write(path, ''.join(json.dumps({'text': text}) + '\n' for text in docs + bible))
    print(f"{path}: {len(docs)} Python documentation pages + {len(bible)} Bible chapters")
    subprocess.run([sys.executable, os.path.join(HERE, 'prepare.py'), '--input', path, '--name', 'study',
                    '--val_fraction', '0.05', '--data_dir', os.path.join(HERE, 'data')], check=True)
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog='study.py', description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest='command', required=True)
    sub.add_parser('list', help='the plans')
    for command in ('run', 'report', 'intervene'):
        p = sub.add_parser(command, help=f'{command} a plan')
        p.add_argument('plan', help=f"{', '.join(PLANS)}, or a JSON plan file")
        p.add_argument('--root', default='.', help="the folder the plan's out_dirs and report are relative to")
    run_ap = sub.choices['run']
    run_ap.add_argument('--launcher', default=shlex.quote(sys.executable),
                        help="what starts train.py, e.g. 'torchrun --standalone --nproc_per_node=8'; "
                             "{index} is replaced by the run's number (e.g. for a rendezvous id)")
    run_ap.add_argument('--extra', default='', help="overrides added to every run, e.g. '--compile=False'")
    run_ap.add_argument('--dry_run', action='store_true', help='list the queue, what is done, and a time estimate')
    run_ap.add_argument('--gpus', type=int, help='for the estimate: devices per run (paper: 8)')
    run_ap.add_argument('--peak_flops', type=float, help=f'for the estimate: peak FLOP/s of one (paper: {H100_PEAK_FLOPS:g}, H100 SXM bf16)')
    run_ap.add_argument('--mfu', type=float, help='for the estimate: the model FLOPs utilisation assumed (paper: 0.4)')
    run_ap.add_argument('--no_report', action='store_true', help='do not write the report at the end (e.g. on nodes > 0)')
    run_ap.add_argument('--overwrite', action='store_true',
                        help="replace the runs in folders that hold another configuration than their entry's "
                             "(without it, the study lists them and stops before anything runs)")
    run_ap.add_argument('--retrain_diverged', action='store_true',
                        help="run the entries whose run diverged again (from their last checkpoint); without it "
                             "a diverged run is kept as a result")
    sub.choices['report'].add_argument('--no_plots', action='store_true')
    sub.choices['intervene'].add_argument('--device', default='cpu', help="where intervene.py evaluates (e.g. cuda)")
    sub.choices['intervene'].add_argument('--data_dir', default='',
                                          help="the data builds' folder ('' = each run's, as it trained)")
    sub.add_parser('corpus', help="build the CPU study's corpus from Debian's packages")
    args = ap.parse_args(argv)
    if args.command == 'list':
        for name, (runs, report_file, _) in PLANS.items():
            print(f"{name}: {len(runs())} runs, report {report_file}. {(runs.__doc__ or '').split(chr(10))[0]}")
        return 0
    if args.command == 'corpus':
        return corpus()
    root = os.path.abspath(args.root)
    if args.command == 'report':
        return report(args.plan, root, plots=not args.no_plots)
    if args.command == 'intervene':
        return intervene_plan(args.plan, root, args.device, args.data_dir)
    extra = shlex.split(args.extra)
    if args.dry_run:
        dry_run(args.plan, root, args, extra)
        return 0
    return run_plan(args.plan, root, args.launcher, extra, report_after=not args.no_report, overwrite=args.overwrite,
                    retrain_diverged=args.retrain_diverged)


if __name__ == '__main__':
    sys.exit(run_command(main, sys.argv[1:], 'study.py', "every file it writes is whole or as it was (runs: their "
                                                         "last checkpoint); run the same command again"))
