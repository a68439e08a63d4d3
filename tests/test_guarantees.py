"""No run is ever mixed, no file ever runs code, no error is a raw traceback (docs/run_safety.md). Each test causes the fault: two runs started at once, a resume in another precision, a
rebuilt corpus, flipped token bytes, a same-size edit with its time restored, a planted pickle, a full
disk (a file size limit), zero intervals, and the bad invocations a user types."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import compare
import prepare
from run_kit import run_files
from helpers import (DOCS, HERE, TINY, command, default_ctrl_c, limit_file_size, logged_steps, python, read_log, run, run_here,
                     sample_here, start, write_jsonl)


# ---------------------------------------------------------------------------------------------
# Runs and data never mixed

@pytest.mark.slow
def test_a_second_run_into_a_busy_out_dir_is_refused(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    first = start(['--max_iters=60', '--log_interval=5', '--eval_interval=30', '--seed=1'], data_dir, out)
    deadline = time.time() + 300
    while not logged_steps(out):
        assert first.poll() is None and time.time() < deadline, first.communicate()
        time.sleep(0.01)
    os.kill(first.pid, signal.SIGSTOP)   # held mid-run (alive, its lock held) however fast this machine is
    try:
        for init in ('scratch', 'auto'):
            p = run_here([f'--init_from={init}', '--seed=2', '--overwrite=True'], data_dir, out, expect_ok=False)
            assert p.returncode != 0 and 'is in use by another run (pid' in p.stderr, p.stderr[-1500:]
    finally:
        os.kill(first.pid, signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-2000:]
    rows = [json.loads(line) for line in open(os.path.join(out, 'log.jsonl'))]
    steps = [r['step'] for r in rows if 'train_loss' in r]
    assert steps == list(range(5, 61, 5))                      # one row per step: nothing interleaved
    assert json.load(open(os.path.join(out, 'config.json')))['seed'] == 1
    run_here(['--init_from=auto', '--max_iters=60'], data_dir, out)   # the lock went with the process


def test_a_resume_in_another_precision_or_on_another_eval_set_is_refused(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    run_here(['--max_iters=2', '--lr_decay_iters=4', '--dtype=float32'], data_dir, out)
    before = open(os.path.join(out, 'config.json')).read()
    for bad, key in (('--dtype=bfloat16', 'dtype_resolved'), ('--eval_tokens=256', 'eval_tokens')):
        p = run_here(['--max_iters=4', '--init_from=resume', '--dtype=float32', bad], data_dir, out, expect_ok=False)
        assert p.returncode != 0 and 'cannot resume' in p.stderr and key in p.stderr, p.stderr[-1500:]
    assert open(os.path.join(out, 'config.json')).read() == before
    # what may change: batch_size (with accumulation), compile, device, log/eval intervals
    run_here(['--max_iters=4', '--init_from=resume', '--batch_size=2', '--eval_interval=1'], data_dir, out)


def test_compare_refuses_pairs_in_other_precisions_or_eval_sets(tmp_path):
    from helpers import make_run
    root = str(tmp_path)
    for seed in (1, 2):
        make_run(root, f'attnres_s{seed}', 'attnres', seed, 3.3, dtype_resolved='float32')
    make_run(root, 'rd_s1', 'rd_attnres', 1, 3.2, dtype_resolved='bfloat16')
    make_run(root, 'rd_s2', 'rd_attnres', 2, 3.2, dtype_resolved='float32', eval_tokens=1)
    results, _, refused = compare.compare([compare.load_run(os.path.join(root, n)) for n in sorted(os.listdir(root))])
    reasons = ' '.join(why for _, why in refused)
    assert not results and 'dtype_resolved' in reasons and 'eval_tokens' in reasons


def flip_byte(path, offset):
    with open(path, 'r+b') as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def copy_dataset(data_dir, tmp_path):
    import shutil
    shutil.copytree(os.path.join(data_dir, 'tiny'), tmp_path / 'data' / 'tiny')
    return str(tmp_path / 'data')


def test_flipped_token_bytes_are_found_by_train_and_prepare(data_dir, tmp_path, capsys):
    data = copy_dataset(data_dir, tmp_path)
    train_bin, val_bin = (os.path.join(data, 'tiny', f'{s}.bin') for s in ('train', 'val'))
    flip_byte(train_bin, prepare.HEADER_BYTES + 1001)          # one token's low bit: still a valid id
    p = run_here(['--max_iters=2'], data, str(tmp_path / 'run'), expect_ok=False)
    assert p.returncode != 0 and 'do not match their data_id' in p.stderr, p.stderr[-1500:]
    assert not os.path.exists(tmp_path / 'run' / 'log.jsonl')
    capsys.readouterr()
    prepare.main(['--dataset', 'tiny', '--data_dir', data])  # not "complete": rebuilt, the same data again
    assert 'not complete' in capsys.readouterr().out
    run_here(['--max_iters=2'], data, str(tmp_path / 'run'))
    with open(val_bin, 'r+b') as f:                           # a token id past the vocabulary, in val.bin
        f.seek(prepare.HEADER_BYTES + 2 * 10)
        f.write((65000).to_bytes(2, 'little'))
    p = run_here(['--max_iters=2'], data, str(tmp_path / 'run2'), expect_ok=False)
    assert 'token id 65000, outside the GPT-2 vocabulary' in p.stderr and 'Traceback' not in p.stderr


def test_a_same_size_edit_with_its_time_restored_is_noticed(tmp_path):
    data = str(tmp_path / 'data')
    path = tmp_path / 'a.jsonl'
    write_jsonl(path, DOCS)
    args = ['--data_dir', data, '--num_proc', '1', '--input', str(path), '--name', 'x']
    prepare.main(args)
    stat = os.stat(path)
    text = path.read_text()
    path.write_text(text.replace('End.', 'Fin.', 1))           # the same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))    # and the same modification time
    assert path.read_text() != text and os.path.getsize(path) == stat.st_size
    assert os.stat(path).st_mtime_ns == stat.st_mtime_ns
    with pytest.raises(SystemExit, match=r'from another input: .*a.jsonl changed .*content differs'):
        prepare.main(args)


# ---------------------------------------------------------------------------------------------
# No file runs code

class Payload:
    """A pickled object whose unpickling would create a file: what a hostile checkpoint would do."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, 'w'))


