"""Tests of prepare.py on small local files, offline (the hub is never contacted)."""

import json
import os

os.environ.setdefault('HF_HUB_OFFLINE', '1')      # before datasets is imported anywhere
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')

import numpy as np
import pytest
import tiktoken

import prepare
from prepare import EOT, HEADER_BYTES, read_tokens
from helpers import DOCS, write_jsonl

ENC = tiktoken.get_encoding('gpt2')


def split_documents(tokens):
    """Decode a token file's body back into documents (each one starts with EOT)."""
    tokens = np.asarray(tokens)
    assert len(tokens) == 0 or tokens[0] == EOT, "every document must start with <|endoftext|>"
    starts = list(np.flatnonzero(tokens == EOT)) + [len(tokens)]
    return [ENC.decode(tokens[a + 1:b].tolist()) for a, b in zip(starts[:-1], starts[1:])]


def write_parquet(path, docs, column='text'):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({column: docs}), path)


def run(tmp_path, *args):
    return prepare.main(['--data_dir', str(tmp_path / 'data'), '--num_proc', '1', *args])


@pytest.mark.parametrize('kind', ['jsonl', 'parquet'])
def test_round_trip_gives_back_the_documents(tmp_path, kind):
    path = tmp_path / f'corpus.{kind}'
    (write_jsonl if kind == 'jsonl' else write_parquet)(path, DOCS)
    assert run(tmp_path, '--input', str(path), '--name', kind, '--val_fraction', '0.2') == 0
    out = tmp_path / 'data' / kind
    train = split_documents(read_tokens(str(out / 'train.bin')))
    val = split_documents(read_tokens(str(out / 'val.bin')))
    assert sorted(train + val) == sorted(DOCS)           # nothing lost, nothing added, delimiters where stated
    assert set(train).isdisjoint(val) and len(val) > 5   # whole documents, never in both splits
    assert train == [d for d in DOCS if d in set(train)]  # the input order is kept
    meta = json.loads((out / 'meta.json').read_text())
    assert meta['train_tokens'] == len(read_tokens(str(out / 'train.bin'))) and meta['eot'] == EOT


def test_same_documents_same_bins_whatever_the_format_or_pool(tmp_path):
    write_jsonl(tmp_path / 'a.jsonl', DOCS)
    write_parquet(tmp_path / 'b.parquet', DOCS, column='body')
    run(tmp_path, '--input', str(tmp_path / 'a.jsonl'), '--name', 'a')
    run(tmp_path, '--input', str(tmp_path / 'b.parquet'), '--name', 'b', '--text_column', 'body')
    prepare.main(['--data_dir', str(tmp_path / 'data'), '--num_proc', '2',
                  '--input', str(tmp_path / 'a.jsonl'), '--name', 'pooled'])
    for split in ('train.bin', 'val.bin'):
        ref = (tmp_path / 'data' / 'a' / split).read_bytes()
        assert (tmp_path / 'data' / 'b' / split).read_bytes() == ref
        assert (tmp_path / 'data' / 'pooled' / split).read_bytes() == ref


def test_split_depends_only_on_the_text(tmp_path):
    # shuffled input: every document lands in the same split as before
    write_jsonl(tmp_path / 'a.jsonl', DOCS)
    write_jsonl(tmp_path / 'r.jsonl', DOCS[::-1])
    run(tmp_path, '--input', str(tmp_path / 'a.jsonl'), '--name', 'a')
    run(tmp_path, '--input', str(tmp_path / 'r.jsonl'), '--name', 'r')
    val_a = split_documents(read_tokens(str(tmp_path / 'data/a/val.bin')))
    val_r = split_documents(read_tokens(str(tmp_path / 'data/r/val.bin')))
    assert sorted(val_a) == sorted(val_r) and len(val_a) > 0


def test_text_files_are_one_document_each(tmp_path):
    for i, d in enumerate(DOCS[:30]):
        (tmp_path / f'doc{i:02d}.txt').write_text(d + "\n\nsecond paragraph\n")
    run(tmp_path, '--input', str(tmp_path / '*.txt'), '--name', 'txt', '--val_fraction', '0.3')
    docs = [split_documents(read_tokens(str(tmp_path / f'data/txt/{s}.bin'))) for s in ('train', 'val')]
    assert len(docs[0]) + len(docs[1]) == 30
    assert all(d.endswith("second paragraph\n") for d in docs[0] + docs[1])


