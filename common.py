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
# them but `residual` (compare.py). docs/training.md ("Resume") lists the keys that may change.
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


def check_device(device):
    """resolve_device(device), refused with a message unless this machine has that device."""
    import torch
    device = resolve_device(device)
    try:
        kind = torch.device(device)
    except RuntimeError:
        raise SystemExit(f"device={device!r} is not a device torch knows: use auto, cpu, cuda, cuda:N or mps") from None
    if kind.type == 'cuda' and not torch.cuda.is_available():
        problem = f"this machine has no CUDA GPU that torch can use (torch {torch.__version__})"
    elif kind.type == 'cuda' and (kind.index or 0) >= torch.cuda.device_count():
        problem = f"this machine has {torch.cuda.device_count()} CUDA GPUs (cuda:0 ...)"
    elif kind.type == 'mps' and not torch.backends.mps.is_available():
        problem = "this machine has no Apple GPU that torch can use (mps)"
    elif kind.type not in ('cpu', 'cuda', 'mps'):
        problem = "this project runs on cpu, cuda or mps"
    else:
        return device
    raise SystemExit(f"device={device!r} but {problem}; use --device=auto or --device=cpu")


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
    and then page-faults them back in on every step. Keeping them in the heap makes CPU training
    faster (docs/performance.md, "CPU notes"); the same as MALLOC_MMAP_MAX_=0 and
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


def lock_folder(folder, name):
    """Take an exclusive flock on folder/name, written with who holds it: (the open lock file, None), or
    (None, a line saying who holds it) when another process does. The kernel releases the lock when the
    file is closed or the process ends, however it ends: a crash leaves no stale lock."""
    import fcntl
    import socket
    import sys
    import time
    os.makedirs(folder, exist_ok=True)
    f = open(os.path.join(folder, name), 'a+')
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or 'a process that has just started'
        f.close()
        return None, holder
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}: "
            f"{' '.join(sys.argv)}\n")
    f.flush()
    return f, None


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
    import gc
    import torch
    tmp = path + '.tmp'
    try:
        torch.save(dict(obj, sha256=content_digest(obj)), tmp)
        os.replace(tmp, path)
        return
    except (OSError, RuntimeError) as e:   # torch.save reports a failed write as a RuntimeError
        reason = getattr(e, 'strerror', None) or str(e).strip().splitlines()[-1]
    # Out of the except block: the exception's traceback held torch.save's open file, whose blocks a
    # removal frees only once it is closed. Measured before that, the free space reads as 0.
    gc.collect()
    written = os.path.getsize(tmp) if os.path.exists(tmp) else 0
    if os.path.exists(tmp):
        os.remove(tmp)
    folder = os.path.dirname(os.path.abspath(path))
    free, need = shutil.disk_usage(folder).free, tensor_bytes(obj)
    raise SystemExit(f"could not write the checkpoint {path} ({reason}; {written / 1e6:,.1f} MB were written "
                     f"before it failed{': the disk is full' if free < need else ''}). The partial file was removed "
                     f"and the previous checkpoint, if any, is kept. A checkpoint of this run needs about "
                     f"{need / 1e6:,.0f} MB; {folder} has {free / 1e6:,.0f} MB free. Make room, then continue with "
                     "--init_from=auto.")


