"""
What the scripts share (nanochat keeps the same kind of helpers in its common.py):

  - the keys that define a run: MODEL_KEYS, FROZEN_ON_RESUME
  - the paired data order: window_order, step_windows, windows_hash, get_windows
  - device and precision: resolve_device, resolve_dtype, tune_cpu_allocator
  - the files of a run, written so that a kill at any moment loses nothing and read with checks:
    atomic_write_text, save_checkpoint / load_checkpoint (a checksum over the whole content), read_log
    (log.jsonl; a line torn by a crash mid-write is dropped with a warning)

train.py, sample.py, bench.py, compare.py, study.py and prepare.py import from here; none of them
imports train.py. torch is imported inside the functions that need it, because prepare.py's worker
processes import this module too and have no use for it.
"""

import functools
import hashlib
import json
import os
import shutil
import warnings

import numpy as np

# the model's shape: a checkpoint can only be loaded into a model built from these
MODEL_KEYS = ('n_layer', 'n_head', 'n_embd', 'block_size', 'residual', 'attnres_block_size')
# what decides what a run's numbers mean (the model, the data and its order, the schedule, the precision,
# the evaluation set): a resumed run must not change them, and the two arms of a pair must agree on all of
# them but `residual` (compare.py). README "Resume" lists the keys that may change.
FROZEN_ON_RESUME = MODEL_KEYS + ('seed', 'dataset', 'data_id', 'total_batch_size', 'lr_decay_iters',
                                 'warmup_iters', 'learning_rate', 'min_lr_ratio', 'weight_decay', 'beta1',
                                 'beta2', 'grad_clip', 'dtype_resolved', 'eval_tokens')


def schedule_length(cfg):
    """The LR schedule's length in steps: lr_decay_iters, where 0 means "follow max_iters" (train.py
    resolves it when a run starts; configs written before it did kept the 0)."""
    return cfg.get('lr_decay_iters') or cfg['max_iters']


# -----------------------------------------------------------------------------
# The paired data order: one global sequence of training windows, keyed by the seed

@functools.lru_cache(maxsize=2)  # a step spans at most two epochs: each permutation is built once
def window_order(n_windows, seed, epoch):
    """The permutation of training windows for one pass over the data, keyed by (seed, epoch)."""
    order = np.random.default_rng([seed, epoch]).permutation(n_windows)
    order.flags.writeable = False  # shared by every step of the epoch
    return order


def step_windows(step, n_windows, windows_per_step, seed):
    """Indices of the windows that optimizer step `step` trains on, a list of ints in order, all ranks
    together: the slice [step * W, (step + 1) * W) of the endless sequence of epochs. It depends on
    nothing but the seed, the step and the batch in windows, so every arm of a seed, on any number of
    processes and with any micro-batch size, trains on the same windows at the same step."""
    ### BEGIN SOLUTION 4
    first = step * windows_per_step
    out = []
    while len(out) < windows_per_step:
        epoch, offset = divmod(first + len(out), n_windows)
        out.extend(window_order(n_windows, seed, epoch)[offset:offset + windows_per_step - len(out)].tolist())
    ### END SOLUTION
    return out


def windows_hash(windows):
    """A short fingerprint of a step's windows, logged so that anyone can check that two arms were paired."""
    return hashlib.sha1(np.asarray(windows, dtype=np.int64).tobytes()).hexdigest()[:12]


def get_windows(data, windows, block_size):
    """(x, y) int64 tensors for window indices: window i is tokens [i*T, i*T + T + 1), y is x shifted by
    one. Index -1 is a padding row (x = 0, y = -1: cross_entropy's ignore_index, so it is never scored)."""
    import torch
    rows = np.full((len(windows), block_size + 1), -1, dtype=np.int64)
    for r, i in enumerate(windows):
        if i >= 0:
            rows[r] = data[i * block_size:i * block_size + block_size + 1]
    rows = torch.from_numpy(rows)
    return rows[:, :-1].clamp_min(0), rows[:, 1:].contiguous()


# -----------------------------------------------------------------------------
# Device and precision

def resolve_device(device):
    """'auto' -> the best available: 'cuda', then Apple's 'mps', then 'cpu'; anything else as given."""
    import torch
    if device != 'auto':
        return device
    if torch.cuda.is_available():
        return 'cuda'
    return 'mps' if torch.backends.mps.is_available() else 'cpu'


