"""Tests of study.py (plans, the runner, the report) and scripts/slurm_study.sh, in miniature on the CPU:
real train.py runs of a tiny model on the built-in corpus, stopped by signals as a cluster would."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

import study
from helpers import assert_same_run, logged_steps
from helpers import HERE, TINY

MINI = [*TINY, '--max_iters=15', '--lr_decay_iters=15', '--eval_interval=15', '--log_interval=5']


def test_paper_plan_runs_whole_seeds_first():
    runs = study.paper_plan()
    assert len(runs) == 5 * 3 * 2 + 5 * 6 and len({r.out_dir for r in runs}) == len(runs)
    assert all(os.path.exists(os.path.join(HERE, r.config)) for r in runs)
    headline, early = runs[:30], runs[30:]
    for seed in range(1, 6):   # seed s of every arm and size before seed s + 1
        assert {r.seed for r in headline[6 * (seed - 1):6 * seed]} == {seed}
        assert {r.seed for r in early[6 * (seed - 1):6 * seed]} == {seed}
    assert {r.config for r in headline[:6]} == {f'config/{a}_{s}.py' for a in ('baseline', 'attnres', 'rd')
                                                 for s in ('120m', '343m')}
    assert {os.path.basename(r.config) for r in early[:6]} == {
        f'{a}_120m_early.py' for a in ('attnres', 'rd', 'ctrl_params', 'ctrl_dup', 'ctrl_fixed_v', 'ctrl_heads')}


def test_cpu_plan_is_the_study_that_was_run():
    runs = study.cpu_plan()
    committed = {os.path.relpath(p, HERE) for p in
                 [os.path.dirname(c) for c in __import__('glob').glob(os.path.join(HERE, 'study/runs/*/*/config.json'))]}
    planned = {r.out_dir for r in runs}
    # every committed run is in the plan, except the removed ctrl_mix mode's
    assert {p for p in committed if 'ctrl_mix' not in p} <= planned
    third = [r for r in runs if '/main_fp32/' in r.out_dir]
    assert [(r.seed, r.overrides[0]) for r in third[:3]] == [(1, f'--residual={m}') for m in
                                                            ('attnres', 'rd_attnres', 'ctrl_heads')]
    assert all('--dtype=float32' in r.overrides for r in third) and len(third) == 30   # seeds 1-10, whole seeds first
    assert [r.seed for r in third] == [seed for seed in range(1, 11) for _ in range(3)]


def test_dry_run_lists_the_queue_and_estimates_the_time(capsys, tmp_path):
    assert study.main(['run', 'paper', '--dry_run', '--root', str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert '60 runs' in out and out.count(': to run') == 60 and '8 x 989 TFLOP/s x 40% MFU' in out
    # the estimate is the FLOP count over the throughput: 120m, 3815 steps of 2^19 tokens + 16 evaluations
    from model import GPT, GPTConfig
    import torch
    with torch.device('meta'):
        per_token = GPT(GPTConfig(n_layer=12, n_head=12, n_embd=768, residual='standard')).flops_per_token()
    seconds = (per_token * 3815 * 2 ** 19 + per_token / 3 * 16 * 10485760) / (8 * 989e12 * 0.4)
    assert f"-> out/baseline_120m_s1: to run, ~{seconds / 60:.0f} min" in out


def mini_plan(path, runs):
    data = json.dumps([dict(config='config/quickstart.py', seed=seed, out_dir=f'runs/{mode}_s{seed}',
                            overrides=[f'--residual={mode}', *MINI, *extra]) for mode, seed, *extra in runs])
    with open(path, 'w') as f:
        f.write(data)
    return str(path)


def study_cmd(plan, root, data_dir, *more):
    return [sys.executable, os.path.join(HERE, 'study.py'), 'run', plan, '--root', str(root),
            f'--extra=--data_dir={data_dir}', *more]


ENV = dict(os.environ, OMP_NUM_THREADS='1')


@pytest.mark.slow
def test_interrupted_study_ends_as_an_uninterrupted_one(data_dir, tmp_path):
    plan = mini_plan(tmp_path / 'mini.json', [('attnres', 1), ('rd_attnres', 1), ('attnres', 2)])
    whole, cut = tmp_path / 'whole', tmp_path / 'cut'
    p = subprocess.run(study_cmd(plan, whole, data_dir), capture_output=True, text=True, env=ENV, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    # the same study, SIGTERM to study.py while its second run trains
    proc = subprocess.Popen(study_cmd(plan, cut, data_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    second = str(cut / 'runs' / 'rd_attnres_s1')
    deadline = time.time() + 300
    while not logged_steps(second):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == study.EXIT_STOPPED and 'study stopped by SIGTERM' in err, err[-2000:]
    assert 0 < max(logged_steps(second)) < 15 and not os.path.exists(cut / 'runs' / 'attnres_s2')
    p = subprocess.run(study_cmd(plan, cut, data_dir), capture_output=True, text=True, env=ENV, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert 'done already' in p.stdout and 'all 3 runs finished' in p.stdout
    for run in ('attnres_s1', 'rd_attnres_s1', 'attnres_s2'):
        assert_same_run(str(whole / 'runs' / run), str(cut / 'runs' / run))
    report = (cut / 'mini_report.md').read_text()
    assert '### rd_attnres vs attnres' in report and '| 1 |' in report
    # a finished study reports any number of times (its results.json and plots/ lie among the runs), also
    # after a report killed mid-write, and the tables stay the same
    first = (whole / 'mini_report.md').read_text()
    report_cmd = [sys.executable, os.path.join(HERE, 'study.py'), 'report', plan, '--root', str(whole)]
    for _ in range(2):
        p = subprocess.run(report_cmd, capture_output=True, text=True, env=ENV, timeout=600)
        assert p.returncode == 0 and (whole / 'mini_report.md').read_text() == first, p.stderr[-2000:]
    results = whole / 'runs' / 'results.json'
    before = os.stat(results).st_ino
    killed = subprocess.Popen(report_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    deadline = time.time() + 300
    while os.stat(results).st_ino == before and killed.poll() is None:   # killed as it writes: once it has
        assert time.time() < deadline, 'the report did not write in time'  # replaced results.json, plots next
        time.sleep(0.001)
    killed.kill()
    killed.wait()
    # what a kill mid-write leaves, planted too (wherever the kill above landed)
    (whole / 'runs' / 'results.json.tmp').write_text('{"half')
    (whole / 'mini_report.md.tmp').write_text('# half a rep')
    (whole / 'runs' / 'plots' / 'curves_half.png').write_bytes(b'\x89PNG half')
    p = subprocess.run(report_cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert p.returncode == 0 and (whole / 'mini_report.md').read_text() == first, p.stderr[-2000:]
    assert 'Skipped' not in first and 'Refused' not in first
    # compare.py over the same folder: the report's own files are skipped with a line that says why
    p = subprocess.run([sys.executable, os.path.join(HERE, 'compare.py'), str(whole / 'runs' / '*')],
                       capture_output=True, text=True, env=ENV, timeout=600)
    assert p.returncode == 0 and '### rd_attnres vs attnres' in p.stdout, p.stderr[-2000:]
    assert 'results.json: not a run directory (a file)' in p.stdout and 'plots: no config.json' in p.stdout
    # run once more: everything is finished, nothing is started
    p = subprocess.run(study_cmd(plan, cut, data_dir, '--no_report'), capture_output=True, text=True, env=ENV,
                       timeout=600)
    assert p.returncode == 0 and p.stdout.count('done already') == 3


@pytest.mark.slow
def test_a_failing_run_stops_the_study_naming_it(data_dir, tmp_path):
    plan = mini_plan(tmp_path / 'bad.json', [('attnres', 1), ('attnres', 2, '--n_head=3'), ('attnres', 3)])
    p = subprocess.run(study_cmd(plan, tmp_path, data_dir), capture_output=True, text=True, env=ENV, timeout=600)
    log = tmp_path / 'runs' / 'attnres_s2' / 'train.out'
    assert p.returncode == 1 and 'run [2/3]' in p.stderr and str(log) in p.stderr, p.stderr[-2000:]
    assert 'n_embd=32 must be divisible by n_head=3' in log.read_text()
    assert not os.path.exists(tmp_path / 'runs' / 'attnres_s3')


def test_runs_of_a_study_share_one_compile_cache(tmp_path, monkeypatch):
    """Each run is started with TORCHINDUCTOR_CACHE_DIR=<root>/inductor_cache, so seeds 2-5 load the kernels
    that seed 1 compiled; a cache folder the user set is left as it is."""
    seen = tmp_path / 'seen'
    launcher = f"sh -c 'printf %s \"$TORCHINDUCTOR_CACHE_DIR\" > {seen}' sh"   # stands in for python/torchrun
    stop = study.Stop.__new__(study.Stop)        # without installing its signal handlers in pytest
    stop.signal = stop.child = None
    run = study.Run('config/study_cpu.py', 1, 'runs/attnres_s1')
    monkeypatch.delenv('TORCHINDUCTOR_CACHE_DIR', raising=False)
    assert study.launch(run, str(tmp_path), launcher, (), 1, stop) == 0
    assert seen.read_text() == str(tmp_path / 'inductor_cache')
    monkeypatch.setenv('TORCHINDUCTOR_CACHE_DIR', '/scratch/my-cache')
    assert study.launch(run, str(tmp_path), launcher, (), 1, stop) == 0
    assert seen.read_text() == '/scratch/my-cache'


def test_a_report_says_the_same_wherever_it_is_run_from(tmp_path, monkeypatch, capsys):
    from helpers import make_run
    root = tmp_path / 'root'
    for seed in (1, 2):
        make_run(str(root / 'runs'), f'standard_s{seed}', 'standard', seed, 3.4)
        make_run(str(root / 'runs'), f'attnres_s{seed}', 'attnres', seed, 3.3)
    (root / 'runs' / 'notes').mkdir()                                  # not a run: listed as skipped
    plan = mini_plan(tmp_path / 'plan.json', [(mode, seed) for seed in (1, 2) for mode in ('standard', 'attnres')])
    reports = []
    for cwd in (root, tmp_path, HERE):
        monkeypatch.chdir(cwd)
        assert study.report(plan, str(root), plots=False) == 0
        reports.append((root / 'plan_report.md').read_text())
    assert reports[0] == reports[1] == reports[2] and '### attnres vs standard' in reports[0]
    assert 'Not part of the plan' in reports[0] and '- runs/notes: not a run (no config.json' in reports[0]


# ---------------------------------------------------------------------------------------------
# scripts/slurm_study.sh, with stand-ins for srun and scontrol

SLURM = os.path.join(HERE, 'scripts', 'slurm_study.sh')


def fake_slurm(tmp_path, srun_body):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    tools = {'scontrol': 'if [ "$1" = show ]; then printf "%s\\n" $FAKE_NODES; else echo "$@" >> "$CALLS"; fi',
             'srun': srun_body}
    for name, body in tools.items():
        (bin_dir / name).write_text(f'#!/usr/bin/env bash\n{body}\n')
        (bin_dir / name).chmod(0o755)
    return dict(ENV, PATH=f"{bin_dir}:{os.environ['PATH']}", CALLS=str(tmp_path / 'calls'), SLURM_JOB_ID='4242',
                SLURM_JOB_NODELIST='node[1-2]', SLURM_SUBMIT_DIR=HERE, FAKE_NODES='node1 node2', SLURM_NNODES='2')


@pytest.mark.parametrize('code, requeued, exit_code', [(75, True, 0), (0, False, 0), (1, False, 1)])
def test_slurm_script_builds_the_launcher_and_requeues_after_a_stop(tmp_path, code, requeued, exit_code):
    assert subprocess.run(['bash', '-n', SLURM]).returncode == 0
    # srun records what it was asked to run and ends as the study would have
    env = fake_slurm(tmp_path, f'printf "%s\\n" "$@" > "{tmp_path}/srun_args"; exit {code}')
    p = subprocess.run(['bash', SLURM], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == exit_code, p.stdout + p.stderr
    args = (tmp_path / 'srun_args').read_text()
    for part in ('--nnodes=2', '--nproc_per_node=8', '--rdzv_endpoint=node1:29500', '--rdzv_id=4242_{index}',
                 'SIGUSR1', 'python study.py run'):
        assert part in args, args
    calls = (tmp_path / 'calls').read_text() if os.path.exists(tmp_path / 'calls') else ''
    assert ('requeue 4242' in calls) == requeued


@pytest.mark.slow
def test_slurm_script_runs_a_plan_through_torchrun(data_dir, tmp_path):
    # srun on one node: run the task command here (drop srun's own options); torchrun's c10d rendezvous on
    # localhost with one CPU process per "node"
    plan = mini_plan(tmp_path / 'one.json', [('rd_attnres', 1)])
    env = fake_slurm(tmp_path, 'while [[ "$1" == -* ]]; do shift; done; SLURM_NODEID=0 exec "$@"')
    env.update(FAKE_NODES='localhost', SLURM_NNODES='1', GPUS_PER_NODE='1', PORT='29517', PLAN=plan,
               STUDY_ARGS=f'--root={tmp_path} --extra=--data_dir={data_dir}')
    p = subprocess.run(['bash', SLURM], capture_output=True, text=True, env=env, timeout=600, cwd=HERE)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    run_dir = tmp_path / 'runs' / 'rd_attnres_s1'
    assert json.load(open(run_dir / 'config.json'))['world_size'] == 1 and study.is_finished(str(run_dir))
    assert 'torchrun' in (run_dir / 'train.out').read_text()


# ---------------------------------------------------------------------------------------------
# A study reports only what its plan asked for, and every piece of advice it prints works when followed

def study_run(plan, root, data_dir, *more):
    return subprocess.run(study_cmd(plan, root, data_dir, *more), capture_output=True, text=True, env=ENV,
                          timeout=600)


def config_of(path):
    return json.load(open(os.path.join(path, 'config.json')))


@pytest.mark.slow
def test_a_folder_counts_as_done_only_for_the_entry_that_ran_there(data_dir, tmp_path):
    plan = mini_plan(tmp_path / 'plan.json', [('attnres', 1)])
    assert study_run(plan, tmp_path, data_dir, '--no_report').returncode == 0
    first = tmp_path / 'runs' / 'attnres_s1'
    log_before = (first / 'log.jsonl').read_bytes()
    # the entry edited after it ran, and a second entry added: refused before anything runs, naming the
    # entry, its folder, the key, and the ways on
    plan = mini_plan(tmp_path / 'plan.json', [('attnres', 1, '--learning_rate=0.0005'), ('rd_attnres', 1)])
    p = study_run(plan, tmp_path, data_dir, '--no_report')
    assert p.returncode == 1 and 'Traceback' not in p.stderr, p.stderr[-2000:]
    assert 'entry 1 (config/quickstart.py seed 1 -> ' in p.stderr and str(first) in p.stderr
    assert "learning_rate 0.003 there, 0.0005 in the plan" in p.stderr and 'finished run' in p.stderr
    assert 'a new out_dir' in p.stderr and '--overwrite' in p.stderr and 'Nothing was run' in p.stderr
    assert not (tmp_path / 'runs' / 'rd_attnres_s1').exists() and (first / 'log.jsonl').read_bytes() == log_before
    # --dry_run says the same of that entry (not "done")
    p = subprocess.run([*study_cmd(plan, tmp_path, data_dir), '--dry_run'], capture_output=True, text=True,
                       env=ENV, timeout=600)
    assert p.returncode == 0 and 'rd_attnres_s1: to run' in p.stdout, p.stderr[-2000:]
    assert 'attnres_s1: refused: holds a finished run of another configuration' in p.stdout
    # the advice followed: --overwrite replaces that run, trains the other, and a rerun has nothing to do
    p = study_run(plan, tmp_path, data_dir, '--no_report', '--overwrite')
    assert p.returncode == 0 and 'all 2 runs finished' in p.stdout, p.stderr[-2000:]
    assert 'replacing the run there' in p.stdout and config_of(first)['learning_rate'] == 0.0005
    assert study.is_finished(str(first)) and study.is_finished(str(tmp_path / 'runs' / 'rd_attnres_s1'))
    p = study_run(plan, tmp_path, data_dir, '--no_report')
    assert p.returncode == 0 and p.stdout.count('done already') == 2, p.stderr[-2000:]
    # the other way on: a new out_dir for the edited entry, the old run left as it was
    edited = json.load(open(plan))
    edited[0]['overrides'].append('--learning_rate=0.001')
    edited[0]['out_dir'] = 'runs/attnres_s1_lr1e-3'
    open(plan, 'w').write(json.dumps(edited))
    p = study_run(plan, tmp_path, data_dir, '--no_report')
    assert p.returncode == 0 and 'all 2 runs finished' in p.stdout, p.stderr[-2000:]
    assert config_of(tmp_path / 'runs' / 'attnres_s1_lr1e-3')['learning_rate'] == 0.001
    assert config_of(first)['learning_rate'] == 0.0005


@pytest.mark.slow
def test_the_committed_cpu_study_is_done_for_its_plan():
    # config.json of these runs hold another machine's absolute out_dir, its git commit and torch version, and
    # none of the keys train.py gained since: none of that is the entry's configuration
    p = subprocess.run([sys.executable, os.path.join(HERE, 'study.py'), 'run', 'cpu', '--dry_run'],
                       capture_output=True, text=True, env=ENV, timeout=600, cwd=HERE)
    assert p.returncode == 0, p.stderr[-2000:]
    entries = [line for line in p.stdout.splitlines() if ' -> study/runs/' in line]
    assert len(entries) == len(study.cpu_plan()) and all(': done, ' in line for line in entries), p.stdout[-3000:]


@pytest.mark.parametrize('second', ['link', 'case', 'parent_link'])
def test_entries_that_resolve_to_one_folder_are_refused(tmp_path, second):
    runs = tmp_path / 'runs'
    (runs / 'run_a').mkdir(parents=True)
    if second == 'link':                  # another name for the same folder
        os.symlink(runs / 'run_a', runs / 'run_b')
        out_dirs, said = ['runs/run_a', 'runs/run_b'], 'the same inode'
    elif second == 'parent_link':         # a link above the folders: one folder once resolved
        os.symlink(runs, tmp_path / 'more')
        out_dirs, said = ['runs/run_b', 'more/run_b'], f"one folder ({runs / 'run_b'})"   # (run_b not made yet)
    else:                                 # one folder on a case-insensitive file system (simulated: by its names)
        out_dirs, said = ['runs/Run_A', 'runs/run_a'], 'differ only in case'
    plan = tmp_path / 'plan.json'
    plan.write_text(json.dumps([dict(config='config/quickstart.py', seed=1, out_dir=d, overrides=[f'--residual={m}'])
                                for d, m in zip(out_dirs, ('attnres', 'rd_attnres'))]))
    for more in ([], ['--dry_run']):
        with pytest.raises(SystemExit) as e:
            study.main(['run', str(plan), '--root', str(tmp_path), *more])
        text = str(e.value)
        assert f'entries 1 ({out_dirs[0]}) and 2 ({out_dirs[1]})' in text and said in text, text
        assert 'own out_dir' in text and 'Nothing was run' in text
    assert sorted(os.listdir(runs)) == sorted(['run_a', 'run_b'][:1 + (second == 'link')]) and \
        os.listdir(runs / 'run_a') == []                    # nothing was written there



@pytest.mark.parametrize('into', ['another_plan', 'out_of_root', 'parent_link'])
def test_a_run_folder_that_is_a_link_is_refused_and_never_overwritten(tmp_path, capsys, into):
    from helpers import make_run
    root = tmp_path / 'root'
    make_run(str(root / 'runs_b'), 'attnres_s1', 'attnres', 1, 3.3)   # plan B's finished run
    make_run(str(tmp_path / 'elsewhere'), 'attnres_s1', 'attnres', 1, 3.3)   # a run out of the root
    (root / 'runs_a').mkdir()
    if into == 'another_plan':
        link, target, out_dir = root / 'runs_a' / 'attnres_s1', root / 'runs_b' / 'attnres_s1', 'runs_a/attnres_s1'
    elif into == 'out_of_root':
        link, target, out_dir = root / 'runs_a' / 'attnres_s1', tmp_path / 'elsewhere' / 'attnres_s1', 'runs_a/attnres_s1'
    else:   # a folder above the run that is a link
        link, target, out_dir = root / 'runs_c', tmp_path / 'elsewhere', 'runs_c/attnres_s1'
    os.symlink(target, link)
    files = {p: open(p, 'rb').read() for d in (root / 'runs_b', tmp_path / 'elsewhere')
             for p in map(str, d.rglob('*')) if os.path.isfile(p)}
    plan = tmp_path / 'plan_a.json'   # another learning rate: --overwrite would train the run there again
    plan.write_text(json.dumps([dict(config='config/quickstart.py', seed=1, out_dir=out_dir,
                                     overrides=['--residual=attnres', *MINI, '--learning_rate=1e-2'])]))
    for more in (['--overwrite'], [], ['--dry_run']):
        with pytest.raises(SystemExit) as e:
            study.main(['run', str(plan), '--root', str(root), *more])
        text = str(e.value)
        assert f'{link} is a link to {target}' in text and 'Nothing was run' in text, text
        assert ('outside --root' in text) == (into != 'another_plan'), text
    assert files == {p: open(p, 'rb').read() for p in files}   # the other plan's run (or the outer one): untouched
    # the advice followed: the link removed, the entry is a run to make in a folder of its own
    assert f'rm {link}' in text
    os.remove(link)
    capsys.readouterr()
    study.main(['run', str(plan), '--root', str(root), '--dry_run'])
    assert f'{out_dir}: to run' in capsys.readouterr().out
    assert files == {p: open(p, 'rb').read() for p in files}

@pytest.mark.slow
def test_a_diverged_run_is_a_result_and_the_study_goes_on(data_dir, tmp_path):
    blow_up = ('--learning_rate=1e30', '--warmup_iters=1')
    plan = mini_plan(tmp_path / 'plan.json', [('attnres', 1, *blow_up), ('rd_attnres', 1), ('standard', 1)])
    diverged, other = tmp_path / 'runs' / 'attnres_s1', tmp_path / 'runs' / 'rd_attnres_s1'
    p = study_run(plan, tmp_path, data_dir)
    assert p.returncode == 0 and 'Traceback' not in p.stderr, p.stdout[-2000:] + p.stderr[-2000:]
    assert '2 of 3 runs finished, 1 diverged' in p.stdout and '--retrain_diverged' in p.stdout
    assert study.is_finished(str(other)) and study.is_finished(str(tmp_path / 'runs' / 'standard_s1'))
    # recorded in its folder: what, at which step first, which value, noticed when
    record = study.divergence(str(diverged))
    assert record['what'] == 'training loss' and record['value'] in ('nan', 'inf', '-inf'), record
    assert 0 <= record['first_step'] <= record['step'] == 5, record
    report = (tmp_path / 'plan_report.md').read_text()
    assert 'Diverged' in report and 'runs/attnres_s1 (attnres, seed 1): non-finite training loss' in report
    assert 'breaks the pairs rd_attnres vs attnres (with runs/rd_attnres_s1), attnres vs standard' in report
    # (its learning rate, the test's way to make it diverge, also keeps it from pairing: listed as refused too)
    # run again: kept as a result, not trained again
    log_before = (diverged / 'log.jsonl').read_bytes()
    p = study_run(plan, tmp_path, data_dir, '--no_report')
    assert p.returncode == 0 and 'diverged already' in p.stdout and p.stdout.count('done already') == 2
    assert (diverged / 'log.jsonl').read_bytes() == log_before
    # asked to: run again as it is (it diverges again: the study still finishes)
    p = study_run(plan, tmp_path, data_dir, '--no_report', '--retrain_diverged')
    assert p.returncode == 0 and '1 diverged' in p.stdout and 'attnres_s1: running' in p.stdout, p.stderr[-2000:]
    # the advice followed: the entry changed (its learning rate lowered), then --overwrite as the message says
    plan = mini_plan(tmp_path / 'plan.json', [('attnres', 1), ('rd_attnres', 1), ('standard', 1)])
    p = study_run(plan, tmp_path, data_dir, '--no_report')
    assert p.returncode == 1 and 'learning_rate 1e+30 there, 0.003 in the plan' in p.stderr, p.stderr[-2000:]
    p = study_run(plan, tmp_path, data_dir, '--overwrite')
    assert p.returncode == 0 and 'all 3 runs finished' in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    report = (tmp_path / 'plan_report.md').read_text()
    assert 'Diverged' not in report and '### rd_attnres vs attnres' in report and '### attnres vs standard' in report


@pytest.mark.slow
def test_a_busy_folder_stops_the_study_and_the_same_command_then_finishes(data_dir, tmp_path):
    from run_kit.run_files import lock_folder
    plan = mini_plan(tmp_path / 'plan.json', [('attnres', 1)])
    held, _ = lock_folder(str(tmp_path / 'runs' / 'attnres_s1'), 'run.lock')   # another run writes there
    try:
        p = study_run(plan, tmp_path, data_dir, '--no_report')
        assert p.returncode == 1 and 'in use by another run' in p.stderr and 'wait for it to end' in p.stderr, \
            p.stderr[-2000:]
        assert 'run the same command again' in p.stderr
    finally:
        held.close()                                                           # ... and it ends
    p = study_run(plan, tmp_path, data_dir, '--no_report')
    assert p.returncode == 0 and 'all 1 runs finished' in p.stdout, p.stderr[-2000:]


def test_a_report_has_no_empty_heading(tmp_path):
    from helpers import make_run
    make_run(str(tmp_path), 'standard_s1', 'standard', 1, 3.4)
    make_run(str(tmp_path), 'attnres_s1', 'attnres', 1, 3.3)
    plan = tmp_path / 'plan.json'      # out_dirs without a folder: the report's section is the root's
    plan.write_text(json.dumps([dict(config='config/quickstart.py', seed=1, out_dir=f'{m}_s1',
                                     overrides=[f'--residual={m}']) for m in ('standard', 'attnres')]))
    assert study.report(str(plan), str(tmp_path), plots=False) == 0
    lines = (tmp_path / 'plan_report.md').read_text().splitlines()
    assert not [line for line in lines if line.startswith('#') and not line.strip('# ')], lines
    assert '## . (the root)' in lines and '### attnres vs standard' in '\n'.join(lines)


# ---------------------------------------------------------------------------------------------
# The report holds its plan's runs only; what it says to do works; a full disk or a stop is one line

def hand_made_study(tmp_path, seeds=(1, 2), modes=('standard', 'attnres')):
    from helpers import make_run
    for seed in seeds:
        for mode in modes:
            make_run(str(tmp_path / 'runs'), f'{mode}_s{seed}', mode, seed, 3.4 - 0.1 * (mode != 'standard'))
    return mini_plan(tmp_path / 'plan.json', [(mode, seed) for seed in seeds for mode in modes])


def test_a_report_holds_its_plans_entries_only(tmp_path):
    from helpers import main_here, make_run
    plan = hand_made_study(tmp_path)
    make_run(str(tmp_path / 'runs'), 'rd_attnres_s1', 'rd_attnres', 1, 3.2)   # another plan's run in the folder
    assert study.report(plan, str(tmp_path), plots=False) == 0
    report = (tmp_path / 'plan_report.md').read_text()
    assert '| attnres vs standard' not in report and '| 2 | 3.4000 | 3.3000 |' in report
    assert 'rd_attnres vs attnres' not in report, report     # not the plan's: in no table
    assert '- runs/rd_attnres_s1: a run of rd_attnres, seed 1, that this plan does not name' in report
    # an entry removed from the plan: its run leaves the tables and is listed apart
    plan = mini_plan(tmp_path / 'plan.json', [('standard', 1), ('attnres', 1), ('standard', 2)])
    assert study.report(plan, str(tmp_path), plots=False) == 0
    report = (tmp_path / 'plan_report.md').read_text()
    assert '| 1 | 3.4000 | 3.3000 |' in report and '| 2 | 3.4000 |' not in report, report
    assert '- runs/attnres_s2: a run of attnres, seed 2, that this plan does not name' in report
    # and an entry not run yet is said, not taken for a run
    plan = mini_plan(tmp_path / 'plan.json', [('standard', 1), ('attnres', 1), ('attnres', 3)])
    assert study.report(plan, str(tmp_path), plots=False) == 0
    report = (tmp_path / 'plan_report.md').read_text()
    assert 'Not run yet' in report and '- runs/attnres_s3: does not exist' in report
    # the way it says to compare every run of the folder, followed
    command = report.split('`python compare.py ')[1].split('`')[0]
    p = main_here(__import__('compare').main, [command])
    assert p.returncode == 0 and '### rd_attnres vs attnres' in p.stdout and '| 2 | 3.4000 | 3.3000 |' in p.stdout


def test_a_log_without_digest_or_fingerprint_is_said_to_be_unchecked(tmp_path):
    plan = hand_made_study(tmp_path, seeds=(1,))
    for mode in ('standard', 'attnres'):   # logs of a train.py that kept neither data digest nor fingerprint
        log = tmp_path / 'runs' / f'{mode}_s1' / 'log.jsonl'
        rows = [{k: v for k, v in json.loads(line).items() if k not in ('data_hash', 'data_digest')}
                for line in log.read_text().splitlines()]
        log.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    assert study.report(plan, str(tmp_path), plots=False) == 0
    report = (tmp_path / 'plan_report.md').read_text()
    assert '| 1 | 3.4000 | 3.3000 |' in report
    assert '- runs/attnres_s1 and runs/standard_s1 (attnres vs standard, seed 1): unpaired-unchecked' in report


def test_the_report_names_the_command_that_measures_the_two_route_runs(tmp_path):
    from helpers import make_run
    for mode in ('attnres', 'rd_attnres'):
        make_run(str(tmp_path / 'runs'), f'{mode}_s1', mode, 1, 3.3)
    log = tmp_path / 'runs' / 'rd_attnres_s1' / 'log.jsonl'   # (make_run's routing rows lack the mean depths)
    log.write_text(''.join(json.dumps(dict(json.loads(line), routing=None)) + '\n' for line in log.read_text().splitlines()))
    (tmp_path / 'runs' / 'rd_attnres_s1' / 'final.safetensors').write_bytes(b'')   # its weights are there
    plan = mini_plan(tmp_path / 'plan.json', [('attnres', 1), ('rd_attnres', 1)])
    assert study.report(plan, str(tmp_path), plots=False) == 0
    report = (tmp_path / 'plan_report.md').read_text()
    assert (f"Not measured yet: 1 runs (runs/rd_attnres_s1): `python study.py intervene {plan} --root {tmp_path}` "
            "measures them") in report, report
    assert '--dataset' not in report
    # a named plan at the repository's root: no --root
    assert study.intervene_command('cpu', HERE) == 'python study.py intervene cpu'


def test_a_stop_between_two_runs_is_said_as_such(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        study.stopped(None, 'SIGTERM', str(tmp_path))
    err = capsys.readouterr().err
    assert e.value.code == study.EXIT_STOPPED and 'study stopped by SIGTERM between two runs, none in progress' in err
    assert ' at between' not in err and 'checkpoint' not in err


def test_a_full_disk_ends_the_report_in_one_line_and_the_advice_then_works(tmp_path, monkeypatch):
    import errno
    import compare
    from run_kit.common import EXIT_WRITE, run_command
    from helpers import main_here
    plan = hand_made_study(tmp_path)
    full = lambda path, data: (_ for _ in ()).throw(OSError(errno.ENOSPC, 'No space left on device'))
    monkeypatch.setattr(compare, 'atomic_write', full)   # the report's results.json: the disk is full
    argv = ['report', plan, '--root', str(tmp_path), '--no_plots']
    p = main_here(lambda a: run_command(study.main, a, 'study.py', ''), argv)
    assert p.returncode == EXIT_WRITE and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert 'could not write' in p.stderr and 'No space left on device' in p.stderr and 'Make room' in p.stderr
    assert not (tmp_path / 'plan_report.md').exists() and not (tmp_path / 'runs' / 'results.json').exists()
    advice = p.stderr.split('run the report again (')[1].split(')')[0]
    # compare.py --json alike
    p = main_here(lambda a: run_command(compare.main, a, 'compare.py', ''),
                  [str(tmp_path / 'runs' / '*'), '--json', str(tmp_path / 'c.json')])
    assert p.returncode == EXIT_WRITE and len(p.stderr.strip().splitlines()) == 1 and 'Make room' in p.stderr
    assert 'run the same command again' in p.stderr and not (tmp_path / 'c.json').exists()
    # room made: the command it names
    monkeypatch.undo()
    assert advice.startswith('python study.py report ')
    p = main_here(lambda a: run_command(study.main, a, 'study.py', ''), shlex.split(advice)[2:] + ['--no_plots'])
    assert p.returncode == 0 and (tmp_path / 'plan_report.md').exists() and (tmp_path / 'runs' / 'results.json').exists()


def run_dir_and_plan(tmp_path, *extra):
    """A plan of rd_attnres and attnres, seed 1; rd_attnres's out_dir goes through a folder and back."""
    entries = [dict(config='config/quickstart.py', seed=1, out_dir='runs/x/../rd_attnres_s1',
                    overrides=['--residual=rd_attnres', *MINI, *extra]),
               dict(config='config/quickstart.py', seed=1, out_dir='runs/attnres_s1', overrides=['--residual=attnres', *MINI])]
    (tmp_path / 'plan.json').write_text(json.dumps(entries))
    return tmp_path / 'runs' / 'rd_attnres_s1', str(tmp_path / 'plan.json')