def load_tensors_only(path, mmap=False):
    """torch.load of tensors and plain values only (weights_only=True), onto the CPU. Older checkpoints kept
    numpy's RNG state as a uint32 array: its reconstruction is allowed, nothing else."""
    import torch
    legacy = [np._core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(legacy):
        return torch.load(path, map_location='cpu', weights_only=True, mmap=mmap)


def load_checkpoint(path):
    """Load a checkpoint onto the CPU (the caller moves what it needs) and verify its checksum.
    Only tensors and plain values are loaded (weights_only=True): a file that holds other Python
    objects, which unpickling could run as code, is refused before anything in it runs. A damaged
    file is an error that leaves the file as it is."""
    import pickle
    try:
        ckpt = load_tensors_only(path)
    except pickle.UnpicklingError as e:
        what = next((line.strip() for line in str(e).splitlines() if 'global' in line.lower()), None)
        if what is None:   # not a pickle at all (text, random bytes): damaged, not dangerous
            raise SystemExit(f"{path} cannot be read ({str(e).splitlines()[0] if str(e) else 'not a checkpoint'}); "
                             "the file is damaged or not a checkpoint and was left as it is. Resume from a copy, or "
                             "start the run again in another out_dir.") from None
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


def checkpoint_progress(path):
    """(step, max_iters) that a checkpoint was written at and for, or None if there is no readable one. Reads
    only the small pickled part: the tensors are memory-mapped, not loaded (a 343M run's checkpoint is 4 GB)."""
    try:
        ckpt = load_tensors_only(path, mmap=True)
        return int(ckpt['step']), int(ckpt['config']['max_iters'])
    except Exception:   # missing, damaged, not a checkpoint: not a finished run's checkpoint
        return None


def model_config(saved, source):
    """The GPTConfig that a saved configuration (a checkpoint's, or a weights file's header) describes,
    checked as train.py checks its keys: a file from anyone may say anything."""
    from model import GPTConfig
    if not isinstance(saved, dict):
        raise SystemExit(f"{source} holds no model configuration (a {type(saved).__name__})")
    bad = [f"{k} is missing" for k in MODEL_KEYS if k not in saved]
    bad += [f"{k}={saved[k]!r} is not {'a string' if k == 'residual' else 'an integer'}" for k in MODEL_KEYS
            if k in saved and not (isinstance(saved[k], str) if k == 'residual'
                                   else isinstance(saved[k], int) and not isinstance(saved[k], bool))]
    if not bad:
        try:
            return GPTConfig(vocab_size=50304, **{k: saved[k] for k in MODEL_KEYS})
        except ValueError as e:
            bad.append(str(e))
    raise SystemExit(f"{source}: its model configuration is not valid ({'; '.join(bad)}); the file is damaged "
                     "or was not written by this project")


def check_tensors(model, tensors, source):
    """Refuse `tensors` ({name: (shape, dtype)}) unless they are exactly `model`'s parameters and buffers
    (a tied weight stored once is enough), before anything is loaded or allocated for them."""
    expected, groups = {}, {}
    for name, t in model.state_dict(keep_vars=True).items():
        expected[name] = (tuple(t.shape), t.dtype)
        groups.setdefault(id(t), []).append(name)
    problems = [f"{n} is not a tensor of this model" for n in tensors if n not in expected]
    problems += [f"{n} has shape {tuple(shape)} {dtype}, the model's is {expected[n][0]} {expected[n][1]}"
                 for n, (shape, dtype) in tensors.items() if n in expected and (tuple(shape), dtype) != expected[n]]
    problems += [f"{names[0]} is missing" for names in groups.values() if not any(n in tensors for n in names)]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ''
        raise SystemExit(f"{source} does not hold the weights of the model its configuration describes: "
                         f"{'; '.join(problems[:3])}{more}. The file is damaged or its configuration was edited.")


def has_eval(rows, step):
    """Whether log rows hold the validation loss of training at `step` (an eval_only row is not one)."""
    return any(r.get('step') == step and 'val_loss' in r and not r.get('eval_only') for r in rows)


def read_log(path):
    """The rows of a log.jsonl. A crash while a line was being appended leaves a torn last line: it
    is dropped with a warning (the step it belonged to is simply not logged). Any other bad line is
    an error that names the file and the line."""
    with open(path, 'rb') as f:
        lines = f.read().split(b'\n')
    # a complete file ends with '\n', so its last piece is ''; a torn one ends mid-line
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode('utf-8'))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if number == len(lines):  # the last piece, with no newline after it: torn by a crash
                warnings.warn(f"{path}: dropped a torn last line ({len(line)} bytes, no newline): "
                              "the run was killed while writing it")
                break
            what = 'not UTF-8' if isinstance(e, UnicodeDecodeError) else f'not valid JSON ({e.msg})'
            raise SystemExit(f"{path}, line {number}: {what}; fix or remove that line") from None
        if not isinstance(row, dict) or not isinstance(row.get('step'), int):
            raise SystemExit(f"{path}, line {number}: not a row of train.py's log (a JSON object with a step); "
                             "fix or remove that line")
        rows.append(row)
    return rows