@pytest.mark.slow
def test_a_planted_pickle_is_refused_and_never_runs(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    run(['--max_iters=2', '--lr_decay_iters=4'], data_dir, out)
    ckpt_path = os.path.join(out, 'ckpt.pt')
    ckpt = torch.load(ckpt_path, weights_only=True)
    marker = str(tmp_path / 'payload_ran')
    ckpt['rng']['extra'] = Payload(marker)
    torch.save(ckpt, ckpt_path)      # (a hostile file could also carry a matching checksum: it proves nothing)
    for p in (run(['--max_iters=4', '--init_from=resume'], data_dir, out, expect_ok=False),
              run(['--eval_only=True', '--init_from=resume'], data_dir, out, expect_ok=False),
              python('sample.py', f'--out_dir={out}', '--device=cpu', '--max_new_tokens=2')):
        assert p.returncode != 0 and 'was refused' in p.stderr and 'Nothing in it was run' in p.stderr, p.stderr[-1500:]
        assert not os.path.exists(marker)


def test_weights_shared_as_safetensors_sample_like_the_checkpoint(data_dir, tmp_path):
    out, weights = str(tmp_path / 'run'), str(tmp_path / 'model.safetensors')
    run_here(['--max_iters=2', '--residual=rd_attnres'], data_dir, out)
    p = sample_here(f'--out_dir={out}', f'--export={weights}')
    assert p.returncode == 0 and 'wrote' in p.stdout, p.stderr[-1500:]
    common_args = ['--start=The', '--num_samples=1', '--max_new_tokens=8', '--device=cpu', '--seed=5']
    a = sample_here(f'--out_dir={out}', *common_args)
    b = sample_here(f'--weights={weights}', *common_args)
    assert a.returncode == 0 and b.returncode == 0, b.stderr[-1500:]
    assert a.stdout.split('\n', 1)[1] == b.stdout.split('\n', 1)[1]   # the same text (first line: the source)
    (tmp_path / 'not.safetensors').write_bytes(b'\x00' * 64)
    bad = sample_here(f'--weights={tmp_path / "not.safetensors"}')
    assert bad.returncode != 0 and 'cannot be read as a .safetensors file' in bad.stderr
    missing = sample_here(f'--weights={weights}', '--start=FILE:/no/such/prompt.txt', '--device=cpu')
    assert 'cannot read the prompt file' in missing.stderr and 'Traceback' not in missing.stderr


# ---------------------------------------------------------------------------------------------
# A full disk: a file size limit makes the write fail as ENOSPC would (EFBIG), without a tmpfs


@pytest.mark.slow
def test_a_full_disk_while_checkpointing_keeps_the_last_checkpoint(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    run(['--max_iters=2', '--lr_decay_iters=4'], data_dir, out)
    ckpt = os.path.join(out, 'ckpt.pt')
    before = open(ckpt, 'rb').read()
    cmd = [sys.executable, os.path.join(HERE, 'train.py'), *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
           '--max_iters=4', '--init_from=auto']
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=600, preexec_fn=limit_file_size(2_000_000))
    assert p.returncode != 0 and 'Traceback' not in p.stderr, p.stderr[-2000:]
    assert 'could not write the checkpoint' in p.stderr and 'previous checkpoint, if any, is kept' in p.stderr
    assert 'needs about' in p.stderr and not os.path.exists(ckpt + '.tmp')
    assert open(ckpt, 'rb').read() == before
    run_here(['--max_iters=4', '--init_from=auto'], data_dir, out)          # room again: it carries on
    assert sorted(read_log(out)[0]) == [1, 2, 3, 4]


def test_a_full_disk_while_preparing_leaves_nothing_behind(tmp_path):
    write_jsonl(tmp_path / 'a.jsonl', DOCS * 20)
    cmd = [sys.executable, os.path.join(HERE, 'prepare.py'), '--input', str(tmp_path / 'a.jsonl'), '--name', 'x',
           '--data_dir', str(tmp_path / 'data'), '--num_proc', '1']
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, preexec_fn=limit_file_size(20_000))
    from run_kit.common import EXIT_WRITE
    assert p.returncode == EXIT_WRITE and 'could not write the prepared data' in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith('prepare.py: '), p.stderr
    assert not os.path.exists(tmp_path / 'data' / 'x')
    # a build killed mid-write leaves a .tmp: the next build removes it
    os.makedirs(tmp_path / 'data' / 'x')
    (tmp_path / 'data' / 'x' / 'train.bin.tmp').write_bytes(b'\x00' * 1000)
    assert subprocess.run(cmd, capture_output=True, timeout=600).returncode == 0
    assert sorted(os.listdir(tmp_path / 'data' / 'x')) == ['meta.json', 'prepare.lock', 'train.bin', 'val.bin']