def test_max_tokens_caps_train_exactly_and_val_tokens_caps_val(tmp_path):
    write_jsonl(tmp_path / 'a.jsonl', DOCS)
    run(tmp_path, '--input', str(tmp_path / 'a.jsonl'), '--name', 'cap', '--max_tokens', '500',
        '--val_tokens', '50', '--val_fraction', '0.5')
    assert len(read_tokens(str(tmp_path / 'data/cap/train.bin'))) == 500
    val = read_tokens(str(tmp_path / 'data/cap/val.bin'))
    first_doc = len(ENC.encode_ordinary(split_documents(val)[0])) + 1
    assert 50 <= len(val) < 50 + 40 and len(val) >= first_doc  # whole documents until the cap is passed


def test_tiny_corpus_prepares_offline_and_rerun_skips(tmp_path, capsys):
    assert run(tmp_path, '--dataset', 'tiny') == 0
    out = tmp_path / 'data' / 'tiny'
    train = read_tokens(str(out / 'train.bin'))
    assert len(train) > 50_000 and len(read_tokens(str(out / 'val.bin'))) > 5_000
    mtime = os.path.getmtime(out / 'train.bin')
    capsys.readouterr()
    assert run(tmp_path, '--dataset', 'tiny') == 0
    assert 'already complete' in capsys.readouterr().out
    assert os.path.getmtime(out / 'train.bin') == mtime
    # another argument under the same name would replace the data runs were trained on: refused, untouched
    with pytest.raises(SystemExit, match=r'built with other arguments \(max_tokens: 1000000000000 -> 1000\).*--force'):
        run(tmp_path, '--dataset', 'tiny', '--max_tokens', '1000')
    assert os.path.getmtime(out / 'train.bin') == mtime
    assert run(tmp_path, '--dataset', 'tiny', '--max_tokens', '1000', '--force') == 0
    assert len(read_tokens(str(out / 'train.bin'))) == 1000


def test_interrupted_run_leaves_no_file_under_a_final_name(tmp_path):
    def documents():
        yield from DOCS[:50]
        raise KeyboardInterrupt  # the user presses Ctrl-C half-way

    out = tmp_path / 'data' / 'x'
    with pytest.raises(KeyboardInterrupt):
        prepare.prepare(documents(), str(out), 10**9, 10**9, 0.1, progress=False)
    assert not out.exists()   # neither final files nor temporaries, nor the folder it created



@pytest.mark.slow   # it starts prepare.py
def test_ctrl_c_inside_its_main_is_one_line(tmp_path):
    from test_study import interrupted
    out = tmp_path / 'data' / 'tiny'
    os.makedirs(out)
    fifo = str(out / 'meta.json')
    os.mkfifo(fifo)   # a build's meta.json that is a pipe: prepare.py waits on it, inside its main, lock held
    interrupted([os.path.join(os.path.dirname(prepare.__file__), 'prepare.py'), '--dataset', 'tiny',
                 '--data_dir', str(tmp_path / 'data'), '--num_proc', '2'], fifo,
                "prepare.py: stopped by Ctrl-C; a build's partial files are removed")
    assert not {'train.bin', 'val.bin', 'train.bin.tmp', 'val.bin.tmp'} & set(os.listdir(out))


