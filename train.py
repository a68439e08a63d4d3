"""
Train one arm of a paired comparison. One process:
    python train.py config/quickstart.py
DDP on 8 GPUs of one node:
    torchrun --standalone --nproc_per_node=8 train.py config/rd_343m.py --seed=2

Paired protocol (SPEC §3): for one `seed`, every arm gets the same initial values of the
parameters it shares with the others and sees the same batches in the same order. The data order is
one global sequence of training windows, a permutation keyed by the seed; step s uses windows
[s*W, (s+1)*W) of it (W = total_batch_size / block_size) and the ranks split them, so the order
depends neither on the number of processes nor on the micro-batch size.
"""

import hashlib
import json
import math
import os
import random
import subprocess
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch

from configurator import configure
from model import GPT, GPTConfig, detect_peak_flops, routing_summary
from prepare import read_tokens

# -----------------------------------------------------------------------------
# Defaults (a config file and --key=value override them; see configurator.py)
# I/O
out_dir = 'out/{residual}_s{seed}'   # {keys} are filled in from the configuration
eval_interval = 250
log_interval = 10
eval_tokens = 10_485_760    # validation: the first eval_tokens of val.bin (0 = all of it), same for every arm
eval_batch_size = 16
eval_only = False
always_save_checkpoint = True
init_from = 'scratch'       # 'scratch' or 'resume' (from out_dir/ckpt.pt)
log_routing = True          # depth distributions of the first validation batch at every eval
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
lr_decay_iters = 0          # length of the schedule (0 = max_iters); fixed, so a run can stop early and resume
warmup_iters = 250
min_lr_ratio = 0.1
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0             # 0 = off
# system
device = 'auto'             # 'auto', 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'              # 'auto' (bf16 on capable GPUs, float32 on CPU), 'float32', 'bfloat16', 'float16'
compile = False
peak_flops = 0.0            # for MFU; 0 = detect from the GPU's name (none on CPU)
cpu_malloc_tuning = True    # on CPU with glibc: keep big freed buffers in the heap (~1.6x faster, see README)
MODEL_KEYS = ('n_layer', 'n_head', 'n_embd', 'block_size', 'residual', 'attnres_block_size')
# keys that decide the data order or the model: a resumed run must not change them
FROZEN_ON_RESUME = MODEL_KEYS + ('seed', 'dataset', 'total_batch_size', 'lr_decay_iters', 'warmup_iters',
                                 'learning_rate', 'min_lr_ratio', 'weight_decay', 'beta1', 'beta2', 'grad_clip')
DEFAULTS = {k: v for k, v in dict(globals()).items()
            if not k.startswith('_') and isinstance(v, (int, float, bool, str)) and k.islower()}


# -----------------------------------------------------------------------------
# Data: one global, seed-keyed order of windows; a fixed validation set

def window_order(n_windows, seed, epoch):
    """The permutation of training windows for one pass over the data, keyed by (seed, epoch)."""
    return np.random.default_rng([seed, epoch]).permutation(n_windows)


def step_windows(step, n_windows, windows_per_step, seed):
    """Indices of the windows that optimizer step `step` trains on, in order (all ranks together)."""
    first = step * windows_per_step
    out = []
    while len(out) < windows_per_step:
        epoch, offset = divmod(first + len(out), n_windows)
        order = window_order(n_windows, seed, epoch)
        out.extend(order[offset:offset + windows_per_step - len(out)].tolist())
    return out


def windows_hash(windows):
    """A short fingerprint of a step's windows, logged so that anyone can check that two arms were paired."""
    return hashlib.sha1(np.asarray(windows, dtype=np.int64).tobytes()).hexdigest()[:12]


def get_windows(data, windows, block_size):
    """(x, y) int64 tensors for window indices: window i is tokens [i*T, i*T + T + 1)."""
    rows = np.stack([data[i * block_size:i * block_size + block_size + 1] for i in windows]).astype(np.int64)
    rows = torch.from_numpy(rows)
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def get_lr(it, cfg):
    """Linear warmup from lr/warmup (non-zero at step 0), then cosine decay to min_lr_ratio * lr."""
    lr, decay_iters = cfg['learning_rate'], cfg['lr_decay_iters'] or cfg['max_iters']
    if it < cfg['warmup_iters']:
        return lr * (it + 1) / cfg['warmup_iters']
    progress = min(1.0, (it - cfg['warmup_iters']) / max(1, decay_iters - cfg['warmup_iters']))
    coeff = 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr * (cfg['min_lr_ratio'] + coeff * (1 - cfg['min_lr_ratio']))