# ---------------------------------------------------------------------------------------------
# Errors are messages, said before anything is written

@pytest.mark.parametrize('args, message', [
    (['--eval_interval=0'], 'eval_interval=0 must be > 0'),
    (['--log_interval=0'], 'log_interval=0 must be > 0'),
    (['--n_head=3'], 'must be divisible by n_head=3'),
    (['--out_dir={resdual}'], '{resdual} is not a config key'),
    (['--device=cuda'], 'no CUDA GPU'),
    (['--eval_tokens=8'], 'eval_tokens=8 is less than one window'),
    (['--init_from=resume'], "there is no"),
])
def test_bad_invocations_are_messages_and_write_nothing(data_dir, tmp_path, args, message):
    if args == ['--device=cuda'] and torch.cuda.is_available():
        pytest.skip('this machine has CUDA')
    out = tmp_path / 'run'
    p = run_here(args, data_dir, str(out) if '{' not in args[0] else str(tmp_path / args[0].split('=')[1]),
                 expect_ok=False)
    assert p.returncode != 0 and message in p.stderr and 'Traceback' not in p.stderr, p.stderr[-1500:]
    assert not any(os.path.exists(out / name) for name in ('config.json', 'log.jsonl', 'run.lock'))


@pytest.mark.slow
def test_more_bad_input_is_a_message(data_dir, tmp_path):
    (tmp_path / 'syntax.py').write_text('n_layer = = 2\n')
    p = python('train.py', str(tmp_path / 'syntax.py'))
    assert p.returncode != 0 and 'syntax.py, line 1' in p.stderr and 'Traceback' not in p.stderr
    p = sample_here('--start=The', f'--out_dir={tmp_path}', '--device=cpu')
    assert 'no checkpoint' in p.stderr and 'Traceback' not in p.stderr
    (tmp_path / 'file').write_text('in the way')
    p = run_here(['--max_iters=2'], data_dir, str(tmp_path / 'file' / 'run'), expect_ok=False)
    assert p.returncode != 0 and 'cannot write to' in p.stderr and 'Traceback' not in p.stderr
    write_jsonl(tmp_path / 'n.jsonl', DOCS[:5])
    with open(tmp_path / 'n.jsonl', 'a') as f:
        f.write(json.dumps({'text': 12345}) + '\n')
    with pytest.raises(SystemExit, match=r"n.jsonl, line 6: 'text' is a int"):
        prepare.main(['--input', str(tmp_path / 'n.jsonl'), '--data_dir', str(tmp_path / 'data'), '--num_proc', '1'])


