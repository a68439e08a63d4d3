"""
Train one arm of a paired comparison. One process:
    python train.py config/quickstart.py
DDP on 8 GPUs of one node (README "Training" for several nodes):
    torchrun --standalone --nproc_per_node=8 train.py config/rd_343m.py --seed=2

Paired protocol (README "Training: train.py"): for one `seed`, every arm gets the same initial values
of the parameters it shares with the others and sees the same batches in the same order. The data
order is one global sequence of training windows, a permutation keyed by the seed; step s uses windows
[s*W, (s+1)*W) of it (W = total_batch_size / block_size) and the ranks split them, so the order
depends neither on the number of processes nor on the micro-batch size.

What the loop never does on a GPU step: wait for the device. Nothing reads a device value back
between log steps (the divergence guard keeps its flags on the device), the data order is cached
per epoch, and every compiled call sees one static shape.
"""

import fcntl
import inspect
import json
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from common import (FROZEN_ON_RESUME, MODEL_KEYS, atomic_write_text, detect_peak_flops, get_windows, load_checkpoint,
                    read_log, resolve_device, resolve_dtype, rng_states, save_checkpoint, schedule_length,
                    set_rng_states, step_windows, tune_cpu_allocator, windows_hash)
from configurator import configure
from model import GPT, GPTConfig, routing_summary
from prepare import read_dataset

# -----------------------------------------------------------------------------
# Defaults (a config file and --key=value override them; see configurator.py)
# I/O
out_dir = 'out/{residual}_s{seed}'   # {keys} are filled in from the configuration
eval_interval = 250
log_interval = 10
eval_tokens = 10_485_760    # validation: the first eval_tokens of val.bin (0 = all of it), same for every arm
eval_batch_size = 16
eval_only = False           # evaluate (the checkpoint, with init_from='resume'), log, exit
always_save_checkpoint = True
init_from = 'scratch'       # 'scratch', 'resume' (from out_dir/ckpt.pt) or 'auto' (whichever fits out_dir)
overwrite = False           # allow a scratch run to replace the run already in out_dir
log_routing = True          # depth distributions of the first validation batch at every eval
wandb_log = False           # also send what log.jsonl gets to Weights & Biases (rank 0; `pip install wandb`)
wandb_project = 'rd-attnres'
wandb_run_name = ''         # '' = the out_dir's name, e.g. rd_120m_s1
wandb_group = ''            # '' = the comparison: shape and budget, e.g. 12x768_1024ctx_3815steps
# data
dataset = 'tiny'            # data/<dataset>/{train,val}.bin, written by prepare.py
data_dir = 'data'
seed = 1                    # initialisation and data order: the pairing key
total_batch_size = 2 ** 19  # tokens per optimizer step, over all processes and micro-steps
batch_size = 16             # micro-batch size per process
block_size = 1024
# model
n_layer = 12
n_head = 12
n_embd = 768
residual = 'rd_attnres'
attnres_block_size = 4
# optimizer: AdamW, linear warmup then cosine decay to min_lr_ratio * learning_rate
learning_rate = 6e-4
max_iters = 3815
lr_decay_iters = 0          # length of the schedule (0 = max_iters), fixed at the start of a run
train_past_schedule = False # allow max_iters > lr_decay_iters: the extra steps run at the final LR
warmup_iters = 250
min_lr_ratio = 0.1
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0             # 0 = off
# system
device = 'auto'             # 'auto', 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'              # 'auto' (bf16 on capable GPUs, float32 on CPU), 'float32', 'bfloat16', 'float16'
fp16_init_scale = 65536.0   # float16 only: the GradScaler's starting loss scale (PyTorch's default)
compile = False
peak_flops = 0.0            # for MFU; 0 = detect from the GPU's name (none on CPU)
cpu_malloc_tuning = True    # on CPU with glibc: keep big freed buffers in the heap (~1.6x faster, see README)
DEFAULTS = {k: v for k, v in dict(globals()).items()
            if not k.startswith('_') and isinstance(v, (int, float, bool, str)) and k.islower()}
# float16: a step whose scaled gradients overflow is skipped by the GradScaler, which then halves the
# scale. That is normal now and then; this many skipped steps in a row means the run has diverged.
MAX_SKIPPED_STEPS = 20
# Preemption: SIGTERM (what a scheduler sends before it kills a job, and what torchrun forwards to its
# workers) and SIGUSR1 (SLURM's --signal) make every rank stop at the same log step and write a
# checkpoint there; the process then exits with this code (sysexits.h's EX_TEMPFAIL: "try again").
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_STOPPED = 75


# -----------------------------------------------------------------------------
# The validation batches and the LR schedule (the training data order is in common.py)

def eval_batches(n_eval, rank, world, batch_size):
    """This rank's validation windows (rank, rank + world, ...) in whole batches of batch_size. Every
    rank gets the same number of batches, the last ones padded with -1, so that a compiled model sees
    one shape for evaluation (a ragged last batch would recompile it with a dynamic batch size)."""
    mine = list(range(rank, n_eval, world))
    n_batches = math.ceil(math.ceil(n_eval / world) / batch_size)
    mine += [-1] * (n_batches * batch_size - len(mine))
    return [mine[i:i + batch_size] for i in range(0, len(mine), batch_size)]


