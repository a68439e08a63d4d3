"""A study never loses, mixes or silently alters a run (docs/run_safety.md). Each test causes
the fault on purpose (a run twice by mistake, a resume with another schedule, a torn log line, flipped
bytes in a checkpoint, a kill between two renames, an edited input, bad rows and files) and checks
that nothing was lost or silently changed."""

import json
import os
import warnings

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')

import pytest
import torch

import prepare
from run_kit import run_control, run_files
from helpers import DOCS, write_jsonl
from helpers import read_log, run, run_here, sample_here




def snapshot(out_dir):
    """Every file of a run directory, but run.lock: who holds the directory, not part of the run."""
    return {name: open(os.path.join(out_dir, name), 'rb').read() for name in sorted(os.listdir(out_dir))
            if name != 'run.lock'}


# ---------------------------------------------------------------------------------------------
# train.py

def test_a_fresh_run_refuses_to_replace_an_existing_run(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    run_here(['--max_iters=2'], data_dir, out)
    before = snapshot(out)
    p = run_here(['--max_iters=2'], data_dir, out, expect_ok=False)        # the same seed loop, run again by mistake
    assert p.returncode != 0 and 'already holds a run' in p.stderr
    assert all(w in p.stderr for w in ('ckpt.pt', 'log.jsonl', '--init_from=resume', '--out_dir', '--overwrite=True'))
    assert snapshot(out) == before                                    # nothing touched
    run_here(['--max_iters=2', '--overwrite=True', '--seed=5'], data_dir, out)   # asked for explicitly: replaced
    assert json.load(open(os.path.join(out, 'config.json')))['seed'] == 5


def test_resume_keeps_the_schedule_it_started_with(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    run_here(['--max_iters=3', '--eval_interval=3'], data_dir, out)                # schedule: 3 steps
    assert json.load(open(os.path.join(out, 'config.json')))['lr_decay_iters'] == 3
    # the old README example, --max_iters=6 on resume, would have stretched the cosine: refused now
    p = run_here(['--max_iters=6', '--init_from=resume'], data_dir, out, expect_ok=False)
    assert p.returncode != 0 and 'past the end of the LR schedule' in p.stderr and '--train_past_schedule=True' in p.stderr
    p = run_here(['--max_iters=6', '--init_from=resume', '--lr_decay_iters=6'], data_dir, out, expect_ok=False)
    assert p.returncode != 0 and 'lr_decay_iters: checkpoint 3 vs now 6' in p.stderr    # frozen like the others
    run_here(['--max_iters=6', '--init_from=resume', '--train_past_schedule=True'], data_dir, out)
    rows = read_log(out)[0]
    assert [rows[s]['lr'] for s in (1, 2, 3)] == pytest.approx([1.5e-3, 3e-3, 3e-3])   # the 3-step schedule, as before
    assert all(rows[s]['lr'] == pytest.approx(3e-3 * 0.1) for s in (4, 5, 6))      # then its final LR, kept


def test_eval_only_on_a_checkpoint_evaluates_logs_and_touches_nothing(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    run_here(['--max_iters=2'], data_dir, out)
    ckpt, config = (open(os.path.join(out, n), 'rb').read() for n in ('ckpt.pt', 'config.json'))
    p = run_here(['--max_iters=4', '--init_from=resume', '--eval_only=True'], data_dir, out)
    assert 'eval_only' in p.stdout
    rows = run_files.read_log(os.path.join(out, 'log.jsonl'))
    assert rows[-1]['eval_only'] is True and rows[-1]['step'] == 2
    assert rows[-1]['val_loss'] == pytest.approx(read_log(out)[1][2]['val_loss'], rel=1e-6)
    assert max(r['step'] for r in rows) == 2                                    # nothing was trained
    assert open(os.path.join(out, 'ckpt.pt'), 'rb').read() == ckpt
    assert open(os.path.join(out, 'config.json'), 'rb').read() == config


def test_the_divergence_message_names_what_was_non_finite():
    assert 'non-finite training loss at step 7' in run_control.divergence_message(7, 7, 10, 'c.pt')
    message = run_control.divergence_message(-1, 4, 10, 'c.pt')
    assert 'non-finite gradient norm at step 4 (the training loss was finite)' in message and 'noticed at step 10' in message


@pytest.mark.slow
def test_a_torn_last_log_line_is_dropped_on_resume(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    args = ['--max_iters=4', '--lr_decay_iters=8', '--eval_interval=2']
    run(args, data_dir, out)
    log = os.path.join(out, 'log.jsonl')
    with open(log, 'a') as f:
        f.write('{"step": 5, "train_loss": 3.1, "lr"')              # the process was killed mid-write
    p = run(['--max_iters=6', '--lr_decay_iters=8', '--eval_interval=2', '--init_from=resume'], data_dir, out)
    assert 'torn last line' in p.stderr
    rows = run_files.read_log(log)                                   # (raises on any bad line)
    assert sorted(r['step'] for r in rows if 'train_loss' in r) == [1, 2, 3, 4, 5, 6]
    assert open(log + '.torn').read() == '{"step": 5, "train_loss": 3.1, "lr"\n'   # the torn bytes, set aside
    with open(log, 'a') as f:
        f.write('{"step": 7}\nnot json\n{"step": 8}\n')              # damage elsewhere is an error, with the line
    with pytest.raises(SystemExit, match=r'log.jsonl, line \d+: not valid JSON'):
        run_files.read_log(log)


def test_a_damaged_checkpoint_is_refused_and_left_as_it_is(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    run_here(['--max_iters=2', '--lr_decay_iters=4'], data_dir, out)
    path = os.path.join(out, 'ckpt.pt')
    data = bytearray(open(path, 'rb').read())
    middle = len(data) // 2
    data[middle:middle + 300] = bytes(255 - b for b in data[middle:middle + 300])   # a few hundred flipped bytes
    open(path, 'wb').write(bytes(data))
    p = run_here(['--max_iters=4', '--lr_decay_iters=4', '--init_from=resume'], data_dir, out, expect_ok=False)
    assert p.returncode != 0 and 'damaged' in p.stderr and 'left as it is' in p.stderr, p.stderr[-1500:]
    assert open(path, 'rb').read() == bytes(data)


def test_checksum_covers_every_tensor_and_value():
    state = dict(model={'w': torch.arange(6.0).reshape(2, 3)}, step=3, rng=(1, [2, 3]))
    digest = run_files.content_digest(state)
    assert digest == run_files.content_digest(dict(model={'w': torch.arange(6.0).reshape(2, 3)}, step=3, rng=(1, [2, 3])))
    assert digest != run_files.content_digest(dict(state, step=4))
    assert digest != run_files.content_digest(dict(state, model={'w': torch.arange(6.0).reshape(3, 2)}))
    changed = torch.arange(6.0).reshape(2, 3)
    changed[1, 2] = torch.nextafter(changed[1, 2], torch.tensor(10.0))   # one bit of one number
    assert digest != run_files.content_digest(dict(state, model={'w': changed}))


def test_resume_refuses_data_from_another_build(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    run_here(['--max_iters=2', '--lr_decay_iters=4'], data_dir, out)
    other = str(tmp_path / 'other')
    prepare.main(['--dataset', 'tiny', '--data_dir', other, '--num_proc', '1', '--max_tokens', '60000'])
    p = run_here(['--max_iters=4', '--lr_decay_iters=4', '--init_from=resume', f'--data_dir={other}'], data_dir, out,
                 expect_ok=False)
    assert p.returncode != 0 and 'data_id' in p.stderr


# ---------------------------------------------------------------------------------------------
# prepare.py

def test_a_kill_between_the_renames_never_mixes_two_corpora(tmp_path, monkeypatch, capsys):
    data = str(tmp_path / 'data')
    write_jsonl(tmp_path / 'a.jsonl', DOCS)
    prepare.main(['--data_dir', data, '--num_proc', '1', '--input', str(tmp_path / 'a.jsonl'), '--name', 'x'])
    real_replace = os.replace

    def killed_after_the_first_bin(src, dst):
        if dst.endswith('val.bin'):
            raise KeyboardInterrupt   # the process dies between train.bin's rename and val.bin's
        real_replace(src, dst)
    monkeypatch.setattr(prepare.os, 'replace', killed_after_the_first_bin)
    with pytest.raises(KeyboardInterrupt):
        prepare.main(['--data_dir', data, '--num_proc', '1', '--input', str(tmp_path / 'a.jsonl'), '--name', 'x',
                      '--val_fraction', '0.3', '--force'])
    monkeypatch.setattr(prepare.os, 'replace', real_replace)
    with pytest.raises(SystemExit, match='carry different data_ids'):
        prepare.read_dataset(data, 'x')                              # train.py refuses the mixed set
    capsys.readouterr()
    prepare.main(['--data_dir', data, '--num_proc', '1', '--input', str(tmp_path / 'a.jsonl'), '--name', 'x',
                  '--val_fraction', '0.3'])
    assert 'already complete' not in capsys.readouterr().out         # not complete: rebuilt
    train_tokens, val_tokens, data_id = prepare.read_dataset(data, 'x')
    assert data_id == json.load(open(os.path.join(data, 'x', 'meta.json')))['data_id']


def test_an_edited_input_is_noticed(tmp_path, capsys):
    data = str(tmp_path / 'data')
    path = tmp_path / 'a.jsonl'
    write_jsonl(path, DOCS)
    args = ['--data_dir', data, '--num_proc', '1', '--input', str(path), '--name', 'x']
    prepare.main(args)
    capsys.readouterr()
    prepare.main(args)
    assert 'already complete' in capsys.readouterr().out             # the same input: nothing to do
    write_jsonl(path, DOCS + ["One more document that was not there before."])
    with pytest.raises(SystemExit, match=r"from another input: .*a.jsonl changed .*--force"):
        prepare.main(args)
    prepare.main(args + ['--force'])
    assert 'not there before' in open(path).read()
    _, _, new_id = prepare.read_dataset(data, 'x')
    assert json.load(open(os.path.join(data, 'x', 'meta.json')))['data_id'] == new_id


def test_rows_without_text_are_an_error_unless_skipped(tmp_path, capsys):
    path = tmp_path / 'a.jsonl'
    with open(path, 'w') as f:
        for i in range(200):
            f.write(json.dumps({'text': DOCS[i % len(DOCS)]} if i % 2 == 0 else {'title': 'no text'}) + '\n')
    args = ['--data_dir', str(tmp_path / 'data'), '--num_proc', '1', '--input', str(path), '--name', 'x']
    with pytest.raises(SystemExit, match=r"100 rows have no 'text' text \(the first: .*a.jsonl, line 2\).*--skip_missing_text"):
        prepare.main(args)
    assert not (tmp_path / 'data' / 'x').exists()
    capsys.readouterr()
    prepare.main(args + ['--skip_missing_text'])
    assert 'left out 100 rows' in capsys.readouterr().out


def test_bad_files_are_named_and_nothing_half_made_is_left(tmp_path):
    (tmp_path / 'txt').mkdir()
    for i in range(5):
        (tmp_path / 'txt' / f'doc{i}.txt').write_text(DOCS[i])
    (tmp_path / 'txt' / 'doc3.txt').write_bytes(b'caf\xe9 latin-1, not UTF-8')
    args = ['--data_dir', str(tmp_path / 'data'), '--num_proc', '1', '--name', 'x']
    with pytest.raises(SystemExit, match=r'doc3.txt: not UTF-8'):
        prepare.main(args + ['--input', str(tmp_path / 'txt' / '*.txt')])
    assert not (tmp_path / 'data' / 'x').exists()
    with open(tmp_path / 'big.jsonl', 'w') as f:                      # a JSON error deep in a large file
        for i in range(3000):
            f.write(json.dumps({'text': DOCS[i % len(DOCS)]}) + '\n' if i != 2499 else '{"text": "unterminated\n')
    for num_proc in ('1', '2'):
        with pytest.raises(SystemExit, match=r'big.jsonl, line 2500: not valid JSON'):
            prepare.main(['--data_dir', str(tmp_path / 'data'), '--num_proc', num_proc, '--name', 'x',
                          '--input', str(tmp_path / 'big.jsonl')])
        assert not (tmp_path / 'data' / 'x').exists()


def test_offline_tokenizer_says_what_to_download_and_how_to_avoid_it(monkeypatch):
    import tiktoken

    def offline(name):
        raise ConnectionError("Max retries exceeded with url: /gpt-2/encodings/main/vocab.bpe")
    monkeypatch.setattr(tiktoken, 'get_encoding', offline)
    with pytest.raises(prepare.InputError, match=r'about 1.5 MB.*TIKTOKEN_CACHE_DIR'):
        prepare.gpt2_encoding()


# ---------------------------------------------------------------------------------------------
# The first run, sample.py and the configuration

def test_sample_says_when_the_prompt_is_cut_and_config_warns_about_a_single_block(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    run_here(['--max_iters=2'], data_dir, out)                              # context 32
    p = sample_here(f'--out_dir={out}', '--start=' + 'word ' * 60, '--num_samples=1', '--max_new_tokens=2', '--device=cpu',
                    '--show_routing=True')
    assert p.returncode == 0, p.stderr[-2000:]
    assert 'longer than the context of 32: only its last 32 tokens are used' in p.stdout
    assert 'routes: qk = ' in p.stdout and 'v = the input of values' in p.stdout   # the legend
    from model import GPTConfig
    with pytest.warns(UserWarning, match='every read sees the embedding and the partial only'):
        GPTConfig(n_layer=2, residual='attnres', attnres_block_size=5)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        GPTConfig(n_layer=2, residual='attnres', attnres_block_size=4)   # = L: fine, no warning