@pytest.mark.slow
def test_ctrl_c_is_a_message(data_dir, tmp_path):
    proc = start(['--max_iters=200', '--log_interval=5'], data_dir, str(tmp_path / 'run'))
    deadline = time.time() + 300
    while not logged_steps(str(tmp_path / 'run')):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0 and 'interrupted (Ctrl-C)' in stderr and 'Traceback' not in stderr, stderr[-1500:]


# Python's start-up imports this (on PYTHONPATH) before the script: the script's first import of torch or numpy,
# the seconds a Ctrl-C most often lands in, then waits on a pipe that the test holds open
HELD_IMPORT = """
import os, sys
class Held:
    def find_spec(self, name, path=None, target=None):
        if name in ('torch', 'numpy'):
            sys.meta_path.remove(self)
            open(os.environ['HELD_IMPORT']).read()
        return None
sys.meta_path.insert(0, Held())
"""


@pytest.mark.slow   # it starts each script (each held before its import: a second in all)
@pytest.mark.parametrize('script', ['compare.py', 'intervene.py', 'sample.py', 'prepare.py', 'study.py', 'train.py'])
def test_ctrl_c_while_torch_loads_is_one_line(tmp_path, script):
    from run_kit.common import EXIT_INTERRUPTED
    (tmp_path / 'hook').mkdir()
    (tmp_path / 'hook' / 'sitecustomize.py').write_text(HELD_IMPORT)
    fifo = str(tmp_path / 'held')
    os.mkfifo(fifo)
    env = dict(os.environ, PYTHONPATH=str(tmp_path / 'hook'), HELD_IMPORT=fifo)
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path), preexec_fn=default_ctrl_c)
    deadline = time.time() + 120
    while True:   # the script is inside its import once it has the pipe open, and waits in the read
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.01)
    try:
        while 'pipe' not in open(f'/proc/{proc.pid}/wchan').read():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(writer)
    assert proc.returncode == EXIT_INTERRUPTED and 'Traceback' not in err, err[-3000:]
    assert err.splitlines() == [f"{script}: stopped by Ctrl-C while starting; nothing was written"], err
    assert sorted(os.listdir(tmp_path)) == ['held', 'hook']   # nothing written in the folder it runs in


