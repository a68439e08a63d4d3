"""Every file the project reads, given a bad one (docs/run_safety.md, the readers' table): missing,
empty, truncated, not UTF-8, not what its name says, from another version, or being written by another
process. Each case causes the fault and asserts a clear message (no traceback) or a correct recovery; and
the messages that claim a file say so only when it is on disk."""

import json
import os
import shutil
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import compare
import prepare
from run_kit import run_files
import study
from helpers import make_run
from helpers import limit_file_size, python
from helpers import logged_steps, start, wait_for_step
from helpers import DOCS, write_jsonl
from helpers import HERE, TINY, assert_same_run, main_here, run, run_here, sample_here

import sample
import train
from helpers import train_here


def message_of(fn, *args):
    """The message of the SystemExit that fn(*args) must raise (any other exception fails the test)."""
    with pytest.raises(SystemExit) as e:
        fn(*args)
    return str(e.value)


def no_traceback(p):
    assert p.returncode != 0 and 'Traceback' not in p.stderr, p.stderr[-2000:]
    return p.stderr


@pytest.fixture(scope='module')
def runs(data_dir, tmp_path_factory):
    """A run stopped at step 2 of a 4-step schedule, a finished 4-step run, and its weights exported:
    tests take copies."""
    root = tmp_path_factory.mktemp('runs')
    run_here(['--max_iters=2', '--lr_decay_iters=4'], data_dir, str(root / 'half'))
    run_here(['--max_iters=4'], data_dir, str(root / 'finished'))
    assert sample_here(f'--out_dir={root / "finished"}', f'--export={root / "w.safetensors"}').returncode == 0
    return root


def copy_run(runs, name, tmp_path):
    out = tmp_path / 'run'
    shutil.copytree(runs / name, out, ignore=shutil.ignore_patterns('run.lock'))
    return out


# ---------------------------------------------------------------------------------------------
# Token bins and meta.json (prepare.read_dataset, prepare.built_from)

def bins(data_dir, tmp_path):
    copy = tmp_path / 'data'
    shutil.copytree(os.path.join(data_dir, 'tiny'), copy / 'tiny')
    return str(copy), copy / 'tiny'


@pytest.mark.parametrize('fault, message', [
    ('missing', 'no prepared data at'),
    ('empty', 'not a token file (0 bytes'),
    ('truncated', 'the file is truncated or corrupted'),
    ('text', 'not a file written by prepare.py'),
    ('folder', 'cannot be read'),
    ('version', 'format version 2, this code reads version 1'),
    ('other build', 'carry different data_ids'),
])
def test_a_bad_token_file_is_a_message(data_dir, tmp_path, fault, message):
    root, folder = bins(data_dir, tmp_path)
    path = folder / 'val.bin'
    if fault == 'missing':
        path.unlink()
    elif fault == 'empty':
        path.write_bytes(b'')
    elif fault == 'truncated':
        path.write_bytes(path.read_bytes()[:-7])
    elif fault == 'text':
        path.write_text('these are words, not tokens ' * 20)
    elif fault == 'folder':
        path.unlink()
        path.mkdir()
    elif fault == 'version':
        header = np.fromfile(path, dtype='<i8', count=16)
        header[1] = 2
        path.write_bytes(header.tobytes() + path.read_bytes()[128:])
    else:   # another build's val.bin: written by a build of other data while this one was read
        header = np.fromfile(path, dtype='<i8', count=16)
        header[3] += 1
        path.write_bytes(header.tobytes() + path.read_bytes()[128:])
    assert message in message_of(prepare.read_dataset, root, 'tiny')


@pytest.mark.parametrize('meta', [None, b'', b'{"data_id": 1', b'\xff\xfe', b'[1, 2]', b'{"data_id": "x"}'])
def test_a_bad_meta_json_means_a_rebuild(data_dir, tmp_path, meta):
    root, folder = bins(data_dir, tmp_path)
    before = (folder / 'train.bin').read_bytes()
    if meta is None:
        (folder / 'meta.json').unlink()
    else:
        (folder / 'meta.json').write_bytes(meta)
    assert prepare.built_from(str(folder)) is None
    prepare.main(['--dataset', 'tiny', '--data_dir', root])        # rebuilt: the same corpus, the same tokens
    assert (folder / 'train.bin').read_bytes() == before and prepare.built_from(str(folder))


def test_two_builds_into_one_folder_never_mix(tmp_path):
    write_jsonl(tmp_path / 'a.jsonl', DOCS * 5)
    out = tmp_path / 'data' / 'x'
    args = ['--input', str(tmp_path / 'a.jsonl'), '--name', 'x', '--data_dir', str(tmp_path / 'data'), '--num_proc', '1']
    second = []
    real_build = prepare.build

    def build_while_another_starts(*a):
        # the moment a second build used to delete this one's .tmp files: it is refused, naming this one
        second.append(python('prepare.py', *args, '--force'))
        return real_build(*a)
    prepare.build = build_while_another_starts
    try:
        prepare.main(args)
    finally:
        prepare.build = real_build
    stderr = no_traceback(second[0])
    assert 'is being built by another prepare.py (pid' in stderr and str(os.getpid()) in stderr
    meta = json.load(open(out / 'meta.json'))
    train, val, data_id = prepare.read_dataset(str(tmp_path / 'data'), 'x')
    assert (len(train), len(val), data_id) == (meta['train_tokens'], meta['val_tokens'], meta['data_id'])
    assert python('prepare.py', *args).returncode == 0                 # the lock went with the build