def resolve_dtype(dtype, device_type):
    """'auto' -> bfloat16 on GPUs that have it in hardware (Ampere and newer), float16 on older GPUs
    (a V100 would only emulate bf16, slowly), float32 elsewhere. Returns (name, torch dtype)."""
    import torch
    if dtype == 'auto':
        if device_type == 'cuda':
            dtype = 'bfloat16' if torch.cuda.is_bf16_supported(including_emulation=False) else 'float16'
        else:
            dtype = 'float32'
    table = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}
    if dtype not in table:
        raise SystemExit(f"dtype must be one of auto, {', '.join(table)}; got {dtype!r}")
    return dtype, table[dtype]


# dense bf16 peak FLOP/s of known GPUs, for MFU, matched in order against torch.cuda.get_device_name()
# (the more specific names first: an "H100 PCIe" must not match "H100", which is the SXM part)
GPU_PEAK_FLOPS = (('H100 PCIe', 756e12), ('H100 NVL', 835e12), ('H100', 989e12), ('H200', 989e12),
                  ('H800', 989e12), ('A100', 312e12), ('A800', 312e12), ('L40S', 362e12), ('A10G', 125e12),
                  ('L4', 121e12), ('RTX 4090', 165e12), ('RTX 3090', 71e12), ('V100', 125e12))


def detect_peak_flops(device):
    """Peak FLOP/s of a CUDA device from its name; 0 when unknown (CPU, MPS, other GPUs)."""
    import torch
    if not str(device).startswith('cuda') or not torch.cuda.is_available():
        return 0.0
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in GPU_PEAK_FLOPS if key in name), 0.0)


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
    import torch
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


def rng_states():
    """The RNG states of torch, numpy and Python as tensors and plain values, so that a checkpoint loads
    with torch.load(weights_only=True): numpy's own state is a tuple holding an array."""
    import random
    import torch
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return dict(torch=torch.get_rng_state(), python=random.getstate(),
                numpy=[name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)])


def set_rng_states(states):
    import random
    import torch
    torch.set_rng_state(states['torch'])
    name, keys, pos, has_gauss, cached = states['numpy']
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else keys     # (older checkpoints: an array)
    np.random.set_state((name, keys.astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = states['python']
    random.setstate((version, tuple(internal), gauss))


def tensor_bytes(obj):
    """The bytes of all tensors in a nested structure: about the size of its checkpoint file."""
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def save_checkpoint(obj, path):
    """torch.save with a checksum of the content, to a temporary name, then renamed. A write that fails
    (a full disk) removes the partial file, keeps the previous checkpoint, and says how much space it needs."""
    import torch
    tmp = path + '.tmp'
    try:
        torch.save(dict(obj, sha256=content_digest(obj)), tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:   # torch.save reports a failed write as a RuntimeError
        written = os.path.getsize(tmp) if os.path.exists(tmp) else 0
        if os.path.exists(tmp):
            os.remove(tmp)
        folder = os.path.dirname(os.path.abspath(path))
        free = shutil.disk_usage(folder).free
        reason = getattr(e, 'strerror', None) or str(e).strip().splitlines()[-1]
        raise SystemExit(f"could not write the checkpoint {path} ({reason}; {written / 1e6:,.1f} MB were written "
                         f"before it failed). The partial file was removed and the previous checkpoint, if any, is "
                         f"kept. A checkpoint of this run needs about {tensor_bytes(obj) / 1e6:,.0f} MB; {folder} has "
                         f"{free / 1e6:,.0f} MB free. Make room, then continue with --init_from=auto.") from None


def load_checkpoint(path):
    """Load a checkpoint onto the CPU (the caller moves what it needs) and verify its checksum.
    Only tensors and plain values are loaded (weights_only=True): a file that holds other Python
    objects, which unpickling could run as code, is refused before anything in it runs. A damaged
    file is an error that leaves the file as it is."""
    import pickle
    import torch
    # older checkpoints kept numpy's RNG state as a uint32 array: its reconstruction is allowed, nothing else
    legacy = [np._core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    try:
        with torch.serialization.safe_globals(legacy):
            ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as e:
        what = next((line.strip() for line in str(e).splitlines() if 'GLOBAL' in line or 'Unsupported' in line),
                    str(e).splitlines()[0])
        raise SystemExit(f"{path} was refused: it holds Python objects other than tensors and plain values "
                         f"({what}), and loading those could run code. Nothing in it was run. A checkpoint written by "
                         "train.py never holds such objects: do not load this file unless you know where it came from."
                         ) from None
    except Exception as e:  # truncated, or damaged where the zip/pickle structure notices
        raise SystemExit(f"{path} cannot be read ({type(e).__name__}: {e}); the file is damaged and was left "
                         "as it is. Resume from a copy, or start the run again in another out_dir.") from None
    if not isinstance(ckpt, dict):
        raise SystemExit(f"{path} is not a checkpoint of train.py (a {type(ckpt).__name__}, not a dict)")
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