@pytest.mark.slow   # it starts prepare.py twice and builds twice
def test_a_build_killed_mid_write_then_run_again_is_the_build_an_uninterrupted_run_makes(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    write_jsonl(tmp_path / 'a.jsonl', DOCS * 400)
    args = ['--input', str(tmp_path / 'a.jsonl'), '--num_proc', '1', '--name', 'x']
    script = os.path.join(os.path.dirname(prepare.__file__), 'prepare.py')
    out = tmp_path / 'data' / 'x'
    p = subprocess.Popen([sys.executable, script, *args, '--data_dir', str(tmp_path / 'data')],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not ((out / 'train.bin.tmp').exists() and (out / 'train.bin.tmp').stat().st_size > 0):
        assert p.poll() is None and time.time() < deadline, 'the build ended before it was seen writing'
        time.sleep(0.005)
    os.kill(p.pid, signal.SIGKILL)   # no handler runs: its temporaries and its lock file stay behind
    p.wait()
    assert not {'train.bin', 'val.bin', 'meta.json'} & set(os.listdir(out))   # nothing under a final name
    with pytest.raises(SystemExit, match='no prepared data'):
        prepare.read_dataset(str(tmp_path / 'data'), 'x')
    assert run(tmp_path, *args) == 0                                 # run again, as a user would
    assert run(tmp_path, *args[:-1], 'clean') == 0                    # an uninterrupted build of the same input
    assert not any(n.endswith('.tmp') for n in os.listdir(out))
    for name in ('train.bin', 'val.bin'):
        assert (out / name).read_bytes() == (tmp_path / 'data' / 'clean' / name).read_bytes()
    assert prepare.read_dataset(str(tmp_path / 'data'), 'x')[2] == prepare.read_dataset(str(tmp_path / 'data'), 'clean')[2]


@pytest.mark.parametrize('damage, message', [
    (lambda b: b[:HEADER_BYTES - 8], 'shorter than'),
    (lambda b: b'\x00' * 8 + b[8:], 'magic'),
    (lambda b: b[:8] + (99).to_bytes(8, 'little') + b[16:], 'version 99'),
    (lambda b: b[:-2], 'truncated or corrupted'),
])
def test_reader_rejects_damaged_files(tmp_path, damage, message):
    run(tmp_path, '--dataset', 'tiny', '--max_tokens', '2000')
    path = tmp_path / 'data' / 'tiny' / 'val.bin'
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=message):
        read_tokens(str(path))


def test_missing_file_says_to_run_prepare(tmp_path):
    with pytest.raises(FileNotFoundError, match='run prepare.py'):
        read_tokens(str(tmp_path / 'nothing.bin'))


def test_bad_inputs_fail_with_actionable_messages(tmp_path):
    (tmp_path / 'empty.jsonl').write_text('')
    write_jsonl(tmp_path / 'col.jsonl', DOCS, column='body')
    write_jsonl(tmp_path / 'few.jsonl', DOCS[:1])
    cases = [
        (['--input', str(tmp_path / 'empty.jsonl')], 'no documents'),
        (['--input', str(tmp_path / 'col.jsonl')], "no column 'text'.*--text_column"),
        (['--input', str(tmp_path / 'nope*.jsonl')], 'matches no file'),
        (['--input', str(tmp_path / 'few.jsonl')], 'not enough text'),
        ([], 'use local files .*--input.*--dataset tiny'),   # the hub is unreachable here
    ]
    for args, message in cases:
        with pytest.raises(SystemExit, match=message):
            run(tmp_path, *args)
    assert not (tmp_path / 'data' / 'local' / 'train.bin').exists()


def test_token_ids_must_fit_uint16(monkeypatch):
    class HugeVocabulary:
        def encode_ordinary(self, text):
            return [70000]
    monkeypatch.setattr(prepare, '_enc', HugeVocabulary())
    with pytest.raises(ValueError, match='does not fit in uint16'):
        prepare.tokenize_document('anything', 0.1)


def test_a_token_id_past_gpt2s_vocabulary_is_found_whatever_its_data_id(tmp_path):
    # a flipped high byte can make an id the embedding does not have; the data_id is made to match, so only
    # the vocabulary check can see it
    import numpy as np
    paths = [str(tmp_path / 'train.bin'), str(tmp_path / 'val.bin')]
    for path, top in zip(paths, (50256, prepare.VOCAB_SIZE)):
        header = np.zeros(prepare.HEADER_INTS, dtype='<i8')
        header[:3] = prepare.MAGIC, prepare.VERSION, 3
        with open(path, 'wb') as f:
            f.write(header.tobytes() + np.array([1, 2, top], dtype='<u2').tobytes())
    data_id = prepare.build_id(*(prepare.token_digest(p)[0] for p in paths))
    assert 'holds token id 50257, outside the GPT-2 vocabulary of 50257' in prepare.verify_tokens(paths, data_id)
    with open(paths[1], 'r+b') as f:   # the same file with the largest id GPT-2 has
        f.seek(prepare.HEADER_BYTES + 4)
        f.write(np.array([50256], dtype='<u2').tobytes())
    assert prepare.verify_tokens(paths, prepare.build_id(*(prepare.token_digest(p)[0] for p in paths))) is None