def export_source(path):
    from safetensors import safe_open
    with safe_open(str(path), framework='pt') as f:
        return json.loads(f.metadata()['config'])['source']


def follow(command):
    """A command the report names (python study.py ...), run as a user would, from the repository."""
    assert command.startswith('python study.py '), command
    return subprocess.run([sys.executable, *shlex.split(command)[1:]], capture_output=True, text=True, env=ENV,
                          cwd=HERE, timeout=600)


@pytest.mark.slow
def test_a_runs_export_and_interventions_are_its_own_through_overwrite_and_rerun(data_dir, tmp_path):
    from run_kit.run_files import stored_digest
    run, plan = run_dir_and_plan(tmp_path)
    p = study_run(plan, tmp_path, data_dir)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert not (tmp_path / 'runs' / 'x').exists()                       # the '..' left no empty folder
    final = run / 'final.safetensors'
    assert export_source(final)['checkpoint_sha256'] == stored_digest(str(run / 'ckpt.pt'))
    # the report's advice followed: the study's command measures the two-route run
    report = (tmp_path / 'plan_report.md').read_text()
    p = follow(report.split('Not measured yet: 1 runs (runs/rd_attnres_s1): `')[1].split('`')[0])
    assert p.returncode == 0 and '1 runs measured' in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    first = json.load(open(run / 'interventions.json'))
    assert first['model']['step'] == 15 and first['model']['run'] == str(run)
    report = (tmp_path / 'plan_report.md').read_text()
    assert (f"| 1 | step 15 (final), checkpoint {first['model']['checkpoint_sha256'][:8]} | "
            f"{first['nll']['as_trained']:.4f} |") in report, report
    # with its plots, the report draws the run's layer map beside them
    assert study.report(plan, str(tmp_path)) == 0
    assert (tmp_path / 'runs' / 'plots' / 'layer_map_rd_attnres.png').read_bytes()[:4] == b'\x89PNG'
    # a kill during an export leaves its temporary file (GBs at the paper's size): the next run removes it
    (run / 'final.safetensors.tmp').write_bytes(b'half an export')
    p = study_run(plan, tmp_path, data_dir, '--no_report')
    assert p.returncode == 0 and p.stdout.count('done already') == 2 and not (run / 'final.safetensors.tmp').exists()
    old_export = final.read_bytes()
    # the entry changed, the run replaced (--overwrite): what was derived from the old run goes with it
    run, plan = run_dir_and_plan(tmp_path, '--learning_rate=0.001')
    p = study_run(plan, tmp_path, data_dir, '--overwrite')
    assert p.returncode == 0 and 'removed final.safetensors and interventions.json' in p.stdout, p.stdout[-2000:]
    assert not (run / 'interventions.json').exists()
    assert export_source(final)['checkpoint_sha256'] == stored_digest(str(run / 'ckpt.pt'))   # the new run's
    report = (tmp_path / 'plan_report.md').read_text()
    assert 'Not measured yet: 1 runs (runs/rd_attnres_s1)' in report and f"{first['nll']['as_trained']:.4f}" not in report
    # the old run's files put back, as a train.py --overwrite outside the study would have left them: the report
    # sets the numbers apart, the next run of the study exports the run there again
    (run / 'interventions.json').write_text(json.dumps(first))
    final.write_bytes(old_export)
    p = study_run(plan, tmp_path, data_dir)
    assert p.returncode == 0 and export_source(final)['checkpoint_sha256'] == stored_digest(str(run / 'ckpt.pt'))
    report = (tmp_path / 'plan_report.md').read_text()
    assert '- runs/rd_attnres_s1: it measured another run: that run\'s final validation loss was' in report, report
    assert f"| 1 | step 15 (final)" not in report
    # and the advice measures it again
    p = follow(report.split('Not measured yet: 1 runs (runs/rd_attnres_s1): `')[1].split('`')[0])
    assert p.returncode == 0 and 'set apart' in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    again = json.load(open(run / 'interventions.json'))
    assert again['model']['checkpoint_sha256'] == stored_digest(str(run / 'ckpt.pt')) != first['model']['checkpoint_sha256']
    report = (tmp_path / 'plan_report.md').read_text()
    assert f"| 1 | step 15 (final), checkpoint {again['model']['checkpoint_sha256'][:8]} |" in report
    assert 'Set apart' not in report and 'Not measured yet' not in report


