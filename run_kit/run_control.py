"""
This process and the checks around train.py's loop (docs/run_safety.md): the device and precision (also
bench.py's and sample.py's), the process group, the stop signals of a preempting scheduler, Ctrl-C, and the
divergence guards.
None of it reads the device on a training step: the guards keep their flags on the device and the
ranks agree on them at log steps, where the loop reads the device anyway.
"""

import gc
import inspect
import os
import signal
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from run_kit.common import H100_PEAK_FLOPS, fail
from run_kit.run_files import CHECKPOINT, EXIT_STOPPED, kept_checkpoint, record_divergence

# Preemption: SIGTERM (what a scheduler sends before it kills a job, and what torchrun forwards to its
# workers) and SIGUSR1 (SLURM's --signal) make every rank stop at the same log step and write a
# checkpoint there; the process then exits with run_files.EXIT_STOPPED (75, "try again").
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# float16: a step whose scaled gradients overflow is skipped by the GradScaler, which then halves the
# scale. That is normal now and then; this many skipped steps in a row means the run has diverged.
MAX_SKIPPED_STEPS = 20

def uneven_batch(total, B, T, world):
    """Why total_batch_size does not split into world x batch_size x block_size, and a batch_size that does."""
    if total % (T * world) != 0:
        return (f"total_batch_size={total} is not a multiple of block_size * world_size = {T} * {world}: no "
                "batch_size can split it evenly; change total_batch_size or the number of processes")
    per_rank = total // (T * world)  # windows per process per step
    fits = max(b for b in range(1, min(B, per_rank) + 1) if per_rank % b == 0)
    return (f"total_batch_size={total} must be divisible by batch_size * block_size * world_size = {B} * {T} * "
            f"{world}; with {world} processes, batch_size={fits} works ({per_rank // fits} micro-steps of {fits} x "
            f"{T} tokens per process)")


def too_few_windows(cfg, train_tokens, val_tokens, train_short):
    """Why the prepared data does not hold one training step (train_short) or one validation window."""
    T, tokens = cfg['block_size'], cfg['eval_tokens']
    if train_short:
        return (f"train.bin holds {train_tokens} tokens, fewer than one step of {cfg['total_batch_size']}: prepare "
                "more data or lower total_batch_size")
    if tokens and val_tokens > T:
        return (f"eval_tokens={tokens} is less than one window's block_size={T} tokens: raise eval_tokens (0 = all "
                f"of val.bin, {val_tokens:,} tokens)")
    return (f"val.bin holds {val_tokens} tokens, fewer than one window of {T + 1}: prepare more validation data or "
            "lower block_size")


@contextmanager
def ctrl_c(out_dir):
    """Ctrl-C stops the run with a message: what is kept and how to continue. The first one also makes the
    process ignore any later one: a second Ctrl-C while the first is handled (a checkpoint's partial file
    being removed, the interpreter's exit handlers) would end in a raw traceback, or leave the partial file.
    Where SIGINT was ignored when the run started (a background job), it stays so."""
    def first(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt
    now = signal.getsignal(signal.SIGINT)   # (common.ctrl_c_while_starting's until the run starts: ours too)
    mine = now is signal.default_int_handler or getattr(now, 'while_starting', False)
    if mine:
        signal.signal(signal.SIGINT, first)
    interrupted = False
    try:
        yield
    except KeyboardInterrupt:
        interrupted = True
        ckpt = os.path.join(out_dir, CHECKPOINT)   # (a checkpoint being written when it came was removed)
        raise SystemExit((f"interrupted (Ctrl-C): the last checkpoint, {ckpt}, is kept; what was trained after it is "
                          "not. To continue:" if os.path.exists(ckpt) else "interrupted (Ctrl-C) before the first "
                          "checkpoint: nothing trained is kept. To start again:") + " the same command with "
                         "--init_from=auto. (SIGTERM instead of Ctrl-C stops at the next log step with a checkpoint.)"
                         ) from None
    finally:
        if mine and not interrupted:   # a caller in the same process (a test, a notebook) gets its handler back
            signal.signal(signal.SIGINT, signal.default_int_handler)


class StopSignals:
    """Takes note of SIGTERM / SIGUSR1 (docs/run_safety.md): the handler only records the signal, the
    ranks agree to stop at the next log step, write a checkpoint there and exit with EXIT_STOPPED.
    restore() gives a caller in the same process (a test, a notebook) its own handlers back."""

    def __init__(self):
        self.received = []
        self.before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda signum, frame: self.received.append(signal.Signals(signum).name))

    def restore(self):
        for sig, handler in self.before.items():
            signal.signal(sig, handler)

    def stopped_at(self, step, ckpt_path):
        """What rank 0 says once the checkpoint of the stop at `step` is on disk, with how to continue."""
        by = self.received[0] if self.received else 'a signal to another rank'
        return (f"stopped by {by} at step {step}: checkpoint written to {ckpt_path}. To continue: the same command "
                f"with --init_from=auto (or resume). Exit code {EXIT_STOPPED}.")


