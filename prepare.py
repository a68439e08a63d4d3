"""
Prepare a corpus as GPT-2 tokens in uint16 .bin files: data/<name>/train.bin and val.bin.

    python prepare.py                                  # FineWeb-Edu sample-10BT, streamed from the hub
    python prepare.py --dataset tiny                   # a small built-in corpus, no download at all
    python prepare.py --input 'texts/**/*.txt' --name mycorpus   # local .txt / .jsonl / .parquet files

File format (one reader for it, read_tokens(), used by train.py too):
    header: 16 little-endian int64 = 128 bytes: [MAGIC, VERSION, n_tokens, data_id, 0, ...]
    body:   n_tokens uint16 token ids
Every document is written as <|endoftext|> (id 50256) followed by its tokens: the delimiter goes
*before* each document, so a model always sees "start of a new document" before its first token.
A document goes to validation when a hash of its text says so (val_fraction), until val holds
val_tokens: a fixed, deterministic set of whole documents that training never sees.
"""

from run_kit.common import ctrl_c_while_starting  # first: a Ctrl-C while torch loads is one line, exit 130
ctrl_c_while_starting(__name__, 'prepare.py')

import argparse
import functools
import glob
import hashlib
import json
import multiprocessing
import os
import signal
import sys
import time

import numpy as np

from run_kit.common import WriteFailed, run_command
from run_kit.run_files import atomic_write, lock_folder, sync_and_rename, write_failed

MAGIC, VERSION = 20261130, 1
HEADER_INTS = 16
HEADER_BYTES = HEADER_INTS * 8
EOT = 50256  # GPT-2's <|endoftext|>
VOCAB_SIZE = 50257  # GPT-2's token ids are 0 .. 50256

DEFAULTS = {  # dataset -> defaults that depend on it
    'fineweb-edu': dict(name='fineweb_edu', max_tokens=2_100_000_000, val_tokens=10_000_000, val_fraction=0.005),
    'tiny': dict(name='tiny', max_tokens=10**12, val_tokens=10**12, val_fraction=0.15),
    'local': dict(name='local', max_tokens=10**12, val_tokens=10_000_000, val_fraction=0.05),
}


class InputError(Exception):
    """Bad input (a file, a row, the network): main() turns it into a message. An Exception, not a
    SystemExit, so that it also travels back from a worker of the multiprocessing pool."""


# -----------------------------------------------------------------------------
# Reading and writing token files