def get_lr(it, cfg):
    """Linear warmup from lr/warmup (non-zero at step 0), then cosine decay to min_lr_ratio * lr over
    lr_decay_iters steps; past the end of the schedule the LR stays at its final value."""
    lr, decay_iters = cfg['learning_rate'], schedule_length(cfg)
    if it < cfg['warmup_iters']:
        return lr * (it + 1) / cfg['warmup_iters']
    progress = min(1.0, (it - cfg['warmup_iters']) / max(1, decay_iters - cfg['warmup_iters']))
    coeff = 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr * (cfg['min_lr_ratio'] + coeff * (1 - cfg['min_lr_ratio']))


# -----------------------------------------------------------------------------
# Processes and messages

def fail(message, master=True):
    """Stop with a message. Under torchrun every rank usually meets the same error: only rank 0 says it."""
    raise SystemExit(message if master else 1)


def divergence_message(loss_step, norm_step, now, ckpt_path):
    """What went non-finite first (-1 = never), and what to do about it."""
    if loss_step >= 0 and (norm_step < 0 or loss_step <= norm_step):
        what = f"training loss at step {loss_step}"
    else:
        what = f"gradient norm at step {norm_step} (the training loss was finite)"
    return (f"non-finite {what}, noticed at step {now}: stopped without saving; {kept_checkpoint(ckpt_path)}. "
            "Start again with a lower learning_rate, more warmup_iters or a grad_clip.")


def kept_checkpoint(ckpt_path):
    """What a run that stops without saving leaves behind, said as it is."""
    return (f"the last good checkpoint, {ckpt_path}, is kept" if os.path.exists(ckpt_path)
            else f"no checkpoint was written ({ckpt_path} does not exist)")


def git_commit():
    try:
        return subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True, timeout=5,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def batch_arithmetic(cfg, world, master):
    """(micro-steps per process, windows per step). total_batch_size must split evenly into
    world_size x batch_size x block_size; if it does not, propose a batch_size that works."""
    T, B, total = cfg['block_size'], cfg['batch_size'], cfg['total_batch_size']
    if total % (B * T * world) == 0:
        return total // (B * T * world), total // T
    if total % (T * world) != 0:
        fail(f"total_batch_size={total} is not a multiple of block_size * world_size = {T} * {world}: "
             "no batch_size can split it evenly; change total_batch_size or the number of processes", master)
    per_rank = total // (T * world)  # windows per process per step
    fits = max(b for b in range(1, min(B, per_rank) + 1) if per_rank % b == 0)
    fail(f"total_batch_size={total} must be divisible by batch_size * block_size * world_size = "
         f"{B} * {T} * {world}; with {world} processes, batch_size={fits} works "
         f"({per_rank // fits} micro-steps of {fits} x {T} tokens per process)", master)


RUN_FILES = ('ckpt.pt', 'log.jsonl', 'config.json')


def existing_run(out_dir):
    """What a previous run left in out_dir (empty if nothing)."""
    found = []
    for name in RUN_FILES:
        path = os.path.join(out_dir, name)
        if os.path.exists(path):
            found.append(f"{name} ({os.path.getsize(path):,} bytes)")
    return found


def frozen_diff(saved, cfg):
    """{key: (saved value, value now)} for the keys that decide what a run's numbers mean (FROZEN_ON_RESUME)."""
    return {k: (saved.get(k), cfg.get(k)) for k in FROZEN_ON_RESUME if k in saved and saved.get(k) != cfg.get(k)}


def describe_diff(diff, then, now):
    return ', '.join(f"{k}: {then} {a!r} vs {now} {b!r}" for k, (a, b) in diff.items())


def check_resumable(saved, cfg, ckpt_path):
    """Refuse to resume a checkpoint whose model, data or schedule differs from this configuration."""
    diff = frozen_diff(saved, cfg)
    if diff:
        raise SystemExit(f"cannot resume {ckpt_path}: it was trained with another configuration "
                         f"({describe_diff(diff, 'checkpoint', 'now')}). Use the checkpoint's values or another out_dir.")


# -----------------------------------------------------------------------------

def main(argv):
    cfg = configure(DEFAULTS, argv)
    validate(cfg)          # every key, before anything is written
    procs = start_processes(cfg)
    handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}   # train() replaces them (preemption)
    try:
        code = train(cfg, procs)
        if procs.ddp:
            # Every rank leaves together. Rank 0 may still be writing the last checkpoint when the others
            # finish; a rank that tears its process group down while a peer still uses it can abort
            # (gloo: "terminate called without an active exception", SIGABRT), and torchrun then reports
            # a finished run as failed.
            torch.distributed.barrier()
    except KeyboardInterrupt:
        raise SystemExit(f"interrupted (Ctrl-C): nothing after the last checkpoint in {cfg['out_dir']} is kept. "
                         "To continue: the same command with --init_from=auto. (SIGTERM instead of Ctrl-C "
                         "stops at the next log step with a checkpoint.)") from None
    finally:
        for sig, handler in handlers.items():   # (a caller in the same process, e.g. a test, gets its own back)
            signal.signal(sig, handler)
        # also on an error: a rank that leaves without this makes the others hang until NCCL times out
        if procs.ddp and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return code