# how a non-finite value is kept on the device (an int64 flag, so that the ranks can all-reduce it with MAX)
NONFINITE = ('nan', 'inf', '-inf')


def note_nonfinite(flags, step, loss, norm, fp16):
    """The divergence guard, on the device, without a read-back: flags is (loss step, norm step, loss value,
    norm value), the first step each went non-finite on this rank and its value (an index into NONFINITE),
    -1 = never. With float16 a non-finite norm is the GradScaler's business: it skips the step."""
    values = torch.stack([loss.detach().float(), norm.detach().float()])
    bad = torch.stack([~torch.isfinite(values[0]), ~torch.isfinite(values[1]) & (not fp16)])
    kind = torch.where(torch.isnan(values), 0, torch.where(values > 0, 1, 2))
    new = bad & (flags[:2] < 0)
    flags.copy_(torch.cat([torch.where(new, step, flags[:2]), torch.where(new, kind, flags[2:])]))


def divergence_message(loss_step, norm_step, step, ckpt_path):
    """What went non-finite first (-1 = never), and what is kept."""
    what = (f"training loss at step {loss_step}" if loss_first(loss_step, norm_step) else
            f"gradient norm at step {norm_step} (the training loss was finite)")
    return f"non-finite {what}, noticed at step {step}: stopped without saving; {kept_checkpoint(ckpt_path)}."


def loss_first(loss_step, norm_step):
    """Whether the training loss went non-finite first (-1 = never): a loss and a norm that go at one step are the
    loss's (the norm follows from it)."""
    return loss_step >= 0 and (norm_step < 0 or loss_step <= norm_step)


# what every divergence message ends with (a run started again here with another configuration is refused
# by --init_from=auto and resume: that would mix two runs in one record)
DIVERGED_ADVICE = ("Start again with a lower learning_rate, more warmup_iters or a grad_clip: in another out_dir, or "
                   "here with --init_from=scratch --overwrite=True (this run's record is replaced).")


def stop_diverged(message, step, what, first_step, value, ckpt_path, master):
    """Stop a run that diverged, with its message, once rank 0 has recorded it in the log (run_files.
    record_divergence): a diverged run is a result that study.py reports, not a crash. A record that cannot be
    written (a full disk) is said, and the run stops all the same."""
    message = f"{message.rstrip('.')}. {DIVERGED_ADVICE}"
    if master:
        try:
            record_divergence(os.path.dirname(ckpt_path), step, what, first_step, value)
        except SystemExit as e:
            message += f" (The divergence could not be recorded in the log: {e})"
    fail(message, master)


def stop_val_loss_diverged(val_loss, step, ckpt_path, master):
    """Stop a run whose validation loss is not finite, without saving, recorded in the log as a divergence."""
    stop_diverged(f"non-finite validation loss {val_loss} at step {step}: stopped without saving; "
                  f"{kept_checkpoint(ckpt_path)}", step, 'validation loss', step, str(val_loss), ckpt_path, master)


def should_stop(flags, step, ckpt_path, master):
    """After the ranks' all-reduce of their flags (train.Run.agree: note_nonfinite's four, then whether a signal
    came), as a list: stop with a message if a loss or gradient norm went non-finite on any rank, recorded in the
    log, and return whether any rank was asked to stop by a signal."""
    loss_step, norm_step, loss_value, norm_value, stop = flags
    if loss_step >= 0 or norm_step >= 0:
        loss = loss_first(loss_step, norm_step)
        stop_diverged(divergence_message(loss_step, norm_step, step, ckpt_path), step,
                      'training loss' if loss else 'gradient norm', loss_step if loss else norm_step,
                      NONFINITE[loss_value if loss else norm_value], ckpt_path, master)
    return stop > 0


def parameter_fingerprint(model):
    """Three float64 sums per parameter (of x, |x| and x²): equal on ranks that hold equal parameters (the same
    reduction of the same numbers on the same kind of device), and all but surely unequal otherwise."""
    return torch.stack([torch.stack([p.double().sum(), p.double().abs().sum(), p.double().square().sum()])
                        for p in model.parameters()])


