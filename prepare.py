"""
Prepare a corpus as GPT-2 tokens in uint16 .bin files: data/<name>/train.bin and val.bin.

    python prepare.py                                  # FineWeb-Edu sample-10BT, streamed from the hub
    python prepare.py --dataset tiny                   # a small built-in corpus, no download at all
    python prepare.py --input 'texts/**/*.txt' --name mycorpus   # local .txt / .jsonl / .parquet files

File format (one reader for it, read_tokens(), used by train.py too):
    header: 16 little-endian int64 = 128 bytes: [MAGIC, VERSION, n_tokens, 0, ...]
    body:   n_tokens uint16 token ids
Every document is written as <|endoftext|> (id 50256) followed by its tokens: the delimiter goes
*before* each document, so a model always sees "start of a new document" before its first token.
A document goes to validation when a hash of its text says so (val_fraction), until val holds
val_tokens: a fixed, deterministic set of whole documents that training never sees.
"""

import argparse
import functools
import glob
import hashlib
import json
import multiprocessing
import os
import sys
import time

import numpy as np

MAGIC, VERSION = 20261130, 1
HEADER_INTS = 16
HEADER_BYTES = HEADER_INTS * 8
EOT = 50256  # GPT-2's <|endoftext|>

DEFAULTS = {  # dataset -> defaults that depend on it
    'fineweb-edu': dict(name='fineweb_edu', max_tokens=2_100_000_000, val_tokens=10_000_000, val_fraction=0.005),
    'tiny': dict(name='tiny', max_tokens=10**12, val_tokens=10**12, val_fraction=0.15),
    'local': dict(name='local', max_tokens=10**12, val_tokens=10_000_000, val_fraction=0.05),
}


# -----------------------------------------------------------------------------
# Reading and writing token files

def read_tokens(path):
    """Validate the header of a token file and return its tokens as a read-only uint16 memmap."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist: run prepare.py first (e.g. python prepare.py --dataset tiny)")
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise ValueError(f"{path} is not a token file ({size} bytes, shorter than the {HEADER_BYTES}-byte header); "
                         "re-run prepare.py")
    header = np.fromfile(path, dtype='<i8', count=HEADER_INTS)
    magic, version, n = int(header[0]), int(header[1]), int(header[2])
    if magic != MAGIC:
        raise ValueError(f"{path} has magic {magic}, expected {MAGIC}: not a file written by prepare.py")
    if version != VERSION:
        raise ValueError(f"{path} has format version {version}, this code reads version {VERSION}: re-run prepare.py")
    if size != HEADER_BYTES + 2 * n:
        raise ValueError(f"{path} is {size} bytes but its header promises {n} tokens ({HEADER_BYTES + 2 * n} bytes): "
                         "the file is truncated or corrupted, re-run prepare.py")
    return np.memmap(path, dtype=np.uint16, mode='r', offset=HEADER_BYTES, shape=(n,))


class TokenWriter:
    """Appends uint16 tokens to <path>.tmp and renames it to <path> only when closed after success,
    so an interrupted run never leaves a file under a final name."""

    def __init__(self, path):
        self.path, self.tmp = path, path + '.tmp'
        self.n = 0
        self.f = open(self.tmp, 'wb')
        self.f.write(np.zeros(HEADER_INTS, dtype='<i8').tobytes())  # placeholder header

    def write(self, tokens):
        self.f.write(tokens.astype('<u2', copy=False).tobytes())
        self.n += len(tokens)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            header = np.zeros(HEADER_INTS, dtype='<i8')
            header[:3] = MAGIC, VERSION, self.n
            self.f.seek(0)
            self.f.write(header.tobytes())
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
            os.replace(self.tmp, self.path)
        else:
            self.f.close()
            os.remove(self.tmp)


def write_json(path, obj):
    with open(path + '.tmp', 'w') as f:
        json.dump(obj, f, indent=2)
    os.replace(path + '.tmp', path)


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


def fineweb_documents():
    from datasets import load_dataset
    try:
        ds = load_dataset("HuggingFaceFW/fineweb-edu", name="sample-10BT", split="train", streaming=True)
        return (row['text'] for row in ds)
    except Exception as e:  # no network, offline mode, hub outage
        raise SystemExit(f"could not reach FineWeb-Edu on the Hugging Face hub ({type(e).__name__}: {e}).\n"
                         "Without the hub, use local files (--input 'path/*.jsonl') or the built-in corpus "
                         "(--dataset tiny).") from None


LOADERS = {'.txt': 'text', '.jsonl': 'json', '.json': 'json', '.parquet': 'parquet'}


def local_documents(pattern, text_column):
    """Local .txt (one document per file), .jsonl/.json or .parquet files, via datasets' generic loaders."""
    from datasets import load_dataset
    files = sorted(set(glob.glob(pattern, recursive=True))) if not os.path.isfile(pattern) else [pattern]
    files = [f for f in files if os.path.isfile(f)]
    if not files:
        raise SystemExit(f"--input {pattern!r} matches no file")
    kinds = {LOADERS.get(os.path.splitext(f)[1].lower()) for f in files}
    if None in kinds or len(kinds) > 1:
        raise SystemExit(f"--input must match files of one kind among {', '.join(LOADERS)}; got "
                         f"{sorted({os.path.splitext(f)[1] for f in files})}")
    kind = kinds.pop()
    options = dict(sample_by='document') if kind == 'text' else {}
    column = 'text' if kind == 'text' else text_column
    first = None
    if any(os.path.getsize(f) > 0 for f in files):
        try:
            ds = load_dataset(kind, data_files=files, split='train', streaming=True, **options)
            first = next(iter(ds), None)
        except StopIteration:  # what some loaders raise for files without a single record
            pass
        except Exception as e:
            raise SystemExit(f"--input {pattern!r}: could not read the files as {kind} ({type(e).__name__}: {e})")
    if first is None:
        raise SystemExit(f"--input {pattern!r}: the files hold no documents")
    if column not in first:
        raise SystemExit(f"--input {pattern!r} has no column {column!r}; its columns are {sorted(first)}: "
                         "pass the right one with --text_column")
    return (row[column] for row in ds), files