# ---------------------------------------------------------------------------------------------
# config.json and log.jsonl (run_files.read_config, read_log: compare.load_run, study.py, train.py --init_from=auto)

BAD_CONFIGS = {'missing': None, 'empty': b'', 'truncated': b'{"residual": "attnres", "se', 'not UTF-8': b'\xff\xfe{}',
               'a list': b'[1, 2]', 'another program': b'{"model": "bert"}'}
BAD_LOGS = {'missing': None, 'not UTF-8 in the middle': b'{"step": 0}\n\xff\xfe\n{"step": 1}\n',
            'bad JSON in the middle': b'{"step": 0}\n{"step": \n{"step": 1}\n', 'rows without a step': b'[1, 2]\n'}


@pytest.mark.parametrize('which, content', [('config.json', c) for c in BAD_CONFIGS.values()] +
                         [('log.jsonl', c) for c in BAD_LOGS.values()],
                         ids=[f'config {k}' for k in BAD_CONFIGS] + [f'log {k}' for k in BAD_LOGS])
def test_compare_skips_what_is_not_a_run_and_reports_the_rest(tmp_path, capsys, which, content):
    root = tmp_path / 'out'
    for seed in (1, 2):
        make_run(str(root), f'attnres_s{seed}', 'attnres', seed, 3.3)
        make_run(str(root), f'rd_s{seed}', 'rd_attnres', seed, 3.2)
    bad = make_run(str(root), 'rd_s3', 'rd_attnres', 3, 3.0)
    make_run(str(root), 'attnres_s3', 'attnres', 3, 3.3)
    if content is None:
        os.remove(os.path.join(bad, which))
    else:
        open(os.path.join(bad, which), 'wb').write(content)
    (root / 'results.json').write_text('{}')                          # a plain file among the runs
    (root / 'plots').mkdir()                                          # a folder without a run
    assert compare.main([str(root / '*')]) == 0
    out = capsys.readouterr().out
    assert '| 1 | 3.3000 | 3.2000 | -0.1000 |' in out and '| 3 |' not in out.split('### Skipped')[0]
    skipped = out.split('### Skipped (3 paths that are not runs)')[1]
    assert 'results.json: not a run directory (a file)' in skipped and 'plots: no config.json' in skipped
    assert 'rd_s3: ' in skipped and ('config.json' if which == 'config.json' else 'log.jsonl') in skipped.split('rd_s3: ')[1]
    assert not study.is_finished(bad)


@pytest.mark.parametrize('content', list(BAD_CONFIGS.values())[1:], ids=list(BAD_CONFIGS)[1:])
def test_train_refuses_a_run_whose_config_cannot_be_read(data_dir, tmp_path, content):
    out = tmp_path / 'run'
    out.mkdir()
    (out / 'config.json').write_bytes(content)
    (out / 'log.jsonl').write_text('{"step": 0, "val_loss": 1.0}\n')
    text = message_of(train_here, data_dir, out, '--init_from=auto')
    assert 'without a readable config.json' in text or 'another configuration' in text
    assert (out / 'config.json').read_bytes() == content                # nothing removed


@pytest.mark.parametrize('run_name', ['half', 'finished'])   # (finished: its final row is missing, and written again)
@pytest.mark.parametrize('content', list(BAD_LOGS.values())[1:], ids=list(BAD_LOGS)[1:])
def test_a_resume_with_a_bad_log_is_a_message(data_dir, tmp_path, runs, content, run_name):
    out = copy_run(runs, run_name, tmp_path)
    (out / 'log.jsonl').write_bytes(content)
    text = message_of(train_here, data_dir, out, '--max_iters=4', '--init_from=auto')
    assert 'log.jsonl, line ' in text and 'fix or remove that line' in text
    assert (out / 'log.jsonl').read_bytes() == content