def ranks_agree(model, step, proc):
    """Under DDP, at a checkpoint: stop, saying so, unless every rank holds rank 0's parameters. DDP keeps them
    equal by averaging gradients; a rank that started from another state, or missed a step, would train
    another model while rank 0's checkpoints record one."""
    if not proc.ddp:
        return
    mine = parameter_fingerprint(model)
    every = [torch.empty_like(mine) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(every, mine)
    apart = [r for r, theirs in enumerate(every) if not torch.equal(theirs, every[0])]
    if apart:
        fail(f"at step {step} the parameters of rank{'s' if len(apart) > 1 else ''} {', '.join(map(str, apart))} differ "
             "from rank 0's: the ranks train different models, nothing was saved. Start the run again from its "
             "last checkpoint (--init_from=auto): every rank then starts from rank 0's state.", proc.master)


class SkippedSteps:
    """float16: counts the steps the GradScaler skipped (their scaled gradients overflowed, the scale went
    down) and stops the run after MAX_SKIPPED_STEPS in a row. The scaler's own check has already read the
    device, so comparing the scales costs no extra wait."""

    def __init__(self, scaler):   # (after the checkpoint's scaler is loaded: the scale the first step starts at)
        self.scaler, self.in_a_row, self.since_log = scaler, 0, 0
        self.scale = scaler.get_scale() if scaler.is_enabled() else None

    def after(self, step, ckpt_path, master):
        """After each step: a skipped step lowered the scale (only the step's scaler.update changes it)."""
        if not self.scaler.is_enabled():
            return
        scale = self.scaler.get_scale()
        skipped, self.scale = scale < self.scale, scale
        self.in_a_row = self.in_a_row + 1 if skipped else 0
        self.since_log += skipped
        if self.in_a_row >= MAX_SKIPPED_STEPS:
            stop_diverged(f"float16: {self.in_a_row} steps in a row had non-finite gradients and were skipped "
                          f"(loss scale now {self.scaler.get_scale():g}), up to step {step}: the run has diverged. "
                          f"Stopped without saving; {kept_checkpoint(ckpt_path)}", step, 'float16 gradients',
                          step - self.in_a_row + 1, f"{self.in_a_row} skipped steps in a row", ckpt_path, master)

    def log_fields(self):
        """The float16 columns of a log row (and the count restarts)."""
        if not self.scaler.is_enabled():
            return {}
        fields, self.since_log = dict(skipped_steps=self.since_log, loss_scale=self.scaler.get_scale()), 0
        return fields


# -----------------------------------------------------------------------------
# This process's device and precision

def resolve_device(device):
    """'auto' -> the best available: 'cuda', then Apple's 'mps', then 'cpu'; anything else as given."""
    if device != 'auto':
        return device
    if torch.cuda.is_available():
        return 'cuda'
    return 'mps' if torch.backends.mps.is_available() else 'cpu'


def check_device(device):
    """resolve_device(device), refused with a message unless this machine has that device."""
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
    if dtype == 'auto':
        if device_type == 'cuda':
            dtype = 'bfloat16' if torch.cuda.is_bf16_supported(including_emulation=False) else 'float16'
        else:
            dtype = 'float32'
    check_dtype(dtype)
    return dtype, getattr(torch, dtype)


def check_dtype(dtype):
    """Refuse a dtype this project does not train in (before anything is written: start_processes)."""
    if dtype not in ('auto', *DTYPES):
        raise SystemExit(f"dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}")


# dense bf16 peak FLOP/s of known GPUs, for MFU, matched in order against torch.cuda.get_device_name()
# (the more specific names first: an "H100 PCIe" must not match "H100", which is the SXM part)
GPU_PEAK_FLOPS = (('H100 PCIe', 756e12), ('H100 NVL', 835e12), ('H100', H100_PEAK_FLOPS), ('H200', H100_PEAK_FLOPS),
                  ('H800', H100_PEAK_FLOPS), ('A100', 312e12), ('A800', 312e12), ('L40S', 362e12), ('A10G', 125e12),
                  ('L4', 121e12), ('RTX 4090', 165e12), ('RTX 3090', 71e12), ('V100', 125e12))


def detect_peak_flops(device):
    """Peak FLOP/s of a CUDA device from its name; 0 when unknown (CPU, MPS, other GPUs)."""
    if not str(device).startswith('cuda') or not torch.cuda.is_available():
        return 0.0
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in GPU_PEAK_FLOPS if key in name), 0.0)