# -----------------------------------------------------------------------------
# Tokenizing

_enc = None


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
        import tiktoken
        _enc = tiktoken.get_encoding("gpt2")
    tokens = [EOT] + _enc.encode_ordinary(text)
    if max(tokens) >= 2 ** 16:
        raise ValueError(f"token id {max(tokens)} does not fit in uint16")
    return goes_to_val(text, val_fraction), np.array(tokens, dtype=np.uint16)


def prepare(documents, out_dir, max_tokens, val_tokens, val_fraction, num_proc=1, meta=None, progress=True):
    """Tokenize `documents` (an iterable of strings) into out_dir/train.bin and out_dir/val.bin.
    Train stops at exactly max_tokens; val takes whole documents until it holds val_tokens."""
    from tqdm import tqdm
    os.makedirs(out_dir, exist_ok=True)
    stats = dict(train_docs=0, val_docs=0, empty_docs=0)
    work = functools.partial(tokenize_document, val_fraction=val_fraction)
    pool = multiprocessing.get_context('spawn').Pool(num_proc) if num_proc > 1 else None
    # imap keeps the documents' order, so the output is the same for any num_proc
    results = pool.imap(work, documents, chunksize=16) if pool else map(work, documents)
    bar = tqdm(total=max_tokens if max_tokens < 10**12 else None, unit='tok', unit_scale=True, disable=not progress)
    t0 = time.time()
    try:
        with TokenWriter(os.path.join(out_dir, 'train.bin')) as train, \
                TokenWriter(os.path.join(out_dir, 'val.bin')) as val:
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
                raise SystemExit(f"not enough text: {train.n} train and {val.n} val tokens from "
                                 f"{stats['train_docs'] + stats['val_docs']} non-empty documents; add documents "
                                 "or raise --val_fraction")
    finally:
        bar.close()
        if pool:
            pool.terminate()
    seconds = time.time() - t0
    summary = dict(meta or {}, train_tokens=train.n, val_tokens=val.n, **stats, seconds=round(seconds, 2),
                   tokens_per_second=round((train.n + val.n) / max(seconds, 1e-9)),
                   bytes=2 * (train.n + val.n) + 2 * HEADER_BYTES, eot=EOT, tokenizer='gpt2')
    write_json(os.path.join(out_dir, 'meta.json'), summary)
    return summary


def is_complete(out_dir, args_meta):
    """True when out_dir holds valid bins written by an earlier run with the same arguments."""
    try:
        with open(os.path.join(out_dir, 'meta.json')) as f:
            meta = json.load(f)
        read_tokens(os.path.join(out_dir, 'train.bin'))
        read_tokens(os.path.join(out_dir, 'val.bin'))
    except (OSError, ValueError):
        return False
    return meta.get('args') == args_meta['args']


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--dataset', choices=['fineweb-edu', 'tiny'], default='fineweb-edu')
    p.add_argument('--input', help="local files instead of --dataset: a path or glob of .txt, .jsonl or .parquet")
    p.add_argument('--text_column', default='text', help="column holding the text (.jsonl/.parquet)")
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
    meta = dict(args={k: getattr(args, k) for k in ('dataset', 'input', 'text_column', 'max_tokens',
                                                     'val_tokens', 'val_fraction')})
    if source == 'local':
        meta['args']['dataset'] = None
    else:
        meta['args']['input'] = None
    if not args.force and is_complete(out_dir, meta):
        print(f"{out_dir} is already complete for these arguments (use --force to rebuild)")
        return 0

    if source == 'tiny':
        documents, files = tiny_documents(), []
        meta['source'] = f"pydoc_data.topics of Python {sys.version.split()[0]}"
        args.num_proc = 1  # too small to be worth a pool
    elif source == 'fineweb-edu':
        documents, files = fineweb_documents(), []
        meta['source'] = "HuggingFaceFW/fineweb-edu sample-10BT (streamed)"
    else:
        documents, files = local_documents(args.input, args.text_column)
        meta['source'] = f"{len(files)} local files matching {args.input!r}"
    s = prepare(documents, out_dir, args.max_tokens, args.val_tokens, args.val_fraction, args.num_proc, meta)
    print(f"{out_dir}: {s['train_docs']:,} train documents, {s['train_tokens']:,} tokens | "
          f"{s['val_docs']:,} val documents, {s['val_tokens']:,} tokens | {s['bytes'] / 1e6:,.1f} MB in 2 files "
          f"| {s['tokens_per_second']:,} tokens/s" + (f" | {len(files)} input files" if files else ""))
    return 0


if __name__ == '__main__':
    sys.exit(main())