def load_split(cfg, split):
    path = os.path.join(cfg['data_dir'], cfg['dataset'], f'{split}.bin')
    if not os.path.exists(path):
        how = {'tiny': 'python prepare.py --dataset tiny', 'fineweb_edu': 'python prepare.py'}.get(
            cfg['dataset'], f"python prepare.py --input 'your/files/*.jsonl' --name {cfg['dataset']}")
        raise SystemExit(f"no prepared data at {path}: run `{how}` first (or set --data_dir / --dataset)")
    return read_tokens(path)


# -----------------------------------------------------------------------------
# Checkpoints and logs: written to a temporary name, then renamed

def atomic_save(obj, path):
    torch.save(obj, path + '.tmp')
    os.replace(path + '.tmp', path)


def atomic_write_text(path, text):
    with open(path + '.tmp', 'w') as f:
        f.write(text)
    os.replace(path + '.tmp', path)


def git_commit():
    try:
        return subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True, timeout=5,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


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


def check_resumable(saved, cfg):
    """Refuse to resume a checkpoint whose model or data order differs from this configuration."""
    diff = {k: (saved.get(k), cfg[k]) for k in FROZEN_ON_RESUME if saved.get(k) != cfg[k]}
    if diff:
        lines = ', '.join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diff.items())
        raise SystemExit(f"cannot resume {cfg['out_dir']}/ckpt.pt: it was trained with another configuration "
                         f"({lines}). Use the checkpoint's values or another out_dir.")


# -----------------------------------------------------------------------------