def test_a_torn_last_line_is_set_aside_before_the_next_row(data_dir, runs, tmp_path):
    # a run killed while appending its final row, then the documented recovery: --init_from=auto (the row is
    # written again), or an eval_only evaluation of its checkpoint (one row more). Each appends after the torn
    # bytes, which used to glue the new row to them: a bad line in the middle, a run no reader would take.
    out = copy_run(runs, 'finished', tmp_path)
    log, aside = out / 'log.jsonl', out / 'log.jsonl.torn'
    whole = log.read_bytes()
    final = whole.rstrip(b'\n').rsplit(b'\n', 1)[1]
    log.write_bytes(whole[:-len(final) - 1] + final[:len(final) // 2])
    assert not study.is_finished(str(out))
    with pytest.warns(UserWarning, match='torn last line .* was moved to .*log.jsonl.torn'):
        assert train_here(data_dir, out, '--init_from=auto', '--max_iters=4') == 0
    assert log.read_bytes() == whole and aside.read_bytes() == final[:len(final) // 2] + b'\n'
    assert study.is_finished(str(out)) and compare.load_run(str(out))['evals'][4]
    with open(log, 'ab') as f:
        f.write(b'{"step": 5, "train_loss": 3.1, "lr"')              # killed again, mid-row
    with pytest.warns(UserWarning, match='was moved to'):
        assert train_here(data_dir, out, '--init_from=resume', '--eval_only=True') == 0
    with warnings.catch_warnings():
        warnings.simplefilter('error')                               # no torn line left to drop
        rows = run_files.read_log(str(log))
    assert rows[-1]['eval_only'] and rows[-1]['step'] == 4 and study.is_finished(str(out))
    assert aside.read_bytes().endswith(b'{"step": 5, "train_loss": 3.1, "lr"\n')
    # a whole row whose newline the kill cut off is a row (its readers keep it): it gets its newline
    with open(log, 'rb+') as f:
        f.truncate(len(log.read_bytes()) - 1)
    run_files.append_log(str(log), dict(step=5))
    assert [r['step'] for r in run_files.read_log(str(log))][-2:] == [4, 5] and aside.read_bytes().count(b'\n') == 2


@pytest.mark.slow
def test_eval_only_from_a_checkpoint_holds_the_out_dir(data_dir, runs, tmp_path):
    # it appends to the log (and repairs its tail): a writer, so not while another process writes there
    out = copy_run(runs, 'finished', tmp_path)
    hold = "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); f.write('pid 1: a test\\n'); " \
           "f.flush(); print('held', flush=True); time.sleep(300)"
    holder = subprocess.Popen([sys.executable, '-c', hold, str(out / 'run.lock')], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == 'held\n'
        before = (out / 'log.jsonl').read_bytes()
        text = message_of(train_here, data_dir, out, '--init_from=resume', '--eval_only=True')
        assert 'is in use by another run (pid 1: a test)' in text and (out / 'log.jsonl').read_bytes() == before
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------------------------------------
# Checkpoints (run_files.load_checkpoint: train.py resume, sample.py; is_finished) and .safetensors weights (sample.py)

def test_a_checkpoint_that_is_not_one_is_a_message(data_dir, tmp_path, runs):
    out = copy_run(runs, 'half', tmp_path)
    ckpt = out / 'ckpt.pt'
    good = ckpt.read_bytes()
    cases = {'empty': b'', 'truncated': good[:len(good) // 2], 'text': b'not a checkpoint\n' * 100}
    for name, content in cases.items():
        ckpt.write_bytes(content)
        text = message_of(train_here, data_dir, out, '--max_iters=4', '--init_from=auto')
        assert 'cannot be read' in text and 'left as it is' in text, name
        assert not study.is_finished(str(out))
    for name, obj in {'a list': [1, 2], 'no config': dict(model={}, step=2),
                      'a model of numbers': dict(model={'w': 1}, optimizer={}, scaler={}, step=2, best_val_loss=1.0,
                                                 config={}, rng={})}.items():
        if isinstance(obj, dict):
            run_files.save_checkpoint(obj, str(ckpt))   # (with a valid checksum: only the content is wrong)
        else:
            torch.save(obj, str(ckpt))
        text = message_of(train_here, data_dir, out, '--max_iters=4', '--init_from=auto')
        assert 'not a checkpoint of train.py' in text, name
        assert 'not a checkpoint of train.py' in message_of(sample.main, [f'--out_dir={out}', '--device=cpu'])


@pytest.mark.parametrize('edit, message', [
    (dict(n_layer=3), 'transformer.h.2.norm_attn.weight is missing'),
    (dict(n_head=3), 'must be divisible by n_head=3'),
    (dict(n_layer='2'), "n_layer='2' is not an integer"),
    (dict(n_embd=1e7), 'n_embd=10000000.0 is not an integer'),
    (dict(n_embd=10 ** 7), 'has shape (50304, 32)'),
    (dict(residual='mystery'), "unknown residual='mystery'"),
    (dict(n_layer=None), 'n_layer=None is not an integer'),
])
def test_weights_whose_header_does_not_match_their_tensors_are_refused(runs, tmp_path, edit, message):
    from safetensors import safe_open
    from safetensors.torch import save_file
    weights = tmp_path / 'w.safetensors'
    with safe_open(str(runs / 'w.safetensors'), framework='pt') as f:
        header, tensors = json.loads(f.metadata()['config']), {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(weights), metadata={'config': json.dumps(dict(header, **edit)), 'format': 'pt'})
    assert message in message_of(sample.main, [f'--weights={weights}', '--device=cpu', '--num_samples=1'])


def test_weights_with_a_tensor_renamed_reshaped_or_recast_are_refused(runs, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file
    weights = tmp_path / 'w.safetensors'
    with safe_open(str(runs / 'w.safetensors'), framework='pt') as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    name = 'transformer.h.0.attn.c_v.weight'
    for label, changed, message in [
            ('renamed', {('x.' + k if k == name else k): t for k, t in tensors.items()}, 'x.' + name + ' is not a tensor'),
            ('reshaped', dict(tensors, **{name: tensors[name][:, :-2].contiguous()}), f'{name} has shape (32, 30)'),
            ('recast', dict(tensors, **{name: tensors[name].double()}), 'torch.float64, the model'),
            ('dropped', {k: t for k, t in tensors.items() if k != name}, f'{name} is missing')]:
        save_file(changed, str(weights), metadata=meta)
        text = message_of(sample.main, [f'--weights={weights}', '--device=cpu', '--num_samples=1'])
        assert message in text and 'does not hold the weights' in text, label
    # and as a program: the message, no traceback
    assert 'does not hold the weights' in no_traceback(python('sample.py', f'--weights={weights}', '--device=cpu'))


def test_an_exported_file_edited_after_its_export_is_refused(runs, tmp_path):
    # the header's configuration and the tensors carry a digest: an edit that still fits the tensors (another
    # attnres_block_size, another mode with the same tensors, a context too big to build) or a changed weight
    # is a message, not a model that samples something else
    from safetensors import safe_open
    from safetensors.torch import save_file
    with safe_open(str(runs / 'w.safetensors'), framework='pt') as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    header, weights, name = json.loads(meta['config']), tmp_path / 'w.safetensors', 'transformer.h.0.attn.c_v.weight'
    args = [f'--weights={weights}', '--device=cpu', '--num_samples=1', '--max_new_tokens=2']
    for edit, changed in [(dict(attnres_block_size=1), tensors), (dict(residual='ctrl_fixed_v'), tensors),
                          (dict(block_size=2 ** 30), tensors), ({}, dict(tensors, **{name: tensors[name] * 1.01}))]:
        save_file(changed, str(weights), metadata=dict(meta, config=json.dumps(dict(header, **edit))))
        assert 'was changed after it was exported' in message_of(sample.main, args), edit
    # one exported before files carried a digest: a warning; a model too big for this machine is a message
    save_file(tensors, str(weights), metadata={'config': json.dumps(dict(header, block_size=2 ** 40)), 'format': 'pt'})
    with pytest.warns(UserWarning, match='has no digest'):
        assert 'cannot be built here' in message_of(sample.main, args)
    assert 'cannot be built here' in no_traceback(python('sample.py', *args))


# ---------------------------------------------------------------------------------------------
# Plans, config files, prompt files

@pytest.mark.parametrize('content, message', [
    (None, 'No such file'), (b'', 'Expecting value'), (b'\xff\xfe[]', "codec can't decode"),
    (b'{"config": "x"}', 'a dict, not a list of runs'), (b'[]', 'with no runs'),
    (b'[{"config": "config/quickstart.py", "seed": "1", "out_dir": "a"}]', "seed must be an integer, got '1'"),
    (b'[{"config": "config/quickstart.py", "seed": 1, "out_dir": "a", "overrides": "--x=1"}]', 'overrides must be a list'),
    (b'["config/quickstart.py"]', 'entry 1 is not an object'),
    (b'[{"config": "config/quickstart.py", "seed": 1, "out_dir": "a", "overides": ["--max_iters=20"]}]',
     "entry 1 has the key 'overides', which a plan entry does not have (did you mean 'overrides'?); an entry's keys "
     "are config, seed, out_dir, overrides"),
    (b'[{"config": "config/quickstart.py", "seed": 1, "out_dir": "a", "max_iters": 20}]',
     """the key 'max_iters', which a plan entry does not have (train.py's keys go in overrides, as "--max_iters=...")"""),
    (b'[{"config": "config/quickstart.py", "seed": 1, "out_dir": "runs/a"}, '
     b'{"config": "config/quickstart.py", "seed": 2, "out_dir": "runs/./a"}]', "entries 1 and 2 both have out_dir"),
])
def test_a_bad_plan_file_is_a_message(tmp_path, content, message):
    path = tmp_path / 'plan.json'
    if content is not None:
        path.write_bytes(content)
    text = message_of(study.load_plan, str(path))
    assert 'not a plan file' in text and message in text


@pytest.mark.parametrize('second, message', [
    (dict(out_dir='runs/a'), "entries 1 and 2 both have out_dir 'runs/a'"),     # seed 2 would be "done already"
    (dict(overides=['--max_iters=2']), "the key 'overides'"),                   # it would train the config's defaults
    (dict(overrides=['--max_iter=2']), "unknown config key 'max_iter'"),
    (dict(overrides=['--n_layer=two']), "config key 'n_layer' in --n_layer must be a int"),
    (dict(overrides=['--out_dir=elsewhere']), '--out_dir=elsewhere is set by the plan itself'),
])
def test_a_plan_is_refused_before_anything_runs(tmp_path, second, message):
    plan = tmp_path / 'plan.json'
    plan.write_text(json.dumps([dict(config='config/quickstart.py', seed=1, out_dir='runs/a', overrides=['--max_iters=2']),
                                dict(dict(config='config/quickstart.py', seed=2, out_dir='runs/b'), **second)]))
    for dry in (['--dry_run'], []):
        text = message_of(study.main, ['run', str(plan), '--root', str(tmp_path / 'root'), *dry])
        assert message in text and ('entry 2' in text or 'entries 1 and 2' in text), text
    assert not (tmp_path / 'root').exists()


def test_a_launcher_that_cannot_start_is_a_message(tmp_path):
    plan = tmp_path / 'plan.json'
    plan.write_text(json.dumps([dict(config='config/quickstart.py', seed=1, out_dir='runs/a')]))
    text = message_of(study.main, ['run', str(plan), '--root', str(tmp_path), '--launcher', 'no-such-torchrun'])
    assert 'the launcher cannot start (no-such-torchrun: No such file or directory)' in text


@pytest.mark.parametrize('content, message', [
    (None, 'cannot read config file'), (b'\xff\xfe n_layer = 2', 'is not UTF-8 text'),
    (b'n_layer = = 2', 'line 1: invalid syntax'), (b'n_layer = 2\nn_head = 1 / 0\n', 'line 2: ZeroDivisionError'),
    ('folder', 'cannot read config file')])
def test_a_bad_config_file_is_a_message(data_dir, tmp_path, content, message):
    path = tmp_path / 'c.py'
    if content == 'folder':
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    assert message in message_of(train.main, [str(path), f'--out_dir={tmp_path / "run"}'])
    assert not (tmp_path / 'run').exists()


def test_a_bad_prompt_file_is_a_message(runs, tmp_path):
    (tmp_path / 'latin1.txt').write_bytes('caf\xe9'.encode('latin-1'))
    for prompt, message in [(tmp_path / 'latin1.txt', 'not UTF-8 text'), (tmp_path, 'cannot read the prompt file'),
                            (tmp_path / 'none.txt', 'cannot read the prompt file')]:
        text = message_of(sample.main, [f'--out_dir={runs / "finished"}', f'--start=FILE:{prompt}', '--device=cpu'])
        assert message in text


@pytest.mark.parametrize('device', ['mps', 'xyz', 'cuda:7'])
def test_a_device_this_machine_lacks_is_refused_before_anything_is_written(data_dir, tmp_path, device):
    if device.startswith('cuda') and torch.cuda.device_count() > 7 or device == 'mps' and torch.backends.mps.is_available():
        pytest.skip('this machine has the device')
    out = tmp_path / 'run'
    assert f"device='{device}'" in message_of(train_here, data_dir, out, f'--device={device}') and not out.exists()
    assert f"device='{device}'" in message_of(sample.main, [f'--out_dir={out}', f'--device={device}'])


# ---------------------------------------------------------------------------------------------
# What a run writes: messages that claim a file say so only when it is there; nothing removed unasked

@pytest.mark.slow
def test_a_stop_signal_on_an_eval_step_checkpoints_whatever_always_save_checkpoint_says(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    args = ['--max_iters=400', '--lr_decay_iters=400', '--log_interval=5', '--eval_interval=5',
            '--always_save_checkpoint=False']
    proc = start(args, data_dir, out)
    wait_for_step(proc, out, 5)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 75, stderr[-2000:]
    stopped = int(stdout.split('stopped by SIGTERM at step ')[1].split(':')[0])
    assert stopped % 5 == 0 and f'checkpoint written to {out}/ckpt.pt' in stdout       # an eval step
    assert run_files.checkpoint_progress(os.path.join(out, 'ckpt.pt')) == (stopped, 400)
    resumed = run_here([*args, '--init_from=auto', f'--max_iters={stopped + 5}'], data_dir, out)
    assert f'resumed at step {stopped}' in resumed.stdout


@pytest.mark.slow
def test_a_full_disk_at_the_final_checkpoint_leaves_the_run_unfinished(data_dir, runs, tmp_path):
    out = str(tmp_path / 'run')
    run(['--max_iters=2', '--lr_decay_iters=4'], data_dir, out)
    cmd = [sys.executable, os.path.join(HERE, 'train.py'), *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
           '--max_iters=4', '--init_from=auto']
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=600, preexec_fn=limit_file_size(2_000_000))
    assert 'could not write the checkpoint' in no_traceback(p)
    assert run_files.checkpoint_progress(os.path.join(out, 'ckpt.pt')) == (2, 2)
    assert run_files.load_checkpoint(os.path.join(out, 'ckpt.pt'))['step'] == 2   # the older one intact (its checksum)
    assert not study.is_finished(out)                       # the final evaluation is logged after its checkpoint
    assert 4 not in {r['step'] for r in run_files.read_log(os.path.join(out, 'log.jsonl')) if 'val_loss' in r}
    run_here(['--max_iters=4', '--init_from=auto'], data_dir, out)   # room again (no limit): resumed
    assert study.is_finished(out)
    assert_same_run(out, str(runs / 'finished'))            # exactly the run that never met a full disk


def test_a_log_that_claims_a_checkpoint_its_ckpt_does_not_hold_is_not_finished(runs, tmp_path):
    # (a log written by an older train.py, which logged the final evaluation before its checkpoint)
    out = copy_run(runs, 'finished', tmp_path)
    assert study.is_finished(str(out))
    shutil.copy(runs / 'half' / 'ckpt.pt', out / 'ckpt.pt')
    assert not study.is_finished(str(out))


def test_free_space_is_measured_once_the_partial_checkpoint_is_gone(tmp_path, monkeypatch):
    # torch.save fails with its file still open, held by the exception's traceback: the free space read
    # while it is open misses the partial file's blocks (a real full disk said "0 MB free" with 12 MB free)
    size = 64 * 2 ** 20

    def save_until_full(obj, path):
        f = open(path, 'wb')
        f.write(b'\x01' * size)
        f.flush()
        raise RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos 832 vs 726')
    monkeypatch.setattr(torch, 'save', save_until_full)
    text = message_of(run_files.save_checkpoint, dict(w=torch.zeros(4)), str(tmp_path / 'ckpt.pt'))
    said = float(text.split(' MB free')[0].rsplit(' has ', 1)[1].replace(',', ''))
    free = shutil.disk_usage(tmp_path).free / 1e6
    assert abs(said - free) < size / 2e6, text            # within 32 MB of the truth, not 64 MB short of it
    assert 'the partial file was removed' in text and os.listdir(tmp_path) == []


@pytest.mark.slow
def test_a_full_disk_while_logging_is_a_message(data_dir, tmp_path):
    out = tmp_path / 'run'
    cmd = [sys.executable, os.path.join(HERE, 'train.py'), *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
           '--max_iters=40', '--lr_decay_iters=40', '--eval_interval=40', '--always_save_checkpoint=False']
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=600, preexec_fn=limit_file_size(6000))
    assert 'could not write' in no_traceback(p) and 'log.jsonl' in p.stderr and 'MB free' in p.stderr
    assert 0 < os.path.getsize(out / 'log.jsonl') <= 6000 and (out / 'config.json').exists()
    # before its first checkpoint: it says that there is none (not that one "is kept"), and auto starts it again
    assert not (out / 'ckpt.pt').exists() and 'no checkpoint was written' in p.stderr and 'is kept' not in p.stderr
    assert subprocess.run(cmd[:-4] + ['--max_iters=2', '--lr_decay_iters=40', '--eval_interval=40', '--init_from=auto'],
                          capture_output=True, cwd=HERE, timeout=600).returncode == 0
    assert [r['step'] for r in run_files.read_log(str(out / 'log.jsonl'))] == [0, 1, 2, 2]


def test_auto_never_removes_a_finished_run_whose_checkpoint_is_gone(data_dir, runs, tmp_path):
    out = copy_run(runs, 'finished', tmp_path)
    (out / 'ckpt.pt').unlink()
    before = {n: (out / n).read_bytes() for n in ('config.json', 'log.jsonl')}
    for init in ('auto', 'scratch', 'resume'):
        text = message_of(train_here, data_dir, out, f'--init_from={init}')
        assert '--overwrite=True' in text and 'ckpt.pt is gone' in text
        assert 'killed before its first checkpoint' not in text      # (resume said so of a finished run)
        assert {n: (out / n).read_bytes() for n in before} == before
    assert train_here(data_dir, out, '--init_from=scratch', '--overwrite=True') == 0   # told to: replaced


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_starts_again(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    proc = start(['--max_iters=400', '--lr_decay_iters=400', '--eval_interval=200', '--log_interval=1'], data_dir, out)
    wait_for_step(proc, out, 3)
    proc.kill()
    proc.communicate()
    assert not os.path.exists(os.path.join(out, 'ckpt.pt')) and max(logged_steps(out)) < 200
    for args in (['--init_from=resume'], []):   # both point to the way out
        assert '--init_from=auto' in no_traceback(run_here(args, data_dir, out, expect_ok=False))
    run_here(['--init_from=auto', '--max_iters=4', '--lr_decay_iters=400', '--eval_interval=200'], data_dir, out)
    assert sorted(logged_steps(out)) == [1, 2, 3, 4]


def test_a_resume_never_makes_the_record_say_less(data_dir, runs, tmp_path, capsys):
    out = copy_run(runs, 'finished', tmp_path)
    before = {n: (out / n).read_bytes() for n in ('config.json', 'log.jsonl', 'ckpt.pt')}
    for init in ('resume', 'auto'):
        assert train_here(data_dir, out, f'--init_from={init}', '--max_iters=2', '--lr_decay_iters=4') == 0
        assert 'nothing to do, nothing written' in capsys.readouterr().out
        assert {n: (out / n).read_bytes() for n in before} == before


def test_a_kill_between_the_final_checkpoint_and_its_row_is_completed(data_dir, runs, tmp_path):
    out = copy_run(runs, 'finished', tmp_path)
    log = out / 'log.jsonl'
    rows = log.read_text().split('\n')[:-1]
    log.write_text('\n'.join(rows[:-1]) + '\n')                 # the final evaluation's row never written
    assert not study.is_finished(str(out))
    assert train_here(data_dir, out, '--init_from=auto', '--max_iters=4') == 0
    assert study.is_finished(str(out))
    assert json.loads(log.read_text().split('\n')[-2])['val_loss'] == json.loads(rows[-1])['val_loss']


@pytest.mark.slow
def test_a_full_disk_at_the_first_checkpoint_advises_what_then_works(data_dir, tmp_path):
    # the log step's row at the first checkpoint's step is appended before the save that fails: auto must not
    # take it for a run that got past a checkpoint that is gone (it refused, and only --overwrite got on)
    out = str(tmp_path / 'run')
    cmd = [sys.executable, os.path.join(HERE, 'train.py'), *TINY, f'--data_dir={data_dir}', f'--out_dir={out}',
           '--init_from=auto']
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=600, preexec_fn=limit_file_size(2_000_000))
    text = no_traceback(p)
    assert 'could not write the checkpoint' in text and 'then continue with --init_from=auto' in text, text
    assert 2 in logged_steps(out) and not os.path.exists(os.path.join(out, 'ckpt.pt'))
    needed = float(text.split('needs about ')[1].split(' MB')[0])
    run_here(['--init_from=auto'], data_dir, out)                     # room again: the advice, followed
    assert study.is_finished(out) and sorted(logged_steps(out)) == [1, 2, 3, 4]
    # what the message said a checkpoint needs is what it takes (the tied weights counted once)
    assert abs(needed - os.path.getsize(os.path.join(out, 'ckpt.pt')) / 1e6) < 1, needed


def test_a_refused_resume_carries_on_as_its_message_says(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    run_here(['--max_iters=2', '--lr_decay_iters=4'], data_dir, out)
    text = message_of(train_here, data_dir, out, '--init_from=resume', '--learning_rate=1e-3')
    assert 'cannot resume' in text and "Use the checkpoint's values or another out_dir" in text
    run_here(['--init_from=resume'], data_dir, out)                  # the checkpoint's values: it carries on
    assert study.is_finished(out)
    run_here(['--learning_rate=1e-3'], data_dir, str(tmp_path / 'other'))   # or another out_dir
    assert study.is_finished(str(tmp_path / 'other'))


@pytest.mark.parametrize('edit, said', [
    (lambda rows: rows[:3] + rows[5:] + rows[3:5], 'out of order'),
    (lambda rows: rows + rows[-2:-1], 'has two'),
])
def test_log_rows_out_of_order_or_repeated_are_a_warning(runs, tmp_path, edit, said):
    out = copy_run(runs, 'finished', tmp_path)
    log = out / 'log.jsonl'
    lines = log.read_text().splitlines(keepends=True)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        run_files.read_log(str(log))                                 # the log as train.py wrote it: no warning
    log.write_text(''.join(edit(lines)))
    with pytest.warns(UserWarning, match=said):
        rows = run_files.read_log(str(log))
    assert len(rows) == len(edit(lines))                              # warned, nothing dropped


# What an older version named the read points' pseudo-queries and gain: written out here, as its files hold them
OLDER_NAMES = {'.w_qk': '.attn_query', '.w_v': '.value_query', '.w_heads1': '.attn_query', '.w_heads2': '.heads2_query',
               '.w_mlp': '.mlp_query', '.w_final': '.final_query', '.source_gain': '.key_gain'}


def with_older_names(tensors):
    renamed = {}
    for name, t in tensors.items():
        new = next((n for n in OLDER_NAMES if name.endswith(n)), None)
        renamed[name[:-len(new)] + OLDER_NAMES[new] if new else name] = t
    return renamed


def test_a_checkpoint_and_an_export_of_an_older_version_load_and_resume(data_dir, runs, tmp_path):
    # an rd_attnres run's files as a version that named w_qk, w_v, ... attn_query, value_query, ... wrote them
    from safetensors import safe_open
    from safetensors.torch import save_file
    old = copy_run(runs, 'half', tmp_path)
    ckpt = run_files.load_checkpoint(str(old / 'ckpt.pt'))
    older = with_older_names(ckpt['model'])
    assert {'attn_query', 'value_query', 'mlp_query', 'final_query', 'key_gain'} <= {n.split('.')[-1] for n in older}
    run_files.save_checkpoint(dict(ckpt, model=older), str(old / 'ckpt.pt'))
    # it loads (sample.py) with the weights it holds, and it resumes into the run an uninterrupted one is
    model, _, _ = sample.load_model(dict(out_dir=str(old), weights=''))
    assert all(torch.equal(t, ckpt['model'][n]) for n, t in model.state_dict().items() if n in ckpt['model'])
    run_here(['--init_from=resume', '--max_iters=4', '--lr_decay_iters=4'], data_dir, str(old))
    rows = [r for r in map(json.loads, open(old / 'log.jsonl')) if 'val_loss' in r or 'loss' in r]
    want = [r for r in map(json.loads, open(runs / 'finished' / 'log.jsonl')) if 'val_loss' in r or 'loss' in r]
    assert [(r['step'], r.get('loss'), r.get('val_loss')) for r in rows] == \
        [(r['step'], r.get('loss'), r.get('val_loss')) for r in want]
    # an export of that version: its digest over the older names, checked, then loaded under today's
    with safe_open(str(runs / 'w.safetensors'), framework='pt') as f:
        header, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    tensors = with_older_names(tensors)
    save_file(tensors, str(tmp_path / 'old.safetensors'),
              metadata=dict(header, sha256=sample.weights_digest(header['config'], tensors)))
    old_export, _, _ = sample.load_model(dict(out_dir='', weights=str(tmp_path / 'old.safetensors')))
    today, _, _ = sample.load_model(dict(out_dir='', weights=str(runs / 'w.safetensors')))
    assert old_export.state_dict().keys() == today.state_dict().keys()
    assert all(torch.equal(t, today.state_dict()[n]) for n, t in old_export.state_dict().items())


# ---------------------------------------------------------------------------------------------
# A checkpoint that is almost one, in every reader of ckpt.pt: sample, intervene, a resume, an evaluation
# (compare.py reads a run's config.json and log only)

def checkpoint_with(ckpt, fault):
    """ckpt (a path) made into a checkpoint with one fault; those with a content fault carry a valid checksum."""
    c = run_files.load_checkpoint(str(ckpt))
    if fault == 'truncated':
        data = ckpt.read_bytes()
        ckpt.write_bytes(data[:len(data) // 2])
        return
    if fault == 'an unknown entry':          # another version's state, or an edit
        c['schedule_state'] = torch.ones(3)
    elif fault == 'an unknown tensor':
        c['model']['transformer.mystery'] = torch.ones(3)
    elif fault == 'another vocabulary':      # the whole model of a 1000-token vocabulary
        c['config']['vocab_size'] = 1000
        c['model'] = {k: (t[:1000].clone() if t.shape[:1] == (50304,) else t) for k, t in c['model'].items()}
    run_files.save_checkpoint(c, str(ckpt))


@pytest.mark.parametrize('fault, message', [
    ('an unknown entry', None),
    ('an unknown tensor', 'transformer.mystery is not a tensor of this model'),
    ('another vocabulary', 'transformer.wte.weight has shape (1000, 32)'),
    ('truncated', 'cannot be read'),
])
def test_a_checkpoint_with_an_unknown_entry_another_vocabulary_or_truncated_is_refused_or_read_as_it_is(
        data_dir, runs, tmp_path, fault, message):
    import intervene
    half, finished = tmp_path / 'half', tmp_path / 'finished'
    for name, out in (('half', half), ('finished', finished)):
        shutil.copytree(runs / name, out, ignore=shutil.ignore_patterns('run.lock'))
    export = finished / 'final.safetensors'
    assert sample_here(f'--out_dir={finished}', f'--export={export}').returncode == 0   # before the fault
    for out in (half, finished):
        checkpoint_with(out / 'ckpt.pt', fault)
    damaged = {out: (out / 'ckpt.pt').read_bytes() for out in (half, finished)}
    train_args = [*TINY, f'--data_dir={data_dir}', '--cpu_malloc_tuning=False', '--init_from=resume']
    commands = {'sample': (sample.main, [f'--out_dir={finished}', '--device=cpu', '--num_samples=1',
                                         '--max_new_tokens=4', '--cpu_threads=1']),
                'intervene': (intervene.main, [f'--out_dir={finished}', f'--data_dir={data_dir}']),
                'evaluation': (train.main, [*train_args, f'--out_dir={finished}', '--eval_only=True']),
                'resume': (train.main, [*train_args, f'--out_dir={half}'])}
    said, warned = {}, {}
    for reader, (main, argv) in commands.items():
        with warnings.catch_warnings(record=True) as w:   # (a warning the command line would print on stderr)
            warnings.simplefilter('always')
            said[reader] = main_here(main, argv, returns_status=reader != 'sample')
        warned[reader] = ' '.join(str(x.message) for x in w)
        assert 'Traceback' not in said[reader].stderr, (reader, said[reader].stderr[-2000:])
    if fault == 'an unknown entry':
        # the weights are read as they are (said), and the model is the run's: intervene.py's as-trained loss is
        # the logged one; a resume, which would go on without that state, is refused, saying what to do
        for reader in ('sample', 'intervene', 'evaluation'):
            assert said[reader].returncode == 0 and 'do not know (schedule_state)' in warned[reader], reader
        assert 'as_trained' in said['intervene'].stdout
        text = said['resume'].stderr
        assert said['resume'].returncode != 0 and 'does not know (schedule_state)' in text
        assert 'start the run again in another out_dir' in text
        run_here([f'--max_iters=4'], data_dir, str(tmp_path / 'again'))            # the advice, followed
        assert study.is_finished(str(tmp_path / 'again'))
    else:
        for reader, p in said.items():
            assert p.returncode != 0 and message in p.stderr, (reader, p.stderr[-2000:])
    if fault == 'truncated':
        # a finished run's damaged checkpoint is not called unfinished: that advice would loop
        text = said['intervene'].stderr
        assert 'is not finished' not in text and 'the file is damaged' in text
        command = text.split('(python intervene.py ')[1].split(')')[0]
        p = main_here(intervene.main, [*command.split(), f'--data_dir={data_dir}'])   # the advice, followed
        assert p.returncode == 0 and 'as_trained' in p.stdout, p.stderr[-2000:]
    for out in (half, finished):                      # every reader left the file as it was
        assert (out / 'ckpt.pt').read_bytes() == damaged[out]