POSITIVE = ('eval_interval', 'log_interval', 'eval_batch_size', 'total_batch_size', 'batch_size', 'block_size',
            'n_layer', 'n_head', 'n_embd', 'attnres_block_size')
NON_NEGATIVE = ('max_iters', 'lr_decay_iters', 'warmup_iters', 'eval_tokens', 'learning_rate', 'weight_decay',
                'grad_clip', 'peak_flops')


def validate(cfg):
    """Check every key that can be checked without data or devices, and fill in out_dir's {keys}, so that a
    bad value is a message before config.json or log.jsonl exist (a rerun with the value fixed then starts
    cleanly). train() checks the rest: the batch arithmetic, the data, the out_dir."""
    try:
        cfg['out_dir'] = cfg['out_dir'].format(**cfg)
    except (KeyError, IndexError, ValueError) as e:
        raise SystemExit(f"out_dir={cfg['out_dir']!r}: {{{e.args[0] if isinstance(e, KeyError) else e}}} is not a "
                         "config key; out_dir may name keys in braces, e.g. 'out/{residual}_s{seed}'") from None
    bad = [f"{k}={cfg[k]!r} must be > 0" for k in POSITIVE if cfg[k] <= 0]
    bad += [f"{k}={cfg[k]!r} must be >= 0" for k in NON_NEGATIVE if cfg[k] < 0]
    bad += [f"{k}={cfg[k]!r} must be in [0, 1]" for k in ('min_lr_ratio',) if not 0 <= cfg[k] <= 1]
    bad += [f"{k}={cfg[k]!r} must be in [0, 1)" for k in ('beta1', 'beta2') if not 0 <= cfg[k] < 1]
    bad += [f"fp16_init_scale={cfg['fp16_init_scale']!r} must be > 0"] if cfg['fp16_init_scale'] <= 0 else []
    if cfg['init_from'] not in ('scratch', 'resume', 'auto'):
        bad.append(f"init_from must be 'scratch', 'resume' or 'auto', got {cfg['init_from']!r}")
    try:
        GPTConfig(**{k: cfg[k] for k in MODEL_KEYS})
    except ValueError as e:
        bad.append(str(e))
    if bad:
        raise SystemExit("bad configuration: " + '; '.join(bad))
    if cfg['device'].startswith('cuda') and not torch.cuda.is_available():
        raise SystemExit(f"device={cfg['device']!r} but this machine has no CUDA GPU that torch can use (torch "
                         f"{torch.__version__}); use --device=auto or --device=cpu")
    resolve_dtype(cfg['dtype'], 'cpu')   # an unknown dtype is an error here, whatever the device
    if cfg['warmup_iters'] >= max(cfg['max_iters'], 1) and not cfg['eval_only'] and os.environ.get('RANK', '0') == '0':
        print(f"note: warmup_iters={cfg['warmup_iters']} >= max_iters={cfg['max_iters']}: the whole run is warmup "
              "(the learning rate never reaches its peak, nor decays)", file=sys.stderr)


@dataclass
class Processes:
    """Who this process is (under torchrun, or alone) and the device it drives."""
    ddp: bool
    rank: int
    world: int
    device: str        # 'cpu', 'cuda:3', 'mps'
    device_type: str   # 'cpu', 'cuda', 'mps'

    @property
    def master(self):  # rank 0 prints, logs and saves
        return self.rank == 0


def start_processes(cfg):
    ddp = int(os.environ.get('RANK', -1)) != -1  # torchrun sets RANK, LOCAL_RANK, WORLD_SIZE
    rank, local_rank, world = ((int(os.environ['RANK']), int(os.environ['LOCAL_RANK']), int(os.environ['WORLD_SIZE']))
                               if ddp else (0, 0, 1))
    device = resolve_device(cfg['device'])
    if ddp and device.startswith('cuda'):
        device = f'cuda:{local_rank}'        # one GPU per process
        torch.cuda.set_device(device)
    device_type = 'cuda' if device.startswith('cuda') else device
    if ddp:
        torch.distributed.init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo')
    return Processes(ddp, rank, world, device, device_type)


def open_data(cfg, procs, windows_per_step):
    """The prepared bins (one build), the number of training windows, the validation windows."""
    T = cfg['block_size']
    train_data, val_data, cfg['data_id'] = read_dataset(cfg['data_dir'], cfg['dataset'])
    n_windows = (len(train_data) - 1) // T
    if n_windows < windows_per_step:
        fail(f"train.bin holds {len(train_data)} tokens, fewer than one step of {cfg['total_batch_size']}: "
             "prepare more data or lower total_batch_size", procs.master)
    n_eval = (len(val_data) - 1) // T
    if cfg['eval_tokens']:
        n_eval = min(n_eval, cfg['eval_tokens'] // T)
    if n_eval < 1 and cfg['eval_tokens'] and len(val_data) > T:
        fail(f"eval_tokens={cfg['eval_tokens']} is less than one block of block_size={T} tokens: raise eval_tokens "
             f"(0 = all of val.bin, {len(val_data):,} tokens)", procs.master)
    if n_eval < 1:
        fail(f"val.bin holds {len(val_data)} tokens, fewer than one block of {T}: prepare more validation data "
             "or lower block_size", procs.master)
    return train_data, val_data, n_windows, n_eval


def lock_out_dir(out_dir):
    """Hold out_dir for this process's whole life: an exclusive flock on out_dir/run.lock, which the kernel
    releases when the process ends, however it ends (a crash leaves no stale lock). Returns None, or a
    line saying who holds it."""
    os.makedirs(out_dir, exist_ok=True)
    f = open(os.path.join(out_dir, 'run.lock'), 'a+')
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or 'a process that has just started'
        f.close()
        return holder
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}: "
            f"{' '.join(sys.argv)}\n")
    f.flush()
    HELD_LOCKS.append(f)   # kept open, and so held, until the process ends
    return None


