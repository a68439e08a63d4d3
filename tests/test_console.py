"""What a nanoGPT user sees (docs/training.md): a short run summary instead of a JSON dump,
an ETA, plain progress lines in log files, and Weights & Biases tracking that records what log.jsonl
records, grouped so that pairs line up, and continued by a resume. The tracker runs in its offline
mode: it writes a local run directory, which is read back here."""

import glob
import json
import os
import struct
import subprocess
import sys

os.environ.setdefault('HF_HUB_OFFLINE', '1')

import pytest

import prepare
from helpers import HERE, read_log, run




def wandb_records(run_dir):
    """The records of an offline W&B run file (run-<id>.wandb): a 7-byte header, then a LevelDB-style
    log of 32 KiB blocks whose records are [crc32 (4) | length (2) | type (1) | data] and may be split
    across blocks (type 1 = whole, 2/3/4 = first/middle/last piece); each whole record is a protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb
    data = open(glob.glob(os.path.join(run_dir, 'run-*.wandb'))[0], 'rb').read()
    assert data[:4] == b':W&B'
    pos, block, records, piece = 7, 32768, [], b''
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:                       # the trailer of a block: padding
            pos += left
            continue
        length, kind = struct.unpack('<HB', data[pos + 4:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        piece += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(piece)
            records.append(record)
            piece = b''
    return records


def tracked(run_dir):
    records = wandb_records(run_dir)
    runs = [r.run for r in records if r.WhichOneof('record_type') == 'run']
    history = {}
    for r in records:
        if r.WhichOneof('record_type') == 'history':
            items = {(i.key or '/'.join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            history.setdefault(items['_step'], {}).update(items)
    return runs, history


@pytest.mark.slow
def test_wandb_records_the_log_and_a_resume_continues_the_same_run(data_dir, tmp_path):
    out = str(tmp_path / 'rd_s3')
    env_args = ['--wandb_log=True', '--residual=rd_attnres', '--seed=3', '--max_iters=4', '--lr_decay_iters=6']
    os.environ.update(WANDB_MODE='offline', WANDB_DIR=str(tmp_path), WANDB_SILENT='true')
    try:
        run(env_args, data_dir, out)
        run(env_args[:3] + ['--max_iters=6', '--lr_decay_iters=6', '--init_from=resume'], data_dir, out)
    finally:
        for k in ('WANDB_MODE', 'WANDB_DIR', 'WANDB_SILENT'):
            os.environ.pop(k)
    run_id = json.load(open(os.path.join(out, 'config.json')))['wandb_run_id']
    dirs = sorted(glob.glob(str(tmp_path / 'wandb' / 'offline-run-*')))
    assert len(dirs) == 2 and all(d.endswith(run_id) for d in dirs)       # the resume continued the same run
    runs, history = tracked(dirs[0])
    assert runs[0].display_name == 'rd_s3' and runs[0].run_group == '2x32h2_32ctx_4steps' and runs[0].job_type == 'rd_attnres'
    assert 'seed3' in runs[0].tags
    config = {c.key: json.loads(c.value_json) for c in runs[0].config.update}
    assert config['residual'] == 'rd_attnres' and config['seed'] == 3 and config['n_layer'] == 2
    train_rows, val_rows = read_log(out)
    for step in (1, 2, 3, 4):
        assert history[step]['train/loss'] == pytest.approx(train_rows[step]['train_loss'])
        assert history[step]['train/lr'] == pytest.approx(train_rows[step]['lr'])
        assert 'train/norm' in history[step] and 'train/tok_per_s' in history[step]
    assert history[2]['val/loss'] == pytest.approx(val_rows[2]['val_loss'])
    js = val_rows[2]['routing']['summary'][1]['js_qk_v']
    assert history[2]['routing/layer1/js_qk_v'] == pytest.approx(js)
    assert 'routing/layer0/depth_v' in history[2] and 'routing/layer1/entropy_qk' in history[2]
    _, resumed = tracked(dirs[1])
    assert sorted(s for s in resumed if 'train/loss' in resumed[s]) == [5, 6]


@pytest.mark.slow
def test_the_console_is_a_short_summary_with_an_eta(data_dir, tmp_path):
    p = run(['--max_iters=4', '--lr_decay_iters=4'], data_dir, str(tmp_path / 'run'))   # the console of a process of its own
    head = p.stdout.split('step 0:')[0]
    assert len(head.strip().splitlines()) <= 5 and '{' not in head          # no JSON dump
    assert 'rd_attnres | 2 layers x 32' in head and 'tokens per step' in head and 'writes to' in head
    assert all(' | eta ' in line for line in p.stdout.splitlines() if line.startswith('step ') and '|' in line)


def test_prepare_writes_plain_progress_lines_when_not_on_a_terminal(tmp_path, capsys):
    p = subprocess.run([sys.executable, os.path.join(HERE, 'prepare.py'), '--dataset', 'tiny', '--data_dir',
                        str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert '\r' not in p.stdout + p.stderr
    progress = prepare.Progress(total=None, enabled=True)    # (pytest's stdout is not a terminal either)
    progress.update(1000)
    progress.t_print -= 11                                    # as if 11 s went by
    progress.update(234)
    progress.close()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith('1,234 tokens, ') and lines[0].endswith(' tokens/s')


def test_quickstart_uses_the_best_device(monkeypatch):
    from configurator import configure
    import train
    cfg = configure(train.DEFAULTS, [os.path.join(HERE, 'config', 'quickstart.py')])
    assert cfg['device'] == 'auto'


def test_a_step_line_says_that_steps_numbers_and_the_time_left_at_the_recent_pace(capsys):
    from run_kit import console
    row = dict(step=40, train_loss=5.08171, lr=0.00198, norm=0.684, dt=9.638, tok_per_s=212.4, mfu=None)
    console.print_step(row, 300)                        # 260 steps left at 9.638 s a step: 2,506 s
    assert capsys.readouterr().out == ("step    40 | loss 5.0817 | lr 1.98e-03 | norm 0.684 | dt 9638ms | tok/s 212 | "
                                       "eta 41m45s (recent pace)\n")
    console.print_step(dict(row, step=100, norm=None, mfu=0.4123, skipped_steps=2, dt=20.0), 300)   # 4,000 s left
    assert capsys.readouterr().out == ("step   100 | loss 5.0817 | lr 1.98e-03 | norm nan | dt 20000ms | tok/s 212 | "
                                       "mfu 41.2% | skipped 2 | eta 1h06m (recent pace)\n")
