"""
What the scripts share (nanochat keeps the same kind of helpers in its common.py):

  - the keys that define a run: MODEL_KEYS, FROZEN_ON_RESUME, schedule_length, model_problems
  - training windows: get_windows (indices to tensors), windows_hash (a step's fingerprint), windows_digest
    (the running digest of every step's windows since step 0); the paired data order itself is train.py's
  - device and precision: resolve_device, resolve_dtype, check_device, detect_peak_flops, tune_cpu,
    tune_cpu_allocator
  - fail: how a run stops with a message (under torchrun, said by rank 0 alone)

The files of a run (config.json, log.jsonl, ckpt.pt, the lock, atomic writes) are run_files.py's.
train.py, sample.py, bench.py, compare.py, study.py, prepare.py and run_files.py import from here; none
of them imports train.py but study.py's time estimate. torch is imported inside the functions that need
it, because prepare.py's worker processes import this module too and have no use for it.
"""

import hashlib

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
    """The LR schedule's length in steps: lr_decay_iters, where 0 means "follow max_iters". The one place
    that says so: a run's start fixes it (run_dir.start_run), and readers of configurations written before
    it was fixed (they kept the 0) resolve it the same way."""
    return cfg.get('lr_decay_iters') or cfg['max_iters']


def fail(message, master=True):
    """Stop with a message. Under torchrun every rank usually meets the same error: only rank 0 says it."""
    raise SystemExit(message if master else 1)


# -----------------------------------------------------------------------------
# Training windows as tensors, a step's fingerprint and the run's digest (the order itself is train.py's)

def windows_hash(windows):
    """A short fingerprint of one step's windows, logged on a training row (the step just trained)."""
    return hashlib.sha1(np.asarray(windows, dtype=np.int64).tobytes()).hexdigest()[:12]


DIGEST_START = '0' * 16   # the data digest of a run that has trained no step


def windows_digest(digest, windows):
    """The run's data digest after one more step: `digest` (of every step before it, DIGEST_START at step
    0) chained with this step's window indices. train.py updates it at every step (M indices hashed, host
    side) and logs it on every training and evaluation row; two rows with the same digest at step s mean
    that every step before s trained on the same windows, not only the logged ones. compare.py checks it."""
    return hashlib.sha1(digest.encode() + np.asarray(windows, dtype=np.int64).tobytes()).hexdigest()[:16]


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


DTYPES = ('float32', 'bfloat16', 'float16')   # and 'auto'


def resolve_dtype(dtype, device_type):
    """'auto' -> bfloat16 on GPUs that have it in hardware (Ampere and newer), float16 on older GPUs
    (a V100 would only emulate bf16, slowly), float32 elsewhere. Returns (name, torch dtype)."""
    import torch
    if dtype == 'auto':
        if device_type == 'cuda':
            dtype = 'bfloat16' if torch.cuda.is_bf16_supported(including_emulation=False) else 'float16'
        else:
            dtype = 'float32'
    check_dtype(dtype)
    return dtype, getattr(torch, dtype)


def check_dtype(dtype):
    """Refuse a dtype this project does not train in (before anything is written: run_control.validate)."""
    if dtype not in ('auto', *DTYPES):
        raise SystemExit(f"dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}")


# dense bf16 peak FLOP/s of known GPUs, for MFU, matched in order against torch.cuda.get_device_name()
# (the more specific names first: an "H100 PCIe" must not match "H100", which is the SXM part)
H100_PEAK_FLOPS = 989e12   # H100 SXM (and H200, H800: the same tensor cores); the paper's budget assumes it
GPU_PEAK_FLOPS = (('H100 PCIe', 756e12), ('H100 NVL', 835e12), ('H100', H100_PEAK_FLOPS), ('H200', H100_PEAK_FLOPS),
                  ('H800', H100_PEAK_FLOPS), ('A100', 312e12), ('A800', 312e12), ('L40S', 362e12), ('A10G', 125e12),
                  ('L4', 121e12), ('RTX 4090', 165e12), ('RTX 3090', 71e12), ('V100', 125e12))


def detect_peak_flops(device):
    """Peak FLOP/s of a CUDA device from its name; 0 when unknown (CPU, MPS, other GPUs)."""
    import torch
    if not str(device).startswith('cuda') or not torch.cuda.is_available():
        return 0.0
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in GPU_PEAK_FLOPS if key in name), 0.0)


def tune_cpu(cfg, device_type):
    """On a CPU: torch's thread count (cfg['cpu_threads']; 0 leaves torch's default, one per core) and the
    allocator (cfg['cpu_malloc_tuning']). A small model's matrices are too small for two threads to share
    well: on a busy 2-core machine they wait for each other (docs/performance.md, "Threads for small models
    on a CPU"). Nothing elsewhere."""
    import torch
    if device_type != 'cpu':
        return
    if cfg['cpu_threads']:
        torch.set_num_threads(cfg['cpu_threads'])
    if cfg['cpu_malloc_tuning']:
        tune_cpu_allocator()


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
# The model a run's configuration describes, and its keys checked

def gpt_config(cfg):
    """The GPTConfig of a run's configuration: its MODEL_KEYS; the vocabulary is GPTConfig's."""
    from model import GPTConfig
    return GPTConfig(**{k: cfg[k] for k in MODEL_KEYS})


def build_model(cfg):
    """The model of a run's configuration (gpt_config, and depth_read): GPT, or TwoPhaseGPT where
    depth_read='two_phase' (the same function and parameters, the reads computed per AttnRes block). On the
    current device (torch.device('meta') for a model without memory)."""
    from fast_read.two_phase_read import TwoPhaseGPT
    from model import GPT
    return (TwoPhaseGPT if cfg.get('depth_read') == 'two_phase' else GPT)(gpt_config(cfg))


def model_problems(cfg):
    """What is wrong with the model keys of a configuration ([] if nothing): train.py's own (run_control.validate)
    and a saved model's, a checkpoint's or a weights file's header, checked alike."""
    bad = [f"{k} is missing" for k in MODEL_KEYS if k not in cfg]
    bad += [f"{k}={cfg[k]!r} is not {'a string' if k == 'residual' else 'an integer'}" for k in MODEL_KEYS
            if k in cfg and not (isinstance(cfg[k], str) if k == 'residual'
                                 else isinstance(cfg[k], int) and not isinstance(cfg[k], bool))]
    if bad:
        return bad
    bad = [f"{k}={cfg[k]!r} must be > 0" for k in MODEL_KEYS if k != 'residual' and cfg[k] <= 0]
    if not bad:
        try:
            gpt_config(cfg)
        except ValueError as e:
            bad.append(str(e))
    return bad