HELD_LOCKS = []


def claim_out_dir(cfg, procs):
    """Hold out_dir (a writing run), then decide how this run starts in it; init_from is resolved to
    'scratch' or 'resume'.
    scratch: never replaces a run by mistake, it needs an empty out_dir or --overwrite=True.
    resume:  needs out_dir/ckpt.pt (checked in resume()).
    auto:    resume when there is a checkpoint (a different run is refused there), start from scratch when
             out_dir holds no run, and start again from scratch when it holds only the beginning of this
             same run, killed before its first checkpoint (nothing trained is lost)."""
    master, out_dir = procs.master, cfg['out_dir']
    if not cfg['eval_only']:
        # Two runs started into one out_dir at the same moment would interleave their logs and overwrite
        # each other's checkpoints: the second is refused, before it reads or writes anything there.
        holder = None
        if master:
            try:
                holder = lock_out_dir(out_dir)
            except OSError as e:
                fail(f"cannot write to {out_dir} ({e.strerror}): choose an out_dir this user can write to")
        if procs.ddp:   # every rank learns whether rank 0 got it
            busy = torch.tensor([int(holder is not None)], device=procs.device)
            torch.distributed.all_reduce(busy)
            holder = holder or ('another run' if busy.item() else None)
        if holder:
            fail(f"{out_dir} is in use by another run ({holder}). Two runs into one out_dir would mix their logs "
                 "and checkpoints: wait for it to end, or use another --out_dir.", master)
        if master:   # what a run killed mid-write left (no other run can be writing them: we hold the lock)
            for name in RUN_FILES:
                if os.path.exists(os.path.join(out_dir, name + '.tmp')):
                    os.remove(os.path.join(out_dir, name + '.tmp'))
    found = existing_run(out_dir)
    if cfg['init_from'] == 'auto':
        cfg['init_from'] = 'resume' if os.path.exists(os.path.join(out_dir, 'ckpt.pt')) else 'scratch'
        if cfg['init_from'] == 'resume' or not found or cfg['eval_only']:
            return
        started = read_run_config(out_dir)
        diff = frozen_diff(started or {}, dict(cfg, lr_decay_iters=schedule_length(cfg)))
        if started is None or diff:
            what = (f"a run with another configuration ({describe_diff(diff, 'that run', 'now')})" if diff
                    else f"files of a run without a readable config.json: {', '.join(found)}")
            fail(f"{out_dir} holds {what}. Use another out_dir, or --init_from=scratch --overwrite=True to "
                 "replace it.", master)
    elif cfg['init_from'] != 'scratch' or cfg['eval_only'] or not found:
        return
    elif not cfg['overwrite']:
        how = ("--init_from=resume (or auto)" if os.path.exists(os.path.join(out_dir, 'ckpt.pt')) else
               "it has no checkpoint yet (killed before its first one): --init_from=auto starts it again")
        fail(f"{out_dir} already holds a run: {', '.join(found)}. To continue it: {how}. To start a new run: "
             "another --out_dir. To replace it: --overwrite=True.", master)
    if master:
        for name in RUN_FILES:
            if os.path.exists(os.path.join(out_dir, name)):
                os.remove(os.path.join(out_dir, name))


def read_run_config(out_dir):
    """out_dir/config.json as a dict, or None if it is missing or unreadable."""
    try:
        with open(os.path.join(out_dir, 'config.json')) as f:
            saved = json.load(f)
        return saved if isinstance(saved, dict) else None
    except (OSError, ValueError):
        return None


def resume(cfg, model, optimizer, scaler, master):
    """Restore model, optimizer, scaler and RNG states from out_dir/ckpt.pt (checksum verified).
    Returns (step, best validation loss, the checkpoint's configuration)."""
    ckpt_path = os.path.join(cfg['out_dir'], 'ckpt.pt')
    if not os.path.exists(ckpt_path):
        started = existing_run(cfg['out_dir'])
        fail(f"init_from='resume' but there is no {ckpt_path}" + (
            f": {cfg['out_dir']} holds only the beginning of a run killed before its first checkpoint "
            f"({', '.join(started)}), nothing to resume. Start it again with --init_from=auto (same configuration) "
            "or replace it with --init_from=scratch --overwrite=True" if started
            else "; start with --init_from=scratch (or auto)"), master)
    ckpt = load_checkpoint(ckpt_path)
    saved = dict(ckpt['config'])
    saved['lr_decay_iters'] = schedule_length(saved)
    if not cfg['lr_decay_iters']:  # not given now: the schedule the run started with
        cfg['lr_decay_iters'] = saved['lr_decay_iters']
    check_resumable(saved, cfg, ckpt_path)
    model.load_state_dict(ckpt['model'])
    optimizer.load_state_dict(ckpt['optimizer'])
    scaler.load_state_dict(ckpt['scaler'])
    set_rng_states(ckpt['rng'])
    return ckpt['step'], ckpt['best_val_loss'], saved


