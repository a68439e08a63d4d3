"""The GPU check (scripts/gpu_check.py, docs/gpus.md) cannot meet a GPU broken: its plumbing runs here at a tiny
shape on the CPU, every check of it, and what it fails on is shown to fail."""

import json
import os
import subprocess
import sys

import pytest

from helpers import HERE

sys.path.insert(0, os.path.join(HERE, 'scripts'))
import gpu_check  # noqa: E402


def test_the_gpu_check_runs_every_check_at_a_tiny_shape(tmp_path):
    out = tmp_path / 'gpu_check'
    p = subprocess.run([sys.executable, os.path.join(HERE, 'scripts', 'gpu_check.py'), '--tiny', '--out', str(out)],
                       capture_output=True, text=True, cwd=HERE, timeout=1200)
    assert p.returncode == 0 and 'every check passed' in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    results = json.load(open(out / 'gpu_check.json'))
    checks = results['checks']
    assert sorted(checks) == sorted(gpu_check.CHECKS) and not any('failed' in r for r in checks.values())
    assert checks['train']['processes'] == 2 and checks['train']['grad_accum'] == 2
    assert checks['resume']['stopped_at'] in (8, 12) and checks['resume']['same_data_order']
    # all nine modes compiled in one process, none of them eager (dynamo's graphs counted per mode)
    modes = checks['bench_120m']['modes']
    assert sorted(modes) == sorted(gpu_check.ALL_MODES.split(',')) and all(m['graphs'] >= 1 for m in modes.values())
    assert checks['bench_343m']['verdict']['depth_read'] in ('plain', 'two_phase')
    assert checks['checkpoint']['bytes'] > 0 and checks['checkpoint']['save_s'] > 0
    table = (out / 'gpu_check.md').read_text()
    assert all(f"| {name} | ok |" in table for name in gpu_check.CHECKS), table


def test_runs_that_part_fail_the_comparison():
    rows = {s: dict(train_loss=4.0 - s / 10, data_hash=f'h{s}') for s in (4, 8)}
    assert gpu_check.compare_losses(rows, {s: dict(r) for s, r in rows.items()}, 0.0) == 0.0
    apart = {s: dict(r, train_loss=r['train_loss'] + 0.1) for s, r in rows.items()}
    with pytest.raises(gpu_check.CheckFailed, match='part by 0.1000 nats'):
        gpu_check.compare_losses(rows, apart, 0.05)
    moved = {s: dict(r, data_hash='x') if s == 8 else dict(r) for s, r in rows.items()}
    with pytest.raises(gpu_check.CheckFailed, match=r'data order differs at steps \[8\]'):
        gpu_check.compare_losses(rows, moved, 1.0)


def test_bench_refuses_a_mode_that_would_run_eager(tmp_path):
    # past dynamo's recompile limit a mode silently runs eager: bench.py says so and fails instead
    p = subprocess.run([sys.executable, os.path.join(HERE, 'bench.py'), '--compile=True', '--backend=eager',
                        '--recompile_limit=2', '--modes=standard,attnres,rd_attnres', '--n_layer=2', '--n_head=2',
                        '--n_embd=32', '--block_size=32', '--attnres_block_size=2', '--batch_size=2', '--rounds=1',
                        '--memory=False', '--device=cpu'], capture_output=True, text=True, cwd=HERE, timeout=600)
    assert p.returncode != 0 and "rd_attnres: torch.compile reached dynamo's recompile limit" in p.stderr, p.stderr[-2000:]