def tune_cpu(cfg, device_type):
    """On a CPU: torch's thread count (cfg['cpu_threads']; 0 leaves torch's default, one per core) and the
    allocator (cfg['cpu_malloc_tuning']). A small model's matrices are too small for two threads to share
    well: on a busy 2-core machine they wait for each other (docs/performance.md, "Threads for small models
    on a CPU"). Nothing elsewhere."""
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
# This process: alone, or one rank of torchrun's

@dataclass
class ThisProcess:
    """Who this process is (under torchrun, or alone) and the device it drives."""
    ddp: bool
    rank: int
    world: int
    device: str        # 'cpu', 'cuda:3', 'mps'
    device_type: str   # 'cpu', 'cuda', 'mps'

    def __post_init__(self):
        self.master = self.rank == 0   # rank 0 prints, logs and saves
        self.dtype, self.peak_flops = None, 0.0   # what it computes in (start_processes), its peak FLOP/s (0: unknown)


def start_processes(cfg):
    """This process: alone, or one rank of torchrun's, in its process group; its device (cfg['device'], refused
    before anything starts where this machine has none such; 'auto' is the best there is), its precision
    (cfg['dtype_resolved']), its peak FLOP/s for MFU, and on a CPU its threads and allocator."""
    device = check_device(cfg['device'])
    check_dtype(cfg['dtype'])
    ddp = int(os.environ.get('RANK', -1)) != -1  # torchrun sets RANK, LOCAL_RANK, WORLD_SIZE
    rank, local_rank, world = ((int(os.environ['RANK']), int(os.environ['LOCAL_RANK']), int(os.environ['WORLD_SIZE']))
                               if ddp else (0, 0, 1))
    if ddp and device.startswith('cuda'):
        device = f'cuda:{local_rank}'        # one GPU per process
        torch.cuda.set_device(device)
    device_type = 'cuda' if device.startswith('cuda') else device
    if ddp:
        # DDP imports torch._dynamo. Imported after the process group exists, it keeps the group, and gloo's three
        # threads, alive past destroy_process_group (torch 2.13): they are still there while the interpreter shuts
        # down, and a finished run can then abort (SIGABRT). Imported first, the group goes when the run leaves it.
        import torch._dynamo as _dynamo  # noqa: F401  (binds only _dynamo: torch stays this module's)
        import datetime   # (a rank that waits longer than ddp_timeout for the others ends the run with an error)
        torch.distributed.init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo',
                                             timeout=datetime.timedelta(seconds=cfg['ddp_timeout']))
    tune_cpu(cfg, device_type)
    # TF32 for the big matmuls of the backbone; the depth reads stay true float32 (model.read_sources)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    cfg['dtype_resolved'], dtype = resolve_dtype(cfg['dtype'], device_type)   # frozen on resume: 'auto' may mean
    proc = ThisProcess(ddp, rank, world, device, device_type)                  # bf16 on one machine, fp16 on another
    proc.dtype, proc.peak_flops = dtype, cfg['peak_flops'] or detect_peak_flops(device)
    if cfg.get('depth_read') == 'fused' and rank == 0:   # where the fused read's kernels run here, in one line
        from fast_read.fused_read import where_it_runs
        note = where_it_runs(device_type)
        if note:
            print(note, file=sys.stderr, flush=True)
    return proc


def leave_process_group(proc):
    """Leave torchrun's process group, also after an error: a rank that leaves without it makes the others hang
    until NCCL times out. What is left of DDP (its reducer and the collective work it holds) is freed first,
    so that the group itself goes here, its threads joined, and not while the interpreter shuts down, where
    gloo can abort the process (SIGABRT, "terminate called without an active exception") after a run that
    went well (start_processes imports torch._dynamo first for the same reason)."""
    if proc.ddp and torch.distributed.is_initialized():
        gc.collect()
        torch.distributed.destroy_process_group()


def wrap_ddp(model, proc):
    """The model as the step runs it: under DDP, wrapped (gradients all-reduced in buckets); alone, as it is."""
    if not proc.ddp:
        return model
    # The buffers are constants (the rotary tables; ctrl_fixed_v's fixed w_v): never resent (torch >= 2.13 calls
    # this forward_sync_buffers=False, older releases broadcast_buffers=False). Gradients live in DDP's buckets.
    DDP = torch.nn.parallel.DistributedDataParallel
    no_buffer_sync = (dict(forward_sync_buffers=False) if 'forward_sync_buffers' in inspect.signature(DDP).parameters
                      else dict(broadcast_buffers=False))
    return DDP(model, device_ids=[torch.device(proc.device)] if proc.device_type == 'cuda' else None,
               gradient_as_bucket_view=True, **no_buffer_sync)
