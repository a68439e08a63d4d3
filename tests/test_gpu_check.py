"""The GPU check (scripts/gpu_check.py, docs/gpus.md) cannot meet a GPU broken, and cannot pass what it did not
check. Its logic is tested here directly (the budget's plan, the preflight in a faked environment, the graph
counts, the comparison of rows, the table); its plumbing runs at a tiny shape on the CPU (slow): every check,
a budget too small for them all, a check cut at the budget's end, the check stopped by a signal midway."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import HERE

sys.path.insert(0, os.path.join(HERE, 'scripts'))
import gpu_check  # noqa: E402

SCRIPT = os.path.join(HERE, 'scripts', 'gpu_check.py')
FACTS = dict(torch='2.13.0+cu128', cuda='12.8', gpus=1, device='NVIDIA H200', nccl=True)


def check_of(argv, gpus=1):
    return gpu_check.Check(gpu_check.parse_args(argv), gpus)


# ---------------------------------------------------------------------------------------------
# The logic (fast)

def test_the_plan_takes_the_checks_that_fit_in_order_and_names_the_rest():
    predicted = dict(train=300, eager=60, resume=90, checkpoint=60, bench_343m=420, bench_120m=720)
    assert gpu_check.plan(gpu_check.CHECKS, predicted, 930) == (['bench_343m', 'train', 'eager', 'resume', 'checkpoint'],
                                                                ['bench_120m'])
    # one that does not fit is left, and a cheaper one after it still runs
    assert gpu_check.plan(gpu_check.CHECKS, predicted, 500) == (['bench_343m', 'eager'],
                                                                ['train', 'resume', 'checkpoint', 'bench_120m'])
    assert gpu_check.plan(['train', 'resume', 'checkpoint'], predicted, 370) == (['train', 'checkpoint'], ['resume'])
    assert gpu_check.plan(gpu_check.CHECKS, predicted, 10) == ([], list(gpu_check.CHECKS))
    # the predictions scale with the steps; --predicted replaces them
    c = check_of(['--steps', '100'])
    fixed, per_step = gpu_check.PREDICTED['gpu']['train']
    assert c.predicted('train') == fixed + per_step * 100
    assert check_of(['--predicted', 'train=42,eager=7']).predicted('train') == 42


def test_the_default_plan_is_the_bench_first_then_train_and_names_the_rest_with_their_command():
    args = gpu_check.parse_args([])
    assert args.only.split(',') == ['bench_343m', 'train'] and args.budget == 9
    # the bench is one process, its modes interleaved: standard and rd_attnres with each depth read
    assert gpu_check.BENCH_343M_MODES.split(',') == ['standard', 'rd_attnres+fused', 'rd_attnres']
    # planned from the measured seconds: the bench, first, fits a 9-minute budget by itself
    c = check_of([])
    run, left = gpu_check.plan(list(gpu_check.DEFAULT_PLAN), {n: c.predicted(n) for n in gpu_check.DEFAULT_PLAN},
                               9 * 60 - gpu_check.STOP_MARGIN['gpu'])
    assert run[0] == 'bench_343m', (run, left)
    results = results_with(dict(bench_343m=dict(status='left', why='the budget')))
    results['asked'] = list(gpu_check.DEFAULT_PLAN)
    table = gpu_check.markdown(results)
    for name in ('eager', 'resume', 'checkpoint', 'bench_120m'):   # named, with the command of a second lease
        row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        assert 'not in this plan' in row and '--only ' in row and name in row.split('--only ')[1], row
    assert '| train |' not in table   # (asked: its own row once it has a result, not a second lease's)


def test_a_cut_check_reports_every_number_its_output_holds(tmp_path):
    c = check_of(['--out', str(tmp_path)])
    run = tmp_path / 'train_compiled'
    run.mkdir()
    rows = [dict(step=0, val_loss=10.65), dict(step=4, train_loss=9.3, dt=71.7, tok_per_s=457, mfu=None),
            dict(step=8, train_loss=5.39, dt=0.270, tok_per_s=121249, mfu=0.298),
            dict(step=12, train_loss=4.35, dt=0.272, tok_per_s=120593, mfu=0.296),
            dict(step=16, train_loss=3.89, dt=0.265, tok_per_s=123556, mfu=0.303),
            dict(step=24, val_loss=3.63)]
    # the child killed while writing a line: the whole lines still count, the torn one does not
    (run / 'log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows) + '{"step": 28, "train_lo')
    n = gpu_check.numbers_so_far(c, 'train')
    assert n['last_step'] == 16 and n['loss'] == 3.89 and n['step_s'] == 0.270 and n['mfu'] == 0.303
    assert n['first_interval_s'] == 71.7 * 4 and n['val_loss'] == 3.63 and n['val_step'] == 24
    table = gpu_check.markdown(results_with(dict(train=dict(status='cut', why="stopped at the budget's end",
                                                            numbers=n))))
    row = next(line for line in table.splitlines() if line.startswith('| train |'))
    assert '**cut**' in row and 'step 0.270 s' in row and 'MFU 30.3%' in row and 'val loss 3.6300' in row, row
    assert 'the compile) 287 s' in row, row
    # a bench cut after some modes: those modes' numbers, the names escaped
    (tmp_path / 'bench_343m.jsonl').write_text(json.dumps(dict(mode='standard|x', step_ms=87.1, mfu=0.461,
                                                               first_step_s=48.2, time_vs_standard=1.0)) + '\n')
    b = gpu_check.numbers_so_far(c, 'bench_343m')
    assert b['modes']['standard|x']['step_ms'] == 87.1
    line = gpu_check.numbers_line(b)
    assert '87 ms' in line and 'first step 48.2 s' in line and '|' not in line, line
    # nothing written yet: no numbers, and the row says only why
    assert gpu_check.numbers_so_far(c, 'eager') == {} and gpu_check.numbers_so_far(c, 'bench_120m') == {}


def test_every_training_run_goes_through_torchrun_even_on_one_gpu():
    c = check_of([], gpus=1)
    args = c.train_args('/tmp/x/train_compiled', True)
    assert args[:5] == [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=1'], args
    assert '--compile=True' in args and '--dtype=bfloat16' in args and '--device=cuda' in args
    assert args[5:8] == [gpu_check.__file__, '--train_child', '/tmp/x/train_compiled.graphs']   # graphs counted
    assert args[9] == 'nosave' and c.train_args('/tmp/x/resume', False)[9] == 'save'   # only resume needs its file
    assert check_of([], gpus=8).train_args('/tmp/x', False)[4] == '--nproc_per_node=8'
    assert check_of(['--tiny']).train_args('/tmp/x', False)[4] == '--nproc_per_node=2'
    # shapes, steps and the micro-batch are the flags'
    c = check_of(['--shape', '120m', '--steps', '8', '--batch_size', '4'])
    args = c.train_args('/tmp/x', True)
    assert '--n_layer=12' in args and '--max_iters=8' in args and '--batch_size=4' in args
    assert '--total_batch_size=8192' in args   # 2 micro-steps of 4 x 1024 on one process


def test_graph_counts_are_asserted_and_an_eager_fallback_fails():
    assert gpu_check.graphs_per_shape('plain', 24, 6) == 1
    assert gpu_check.graphs_per_shape('two_phase', 24, 6) == 3     # embedding, head + loss, one region for 8 blocks
    assert gpu_check.graphs_per_shape('two_phase', 2, 2) == 3
    assert gpu_check.graphs_per_shape('two_phase', 2, 3) == 4      # blocks of 3 and 1 sublayers: two regions
    ddp = dict(wrapper='DistributedDataParallel', graph_breaks=0, pg_backend='nccl')
    assert gpu_check.graph_problem([dict(ddp, graphs=2)] * 2, 2, 2) is None
    assert 'ran eager' in gpu_check.graph_problem([dict(ddp, graphs=0)], 2, 1)
    assert '3 graphs, 2 expected' in gpu_check.graph_problem([dict(ddp, graphs=2), dict(ddp, graphs=3)], 2, 2)
    assert 'without DDP' in gpu_check.graph_problem([dict(ddp, graphs=2, wrapper='GPT')], 2, 1)
    assert '1 of 2 ranks' in gpu_check.graph_problem([dict(ddp, graphs=2)], 2, 2)


def test_reads_in_bf16_are_caught_by_their_dtype(monkeypatch):
    import torch
    import model
    cfg = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, attnres_block_size=2, residual='rd_attnres')
    for depth_read in ('plain', 'two_phase'):
        assert gpu_check.read_dtypes(dict(cfg, depth_read=depth_read), 'cpu') == ['torch.float32']
    assert gpu_check.reads_problem(['torch.float32']) is None
    monkeypatch.setattr(model, 'fp32', lambda x: x.to(torch.bfloat16))   # the reads silently in bf16
    for depth_read in ('plain', 'two_phase'):
        dtypes = gpu_check.read_dtypes(dict(cfg, depth_read=depth_read), 'cpu')
        assert 'torch.bfloat16' in dtypes and 'bfloat16' in gpu_check.reads_problem(dtypes)
    assert 'not recorded' in gpu_check.reads_problem(None)


def test_runs_that_part_fail_the_comparison():
    rows = {s: dict(train_loss=4.0 - s / 10, data_hash=f'h{s}') for s in (4, 8)}
    assert gpu_check.compare_losses(rows, {s: dict(r) for s, r in rows.items()}, 0.0) == 0.0
    apart = {s: dict(r, train_loss=r['train_loss'] + 0.1) for s, r in rows.items()}
    with pytest.raises(gpu_check.CheckFailed, match='part by 0.1000 nats'):
        gpu_check.compare_losses(rows, apart, 0.05)
    moved = {s: dict(r, data_hash='x') if s == 8 else dict(r) for s, r in rows.items()}
    with pytest.raises(gpu_check.CheckFailed, match=r'data order differs at steps \[8\]'):
        gpu_check.compare_losses(rows, moved, 1.0)
    # the evaluation rows: the compiled evaluation graph against the eager one
    val = {s: dict(val_loss=4.0, data_digest=f'd{s}') for s in (0, 8)}
    assert gpu_check.compare_runs(val, {s: dict(r) for s, r in val.items()}, 0.0, 'val') == 0.0
    with pytest.raises(gpu_check.CheckFailed, match='val losses part by 0.0200'):
        gpu_check.compare_runs(val, {s: dict(r, val_loss=4.02) for s, r in val.items()}, 0.01, 'val')
    with pytest.raises(gpu_check.CheckFailed, match='no val rows'):
        gpu_check.compare_runs({}, {}, 0.01, 'val')


def lines_of(items):
    return {p['piece']: p for p in items if p['ok'] is not True}


def test_the_preflight_says_each_missing_piece_in_one_line_and_skips_what_needs_it(tmp_path):
    c = check_of(['--out', str(tmp_path / 'g')])
    everything = dict(have=lambda name: True, path=os.environ['PATH'], header=__file__, free_bytes=1e12)
    assert lines_of(gpu_check.preflight(c, FACTS, **everything)) == {}
    # no C compiler on PATH, no Python headers: the compiled checks are skipped, resume and checkpoint still run
    items = lines_of(gpu_check.preflight(c, FACTS, **dict(everything, path=str(tmp_path), header='/nowhere/Python.h')))
    assert sorted(items) == ['compiler', 'python_headers']
    assert all('\n' not in p['line'] for p in items.values())
    assert 'no C compiler' in items['compiler']['line'] and 'apt-get install gcc' in items['compiler']['line']
    assert 'python3' in items['python_headers']['line']
    assert sorted(gpu_check.blocked(items.values())) == sorted(gpu_check.COMPILED)
    # a package: numpy is needed by every check, wandb by none (said, nothing skipped)
    items = lines_of(gpu_check.preflight(c, FACTS, **dict(everything, have=lambda name: name not in ('numpy', 'wandb'))))
    assert items['numpy']['line'].endswith('pip install numpy') and items['numpy']['needed_by'] == list(gpu_check.CHECKS)
    assert items['wandb']['ok'] is None and items['wandb']['needed_by'] == [] and 'pip install wandb' in items['wandb']['line']
    # the disk: a 343m checkpoint and its temporary file
    items = lines_of(gpu_check.preflight(c, FACTS, **dict(everything, free_bytes=3e9)))
    assert '4.24 GB checkpoint' in items['disk']['line'] and 'checkpoint' in items['disk']['needed_by']
    # no GPU, or no NCCL
    assert lines_of(gpu_check.preflight(c, dict(FACTS, gpus=0), **everything))['gpu']['needed_by'] == list(gpu_check.CHECKS)
    assert 'CUDA build' in lines_of(gpu_check.preflight(c, dict(FACTS, nccl=False), **everything))['nccl']['line']
    # another torch than the pinned one: said, nothing skipped
    item = lines_of(gpu_check.preflight(c, dict(FACTS, torch='2.11.0+cu128'), **everything))['torch']
    assert item['ok'] is None and item['needed_by'] == [] and 'not the 2.13.0' in item['line']
    # --tiny runs dynamo's eager backend: no compiler needed
    tiny = check_of(['--tiny', '--out', str(tmp_path / 'g')], gpus=0)
    assert lines_of(gpu_check.preflight(tiny, dict(FACTS, gpus=0), **dict(everything, path=str(tmp_path)))) == {}


def results_with(checks, tiny=False):
    return dict(machine=dict(FACTS, date='2026-12-04'), tiny=tiny, budget_min=10, preflight=[], checks=checks)


@pytest.mark.slow
def test_a_compiles_seconds_and_recompiles_are_torchs_own_counts():
    # in a fresh process (torch's counters are per process): a function compiled, then called under no_grad (the
    # eval graph's recompile), then with another shape marked static: each guard failure one recompile
    code = ('import sys, json, torch; sys.path.insert(0, sys.argv[1]); import gpu_check\n'
            'f = torch.compile(lambda x: (x.sin() + 1).sum(), backend="eager", dynamic=False)\n'
            'f(torch.randn(8, requires_grad=True))\n'
            'with torch.no_grad():\n    f(torch.randn(8))\n'
            'f(torch.randn(9, requires_grad=True))\n'
            'print(json.dumps(gpu_check.compile_seconds()))')
    p = subprocess.run([sys.executable, '-c', code, os.path.join(HERE, 'scripts')], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    t = json.loads(p.stdout.strip().split('\n')[-1])
    assert t['total'] > 0 and t['backend'] is not None and t['dynamo'] == pytest.approx(t['total'] - t['backend'], abs=0.011)
    assert t['recompiles'] == 2 and 'grad_mode' in t['recompile_reasons'][0], t
    assert t['inductor'] is None   # (the eager backend: no inductor; said as '-', not 0)
    line = gpu_check.compile_line(t)
    assert line.startswith(f"; compile {t['total']:.1f} s") and "inductor's forward -" in line and '2 recompiles' in line
    assert gpu_check.compile_line(None) == ''


def test_the_verdict_is_the_fastest_read_by_two_percent_else_the_plain_read():
    v = gpu_check.read_verdict(dict(fused=0.90, two_phase=1.20))
    assert v['depth_read'] == 'fused' and v['two_phase_x_plain'] == 1.20
    assert "the fused read is 0.900x" in v['reason'] and "should use depth_read='fused'" in v['reason']
    assert gpu_check.read_verdict(dict(fused=0.97, two_phase=0.95))['depth_read'] == 'two_phase'
    assert gpu_check.read_verdict(dict(fused=0.985, two_phase=1.3))['depth_read'] == 'plain'   # within noise
    # every read the verdict weighs is a mode the bench runs, and one train.py builds
    from run_kit.common import DEPTH_READS
    assert set(gpu_check.READS) | {'plain'} == set(DEPTH_READS)
    assert {f'rd_attnres+{r}' for r in gpu_check.READS} <= set(gpu_check.ALL_MODES.split(','))   # (bench_120m)
    assert gpu_check.read_verdict(dict(fused=0.9))['depth_read'] == 'fused'   # the reads one bench ran


def test_the_table_names_what_was_not_checked_and_tiny_gives_no_verdict():
    verdict = dict(depth_read='plain', two_phase_x_plain=1.01, reason="the paper configs should use depth_read='plain'")
    mode = dict(step_ms=1.0, tok_per_s=1.0, mfu=None, peak_mem_gb=None, x_standard=1.0, x_plain=1.0, graphs=1)
    checks = dict(train=dict(status='failed', why='rank 0 compiled no graph: the compiled run ran eager'),
                  resume=dict(status='skipped', why="needs the eager check's run"),
                  checkpoint=dict(status='cut', why="stopped at the budget's end"),
                  bench_343m=dict(modes=dict(standard=mode), verdict=verdict),
                  bench_120m=dict(status='left', why='the budget: predicted 720 s, 100 s left'))
    table = gpu_check.markdown(results_with(checks))
    assert '| train | **failed** | rank 0 compiled no graph' in table and '| bench_120m | **left** |' in table
    assert "**the paper configs should use depth_read='plain'**" in table
    line, code = gpu_check.summary(results_with(checks), list(checks))
    assert code == 1 and 'FAILED: train' in line and 'CUT: checkpoint' in line
    assert 'NOT CHECKED (skipped): resume' in line and 'NOT CHECKED (left): bench_120m' in line
    # those that ran passed, some did not run: not a pass
    ok_and_left = dict(bench_343m=checks['bench_343m'], bench_120m=checks['bench_120m'])
    assert gpu_check.summary(results_with(ok_and_left), list(ok_and_left))[1] == 2
    assert gpu_check.summary(results_with(dict(bench_343m=checks['bench_343m'])), ['bench_343m'])[1] == 0
    tiny = gpu_check.markdown(results_with(dict(bench_343m=dict(modes=dict(standard=mode), verdict=None)), tiny=True))
    assert 'not measurements and it gives no verdict' in tiny and 'should use' not in tiny


# ---------------------------------------------------------------------------------------------
# The plumbing (slow): the check run at a tiny shape on the CPU

def gpu_check_run(out, *args, timeout=1200):
    return subprocess.run([sys.executable, SCRIPT, '--tiny', '--out', str(out), *args], capture_output=True, text=True,
                          cwd=HERE, timeout=timeout)


def processes_naming(text):
    """The live processes whose command line holds text (zombies have none)."""
    found = []
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                if text.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_the_gpu_check_runs_every_check_at_a_tiny_shape(tmp_path):
    out = tmp_path / 'gpu_check'
    p = gpu_check_run(out, '--budget', '30', '--only', ','.join(gpu_check.CHECKS))
    assert p.returncode == 0 and 'passed: ' + ', '.join(gpu_check.CHECKS) in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    checks = json.load(open(out / 'gpu_check.json'))['checks']
    assert sorted(checks) == sorted(gpu_check.CHECKS) and all(r.get('status', 'ok') == 'ok' for r in checks.values())
    train = checks['train']
    assert train['launcher'] == 'torchrun --nproc_per_node=2' and train['ddp'] == 'gloo' and train['grad_accum'] == 2
    assert train['graphs'] == train['graphs_expected'] == 2 and train['read_dtypes'] == ['torch.float32']
    # where its compile went (rank 0, torch's timers): dynamo's seconds, and the eval graph as the one recompile
    t = train['compile']
    assert t['total'] > 0 and t['dynamo'] > 0 and t['frames'] >= 1 and t['recompiles'] == 1, t
    assert 'grad_mode' in t['recompile_reasons'][0], t
    assert checks['eager']['train_steps_compared'] == 4 and checks['eager']['val_steps_compared'] == 2   # steps 0, 16
    assert checks['resume']['stopped_at'] in (8, 12) and checks['resume']['same_data_order']
    # all ten modes compiled in one process, each with the graphs it is designed to have
    modes = checks['bench_120m']['modes']
    assert sorted(modes) == sorted(gpu_check.ALL_MODES.split(','))
    assert all(m['graphs'] == (3 if '+two_phase' in name else 1) for name, m in modes.items())
    assert checks['bench_343m']['verdict'] is None   # --tiny: no verdict
    assert checks['checkpoint']['bytes'] > 0 and checks['checkpoint']['host_baseline_bytes'] > 0
    table = (out / 'gpu_check.md').read_text()
    assert all(f"| {name} | ok |" in table for name in gpu_check.CHECKS) and 'gives no verdict' in table, table
    assert f"compile {t['total']:.1f} s (dynamo {t['dynamo']:.1f}" in table and '1 recompiles (' in table, table
    assert 'should use' not in p.stdout
    assert not any(out.glob('**/ckpt.pt')) and not (out / 'checkpoint_probe.pt').exists()   # no weights left behind


@pytest.mark.slow
def test_the_preflight_of_a_machine_without_a_compiler_skips_the_compiled_checks(tmp_path):
    # PATH without gcc or cc; --backend inductor, as on a GPU: one line, and the checks that compile skipped, named
    empty = tmp_path / 'bin'
    empty.mkdir()
    p = subprocess.run([sys.executable, SCRIPT, '--tiny', '--backend', 'inductor', '--preflight', '--budget', '10',
                        '--only', ','.join(gpu_check.CHECKS), '--out', str(tmp_path / 'g')], capture_output=True, text=True, cwd=HERE, timeout=300,
                       env=dict(os.environ, PATH=str(empty), CC=''))
    assert p.returncode == 2, p.stdout + p.stderr
    missing = [line for line in p.stdout.splitlines() if line.startswith('  MISSING ')]
    assert len(missing) == 1 and 'no C compiler' in missing[0], p.stdout
    assert 'budget 10 min: resume ~' in p.stdout and 'train ~' not in p.stdout, p.stdout
    skipped = json.load(open(tmp_path / 'g' / 'gpu_check.json'))['checks']
    assert sorted(skipped) == sorted(gpu_check.COMPILED) and all(r['status'] == 'skipped' for r in skipped.values())


@pytest.mark.slow
def test_a_budget_too_small_for_every_check_ends_in_time_with_the_rest_named(tmp_path):
    # one process, still under torchrun; train is predicted to fit 45 s, resume (40 s) and bench_120m (40 s) not
    out = tmp_path / 'gpu_check'
    t0 = time.time()
    p = gpu_check_run(out, '--nproc', '1', '--budget', '0.75', '--only', 'train,resume,bench_120m')
    assert time.time() - t0 < 45 + 5   # (+ starting and ending the interpreter, a second or two on a loaded CPU)
    assert p.returncode == 2, p.stdout[-3000:] + p.stderr[-3000:]
    assert 'NOT CHECKED (left): resume, bench_120m' in p.stdout, p.stdout[-2000:]
    results = json.load(open(out / 'gpu_check.json'))
    assert results['elapsed_s'] < 45   # ended within the budget, on its own clock
    checks = results['checks']
    assert checks['train']['launcher'] == 'torchrun --nproc_per_node=1' and checks['train']['ddp'] == 'gloo'
    assert checks['train']['graphs'] == 2
    assert checks['resume']['status'] == checks['bench_120m']['status'] == 'left'
    assert '| resume | **left** | the budget: predicted 40 s' in (out / 'gpu_check.md').read_text()


@pytest.mark.slow
def test_a_check_still_running_at_the_budgets_end_is_cut_with_its_output_kept(tmp_path):
    # train predicted (wrongly) to take 1 s, and given 4000 steps: the budget's end stops it
    out = tmp_path / 'gpu_check'
    t0 = time.time()
    p = gpu_check_run(out, '--nproc', '1', '--budget', '0.75', '--steps', '4000', '--predicted', 'train=1',
                      '--only', 'train,checkpoint', timeout=120)
    assert time.time() - t0 < 45 + 5
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    results = json.load(open(out / 'gpu_check.json'))
    assert results['elapsed_s'] < 45   # stopped within the budget: its margin (5 s) covers the grace (3 s)
    checks = results['checks']
    assert checks['train']['status'] == 'cut' and checks['checkpoint']['status'] == 'left', checks
    # what it had measured before the cut is in the JSON and the table, not only "cut"
    numbers = checks['train']['numbers']
    assert numbers['last_step'] >= 8 and numbers['step_s'] > 0 and numbers['val_loss'] > 0, numbers
    row = next(line for line in (out / 'gpu_check.md').read_text().splitlines() if line.startswith('| train |'))
    assert f"reached step {numbers['last_step']}" in row and 'val loss' in row, row
    assert (out / 'train_compiled.out').exists()   # (what it printed before the end, however little)
    assert not any(out.glob('**/ckpt.pt'))         # the stopped run's checkpoint not left behind
    assert processes_naming(str(out)) == []


@pytest.mark.slow
def test_a_check_stopped_midway_keeps_its_output_and_leaves_no_process(tmp_path):
    out = tmp_path / 'gpu_check'
    proc = subprocess.Popen([sys.executable, SCRIPT, '--tiny', '--out', str(out), '--only', 'train', '--steps', '2000',
                             '--budget', '30'],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE)
    try:
        # the event: the compiled run under torchrun has logged a training step (read from its streamed output)
        for line in proc.stdout:
            if line.startswith('== train'):
                break
        log = out / 'train_compiled' / 'log.jsonl'
        while not (log.exists() and 'train_loss' in log.read_text()):
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.1)   # (polling the log for the event, not waiting for it to happen)
        workers = processes_naming(str(out / 'train_compiled'))
        assert len(workers) >= 2   # torchrun and its worker
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, rest[-2000:]
    assert 'step     4 | loss' in (out / 'train_compiled.out').read_text()   # what the child printed, kept
    checks = json.load(open(out / 'gpu_check.json'))['checks']
    assert checks['train']['status'] == 'interrupted' and 'SIGTERM' in checks['train']['why']
    assert processes_naming(str(out)) == []


@pytest.mark.slow
def test_bench_refuses_a_mode_that_would_run_eager(tmp_path):
    # past dynamo's recompile limit a mode silently runs eager: bench.py says so and fails instead
    p = subprocess.run([sys.executable, os.path.join(HERE, 'bench.py'), '--compile=True', '--backend=eager',
                        '--recompile_limit=2', '--modes=standard,attnres,rd_attnres', '--n_layer=2', '--n_head=2',
                        '--n_embd=32', '--block_size=32', '--attnres_block_size=2', '--batch_size=2', '--rounds=1',
                        '--memory=False', '--device=cpu'], capture_output=True, text=True, cwd=HERE, timeout=600)
    assert p.returncode != 0 and "rd_attnres: torch.compile reached dynamo's recompile limit" in p.stderr, p.stderr[-2000:]


def test_a_runs_log_is_read_by_its_owner_a_torn_line_dropped_a_bad_one_a_failed_check(tmp_path):
    # the check reads its runs' logs through run_files.read_log: a cut run's torn last line is dropped (the rows
    # before it kept), a garbled line is the check's failure naming the file and the line, never a traceback
    rows = [{'step': 0, 'val_loss': 5.0}, {'step': 4, 'train_loss': 4.0}]
    log = tmp_path / 'log.jsonl'
    log.write_text(''.join(json.dumps(r) + '\n' for r in rows) + '{"step": 8, "train_lo')
    with pytest.warns(UserWarning, match='torn last line'):
        train, val = gpu_check.read_rows(str(tmp_path))
    assert sorted(train) == [4] and sorted(val) == [0]
    log.write_text(json.dumps(rows[0]) + '\nnot json\n')
    with pytest.raises(gpu_check.CheckFailed, match=r'log.jsonl, line 2: not valid JSON'):
        gpu_check.read_rows(str(tmp_path))
    assert gpu_check.read_rows_safely(str(tmp_path)) == {}