def flip_a_weight(path, tensor):
    """One bit of `tensor`'s bytes flipped where path (a checkpoint or an export) stores them, nothing else touched:
    the checksum or digest written in the file stays as it was."""
    data = bytearray(path.read_bytes())
    at = data.find(tensor.detach().contiguous().numpy().tobytes()[:64])
    assert at > 0
    data[at + 5] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_a_flipped_byte_in_a_checkpoint_or_an_export_is_noticed_by_the_report_and_the_study(data_dir, tmp_path):
    # the checksum inside a file is not trusted alone: the report and the study recompute it from the content
    import torch
    from run_kit.run_files import load_checkpoint, stored_digest
    run, plan = run_dir_and_plan(tmp_path)
    p = study_run(plan, tmp_path, data_dir)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    report = (tmp_path / 'plan_report.md').read_text()
    p = follow(report.split('Not measured yet: 1 runs (runs/rd_attnres_s1): `')[1].split('`')[0])
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    measured = json.load(open(run / 'interventions.json'))
    final, ckpt = run / 'final.safetensors', run / 'ckpt.pt'
    weight = load_checkpoint(str(ckpt))['model']['transformer.wte.weight'].clone()   # (loaded, it maps the file)
    from safetensors.torch import load_file
    export = {k: t.clone() for k, t in load_file(str(final)).items()}   # (load_file maps the file)
    # an edited export, its checkpoint intact: the study exports the run again, and says so
    flip_a_weight(final, weight)
    p = study_run(plan, tmp_path, data_dir, '--no_report')
    assert p.returncode == 0 and 'final.safetensors had been changed after it was written: exported again' in p.stdout
    assert study.export_of(str(final))[1] is True
    assert all(torch.equal(t, export[k]) for k, t in load_file(str(final)).items())   # the run's weights again
    # a flipped byte in the checkpoint keeps its stored checksum: the report says the file is damaged now, and
    # keeps the numbers (measured from it intact: intervene.py verifies what it loads)
    digest = stored_digest(str(ckpt))
    flip_a_weight(ckpt, weight)
    assert stored_digest(str(ckpt)) == digest
    p = study_run(plan, tmp_path, data_dir)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    report = (tmp_path / 'plan_report.md').read_text()
    assert (f"| 1 | step 15 (final), checkpoint {digest[:8]}; its ckpt.pt since damaged: its content no longer "
            f"matches the checksum written with it (damaged) | {measured['nll']['as_trained']:.4f} |") in report, report
    # an edited export with no checkpoint to export it from again: said, not taken for the run's
    ckpt.unlink()
    flip_a_weight(final, weight)
    p = study_run(plan, tmp_path, data_dir, '--no_report')
    assert p.returncode == 0 and 'final.safetensors was changed after it was written and there is no ckpt.pt' in p.stdout