@torch.no_grad()
def evaluate(model, raw_model, val_data, val_batches, routing_windows, cfg, procs, ctx):
    """Mean NLL over the fixed validation windows (ranks split them, the sums are reduced) and, on
    rank 0, the routing diagnostics of the windows routing_windows. The sums stay on the device: one
    read-back at the end, not one per batch."""
    T, dev = cfg['block_size'], procs.device
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=dev)  # (sum of token losses, number of tokens)
    for windows in val_batches:
        x, y = get_windows(val_data, windows, T)
        x, y = x.to(dev), y.to(dev)
        with ctx:
            _, loss = model(x, y)            # the mean over the scored tokens (padding has y = -1)
        n = (y != -1).sum().double()
        total += torch.stack([torch.where(n > 0, loss.double() * n, 0.0), n])
    if procs.ddp:
        torch.distributed.all_reduce(total)
    routing = None
    if cfg['log_routing'] and procs.master and cfg['residual'] != 'standard':
        x, y = get_windows(val_data, routing_windows, T)
        raw_model.record_routing = True    # the plain module: recording is Python work, kept out of the graph
        with ctx:
            raw_model(x.to(dev), y.to(dev))
        raw_model.record_routing = False
        routing = dict(summary=routing_summary(raw_model.routing),
                       alpha=[dict(sublayer=r['sublayer'], layer=r['layer'], route=r['route'],
                                   alpha=[round(a, 5) for a in r['alpha'].tolist()]) for r in raw_model.routing])
    model.train()
    return (total[0] / total[1]).item(), routing


def train_step(step, model, raw_model, optimizer, scaler, data, mine, cfg, procs, ctx, first_nonfinite):
    """One optimizer step on this rank's windows `mine` (grad_accum micro-batches of batch_size).
    Returns the mean training loss and the gradient norm, both still on the device."""
    T, B = cfg['block_size'], cfg['batch_size']
    grad_accum = len(mine) // B
    loss_sum = torch.zeros((), device=procs.device)
    for micro in range(grad_accum):
        x, y = get_windows(data, mine[micro * B:(micro + 1) * B], T)
        if procs.device_type == 'cuda':   # pinned memory: the copy runs while the GPU works
            x, y = x.pin_memory(), y.pin_memory()
        x, y = x.to(procs.device, non_blocking=True), y.to(procs.device, non_blocking=True)
        if procs.ddp:
            # all-reduce the gradients once per step, on the last micro-step, not after each one
            model.require_backward_grad_sync = micro == grad_accum - 1
        with ctx:
            _, loss = model(x, y)
            # each micro-batch's loss is a mean over its tokens; dividing by grad_accum makes the summed
            # gradients those of the mean over the whole step
            loss = loss / grad_accum
        loss_sum += loss.detach()
        scaler.scale(loss).backward()     # float16: scaled up so that small gradients do not underflow
    scaler.unscale_(optimizer)            # (these scaler calls do nothing unless float16)
    norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg['grad_clip'] or float('inf'))
    # the divergence guard, on the device: the first step whose loss / gradient norm was non-finite.
    # (With float16 a non-finite norm is the scaler's business: it skips the step.)
    bad = torch.stack([~torch.isfinite(loss_sum), ~torch.isfinite(norm) & (not scaler.is_enabled())])
    first_nonfinite.copy_(torch.where(bad & (first_nonfinite < 0), step, first_nonfinite))
    if scaler.is_enabled():
        scaler.step(optimizer)            # skipped if the gradients overflowed
        scaler.update()                   # ... and then the scale is halved
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, norm


def check_in(first_nonfinite, stop_requested, now, cfg, procs):
    """The ranks agree, in one all-reduce and one read-back at a step where the loop reads the device
    anyway: stop with a message if a loss or gradient norm went non-finite on any rank, and return
    whether any rank was asked to stop by a signal (then all of them stop at this same step)."""
    flags = torch.cat([first_nonfinite, first_nonfinite.new_tensor([int(stop_requested)])])
    if procs.ddp:  # (a loss can go non-finite, and a signal arrive, on one rank first)
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
    loss_step, norm_step, stop = flags.tolist()
    if loss_step >= 0 or norm_step >= 0:
        fail(divergence_message(loss_step, norm_step, now, os.path.join(cfg['out_dir'], 'ckpt.pt')), procs.master)
    return stop > 0