# train.py in a process whose second checkpoint write, and the removal of its partial file, each wait for the test:
# the two Ctrl-Cs then come exactly where they are meant to, whatever the machine's load
AT_EVENTS = """
import os, runpy, sys, time
import torch
events = os.environ['CTRL_C_EVENTS']
def mark(name):
    open(os.path.join(events, name), 'w').close()
def wait_for(name):
    while not os.path.exists(os.path.join(events, name)):
        time.sleep(0.01)
real_save, real_remove, saves = torch.save, os.remove, []
def save(obj, f, *args, **kwargs):
    real_save(obj, f, *args, **kwargs)
    saves.append(f)
    if len(saves) == 2:            # the second checkpoint: written to its temporary file, not yet renamed
        mark('writing')
        wait_for('first sent')     # (the first Ctrl-C lands here)
def remove(path, *args, **kwargs):
    if str(path).endswith('ckpt.pt.tmp'):
        mark('removing')           # the partial file is being removed: the second Ctrl-C lands here
        wait_for('second sent')
    return real_remove(path, *args, **kwargs)
torch.save, os.remove = save, remove
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))   # as `python train.py` would have it
runpy.run_path(sys.argv[0], run_name='__main__')
"""


@pytest.mark.slow
def test_ctrl_c_twice_during_a_checkpoint_write_is_one_message(data_dir, tmp_path):
    # the first Ctrl-C while the second checkpoint is written, the second while its partial file is removed:
    # it ended in a raw traceback, or left the partial ckpt.pt.tmp behind
    out, events = tmp_path / 'run', tmp_path / 'events'
    events.mkdir()
    (tmp_path / 'at_events.py').write_text(AT_EVENTS)
    args = ['--max_iters=6', '--eval_interval=2', '--lr_decay_iters=6']
    proc = subprocess.Popen([sys.executable, str(tmp_path / 'at_events.py'), *command(args, data_dir, str(out))[1:]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE, preexec_fn=default_ctrl_c,
                            env=dict(os.environ, OMP_NUM_THREADS='1', CTRL_C_EVENTS=str(events)))
    for event, sent in (('writing', 'first sent'), ('removing', 'second sent')):
        deadline = time.time() + 300
        while not (events / event).exists():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        (events / sent).touch()
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0 and 'interrupted (Ctrl-C): the last checkpoint' in stderr, stderr[-2000:]
    assert 'Traceback' not in stderr and 'Exception ignored' not in stderr, stderr[-2000:]
    assert not (out / 'ckpt.pt.tmp').exists() and run_files.checkpoint_progress(str(out / 'ckpt.pt')) == (2, 6)
    run_here([*args, '--init_from=auto'], data_dir, str(out))               # and the run carries on to its end
    assert sorted(read_log(str(out))[1]) == [0, 2, 4, 6]


@pytest.mark.parametrize('call', ['open', 'close'])
def test_a_ctrl_c_as_the_temporary_file_is_created_leaves_no_partial_file(tmp_path, monkeypatch, call):
    # the interrupt comes the moment the temporary file exists, before its name is returned to the writer
    # (Python raises it between two bytecodes: right after os.open, or after os.close): the file is removed,
    # the old one kept
    path = tmp_path / 'ckpt.pt'
    path.write_text('the last checkpoint')
    real = getattr(os, call)

    def then_ctrl_c(*args, **kwargs):
        result = real(*args, **kwargs)
        if (tmp_path / 'ckpt.pt.tmp').exists():
            raise KeyboardInterrupt
        return result
    monkeypatch.setattr(os, call, then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        run_files.atomic_write(str(path), 'a new checkpoint')
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ['ckpt.pt'] and path.read_text() == 'the last checkpoint'
    run_files.atomic_write(str(path), 'a new checkpoint')   # and the next write claims the usual name again
    assert os.listdir(tmp_path) == ['ckpt.pt'] and path.read_text() == 'a new checkpoint'


def test_a_full_disk_before_preparing_is_said_and_leaves_nothing(tmp_path):
    # no room even for the lock file's line (0 bytes free): not "a --data_dir this user can write to" (it is
    # not a permission problem), and no empty prepare.lock left in a folder the build created
    cmd = [sys.executable, os.path.join(HERE, 'prepare.py'), '--dataset', 'tiny', '--data_dir', str(tmp_path / 'data')]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, preexec_fn=limit_file_size(0))
    assert p.returncode != 0 and 'Traceback' not in p.stderr, p.stderr[-2000:]
    assert 'could not write the prepared data' in p.stderr and 'MB free' in p.stderr and 'this user' not in p.stderr
    assert not os.path.exists(tmp_path / 'data' / 'tiny')


def test_compare_says_what_one_pair_and_two_shapes_mean(tmp_path, capsys):
    from helpers import make_run
    root = str(tmp_path)
    make_run(root, 'attnres_s1', 'attnres', 1, 3.3)
    make_run(root, 'rd_s1', 'rd_attnres', 1, 3.2)
    assert compare.main([os.path.join(root, '*'), '--json', os.path.join(root, 'r.json')]) == 0
    out = capsys.readouterr().out
    assert 'nan' not in out and 'one pair: no spread' in out
    assert json.load(open(os.path.join(root, 'r.json')))[0]['sd'] is None    # valid JSON, no NaN
    other = tmp_path / 'shapes'
    make_run(str(other), 'attnres_s1', 'attnres', 1, 3.3, n_layer=4)
    make_run(str(other), 'rd_s1', 'rd_attnres', 1, 3.2, n_layer=6)
    with pytest.raises(SystemExit, match='differ in shape or budget'):
        compare.main([str(other / '*')])


@pytest.mark.slow
def test_no_broadcast_buffers_warning_under_torchrun(data_dir, tmp_path):
    torchrun = (sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2')
    p = run(['--max_iters=1', '--eval_interval=1'], data_dir, str(tmp_path / 'run'), launcher=torchrun)
    assert 'broadcast_buffers' not in p.stderr and 'FutureWarning' not in p.stderr, p.stderr[-2000:]


def test_messages_say_what_happened(data_dir, tmp_path):
    # a .jsonl whose first rows lack the column: the rows are counted (and --skip_missing_text works),
    # not "no column 'text'"
    path = tmp_path / 'a.jsonl'
    with open(path, 'w') as f:
        f.write(json.dumps({'title': 'no text here'}) + '\n')
        f.write(''.join(json.dumps({'text': d}) + '\n' for d in DOCS))
    args = ['--input', str(path), '--data_dir', str(tmp_path / 'data'), '--num_proc', '1']
    with pytest.raises(SystemExit, match=r"1 rows have no 'text' text \(the first: .*a.jsonl, line 1\)"):
        prepare.main(args)
    prepare.main(args + ['--skip_missing_text'])
    # a non-UTF-8 line deep in a .jsonl is named exactly
    with open(tmp_path / 'b.jsonl', 'wb') as f:
        for i in range(3000):
            f.write(json.dumps({'text': DOCS[i % len(DOCS)]}).encode() + b'\n' if i != 2499 else b'{"text": "caf\xe9"}\n')
    with pytest.raises(SystemExit, match=r'b.jsonl, line 2500: not UTF-8'):
        prepare.main(['--input', str(tmp_path / 'b.jsonl'), '--data_dir', str(tmp_path / 'data'), '--name', 'b',
                      '--num_proc', '1'])
    # eval_only from scratch says that it writes nothing, and does not
    p = run_here(['--eval_only=True'], data_dir, str(tmp_path / 'eval'))
    assert 'writes nothing' in p.stdout and 'writes to' not in p.stdout and not os.path.exists(tmp_path / 'eval' / 'log.jsonl')
    # a run shorter than its warmup says so
    p = run_here(['--max_iters=2', '--warmup_iters=5'], data_dir, str(tmp_path / 'short'))
    assert 'the whole run is warmup' in p.stderr