@pytest.mark.slow
def test_another_runs_checkpoint_is_not_measured_as_the_runs_and_the_advice_trains_the_run_again(data_dir, tmp_path):
    # a run's ckpt.pt replaced by one of the same mode and seed trained with another learning rate: the study
    # does not export it as the run's, intervene.py refuses it naming both values; disguised (its configuration
    # made the run's), its loss on the run's own evaluation set gives it away; the advice followed (the folder
    # moved aside, the plan's commands) trains the run again and measures it
    import shutil
    from run_kit.run_files import load_checkpoint, save_checkpoint
    run, plan = run_dir_and_plan(tmp_path)
    os.makedirs(tmp_path / 'other')
    other, other_plan = run_dir_and_plan(tmp_path / 'other', '--learning_rate=0.001')
    for entries, root in ((plan, tmp_path), (other_plan, tmp_path / 'other')):
        p = study_run(entries, root, data_dir, '--no_report')
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    own_export = (run / 'final.safetensors').read_bytes()
    shutil.copy(other / 'ckpt.pt', run / 'ckpt.pt')
    p = study_run(plan, tmp_path, data_dir, '--no_report')
    assert p.returncode == 0 and ("not exported: its ckpt.pt was trained with learning_rate=0.001 (config.json: "
                                  "0.003), not this run's model") in p.stdout, p.stdout[-2000:]
    assert (run / 'final.safetensors').read_bytes() == own_export
    measure = f"python study.py intervene {plan} --root {tmp_path}"
    p = follow(measure)
    said = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(said) == 1 and 'Traceback' not in p.stderr, p.stderr[-3000:]
    assert ("ckpt.pt is not the model of the run in" in said[0] and "learning_rate=0.001 (config.json there: 0.003)"
            in said[0]), said
    assert not (run / 'interventions.json').exists()
    # the same weights, their configuration made the run's: the loss they score is not the one the run logged
    ckpt = load_checkpoint(str(other / 'ckpt.pt'))
    ckpt.pop('sha256', None)
    ckpt['config'] = dict(ckpt['config'], learning_rate=config_of(run)['learning_rate'])
    save_checkpoint(ckpt, str(run / 'ckpt.pt'))
    p = follow(measure)
    said = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(said) == 1 and 'on that run\'s own evaluation set it scores' in said[0], p.stderr
    assert not (run / 'interventions.json').exists()
    # the advice, as it is written: move the folder aside, train, measure
    train = f"python study.py run {plan} --root {tmp_path}"
    assert f"move {run} aside, then {train} trains it and {measure} measures it" in said[0], said
    os.rename(run, tmp_path / 'replaced')
    p = follow(f"{train} --extra=--data_dir={data_dir}")   # (the data as the study was run with: its --extra)
    assert p.returncode == 0 and 'done already' in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    p = follow(measure)
    assert p.returncode == 0 and '1 runs measured' in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    first = json.load(open(run / 'interventions.json'))
    assert first['model']['checkpoint_sha256'] == export_source(run / 'final.safetensors')['checkpoint_sha256']
    assert (f"| 1 | step 15 (final), checkpoint {first['model']['checkpoint_sha256'][:8]} |"
            in (tmp_path / 'plan_report.md').read_text())