def train(cfg, procs):
    """Train (or evaluate) one run. Returns the process's exit code: 0, or EXIT_STOPPED after a signal."""
    master = procs.master
    if procs.device_type == 'cpu' and cfg['cpu_malloc_tuning']:
        tune_cpu_allocator()
    dt_name, ptdtype = resolve_dtype(cfg['dtype'], procs.device_type)
    cfg['dtype_resolved'] = dt_name     # frozen on resume: 'auto' may mean bf16 on one machine, fp16 on another
    ctx = nullcontext() if ptdtype == torch.float32 else torch.autocast(device_type=procs.device_type, dtype=ptdtype)
    # TF32 for the big matmuls of the backbone; the depth reads stay true float32 (model.depth_read)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    T, B = cfg['block_size'], cfg['batch_size']
    grad_accum, windows_per_step = batch_arithmetic(cfg, procs.world, master)
    train_data, val_data, n_windows, n_eval = open_data(cfg, procs, windows_per_step)
    asked_auto = cfg['init_from'] == 'auto'
    claim_out_dir(cfg, procs)
    ckpt_path, log_path = (os.path.join(cfg['out_dir'], name) for name in ('ckpt.pt', 'log.jsonl'))

    # ---- model, optimizer, state ----
    torch.manual_seed(cfg['seed'])  # the same on every rank: the initialisation is part of the pairing
    model = GPT(GPTConfig(vocab_size=50304, **{k: cfg[k] for k in MODEL_KEYS})).to(procs.device)
    optimizer = model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'],
                                           (cfg['beta1'], cfg['beta2']), procs.device_type)
    scaler = torch.amp.GradScaler(procs.device_type, init_scale=cfg['fp16_init_scale'],
                                  enabled=(ptdtype == torch.float16))
    step, best_val, saved = 0, float('inf'), {}
    if cfg['init_from'] == 'resume':
        step, best_val, saved = resume(cfg, model, optimizer, scaler, master)
        if asked_auto and step >= cfg['max_iters'] and not cfg['eval_only']:
            if master:
                print(f"{cfg['out_dir']}: already finished at step {step} (max_iters={cfg['max_iters']}); "
                      "nothing to do", flush=True)
            return 0
    # the schedule's length is fixed now and frozen for the rest of the run (a resume keeps it)
    cfg['lr_decay_iters'] = schedule_length(cfg)
    if cfg['max_iters'] > cfg['lr_decay_iters'] and not cfg['train_past_schedule'] and not cfg['eval_only']:
        fail(f"max_iters={cfg['max_iters']} runs past the end of the LR schedule (lr_decay_iters="
             f"{cfg['lr_decay_iters']}): the extra steps would train at the final LR. If that is what you "
             "want, add --train_past_schedule=True.", master)
    if saved and master and not cfg['eval_only'] and os.path.exists(log_path):
        # forget what was logged after the checkpoint (and a line torn by a crash): it is trained again
        rows = [r for r in read_log(log_path) if r['step'] <= step]
        atomic_write_text(log_path, ''.join(json_line(r) for r in rows))

    raw_model = model                   # the plain module: checkpoints, routing diagnostics
    if cfg['compile']:
        # dynamic=False: every call has a static shape (training (B, T), evaluation (eval_batch_size, T)),
        # so a shape change would be a visible recompile, never a silent switch to a slower dynamic graph
        model = torch.compile(model, dynamic=False)
    eval_model = model                  # compiled if asked, without the DDP wrapper
    if procs.ddp:
        # The only buffers are the constant rotary tables, the same on every rank: no need to resend them
        # every step (torch >= 2.13 calls this forward_sync_buffers=False and deprecates broadcast_buffers,
        # older releases know only broadcast_buffers). gradient_as_bucket_view: gradients live in DDP's
        # buckets, no extra copy.
        DDP = torch.nn.parallel.DistributedDataParallel
        no_buffer_sync = (dict(forward_sync_buffers=False) if 'forward_sync_buffers' in inspect.signature(DDP).parameters
                          else dict(broadcast_buffers=False))
        model = DDP(model, device_ids=[torch.device(procs.device)] if procs.device_type == 'cuda' else None,
                    gradient_as_bucket_view=True, **no_buffer_sync)
    peak = cfg['peak_flops'] or detect_peak_flops(procs.device)
    val_batches = eval_batches(n_eval, procs.rank, procs.world, cfg['eval_batch_size'])
    routing_windows = list(range(min(cfg['eval_batch_size'], n_eval)))  # the first validation batch

    # (before config.json is written: the tracked run's id goes into it, so that a resume finds it)
    tracker = start_wandb(cfg, saved) if master and cfg['wandb_log'] and not cfg['eval_only'] else None
    if master and not cfg['eval_only']:
        os.makedirs(cfg['out_dir'], exist_ok=True)
        meta = dict(cfg, git_commit=git_commit(), torch_version=torch.__version__, world_size=procs.world,
                    grad_accum=grad_accum, n_params=raw_model.get_num_params(),
                    device_name=torch.cuda.get_device_name(procs.device) if procs.device_type == 'cuda' else procs.device,
                    train_tokens=len(train_data), eval_windows=n_eval)
        atomic_write_text(os.path.join(cfg['out_dir'], 'config.json'), json.dumps(meta, indent=2) + '\n')
    if master:
        print_run_summary(cfg, raw_model, grad_accum, procs, dt_name, len(train_data), n_eval, step)

    def log(row):  # rank 0 appends to log.jsonl (and sends to the tracker)
        if master:
            with open(log_path, 'a') as f:
                f.write(json_line(row))
            if tracker is not None:
                tracker.log(wandb_row(row), step=row['step'])

    def save(val_loss):
        """Checkpoint at `step` (rank 0), after the ranks have checked that nothing diverged."""
        check_in(first_nonfinite, False, step, cfg, procs)
        if master:
            save_checkpoint(dict(model=raw_model.state_dict(), optimizer=optimizer.state_dict(),
                                 scaler=scaler.state_dict(), step=step, best_val_loss=min(best_val, val_loss),
                                 config=cfg, rng=rng_states()), ckpt_path)

    def evaluate_log_save():
        """Evaluate at `step`, log it, and checkpoint."""
        val_loss, routing = evaluate(eval_model, raw_model, val_data, val_batches, routing_windows, cfg, procs, ctx)
        if not math.isfinite(val_loss):
            fail(f"non-finite validation loss {val_loss} at step {step}: stopped without saving; "
                 f"{kept_checkpoint(ckpt_path)}", master)
        if master:
            print(f"step {step}: val loss {val_loss:.4f}", flush=True)
        log(dict(step=step, tokens=step * cfg['total_batch_size'], val_loss=val_loss, routing=routing))
        if step > 0 and (cfg['always_save_checkpoint'] or step == cfg['max_iters']):
            save(val_loss)
        return val_loss

    if cfg['eval_only']:  # evaluate what there is (the checkpoint, or the initialisation), log, exit
        val_loss, routing = evaluate(eval_model, raw_model, val_data, val_batches, routing_windows, cfg, procs, ctx)
        if master:
            print(f"step {step}: val loss {val_loss:.4f} (eval_only: nothing trained or saved)")
        if saved:
            log(dict(step=step, tokens=step * cfg['total_batch_size'], val_loss=val_loss, routing=routing,
                     eval_only=True))
        return 0

    # Preemption: a signal handler only takes note; the ranks agree to stop at the next log step
    # (README: "Preemption"). From here on a signal no longer kills the process: it checkpoints.
    stop_signal = []
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: stop_signal.append(signal.Signals(signum).name))

    # The divergence guard without a host sync: each step folds "was the loss / the gradient norm
    # non-finite" into these device flags (the first step it happened, -1 = never), which are read back
    # only at log steps and before a checkpoint is written. A diverged run therefore goes on for at
    # most log_interval - 1 steps and then stops, and a checkpoint is never written after a non-finite step.
    first_nonfinite = torch.full((2,), -1, dtype=torch.int64, device=procs.device)  # (loss, gradient norm)
    if step == 0:                        # the curves start at the untrained model
        best_val = evaluate_log_save()
    start_step, t_last, t_last_step = step, time.time(), step
    skipped_in_a_row = skipped_since_log = 0
    while step < cfg['max_iters']:
        lr = get_lr(step, cfg)
        for group in optimizer.param_groups:
            group['lr'] = lr
        windows = step_windows(step, n_windows, windows_per_step, cfg['seed'])    # the whole step, all ranks
        mine = windows[procs.rank * grad_accum * B:(procs.rank + 1) * grad_accum * B]   # this rank's share
        scale = scaler.get_scale() if scaler.is_enabled() else None
        loss_sum, norm = train_step(step, model, raw_model, optimizer, scaler, train_data, mine, cfg, procs, ctx,
                                    first_nonfinite)
        if scaler.is_enabled():
            # float16: a step whose scaled gradients overflowed was skipped (the scale went down). The
            # scaler's own check already read the device, so comparing the scales costs no extra wait.
            skipped = scaler.get_scale() < scale
            skipped_in_a_row = skipped_in_a_row + 1 if skipped else 0
            skipped_since_log += skipped
            if skipped_in_a_row >= MAX_SKIPPED_STEPS:
                fail(f"float16: {skipped_in_a_row} steps in a row had non-finite gradients and were skipped "
                     f"(loss scale now {scaler.get_scale():g}), up to step {step}: the run has diverged. Stopped "
                     f"without saving; {kept_checkpoint(ckpt_path)}.", master)
        step += 1

        stopping = False
        if step % cfg['log_interval'] == 0 or step == cfg['max_iters']:
            stopping = check_in(first_nonfinite, bool(stop_signal), step, cfg, procs)
            if procs.ddp:
                torch.distributed.all_reduce(loss_sum)
            train_loss = loss_sum.item() / procs.world  # .item() waits for the device, so dt below is real
            now = time.time()
            dt = (now - t_last) / (step - t_last_step)
            first_interval = t_last_step == start_step  # includes torch.compile's compilation: no MFU
            t_last, t_last_step = now, step
            tok_s = cfg['total_batch_size'] / dt
            mfu = raw_model.estimate_mfu(cfg['total_batch_size'] // procs.world, dt, peak, T) \
                if peak and not first_interval else None
            norm_value = norm.item()
            if master:
                print(f"step {step:5d} | loss {train_loss:.4f} | lr {lr:.2e} | norm {norm_value:.3f} | "
                      f"dt {dt * 1000:.0f}ms | tok/s {tok_s:,.0f} | mfu {'-' if mfu is None else f'{100 * mfu:.1f}%'}"
                      + (f" | skipped {skipped_since_log}" if scaler.is_enabled() else '')
                      + f" | eta {format_duration((cfg['max_iters'] - step) * dt)}", flush=True)
            log(dict(step=step, tokens=step * cfg['total_batch_size'], train_loss=train_loss, lr=lr,
                     norm=norm_value if math.isfinite(norm_value) else None, dt=dt, tok_per_s=tok_s, mfu=mfu,
                     data_hash=windows_hash(windows),
                     **(dict(skipped_steps=skipped_since_log, loss_scale=scaler.get_scale())
                        if scaler.is_enabled() else {})))
            skipped_since_log = 0
        if step % cfg['eval_interval'] == 0 or step == cfg['max_iters']:
            best_val = min(best_val, evaluate_log_save())
            t_last, t_last_step = time.time(), step   # the evaluation's time is not training time
        elif stopping:
            save(best_val)
        if stopping and step < cfg['max_iters']:
            if master:
                print(f"stopped by {stop_signal[0] if stop_signal else 'a signal to another rank'} at step {step}: "
                      f"checkpoint written to {ckpt_path}. To continue: the same command with --init_from=auto "
                      f"(or resume). Exit code {EXIT_STOPPED}.", flush=True)
            break
    if tracker is not None:
        tracker.finish()
    return EXIT_STOPPED if step < cfg['max_iters'] else 0


# -----------------------------------------------------------------------------
# Weights & Biases (nanoGPT's wandb_log / wandb_project / wandb_run_name), imported only when on

def start_wandb(cfg, saved):
    """One tracked run per training run: the arms of a comparison share a group (shape and budget),
    each is named after its out_dir and tagged with its mode and seed, so that pairs line up in the
    dashboard. The run's id is kept in config.json and the checkpoints: a resume continues it."""
    import wandb
    cfg['wandb_run_id'] = saved.get('wandb_run_id') or secrets.token_hex(4)   # a new run's id: 8 hex digits
    group = cfg['wandb_group'] or f"{cfg['n_layer']}x{cfg['n_embd']}_{cfg['block_size']}ctx_{cfg['max_iters']}steps"
    return wandb.init(project=cfg['wandb_project'], name=cfg['wandb_run_name'] or os.path.basename(cfg['out_dir']),
                      group=group, job_type=cfg['residual'], tags=[cfg['residual'], f"seed{cfg['seed']}"],
                      config=cfg, id=cfg['wandb_run_id'], resume='allow')


def wandb_row(row):
    """A log.jsonl row as flat dashboard keys: train/loss, val/loss, routing/layer3/js_qk_v, ..."""
    out = {}
    for key, value in row.items():
        if key in ('train_loss', 'val_loss'):
            out[f"{key.split('_')[0]}/loss"] = value
        elif key == 'routing':
            for layer in (value or {}).get('summary', []):
                out.update({f"routing/layer{layer['layer']}/{k}": v for k, v in layer.items() if k != 'layer'})
        elif key not in ('step', 'data_hash', 'eval_only') and value is not None:
            out[f"train/{key}" if key != 'tokens' else key] = value
    return out


# -----------------------------------------------------------------------------
# Console and log formatting

def json_line(row):
    return json.dumps(row) + '\n'


def format_duration(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def print_run_summary(cfg, model, grad_accum, procs, dt_name, train_tokens, n_eval, step):
    """A few lines that matter; the whole configuration is in out_dir/config.json."""
    T = cfg['block_size']
    print(f"{cfg['residual']} | {cfg['n_layer']} layers x {cfg['n_embd']} ({cfg['n_head']} heads), "
          f"attnres_block_size {cfg['attnres_block_size']}, context {T} | "
          f"{model.get_num_params() / 1e6:.2f}M parameters | seed {cfg['seed']}")
    print(f"batch: {grad_accum} micro-steps x {procs.world} processes x {cfg['batch_size']} x {T} = "
          f"{cfg['total_batch_size']:,} tokens per step | {cfg['max_iters']} steps = "
          f"{cfg['max_iters'] * cfg['total_batch_size'] / 1e6:,.1f}M tokens | LR {cfg['learning_rate']:g}, "
          f"warmup {cfg['warmup_iters']}, schedule {cfg['lr_decay_iters']} steps")
    print(f"data: {cfg['data_dir']}/{cfg['dataset']} ({train_tokens:,} train tokens, {n_eval} validation windows) | "
          f"{procs.device}, {dt_name}{', compiled' if cfg['compile'] else ''}")
    print(f"eval_only: evaluates {'the checkpoint in ' + cfg['out_dir'] if step else 'the initialisation'} and "
          f"writes {'one eval_only row to log.jsonl' if step else 'nothing'}" if cfg['eval_only'] else
          f"writes to {cfg['out_dir']} (config.json, log.jsonl, ckpt.pt)"
          + (f" | resumed at step {step}" if step else ''), flush=True)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
