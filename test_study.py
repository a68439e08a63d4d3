"""Tests of the study driver: the order of the runs, skipping finished runs, resuming interrupted ones."""

import json
import os

import study


def test_queue_completes_pairs_first_then_standard_then_the_controls():
    q = study.queue()
    assert q[:4] == [('main', 'attnres', 1), ('main', 'rd_attnres', 1), ('main', 'attnres', 2), ('main', 'rd_attnres', 2)]
    assert [m for _, m, _ in q[10:15]] == ['standard'] * 5
    assert {m for b, m, _ in q[15:35]} == {'attnres', 'ctrl_params', 'ctrl_dup', 'ctrl_fixed_v'}
    assert all(b == 'early' for b, _, _ in q[15:35])
    assert q[35:45] == [('early2', m, s) for s in (1, 2, 3, 4, 5) for m in ('attnres', 'ctrl_mix')]
    assert q[45:] == [('early2', 'ctrl_dup', 1)] + [('early2_fp32', m, s) for s in (1, 2, 3) for m in ('attnres', 'ctrl_dup')]
    assert len(q) == 35 + 10 + 7 and len(set(q)) == len(q)


def test_restart_skips_finished_runs_and_resumes_interrupted_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(study, 'HERE', str(tmp_path))
    done = study.run_dir('main', 'attnres', 1)
    os.makedirs(done)
    json.dump(dict(max_iters=200), open(os.path.join(done, 'config.json'), 'w'))
    with open(os.path.join(done, 'log.jsonl'), 'w') as f:
        f.write(json.dumps(dict(step=200, val_loss=5.0)) + '\n')
    half = study.run_dir('main', 'rd_attnres', 1)
    os.makedirs(half)
    json.dump(dict(max_iters=200), open(os.path.join(half, 'config.json'), 'w'))
    with open(os.path.join(half, 'log.jsonl'), 'w') as f:
        f.write(json.dumps(dict(step=100, val_loss=5.5)) + '\n')
    open(os.path.join(half, 'ckpt.pt'), 'w').close()

    calls = []
    monkeypatch.setattr(study.subprocess, 'run', lambda args, **kw: calls.append(args))
    study.run_all()
    assert study.is_finished(done) and not study.is_finished(half)
    assert f'--out_dir={done}' not in [a[5] for a in calls]            # finished: skipped
    assert calls[0][3:5] == ['--residual=rd_attnres', '--seed=1'] and calls[0][-1] == '--init_from=resume'
    assert len(calls) == len(study.queue()) - 1
    early = [a for a in calls if f'--max_iters={study.EARLY_ITERS}' in a]
    assert len(early) == 20 + 17 and sum('--dtype=float32' in a for a in calls) == 6