@pytest.mark.slow
def test_the_reports_advice_works_on_the_cpu_plan(data_dir, tmp_path):
    from helpers import train_here
    run = tmp_path / 'study' / 'runs' / 'main_fp32' / 'rd_attnres_s1'   # one of the cpu plan's entries, tiny
    train_here(data_dir, str(run), '--residual=rd_attnres', '--seed=1', '--dtype=float32')
    assert study.report('cpu', str(tmp_path), plots=False) == 0
    report = (tmp_path / 'study' / 'report.md').read_text()
    command = report.split('Not measured yet: 1 runs (study/runs/main_fp32/rd_attnres_s1): `')[1].split('`')[0]
    assert command == f'python study.py intervene cpu --root {tmp_path}'
    p = follow(command)
    assert p.returncode == 0 and '1 runs measured' in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    report = (tmp_path / 'study' / 'report.md').read_text()
    assert '| 1 | step 4 (final), checkpoint ' in report and 'Not measured yet' not in report, report
    # a run whose weights are not here (as the committed runs: their logs only): the way the report says,
    # a rerun whose log equals the run's (here the run above: the same log, copied) measured against it
    import shutil
    kept = tmp_path / 'study' / 'runs' / 'main' / 'rd_attnres_s1'
    os.makedirs(kept)
    for name in ('config.json', 'log.jsonl'):
        shutil.copy(run / name, kept)
    assert study.report('cpu', str(tmp_path), plots=False) == 0
    report = (tmp_path / 'study' / 'report.md').read_text()
    said = report.split('No interventions yet for 1 runs of rd_attnres or ctrl_heads here (study/runs/main/rd_attnres_s1)')[1]
    command = said.split('`')[1]
    assert command.startswith('python intervene.py --out_dir=<the rerun> --same_as=<the run> '), command
    command = command.replace('<the rerun>', str(run)).replace('<the run>', str(kept))
    from helpers import main_here
    import intervene
    p = main_here(intervene.main, shlex.split(command)[2:])
    assert p.returncode == 0, p.stdout + p.stderr
    assert study.report('cpu', str(tmp_path), plots=False) == 0
    report = (tmp_path / 'study' / 'report.md').read_text()
    assert '| 1 | step 4 (final), of a rerun with an equal log |' in report and 'No interventions yet' not in report