def main(argv):
    cfg = configure(DEFAULTS, argv)
    cfg['out_dir'] = cfg['out_dir'].format(**cfg)

    # ---- processes and devices ----
    ddp = int(os.environ.get('RANK', -1)) != -1
    if ddp:
        rank, local_rank, world = int(os.environ['RANK']), int(os.environ['LOCAL_RANK']), int(os.environ['WORLD_SIZE'])
    else:
        rank, local_rank, world = 0, 0, 1
    dev = cfg['device']
    if dev == 'auto':
        dev = 'cuda' if torch.cuda.is_available() else 'mps' if torch.backends.mps.is_available() else 'cpu'
    if ddp and dev.startswith('cuda'):
        dev = f'cuda:{local_rank}'
        torch.cuda.set_device(dev)
    device_type = 'cuda' if dev.startswith('cuda') else dev
    if ddp:
        torch.distributed.init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo')
    master = rank == 0
    if device_type == 'cpu' and cfg['cpu_malloc_tuning']:
        tune_cpu_allocator()
    dt_name = cfg['dtype']
    if dt_name == 'auto':
        dt_name = ('bfloat16' if torch.cuda.is_bf16_supported() else 'float16') if device_type == 'cuda' else 'float32'
    ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dt_name]
    ctx = nullcontext() if ptdtype == torch.float32 else torch.autocast(device_type=device_type, dtype=ptdtype)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    # ---- batch arithmetic ----
    T, B = cfg['block_size'], cfg['batch_size']
    if cfg['total_batch_size'] % (B * T * world) != 0:
        raise SystemExit(f"total_batch_size={cfg['total_batch_size']} must be divisible by batch_size * block_size "
                         f"* world_size = {B} * {T} * {world}")
    grad_accum = cfg['total_batch_size'] // (B * T * world)
    windows_per_step = cfg['total_batch_size'] // T

    # ---- data ----
    train_data, val_data = load_split(cfg, 'train'), load_split(cfg, 'val')
    n_windows = (len(train_data) - 1) // T
    if n_windows < windows_per_step:
        raise SystemExit(f"train.bin holds {len(train_data)} tokens, fewer than one step of "
                         f"{cfg['total_batch_size']}: prepare more data or lower total_batch_size")
    n_eval = (len(val_data) - 1) // T
    if cfg['eval_tokens']:
        n_eval = min(n_eval, cfg['eval_tokens'] // T)
    if n_eval < 1:
        raise SystemExit(f"val.bin holds {len(val_data)} tokens, fewer than one block of {T}")

    # ---- model, optimizer, state ----
    os.makedirs(cfg['out_dir'], exist_ok=True)
    ckpt_path = os.path.join(cfg['out_dir'], 'ckpt.pt')
    log_path = os.path.join(cfg['out_dir'], 'log.jsonl')
    torch.manual_seed(cfg['seed'])  # the same on every rank: the initialisation is part of the pairing
    model = GPT(GPTConfig(vocab_size=50304, **{k: cfg[k] for k in MODEL_KEYS})).to(dev)
    optimizer = model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'],
                                           (cfg['beta1'], cfg['beta2']), device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=(ptdtype == torch.float16))
    step, best_val = 0, float('inf')
    if cfg['init_from'] == 'resume':
        if not os.path.exists(ckpt_path):
            raise SystemExit(f"init_from='resume' but there is no {ckpt_path}; start with init_from='scratch'")
        ckpt = torch.load(ckpt_path, map_location=dev, weights_only=False)
        check_resumable(ckpt['config'], cfg)
        model.load_state_dict(ckpt['model'])
        optimizer.load_state_dict(ckpt['optimizer'])
        scaler.load_state_dict(ckpt['scaler'])
        step, best_val = ckpt['step'], ckpt['best_val_loss']
        torch.set_rng_state(ckpt['rng']['torch'].cpu())
        np.random.set_state(ckpt['rng']['numpy'])
        random.setstate(ckpt['rng']['python'])
        if master and os.path.exists(log_path):  # forget what was logged after the checkpoint
            with open(log_path) as f:
                rows = [line for line in f if json.loads(line)['step'] <= step]
            atomic_write_text(log_path, ''.join(rows))
        del ckpt
    elif cfg['init_from'] != 'scratch':
        raise SystemExit(f"init_from must be 'scratch' or 'resume', got {cfg['init_from']!r}")
    elif master and os.path.exists(log_path):
        os.remove(log_path)  # a fresh run starts a fresh log
    raw_model = model                   # the plain module: checkpoints, routing diagnostics
    if cfg['compile']:
        model = torch.compile(model)
    eval_model = model                  # compiled if asked, without the DDP wrapper
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if device_type == 'cuda' else None)
    peak = cfg['peak_flops'] or detect_peak_flops(dev)

    if master:
        meta = dict(cfg, git_commit=git_commit(), torch_version=torch.__version__, world_size=world,
                    grad_accum=grad_accum, device_name=torch.cuda.get_device_name(dev) if device_type == 'cuda' else dev,
                    dtype_resolved=dt_name, n_params=raw_model.get_num_params(), train_tokens=len(train_data),
                    eval_windows=n_eval)
        atomic_write_text(os.path.join(cfg['out_dir'], 'config.json'), json.dumps(meta, indent=2) + '\n')
        print(json.dumps(meta, indent=2))
        print(f"{raw_model.get_num_params() / 1e6:.2f}M parameters | {grad_accum} micro-steps x {world} processes "
              f"x {B} x {T} = {cfg['total_batch_size']} tokens per step")

    def log(row):
        if master:
            with open(log_path, 'a') as f:
                f.write(json.dumps(row) + '\n')

    @torch.no_grad()
    def evaluate():
        """Mean NLL over the fixed validation windows; ranks split them and the sums are reduced."""
        model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=dev)  # (sum of losses, number of tokens)
        mine = list(range(rank, n_eval, world))
        for i in range(0, len(mine), cfg['eval_batch_size']):
            x, y = get_windows(val_data, mine[i:i + cfg['eval_batch_size']], T)
            with ctx:
                _, loss = eval_model(x.to(dev), y.to(dev))
            total += torch.tensor([loss.item() * y.numel(), y.numel()], dtype=torch.float64, device=dev)
        if ddp:
            torch.distributed.all_reduce(total)
        routing = None
        if cfg['log_routing'] and master and cfg['residual'] != 'standard':
            x, y = get_windows(val_data, list(range(min(cfg['eval_batch_size'], n_eval))), T)
            raw_model.record_routing = True
            with ctx:
                raw_model(x.to(dev), y.to(dev))
            raw_model.record_routing = False
            routing = dict(summary=routing_summary(raw_model.routing),
                           alpha=[dict(sublayer=r['sublayer'], layer=r['layer'], route=r['route'],
                                       alpha=[round(a, 5) for a in r['alpha'].tolist()]) for r in raw_model.routing])
        model.train()
        return (total[0] / total[1]).item(), routing

    def save_checkpoint():
        if master:
            atomic_save(dict(model=raw_model.state_dict(), optimizer=optimizer.state_dict(), scaler=scaler.state_dict(),
                             step=step, best_val_loss=best_val, config=cfg,
                             rng=dict(torch=torch.get_rng_state(), numpy=np.random.get_state(), python=random.getstate())),
                        ckpt_path)

    def diverged(what):
        raise SystemExit(f"non-finite {what} at step {step}: stopped without saving, so the last good checkpoint "
                         f"({ckpt_path}, if any) is kept. Start again with a lower learning_rate, more "
                         "warmup_iters or a grad_clip.")

    # ---- the loop ----
    resumed_at = step if cfg['init_from'] == 'resume' else None
    t_last, t_last_step = time.time(), step
    while True:
        if (step % cfg['eval_interval'] == 0 or step == cfg['max_iters']) and step != resumed_at:
            val_loss, routing = evaluate()
            if not math.isfinite(val_loss):
                diverged(f"validation loss {val_loss}")
            best_val = min(best_val, val_loss)
            if master:
                print(f"step {step}: val loss {val_loss:.4f}")
            log(dict(step=step, tokens=step * cfg['total_batch_size'], val_loss=val_loss, routing=routing))
            if cfg['eval_only']:
                break
            if step > 0 and (cfg['always_save_checkpoint'] or step == cfg['max_iters']):
                save_checkpoint()
            t_last, t_last_step = time.time(), step
        if step >= cfg['max_iters']:
            break

        lr = get_lr(step, cfg)
        for group in optimizer.param_groups:
            group['lr'] = lr
        windows = step_windows(step, n_windows, windows_per_step, cfg['seed'])
        mine = windows[rank * grad_accum * B:(rank + 1) * grad_accum * B]  # this rank's share of the step
        loss_sum = torch.zeros((), device=dev)
        for micro in range(grad_accum):
            x, y = get_windows(train_data, mine[micro * B:(micro + 1) * B], T)
            if device_type == 'cuda':
                x, y = x.pin_memory(), y.pin_memory()
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            if ddp:  # synchronise gradients on the last micro-step only
                model.require_backward_grad_sync = micro == grad_accum - 1
            with ctx:
                _, loss = model(x, y)
                loss = loss / grad_accum
            loss_sum += loss.detach()
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg['grad_clip'] or float('inf'))
        if not torch.isfinite(norm):
            diverged(f"training loss {loss_sum.item()}, gradient norm {norm.item()}")
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        step += 1

        if step % cfg['log_interval'] == 0 or step == cfg['max_iters']:
            if ddp:
                torch.distributed.all_reduce(loss_sum)
            train_loss = loss_sum.item() / world  # .item() also waits for the device, so dt below is real
            now = time.time()
            dt = (now - t_last) / (step - t_last_step)
            t_last, t_last_step = now, step
            tok_s = cfg['total_batch_size'] / dt
            mfu = raw_model.estimate_mfu(cfg['total_batch_size'] // world, dt, peak, T) if peak else None
            if master:
                print(f"step {step:5d} | loss {train_loss:.4f} | lr {lr:.2e} | norm {norm.item():.3f} | dt {dt * 1000:.0f}ms "
                      f"| tok/s {tok_s:,.0f} | mfu {'-' if mfu is None else f'{100 * mfu:.1f}%'}", flush=True)
            log(dict(step=step, tokens=step * cfg['total_batch_size'], train_loss=train_loss, lr=lr,
                     norm=norm.item(), dt=dt, tok_per_s=tok_s, mfu=mfu, data_hash=windows_hash(windows)))

    if ddp:
        torch.distributed.destroy_process_group()


if __name__ == '__main__':
    main(sys.argv[1:])