def read_header(path):
    """Validate a token file's header and size; returns (n_tokens, data_id)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist: run prepare.py first (e.g. python prepare.py --dataset tiny)")
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise ValueError(f"{path} is not a token file ({size} bytes, shorter than the {HEADER_BYTES}-byte header); "
                         "re-run prepare.py")
    header = np.fromfile(path, dtype='<i8', count=HEADER_INTS)
    magic, version, n, data_id = (int(v) for v in header[:4])
    if magic != MAGIC:
        raise ValueError(f"{path} has magic {magic}, expected {MAGIC}: not a file written by prepare.py")
    if version != VERSION:
        raise ValueError(f"{path} has format version {version}, this code reads version {VERSION}: re-run prepare.py")
    if size != HEADER_BYTES + 2 * n:
        raise ValueError(f"{path} is {size} bytes but its header promises {n} tokens ({HEADER_BYTES + 2 * n} bytes): "
                         "the file is truncated or corrupted, re-run prepare.py")
    return n, data_id


def read_tokens(path):
    """Validate the header of a token file and return its tokens as a read-only uint16 memmap."""
    n, _ = read_header(path)
    return np.memmap(path, dtype=np.uint16, mode='r', offset=HEADER_BYTES, shape=(n,))


def build_id(train_digest, val_digest):
    """A build's data_id: a hash of both files' tokens (the same corpus and arguments give the same id)."""
    digest = hashlib.sha256(train_digest + val_digest).digest()
    return int.from_bytes(digest[:8], 'little', signed=True) or 1


def token_digest(path, chunk=1 << 26):
    """(SHA-256 of a token file's tokens, its largest token id), in one pass over the file."""
    h, top = hashlib.sha256(), 0
    with open(path, 'rb') as f:
        f.seek(HEADER_BYTES)
        while block := f.read(chunk):
            h.update(block)
            top = max(top, int(np.frombuffer(block, dtype='<u2').max()))
    return h.digest(), top


def verify_tokens(paths, data_id, vocab_size=VOCAB_SIZE):
    """Check the tokens themselves against the build's data_id and the vocabulary: a flipped byte in a
    .bin (which its header cannot show) would otherwise train silently, or crash deep in the model with
    a token id past the embedding. Returns None, or what is wrong. Cost: one read of both files
    (docs/run_safety.md)."""
    digests = []
    for path in paths:
        digest, top = token_digest(path)
        if top >= vocab_size:
            return (f"{path} holds token id {top}, outside the GPT-2 vocabulary of {vocab_size}: the file is damaged; "
                    "run prepare.py again with --force")
        digests.append(digest)
    if build_id(*digests) != data_id:
        return (f"the tokens of {paths[0]} and {paths[1]} do not match their data_id {data_id}: a file was changed "
                "after prepare.py wrote it (a flipped byte, an edit); run prepare.py again with --force")
    return None


def read_dataset(data_dir, name, verify=True):
    """(train tokens, val tokens, data_id) of data/<name>, checked to be one build: both files carry the
    data_id of the build that wrote them (a hash of their contents), so a train.bin of one build next
    to a val.bin of another is refused instead of silently mixing two corpora."""
    paths = [os.path.join(data_dir, name, f'{split}.bin') for split in ('train', 'val')]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        how = {'tiny': 'python prepare.py --dataset tiny', 'fineweb_edu': 'python prepare.py'}.get(
            name, f"python prepare.py --input 'your/files/*.jsonl' --name {name}")
        raise SystemExit(f"no prepared data at {missing[0]}: run `{how}` first (or set --data_dir / --dataset)")
    try:
        (_, train_id), (_, val_id) = read_header(paths[0]), read_header(paths[1])
    except ValueError as e:
        raise SystemExit(str(e)) from None
    except OSError as e:   # a folder or an unreadable file where a .bin should be
        raise SystemExit(f"{e.filename or paths[0]} cannot be read ({e.strerror}): run prepare.py again with --force") from None
    if train_id != val_id:
        raise SystemExit(f"{paths[0]} and {paths[1]} carry different data_ids ({train_id} vs {val_id}): two "
                         f"builds (a prepare.py run interrupted between its renames: {meta_id_says(data_dir, name)}), "
                         "or a damaged header; run prepare.py again with --force")
    problem = verify_tokens(paths, train_id) if verify else None
    if problem:
        raise SystemExit(problem)
    return read_tokens(paths[0]), read_tokens(paths[1]), train_id


def meta_id_says(data_dir, name):
    """Which of the two files meta.json's data_id agrees with, for the message."""
    try:
        with open(os.path.join(data_dir, name, 'meta.json')) as f:
            meta_id = json.load(f).get('data_id')
    except (OSError, ValueError, AttributeError):
        return "meta.json cannot be read"
    return f"meta.json names data_id {meta_id}"


class TokenWriter:
    """Appends uint16 tokens to <path>.tmp; finish() writes the header, commit() syncs the file to disk and
    renames it to <path> (run_files.sync_and_rename, as atomic_write does), discard() removes it. A run that
    fails or is killed never leaves a file under a final name."""

    def __init__(self, path):
        self.path, self.tmp = path, path + '.tmp'
        self.n = 0
        self.digest = hashlib.sha256()
        self.f = open(self.tmp, 'wb')
        self.f.write(np.zeros(HEADER_INTS, dtype='<i8').tobytes())  # placeholder header

    def write(self, tokens):
        data = tokens.astype('<u2', copy=False).tobytes()
        self.f.write(data)
        self.digest.update(data)
        self.n += len(tokens)

    def finish(self, data_id):
        header = np.zeros(HEADER_INTS, dtype='<i8')
        header[:4] = MAGIC, VERSION, self.n, data_id
        self.f.seek(0)
        self.f.write(header.tobytes())
        self.f.close()

    def commit(self):
        sync_and_rename(self.tmp, self.path)

    def discard(self):
        try:
            self.f.close()
        except OSError:   # closing flushes the buffer, which fails again on a full disk: the file goes anyway
            pass
        if os.path.exists(self.tmp):
            os.remove(self.tmp)


# -----------------------------------------------------------------------------
# Sources of documents (each yields strings)

def tiny_documents(piece_chars=1500):
    """The built-in corpus: Python's own help-topic texts (pydoc_data.topics), which ship with every
    CPython, so the quickstart needs no download. Each topic is cut into pieces of whole paragraphs
    of about piece_chars characters: the hash-based split then draws from several hundred documents,
    and the size of the validation set barely depends on the Python version's texts."""
    from pydoc_data.topics import topics
    docs = []
    for key in sorted(topics):
        piece = ''
        for paragraph in topics[key].split('\n\n'):
            if piece and len(piece) + len(paragraph) > piece_chars:
                docs.append(piece)
                piece = ''
            piece = piece + '\n\n' + paragraph if piece else paragraph
        if piece:
            docs.append(piece)
    return docs


FINEWEB = dict(path="HuggingFaceFW/fineweb-edu", name="sample-10BT", split="train")


def fineweb_documents(revision):
    from datasets import load_dataset
    try:
        ds = load_dataset(**FINEWEB, revision=revision, streaming=True)
        return (row['text'] for row in ds)
    except Exception as e:  # no network, offline mode, hub outage
        raise InputError(f"could not reach FineWeb-Edu on the Hugging Face hub ({type(e).__name__}: {e}).\n"
                         "Without the hub, use local files (--input 'path/*.jsonl') or the built-in corpus "
                         "(--dataset tiny).") from None


KINDS = {'.txt': 'text', '.jsonl': 'json', '.json': 'json', '.parquet': 'parquet'}


def find_files(pattern):
    files = sorted(set(glob.glob(pattern, recursive=True))) if not os.path.isfile(pattern) else [pattern]
    files = [f for f in files if os.path.isfile(f)]
    if not files:
        raise InputError(f"--input {pattern!r} matches no file")
    kinds = {KINDS.get(os.path.splitext(f)[1].lower()) for f in files}
    if None in kinds or len(kinds) > 1:
        raise InputError(f"--input must match files of one kind among {', '.join(KINDS)}; got "
                         f"{sorted({os.path.splitext(f)[1] for f in files})}")
    return files, kinds.pop()


def file_rows(path, kind, column):
    """(line or row number, the row's text or None if it has no `column`) of one file. Every error
    names the file and, where the format has lines, the line."""
    if kind == 'text':  # one document per file
        try:
            with open(path, encoding='utf-8') as f:
                yield 1, f.read()
        except UnicodeDecodeError as e:
            raise InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    elif kind == 'json':  # JSON Lines: one object per line
        # read as bytes and decode line by line: a text reader decodes ahead, and would name the wrong line
        with open(path, 'rb') as f:
            for number, raw in enumerate(f, 1):
                try:
                    line = raw.decode('utf-8')
                except UnicodeDecodeError as e:
                    raise InputError(f"{path}, line {number}: not UTF-8 text ({e.reason} at byte {e.start} of "
                                     "the line)") from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{path}, line {number}: not valid JSON ({e.msg}, column {e.colno})") from None
                if not isinstance(row, dict):
                    raise InputError(f"{path}, line {number}: expected a JSON object per line, "
                                     f"got {type(row).__name__}")
                yield number, text_value(row.get(column), path, f"line {number}", column)
    else:
        import pyarrow.parquet as pq
        try:
            table = pq.ParquetFile(path)
            if column not in table.schema_arrow.names:
                raise InputError(f"{path} has no column {column!r}; its columns are "
                                 f"{sorted(table.schema_arrow.names)}: pass the right one with --text_column")
            number = 0
            for batch in table.iter_batches(batch_size=1024, columns=[column]):
                for text in batch.column(0).to_pylist():
                    number += 1
                    yield number, text_value(text, path, f"row {number}", column)
        except InputError:
            raise
        except Exception as e:
            raise InputError(f"{path}: could not read it as Parquet ({type(e).__name__}: {e})") from None


def text_value(value, path, where, column):
    """A row's text: a string, or None when the row has none. Anything else is an error naming the row."""
    if value is None or isinstance(value, str):
        return value
    raise InputError(f"{path}, {where}: {column!r} is a {type(value).__name__} ({str(value)[:40]!r}), not text")


class LocalDocuments:
    """Local .txt (one document per file), .jsonl (one per line) or .parquet (one per row) files, read
    in name order. A row without the text column is an error (how many, and the first one) unless
    skip_missing is set; it is found while the rows stream by, so the error comes at the end, before
    anything is renamed into place."""

    def __init__(self, pattern, column, skip_missing):
        self.files, self.kind = find_files(pattern)
        self.pattern, self.column, self.skip_missing = pattern, column, skip_missing
        self.missing, self.first_missing = 0, None
        self.check_first_row()

    def check_first_row(self, look=1000):
        """A wrong --text_column is said at once, not after a whole pass: if none of the first rows has the
        column (a row or two without it are the missing rows of the end, or --skip_missing_text's)."""
        seen = 0
        for path in self.files:
            for _, text in file_rows(path, self.kind, self.column):
                if text is not None:
                    return
                seen += 1
                if seen >= look:
                    break
            if seen >= look:
                break
        if seen == 0:
            raise InputError(f"--input {self.pattern!r}: the files hold no documents")
        if self.kind == 'json':
            with open(self.files[0], encoding='utf-8', errors='replace') as f:
                keys = sorted(json.loads(next(line for line in f if line.strip())))
            raise InputError(f"--input {self.pattern!r} has no column {self.column!r} in its first {seen} rows; "
                             f"its columns are {keys}: pass the right one with --text_column")
        raise InputError(f"--input {self.pattern!r}: the first {seen} documents are empty")

    def __iter__(self):
        for path in self.files:
            for number, text in file_rows(path, self.kind, self.column):
                if text is None:
                    self.missing += 1
                    self.first_missing = self.first_missing or f"{path}, {'line' if self.kind == 'json' else 'row'} {number}"
                    continue
                yield text
        if self.missing and not self.skip_missing:
            raise InputError(f"{self.missing} rows have no {self.column!r} text (the first: {self.first_missing}); "
                             "fix the input, or pass --skip_missing_text to leave them out")

    def fingerprint(self):
        """What 'the same input' means for a rebuild: each file's path, size and a hash of its content (not
        its modification time, which an edit can leave as it was)."""
        return [[os.path.abspath(f), os.path.getsize(f), file_sha256(f)] for f in self.files]


def file_sha256(path, chunk=1 << 24):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# -----------------------------------------------------------------------------
# Tokenizing

_enc = None


def gpt2_encoding():
    """tiktoken's GPT-2 BPE. On first use tiktoken downloads its two files (about 1.5 MB, once, into
    its cache); without a network that fails deep inside `requests`, so say what to do instead."""
    import tiktoken
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise InputError(
            f"could not load GPT-2's BPE files ({type(e).__name__}: {e}). tiktoken downloads them once "
            "(about 1.5 MB: vocab.bpe and encoder.json from openaipublic.blob.core.windows.net) into the folder "
            "TIKTOKEN_CACHE_DIR (default: a tiktoken folder in your temp directory). Offline, copy a cache "
            "folder from a machine that has one and point TIKTOKEN_CACHE_DIR at it.") from None


def goes_to_val(text, val_fraction):
    """A document's split depends only on its text: stable across runs, machines and orderings."""
    h = int.from_bytes(hashlib.sha1(text.encode('utf-8', 'replace')).digest()[:8], 'little')
    return h < val_fraction * 2 ** 64


def tokenize_document(text, val_fraction):
    """-> (goes to val?, [EOT] + GPT-2 tokens as uint16), or None for an empty document."""
    global _enc
    if not text or not text.strip():
        return None
    if _enc is None:
        _enc = gpt2_encoding()
    tokens = [EOT] + _enc.encode_ordinary(text)
    if max(tokens) >= 2 ** 16:
        raise ValueError(f"token id {max(tokens)} does not fit in uint16")
    return goes_to_val(text, val_fraction), np.array(tokens, dtype=np.uint16)


class Progress:
    """tqdm's bar on a terminal; in a log file (stdout not a terminal) a plain line every ~10 s instead
    of carriage-return fragments."""

    def __init__(self, total, enabled):
        self.enabled, self.total, self.n = enabled, total, 0
        self.t0 = self.t_print = time.time()
        self.bar = None
        if enabled and sys.stdout.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit='tok', unit_scale=True)

    def update(self, n):
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.enabled and time.time() - self.t_print >= 10:
            self.t_print = time.time()
            of = f" of {self.total:,}" if self.total else ''
            print(f"{self.n:,}{of} tokens, {self.n / (self.t_print - self.t0):,.0f} tokens/s", flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def prepare(documents, out_dir, max_tokens, val_tokens, val_fraction, num_proc=1, meta=None, progress=True):
    """Tokenize `documents` (an iterable of strings) into out_dir/train.bin and out_dir/val.bin.
    Train stops at exactly max_tokens; val takes whole documents until it holds val_tokens.
    The two bins and meta.json are one set: both bins carry the data_id of this build and are renamed
    into place together, then meta.json (which names the data_id too) is written."""
    created = not os.path.isdir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    for name in ('train.bin.tmp', 'val.bin.tmp', 'meta.json.tmp'):   # left by a build killed mid-write
        if os.path.exists(os.path.join(out_dir, name)):
            os.remove(os.path.join(out_dir, name))
    stats = dict(train_docs=0, val_docs=0, empty_docs=0)
    work = functools.partial(tokenize_document, val_fraction=val_fraction)
    # a worker ignores Ctrl-C (a terminal sends it to the whole process group): the parent ends them, in one line
    pool = (multiprocessing.get_context('spawn').Pool(num_proc, initializer=signal.signal,
                                                       initargs=(signal.SIGINT, signal.SIG_IGN))
            if num_proc > 1 else None)
    # imap keeps the documents' order, so the output is the same for any num_proc
    results = pool.imap(work, documents, chunksize=16) if pool else map(work, documents)
    bar = Progress(max_tokens if max_tokens < 10**12 else None, progress)
    t0 = time.time()
    train = val = None
    try:
        train = TokenWriter(os.path.join(out_dir, 'train.bin'))
        val = TokenWriter(os.path.join(out_dir, 'val.bin'))
        for result in results:
            if result is None:
                stats['empty_docs'] += 1
                continue
            is_val, tokens = result
            if is_val and val.n < val_tokens:
                val.write(tokens)
                stats['val_docs'] += 1
            else:
                tokens = tokens[:max_tokens - train.n]
                train.write(tokens)
                stats['train_docs'] += 1
            bar.update(len(tokens))
            if train.n >= max_tokens:
                break
        if train.n == 0 or val.n == 0:
            raise InputError(f"not enough text: {train.n} train and {val.n} val tokens from "
                             f"{stats['train_docs'] + stats['val_docs']} non-empty documents; add documents "
                             "or raise --val_fraction")
        data_id = build_id(train.digest.digest(), val.digest.digest())
        train.finish(data_id)
        val.finish(data_id)
        train.commit()
        val.commit()
    except BaseException:
        for writer in (train, val):
            if writer is not None:
                writer.discard()
        if created and not os.listdir(out_dir):
            os.rmdir(out_dir)
        raise
    finally:
        bar.close()
        if pool:
            pool.terminate()
    seconds = time.time() - t0
    summary = dict(meta or {}, data_id=data_id, train_tokens=train.n, val_tokens=val.n, **stats,
                   seconds=round(seconds, 2), tokens_per_second=round((train.n + val.n) / max(seconds, 1e-9)),
                   bytes=2 * (train.n + val.n) + 2 * HEADER_BYTES, eot=EOT, tokenizer='gpt2')
    atomic_write(os.path.join(out_dir, 'meta.json'), json.dumps(summary, indent=2))
    return summary


def built_from(out_dir):
    """meta.json of a complete build in out_dir, or None: meta.json exists, both bins are valid, carry the
    data_id it names (a build interrupted between its renames is not complete) and their tokens match it."""
    paths = [os.path.join(out_dir, f'{split}.bin') for split in ('train', 'val')]
    try:
        with open(os.path.join(out_dir, 'meta.json')) as f:
            meta = json.load(f)
        ids = {read_header(path)[1] for path in paths}
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or ids != {meta.get('data_id')}:
        return None
    problem = verify_tokens(paths, meta['data_id'])
    if problem:
        print(f"not complete: {problem}")
        return None
    return meta


def describe_change(old, new):
    """A short human description of how the inputs differ."""
    if isinstance(old, list) and isinstance(new, list):  # local files: [path, size, mtime_ns]
        before, after = {f[0]: f[1:] for f in old}, {f[0]: f[1:] for f in new}
        parts = [f"{p} is new" for p in after if p not in before][:3]
        parts += [f"{p} is gone" for p in before if p not in after][:3]
        parts += [f"{p} changed (size {before[p][0]:,} -> {after[p][0]:,} bytes, "
                  f"{'content differs' if isinstance(before[p][1], str) else 'fingerprinted by time before'})"
                  for p in after if p in before and before[p] != after[p]][:3]
        return '; '.join(parts)
    return f"{old} -> {new}"


def main(argv=None):
    try:
        return run(argv)
    except InputError as e:
        raise SystemExit(str(e)) from None


def run(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--dataset', choices=['fineweb-edu', 'tiny'], default='fineweb-edu')
    p.add_argument('--revision', default='main', help="FineWeb-Edu: the hub revision (a branch, tag or commit)")
    p.add_argument('--input', help="local files instead of --dataset: a path or glob of .txt, .jsonl or .parquet")
    p.add_argument('--text_column', default='text', help="column holding the text (.jsonl/.parquet)")
    p.add_argument('--skip_missing_text', action='store_true',
                   help="leave out rows that have no --text_column (by default they are an error)")
    p.add_argument('--name', help="output folder data/<name> (default: fineweb_edu, tiny or local)")
    p.add_argument('--data_dir', default='data')
    p.add_argument('--max_tokens', type=int, help="cap on train tokens (default 2.1B for FineWeb-Edu)")
    p.add_argument('--val_tokens', type=int, help="cap on validation tokens (default 10M)")
    p.add_argument('--val_fraction', type=float, help="share of documents drawn for validation")
    p.add_argument('--num_proc', type=int, default=max(1, (os.cpu_count() or 2) - 1))
    p.add_argument('--force', action='store_true', help="rebuild even if complete files exist")
    args = p.parse_args(argv)

    source = 'local' if args.input else args.dataset
    defaults = DEFAULTS[source]
    for key in ('name', 'max_tokens', 'val_tokens', 'val_fraction'):
        if getattr(args, key) is None:
            setattr(args, key, defaults[key])
    if not 0 < args.val_fraction < 1:
        raise SystemExit(f"--val_fraction must be between 0 and 1, got {args.val_fraction}")
    out_dir = os.path.join(args.data_dir, args.name)
    # One build at a time into a folder: held (out_dir/prepare.lock) from before anything there is read
    # until the build is in place, so that two builds never remove or rename each other's files.
    created = not os.path.isdir(out_dir)
    try:
        lock, holder = lock_folder(out_dir, LOCK)
    except OSError as e:   # a full disk, or a folder this user cannot write to: nothing is left behind
        if created and os.path.isdir(out_dir) and not os.listdir(out_dir):
            os.rmdir(out_dir)
        raise cannot_write(args, out_dir, e) from None
    if holder:
        raise InputError(f"{out_dir} is being built by another prepare.py ({holder}). Two builds into one folder "
                         "would mix their files: wait for it to end, or write elsewhere with --name.")
    try:
        return build(args, out_dir)
    finally:
        lock.close()
        if created and os.listdir(out_dir) == [LOCK]:   # a failed first build leaves no folder behind
            os.remove(os.path.join(out_dir, LOCK))
            try:
                os.rmdir(out_dir)
            except OSError:   # another build has just started in it
                pass


LOCK = 'prepare.lock'


def cannot_write(args, out_dir, error):
    """A failed write of a build, the one line prepare.py ends with (run_files.write_failed; exit EXIT_WRITE)."""
    need = f"The train split alone needs about {2 * args.max_tokens / 1e6:,.0f} MB" if args.max_tokens < 10 ** 12 else ''
    return WriteFailed(write_failed(out_dir, error, "the partial files were removed and a previous build, if any, is "
                                    "as it was", what=f"the prepared data in {out_dir}", need=need,
                                    then="run the same command again", elsewhere="a --data_dir").code)


def build(args, out_dir):
    source = 'local' if args.input else args.dataset
    meta = dict(args={k: getattr(args, k) for k in ('dataset', 'input', 'text_column', 'max_tokens',
                                                     'val_tokens', 'val_fraction')})
    if source == 'local':
        meta['args']['dataset'] = None
    else:
        meta['args']['input'] = None

    # the input, and its fingerprint: "already complete" means the same arguments *and* the same input
    if source == 'tiny':
        documents = tiny_documents()
        meta['source'] = f"pydoc_data.topics of Python {sys.version.split()[0]}"
        meta['inputs'] = hashlib.sha256('\0'.join(documents).encode()).hexdigest()
        args.num_proc = 1  # too small to be worth a pool
    elif source == 'fineweb-edu':
        documents = None  # streamed only if there is work to do
        meta['source'] = "HuggingFaceFW/fineweb-edu sample-10BT (streamed)"
        meta['inputs'] = dict(FINEWEB, revision=args.revision)
    else:
        documents = LocalDocuments(args.input, args.text_column, args.skip_missing_text)
        meta['source'] = f"{len(documents.files)} local files matching {args.input!r}"
        meta['inputs'] = documents.fingerprint()
    existing = built_from(out_dir)
    if not args.force and existing and existing.get('args') != meta['args']:
        old = existing.get('args') or {}
        diff = ', '.join(f"{k}: {old.get(k)!r} -> {v!r}" for k, v in meta['args'].items() if old.get(k) != v)
        raise InputError(f"{out_dir} was built with other arguments ({diff}). A rebuild changes the data (runs "
                         "trained on it cannot be resumed on the new one): rebuild with --force, or write the new "
                         "data elsewhere with --name.")
    if not args.force and existing:
        if existing.get('inputs') == meta['inputs']:
            print(f"{out_dir} is already complete for these arguments and this input (use --force to rebuild)")
            return 0
        raise InputError(f"{out_dir} was built with these arguments but from another input: "
                         f"{describe_change(existing.get('inputs'), meta['inputs'])}. A rebuild changes the "
                         f"data (runs trained on it cannot be resumed on the new one): rebuild with --force, or "
                         f"write the new data elsewhere with --name.")
    if documents is None:
        documents = fineweb_documents(args.revision)
    try:
        s = prepare(documents, out_dir, args.max_tokens, args.val_tokens, args.val_fraction, args.num_proc, meta)
    except OSError as e:   # a full disk, a folder that cannot be written
        raise cannot_write(args, out_dir, e) from None
    if getattr(documents, 'missing', 0):
        print(f"left out {documents.missing} rows without {args.text_column!r} text (the first: {documents.first_missing})")
    files = getattr(documents, 'files', [])
    print(f"{out_dir}: {s['train_docs']:,} train documents, {s['train_tokens']:,} tokens | "
          f"{s['val_docs']:,} val documents, {s['val_tokens']:,} tokens | {s['bytes'] / 1e6:,.1f} MB in 2 files "
          f"| {s['tokens_per_second']:,} tokens/s" + (f" | {len(files)} input files" if files else ""))
    return 0


if __name__ == '__main__':
    sys.exit(run_command(main, sys.argv[1:], 'prepare.py', "a build's partial files are removed, the folder's "
                                                           "finished files are as they were; run the same command "
                                                           "again"))