def interrupted(argv, fifo, said):
    """Run a command that reads `fifo`, Ctrl-C it once it has opened the file (it then waits for its content),
    and check that it ends in one line and status 130, no traceback."""
    from run_kit.common import EXIT_INTERRUPTED
    from helpers import default_ctrl_c
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV, cwd=HERE, preexec_fn=default_ctrl_c)
    deadline = time.time() + 300
    while True:   # the event: the command has the file open (a writer's open succeeds once a reader is there)
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.01)
    try:
        # and then waits in its read (a signal that comes before the read starts is noted by Python but acted on
        # only after the read returns, which it never would): Linux says where a process sleeps
        while 'pipe' not in open(f'/proc/{proc.pid}/wchan').read():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(writer)
    assert proc.returncode == EXIT_INTERRUPTED and 'Traceback' not in err, err[-3000:]
    assert err.strip().splitlines() == [err.strip()] and said in err, err


@pytest.mark.slow
@pytest.mark.parametrize('tool', ['study report', 'compare', 'intervene'])
def test_ctrl_c_is_one_line(tmp_path, tool):
    plan = hand_made_study(tmp_path, seeds=(1,))
    run = tmp_path / 'runs' / 'attnres_s1'
    fifo = str(tmp_path / 'fifo')
    if tool == 'intervene':   # --same_as reads the other run's log first: a log that is a pipe
        os.makedirs(tmp_path / 'other')
        os.mkfifo(tmp_path / 'other' / 'log.jsonl')
        fifo = str(tmp_path / 'other' / 'log.jsonl')
        argv = ['intervene.py', f'--out_dir={run}', f'--same_as={tmp_path / "other"}', f'--json={run}/i.json']
        said = 'intervene.py: stopped by Ctrl-C; nothing was written'
    else:                     # a run's log that is a pipe: the report (or compare.py) reads it
        os.remove(run / 'log.jsonl')
        os.mkfifo(run / 'log.jsonl')
        fifo = str(run / 'log.jsonl')
        argv = (['study.py', 'report', plan, '--root', str(tmp_path)] if tool == 'study report' else
                ['compare.py', str(tmp_path / 'runs' / '*'), '--json', str(tmp_path / 'c.json')])
        said = f"{argv[0]}: stopped by Ctrl-C;"
    interrupted([os.path.join(HERE, argv[0]), *argv[1:]], fifo, said)
    assert not (tmp_path / 'plan_report.md').exists() and not (tmp_path / 'c.json').exists()


@pytest.mark.slow
@pytest.mark.parametrize('tool', ['study report', 'compare'])
def test_a_full_disk_is_one_line(tmp_path, tool):
    from run_kit.common import EXIT_WRITE
    from helpers import limit_file_size
    plan = hand_made_study(tmp_path)
    argv = (['study.py', 'report', plan, '--root', str(tmp_path)] if tool == 'study report' else
            ['compare.py', str(tmp_path / 'runs' / '*'), '--json', str(tmp_path / 'c.json')])
    p = subprocess.run([sys.executable, os.path.join(HERE, argv[0]), *argv[1:]], capture_output=True, text=True,
                       env=ENV, cwd=HERE, timeout=600, preexec_fn=limit_file_size(100))   # a file of 100 bytes at most
    assert p.returncode == EXIT_WRITE and 'Traceback' not in p.stderr, p.stderr[-3000:]
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and 'could not write' in p.stderr, p.stderr
    assert 'File too large' in p.stderr and 'Make room' in p.stderr
    left = [f for f in __import__('glob').glob(str(tmp_path / '**' / '*'), recursive=True) if f.endswith('.tmp')]
    assert not left and not (tmp_path / 'c.json').exists() and not (tmp_path / 'plan_report.md').exists()
