"""
What the scripts share (nanochat keeps the same kind of helpers in its common.py):

  - the keys that define a run: MODEL_KEYS, FROZEN_ON_RESUME
  - device and precision: resolve_device, resolve_dtype, tune_cpu_allocator
  - the files of a run, written so that a kill at any moment loses nothing and read with checks:
    atomic_write_text, save_checkpoint / load_checkpoint (a checksum over the whole content), read_log
    (log.jsonl; a line torn by a crash mid-write is dropped with a warning)

train.py, sample.py, bench.py, compare.py and study.py import from here; none of them imports train.py.
"""

import hashlib
import json
import os
import warnings

import numpy as np
import torch

# the model's shape: a checkpoint can only be loaded into a model built from these
MODEL_KEYS = ('n_layer', 'n_head', 'n_embd', 'block_size', 'residual', 'attnres_block_size')
# what decides the model, the data order or the schedule: a resumed run must not change them, and the
# two arms of a pair must agree on all of them but `residual` (compare.py)
FROZEN_ON_RESUME = MODEL_KEYS + ('seed', 'dataset', 'data_id', 'total_batch_size', 'lr_decay_iters',
                                 'warmup_iters', 'learning_rate', 'min_lr_ratio', 'weight_decay', 'beta1',
                                 'beta2', 'grad_clip')


# -----------------------------------------------------------------------------
# Device and precision

def resolve_device(device):
    """'auto' -> the best available: 'cuda', then Apple's 'mps', then 'cpu'; anything else as given."""
    if device != 'auto':
        return device
    if torch.cuda.is_available():
        return 'cuda'
    return 'mps' if torch.backends.mps.is_available() else 'cpu'


def resolve_dtype(dtype, device_type):
    """'auto' -> bfloat16 on GPUs that have it in hardware (Ampere and newer), float16 on older GPUs
    (a V100 would only emulate bf16, slowly), float32 elsewhere. Returns (name, torch dtype)."""
    if dtype == 'auto':
        if device_type == 'cuda':
            dtype = 'bfloat16' if torch.cuda.is_bf16_supported(including_emulation=False) else 'float16'
        else:
            dtype = 'float32'
    table = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}
    if dtype not in table:
        raise SystemExit(f"dtype must be one of auto, {', '.join(table)}; got {dtype!r}")
    return dtype, table[dtype]


def tune_cpu_allocator():
    """glibc returns large freed blocks (here: the (B, T, vocab) logits and their gradient) to the OS
    and then page-faults them back in on every step. Keeping them in the heap was measured to make
    CPU training ~1.6x faster (README, CPU notes); the same as MALLOC_MMAP_MAX_=0 and
    MALLOC_TRIM_THRESHOLD_=<huge> in the environment. No effect (and no error) elsewhere."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
        M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1))
    except (OSError, AttributeError):
        return False  # not glibc (macOS, Windows, musl)


# -----------------------------------------------------------------------------
# The files of a run. Everything is written under a temporary name and renamed: a rename is atomic,
# so a reader (or a resumed run) sees either the old file or the new one, never half of one.

def atomic_write_text(path, text):
    with open(path + '.tmp', 'w') as f:
        f.write(text)
    os.replace(path + '.tmp', path)


def content_digest(obj):
    """SHA-256 over everything a checkpoint holds: every tensor's dtype, shape and bytes, every other
    value's repr, in order. Stored in the checkpoint and recomputed on load, so a flipped byte
    anywhere in the tensors (which torch.load does not notice) is caught before a run resumes from it."""
    h = hashlib.sha256()

    def walk(x):
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f"tensor {t.dtype} {tuple(t.shape)};".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())
        elif isinstance(x, np.ndarray):
            h.update(f"array {x.dtype} {x.shape};".encode())
            h.update(np.ascontiguousarray(x).view(np.uint8))
        elif isinstance(x, dict):
            h.update(f"dict {len(x)};".encode())
            for k, v in x.items():
                h.update(repr(k).encode())
                walk(v)
        elif isinstance(x, (list, tuple)):
            h.update(f"{type(x).__name__} {len(x)};".encode())
            for v in x:
                walk(v)
        else:
            h.update(repr(x).encode())
    walk(obj)
    return h.hexdigest()


def save_checkpoint(obj, path):
    """torch.save with a checksum of the content, to a temporary name, then renamed."""
    torch.save(dict(obj, sha256=content_digest(obj)), path + '.tmp')
    os.replace(path + '.tmp', path)


def load_checkpoint(path):
    """Load a checkpoint onto the CPU (the caller moves what it needs) and verify its checksum.
    A damaged file is an error that leaves the file as it is."""
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=False)
    except Exception as e:  # truncated, or damaged where the zip/pickle structure notices
        raise SystemExit(f"{path} cannot be read ({type(e).__name__}: {e}); the file is damaged and was left "
                         "as it is. Resume from a copy, or start the run again in another out_dir.") from None
    stored = ckpt.pop('sha256', None)
    if stored is None:
        warnings.warn(f"{path} has no checksum (written by an older train.py): not verified")
    elif stored != content_digest(ckpt):
        raise SystemExit(f"{path} is damaged: its content does not match the checksum written with it. "
                         "It was left as it is; resume from a copy, or start the run again in another out_dir.")
    return ckpt


def read_log(path):
    """The rows of a log.jsonl. A crash while a line was being appended leaves a torn last line: it
    is dropped with a warning (the step it belonged to is simply not logged). Any other bad line is
    an error that names the file and the line."""
    with open(path) as f:
        lines = f.read().split('\n')
    # a complete file ends with '\n', so its last piece is ''; a torn one ends mid-line
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if number == len(lines):  # the last piece, with no newline after it: torn by a crash
                warnings.warn(f"{path}: dropped a torn last line ({len(line)} characters, no newline): "
                              "the run was killed while writing it")
                break
            raise SystemExit(f"{path}, line {number}: not valid JSON ({e.msg}); fix or remove that line") from None
    return rows
