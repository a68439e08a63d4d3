"""
Train one arm of a paired comparison. One process:
    python train.py config/quickstart.py
DDP on 8 GPUs of one node (docs/training.md for several nodes):
    torchrun --standalone --nproc_per_node=8 train.py config/rd_343m.py --seed=2

Paired protocol (docs/training.md): for one `seed`, every arm gets the same initial values of the
parameters it shares with the others and sees the same batches in the same order. The data order is
one global sequence of training windows, a permutation keyed by the seed; step s uses windows
[s*W, (s+1)*W) of it (W = total_batch_size / block_size) and the ranks split them, so the order
depends neither on the number of processes nor on the micro-batch size.

This file is the loop. How a run claims its out_dir, resumes and records itself is in run_dir.py, the
files it keeps there (config.json, log.jsonl, checkpoints) in run_files.py; the checks around the loop
(the configuration, stop signals, Ctrl-C, divergence) are in run_control.py. On a GPU step the loop
never waits for the device; compiled calls see one shape.
"""

import inspect
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from common import (MODEL_KEYS, detect_peak_flops, get_windows, resolve_device, resolve_dtype, schedule_length,
                    step_windows, tune_cpu_allocator, windows_hash)
from configurator import configure
from model import GPT, GPTConfig
from routing import routing_summary
from run_control import (SkippedSteps, StopSignals, batch_arithmetic, check_in, ctrl_c, fix_schedule, open_data,
                         validate)
from run_dir import RunRecord, claim_out_dir, fail, print_run_summary, print_step, resume
from run_files import EXIT_STOPPED, is_finished, kept_checkpoint, rng_states

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
depth_read = 'plain'        # or 'two_phase': the same reads, computed per block (docs/performance.md)
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
cpu_malloc_tuning = True    # on CPU with glibc: keep big freed buffers in the heap (docs/performance.md)
DEFAULTS = {k: v for k, v in dict(globals()).items()
            if not k.startswith('_') and isinstance(v, (int, float, bool, str)) and k.islower()}


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
# Processes

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


def main(argv):
    cfg = configure(DEFAULTS, argv)
    validate(cfg)          # every key and the device, before anything is written
    procs = start_processes(cfg)
    try:
        with ctrl_c(cfg['out_dir']):   # a message, not a traceback, however many times it is pressed
            code = train(cfg, procs)
            if procs.ddp:
                # every rank leaves together: one that tears its process group down while rank 0 still writes
                # the last checkpoint can abort (gloo: SIGABRT), and torchrun then reports the run as failed
                torch.distributed.barrier()
    finally:
        # also on an error: a rank that leaves without this makes the others hang until NCCL times out
        if procs.ddp and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return code


# -----------------------------------------------------------------------------
# Evaluation and one training step

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


# -----------------------------------------------------------------------------
# The run

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
    claim_out_dir(cfg, procs)           # init_from is now 'scratch' or 'resume'
    record = RunRecord(cfg, master)

    torch.manual_seed(cfg['seed'])  # the same on every rank: the initialisation is part of the pairing
    config = GPTConfig(vocab_size=50304, depth_read=cfg['depth_read'], **{k: cfg[k] for k in MODEL_KEYS})
    model = GPT(config).to(procs.device)
    optimizer = model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'],
                                           (cfg['beta1'], cfg['beta2']), procs.device_type)
    scaler = torch.amp.GradScaler(procs.device_type, init_scale=cfg['fp16_init_scale'],
                                  enabled=(ptdtype == torch.float16))
    step, best_val, saved = 0, float('inf'), {}
    if cfg['init_from'] == 'resume':
        step, best_val, saved = resume(cfg, model, optimizer, scaler, master)
    fix_schedule(cfg, master)           # its length is fixed now and frozen for the rest of the run

    raw_model = model                   # the plain module: checkpoints, routing diagnostics
    if cfg['compile']:
        model = torch.compile(model, dynamic=False)   # one static shape per call: a new one is a visible recompile
    eval_model = model                  # compiled if asked, without the DDP wrapper
    if procs.ddp:
        # The only buffers are the constant rotary tables: never resent (torch >= 2.13 calls this
        # forward_sync_buffers=False, older releases broadcast_buffers=False). Gradients live in DDP's buckets.
        DDP = torch.nn.parallel.DistributedDataParallel
        no_buffer_sync = (dict(forward_sync_buffers=False) if 'forward_sync_buffers' in inspect.signature(DDP).parameters
                          else dict(broadcast_buffers=False))
        model = DDP(model, device_ids=[torch.device(procs.device)] if procs.device_type == 'cuda' else None,
                    gradient_as_bucket_view=True, **no_buffer_sync)
    peak = cfg['peak_flops'] or detect_peak_flops(procs.device)
    val_batches = eval_batches(n_eval, procs.rank, procs.world, cfg['eval_batch_size'])
    routing_windows = list(range(min(cfg['eval_batch_size'], n_eval)))  # the first validation batch
    first_nonfinite = torch.full((2,), -1, dtype=torch.int64, device=procs.device)  # see check_in

    def evaluate_log_save(checkpoint):
        """Evaluate at `step`; checkpoint if asked (after the ranks have checked that nothing diverged);
        then log, so that a logged evaluation always has its checkpoint on disk."""
        val_loss, routing = evaluate(eval_model, raw_model, val_data, val_batches, routing_windows, cfg, procs, ctx)
        if not math.isfinite(val_loss):
            fail(f"non-finite validation loss {val_loss} at step {step}: stopped without saving; "
                 f"{kept_checkpoint(record.ckpt_path)}", master)
        if master:
            print(f"step {step}: val loss {val_loss:.4f}" + (' (eval_only: nothing trained or saved)'
                                                             if cfg['eval_only'] else ''), flush=True)
        if checkpoint:
            save(min(best_val, val_loss))
        if saved or not cfg['eval_only']:   # eval_only from the initialisation writes nothing
            record.log(dict(step=step, tokens=step * cfg['total_batch_size'], val_loss=val_loss, routing=routing,
                            **(dict(eval_only=True) if cfg['eval_only'] else {})))
        return val_loss

    def save(best):
        check_in(first_nonfinite, False, step, record.ckpt_path, procs)
        record.save(dict(model=raw_model.state_dict(), optimizer=optimizer.state_dict(), scaler=scaler.state_dict(),
                         step=step, best_val_loss=best, config=cfg, rng=rng_states()))

    if master:
        print_run_summary(cfg, raw_model, grad_accum, procs, dt_name, len(train_data), n_eval, step)
    if cfg['eval_only']:  # evaluate what there is (the checkpoint, or the initialisation), log, exit
        evaluate_log_save(checkpoint=False)
        return 0
    if saved and step >= cfg['max_iters']:   # nothing to train: the record stays as it is
        if step == saved['max_iters'] and not is_finished(cfg['out_dir']):   # killed between the final save and its row
            record.rewind(step)
            evaluate_log_save(checkpoint=False)
        elif master:
            print(f"{cfg['out_dir']}: already finished at step {step} (max_iters={cfg['max_iters']}); nothing to "
                  "do, nothing written", flush=True)
        return 0
    record.start(step, saved, procs, dict(grad_accum=grad_accum, n_params=raw_model.get_num_params(),
                                          train_tokens=len(train_data), eval_windows=n_eval))
    stop = StopSignals()   # from here on SIGTERM / SIGUSR1 no longer kill the process: they checkpoint
    skips = SkippedSteps(scaler)
    try:
        if step == 0:                        # the curves start at the untrained model
            best_val = evaluate_log_save(checkpoint=False)
        start_step, t_last, t_last_step = step, time.time(), step
        while step < cfg['max_iters']:
            lr = get_lr(step, cfg)
            for group in optimizer.param_groups:
                group['lr'] = lr
            windows = step_windows(step, n_windows, windows_per_step, cfg['seed'])    # the whole step, all ranks
            mine = windows[procs.rank * grad_accum * B:(procs.rank + 1) * grad_accum * B]   # this rank's share
            skips.before()
            loss_sum, norm = train_step(step, model, raw_model, optimizer, scaler, train_data, mine, cfg, procs, ctx,
                                        first_nonfinite)
            skips.after(step, record.ckpt_path, master)
            step += 1

            stopping = False
            if step % cfg['log_interval'] == 0 or step == cfg['max_iters']:
                stopping = check_in(first_nonfinite, bool(stop.received), step, record.ckpt_path, procs)
                if procs.ddp:
                    torch.distributed.all_reduce(loss_sum)
                train_loss = loss_sum.item() / procs.world  # .item() waits for the device, so dt below is real
                now = time.time()
                dt = (now - t_last) / (step - t_last_step)
                first_interval = t_last_step == start_step  # includes torch.compile's compilation: no MFU
                t_last, t_last_step = now, step
                mfu = raw_model.estimate_mfu(cfg['total_batch_size'] // procs.world, dt, peak, T) \
                    if peak and not first_interval else None
                norm_value = norm.item()
                row = dict(step=step, tokens=step * cfg['total_batch_size'], train_loss=train_loss, lr=lr,
                           norm=norm_value if math.isfinite(norm_value) else None, dt=dt,
                           tok_per_s=cfg['total_batch_size'] / dt, mfu=mfu, data_hash=windows_hash(windows),
                           **skips.log_fields())
                if master:
                    print_step(row, cfg['max_iters'])
                record.log(row)
            if step % cfg['eval_interval'] == 0 or step == cfg['max_iters']:
                # a stop by signal always checkpoints, whatever always_save_checkpoint says: that is its point
                best_val = min(best_val, evaluate_log_save(
                    checkpoint=cfg['always_save_checkpoint'] or stopping or step == cfg['max_iters']))
                t_last, t_last_step = time.time(), step   # the evaluation's time is not training time
            elif stopping:
                save(best_val)
            if stopping and step < cfg['max_iters']:
                if master:   # (said once the checkpoint is on disk)
                    print(f"stopped by {stop.received[0] if stop.received else 'a signal to another rank'} at step "
                          f"{step}: checkpoint written to {record.ckpt_path}. To continue: the same command with "
                          f"--init_from=auto (or resume). Exit code {EXIT_STOPPED}.", flush=True)
                break
    finally:
        stop.restore()
        record.finish()
    return EXIT_STOPPED if step < cfg['max_iters'] else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
