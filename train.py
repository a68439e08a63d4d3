"""
Train one arm of a paired comparison. One process:
    python train.py config/quickstart.py
DDP on 8 GPUs of one node (docs/training.md for several nodes):
    torchrun --standalone --nproc_per_node=8 train.py config/rd_343m.py --seed=2

The paired protocol (docs/training.md, "Paired seeds"): for one `seed`, every arm starts from the same
values of the parameters it shares with the others and trains on the same windows at every step, on any
number of processes and with any micro-batch size that divides the batch. Its pieces (a bare name is here):
  - the initialisation: torch.manual_seed(seed) before the model is built (set_up_run), the same in every mode
  - window_order, step_windows: step s trains on windows [s*M, (s+1)*M) of the epochs' permutations in turn
    (count_windows, batch_arithmetic: n_windows, M); train gives each rank grad_accum * batch_size of them
  - get_windows (tensors); windows_hash, a step's fingerprint (data_hash), and windows_digest (data_digest)
  - the check: compare.pair_problem (the frozen keys, compare.FROZEN) and compare.data_problem (the digests)

Reading order: step_windows, train_step, train. Around the loop (run_kit/): run_dir.start_run, the one door to a
run; run_control (this process, the guards). Every collective of a training step is here: DDP's gradient
all-reduce; at log steps Run.agree_to_stop's and the loss's (a checkpoint adds run_control.ranks_agree's).
"""

from run_kit.common import ctrl_c_while_starting  # first: a Ctrl-C while torch loads is one line, exit 130
ctrl_c_while_starting(__name__, 'train.py')

import functools
import hashlib
import math
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass

from configurator import configure, exit_on_help
exit_on_help(__name__, __file__, "docs/training.md; README's Quickstart")   # -h/--help: the keys below, before torch loads
import numpy as np
import torch

# what the lesson is made of: the model and the data
from model import GPT
from prepare import read_dataset
from run_kit.common import build_model, fail, validate
# machinery a reader may skip: how a run starts and what it records (run_dir: the one door), the guards around
# the loop (run_control: signals, Ctrl-C, divergence, processes, devices), the run's files, the console, the checks
from fast_read.two_phase_read import compile_model
from run_kit import console, run_control, run_dir, run_files
from run_kit.routing import routing_of_batch

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
wandb_group = ''            # '' = the runs compare.py may pair: shape and budget, e.g. 12x768h12_1024ctx_3815steps
# data
dataset = 'tiny'            # data/<dataset>/{train,val}.bin, written by prepare.py
data_dir = 'data'
seed = 1                    # initialisation and data order: what pairs two arms
total_batch_size = 2 ** 19  # tokens per optimizer step, over all processes and micro-steps
batch_size = 16             # micro-batch size per process
block_size = 1024
# model
n_layer = 12
n_head = 12
n_embd = 768
residual = 'rd_attnres'     # the method (GPTConfig's own default: 'standard')
attnres_block_size = 4
depth_read = 'plain'        # how the reads are computed: 'two_phase', 'fused' per AttnRes block, the same values
# optimizer: AdamW, linear warmup then cosine decay to min_lr_ratio * learning_rate
learning_rate = 6e-4
max_iters = 3815            # optimizer steps (nanoGPT's iters)
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
ddp_timeout = 1800          # seconds a rank waits for the others at a collective (rank 0's checkpoint save)
peak_flops = 0.0            # for MFU; 0 = detect from the GPU's name (none on CPU)
cpu_malloc_tuning = True    # on CPU with glibc: keep big freed buffers in the heap (docs/performance.md)
cpu_threads = 0             # on CPU: torch's threads, 0 = one per core (small models: 1, docs/performance.md)
DEFAULTS = {k: v for k, v in dict(globals()).items()
            if not k.startswith('_') and isinstance(v, (int, float, bool, str)) and k.islower()}


# -----------------------------------------------------------------------------
# The paired data order: one global sequence of training windows, drawn from the seed. A window is
# block_size + 1 consecutive tokens of train.bin; M windows (all ranks together) make one optimizer step.

@functools.lru_cache(maxsize=2)  # a step spans at most two epochs: each permutation is built once
def window_order(n_windows, seed, epoch):
    """The permutation of training windows for one pass over the data, seeded by (seed, epoch)."""
    order = np.random.default_rng([seed, epoch]).permutation(n_windows)
    order.flags.writeable = False  # shared by every step of the epoch
    return order


def step_windows(step, n_windows, windows_per_step, seed):
    """Indices of the windows that optimizer step `step` trains on, a list of ints in order, all ranks
    together: the slice [step * M, (step + 1) * M) of the endless sequence of epochs, M = windows_per_step.
    It depends on nothing but the seed, the step, the number of training windows and M, so every arm of a
    seed, on any number of processes and with any micro-batch size that divides the batch, trains on the same
    windows at each step."""
    ### BEGIN SOLUTION 4
    first = step * windows_per_step
    out = []
    while len(out) < windows_per_step:
        epoch, offset = divmod(first + len(out), n_windows)
        out.extend(window_order(n_windows, seed, epoch)[offset:offset + windows_per_step - len(out)].tolist())
    ### END SOLUTION
    return out


def get_windows(data, windows, block_size):
    """(x, y) int64 token ids for window indices (nanoGPT's get_batch; not model.py's x): window i is tokens
    [i*T, i*T + T + 1), y is x shifted by one. Index -1 is a padding row (x = 0, y = -1: cross_entropy's
    ignore_index, never scored)."""
    rows = np.full((len(windows), block_size + 1), -1, dtype=np.int64)
    for r, i in enumerate(windows):
        if i >= 0:
            rows[r] = data[i * block_size:i * block_size + block_size + 1]
    rows = torch.from_numpy(rows)
    return rows[:, :-1].clamp_min(0), rows[:, 1:].contiguous()


# A step's fingerprint, windows_hash (data_hash of the row after it), and the data digest, windows_digest chained
# over every step's windows since DIGEST_START (every row, the checkpoint): one digest at s = the same steps before s
DIGEST_START = '0' * 16


def windows_hash(windows):
    return hashlib.sha1(np.asarray(windows, dtype=np.int64).tobytes()).hexdigest()[:12]


def windows_digest(digest, windows):
    return hashlib.sha1(digest.encode() + np.asarray(windows, dtype=np.int64).tobytes()).hexdigest()[:16]


def batch_arithmetic(cfg, world, master):
    """(grad_accum, M): micro-steps per process, and windows per step (all ranks), M = total_batch_size /
    block_size. A total_batch_size that does not split into world x batch_size x block_size is refused."""
    T, B, total = cfg['block_size'], cfg['batch_size'], cfg['total_batch_size']
    if total % (B * T * world):
        fail(run_control.uneven_batch(total, B, T, world), master)   # (it names a batch_size that works)
    return total // (B * T * world), total // T


def count_windows(cfg, master, windows_per_step, train_data, val_data):
    """(n_windows, n_eval): train.bin's windows (window i: tokens [i*T, i*T + T + 1)) and those of val.bin's
    first eval_tokens, refused when there is not one step or one validation window."""
    T, tokens = cfg['block_size'], cfg['eval_tokens']
    n_windows, n_eval = (len(train_data) - 1) // T, min((len(val_data) - 1) // T, tokens // T if tokens else 1 << 62)
    if n_windows < windows_per_step or n_eval < 1:
        fail(run_control.too_few_windows(cfg, len(train_data), len(val_data), n_windows < windows_per_step), master)
    return n_windows, n_eval


# -----------------------------------------------------------------------------
# The validation batches and the LR schedule

def eval_batches(n_eval, rank, world, batch_size):
    """This rank's validation windows (rank, rank + world, ...) in whole batches of batch_size. Every
    rank gets the same number of batches, the last ones padded with -1, so that a compiled model sees
    one shape for evaluation (a ragged last batch would recompile it with a dynamic batch size)."""
    ours = list(range(rank, n_eval, world))
    n_batches = math.ceil(math.ceil(n_eval / world) / batch_size)
    ours += [-1] * (n_batches * batch_size - len(ours))
    return [ours[i:i + batch_size] for i in range(0, len(ours), batch_size)]


def get_lr(it, cfg):
    """Linear warmup from lr/warmup (non-zero at step 0), then cosine decay to min_lr_ratio * lr over
    lr_decay_iters steps; past the end of the schedule the LR stays at its final value."""
    lr, decay_iters = cfg['learning_rate'], cfg['lr_decay_iters']   # (fixed when the run started: run_dir.start_run)
    if it < cfg['warmup_iters']:
        return lr * (it + 1) / cfg['warmup_iters']
    progress = min(1.0, (it - cfg['warmup_iters']) / max(1, decay_iters - cfg['warmup_iters']))
    coeff = 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr * (cfg['min_lr_ratio'] + coeff * (1 - cfg['min_lr_ratio']))


def main(argv):
    cfg = configure(DEFAULTS, argv)
    validate(cfg)                               # every key, before anything is written
    proc = run_control.start_processes(cfg)     # this process: its device, precision, threads, process group
    try:
        with run_control.ctrl_c(cfg['out_dir']):   # a message, not a traceback, however many times it is pressed
            code = train(cfg, proc)
            if proc.ddp:   # every rank leaves together: one that leaves while rank 0 still writes the last
                torch.distributed.barrier()   # checkpoint can abort (gloo: SIGABRT), and torchrun reports a failure
    finally:
        run_control.leave_process_group(proc)   # also on an error
    return code


# -----------------------------------------------------------------------------
# Evaluation and one training step

@torch.no_grad()
def evaluate(compiled_model, raw_model, val_data, val_batches, routing_windows, cfg, proc, ctx):
    """Mean NLL over the fixed validation windows (ranks split them, the sums are reduced; one read-back at the
    end, not one per batch) and, on rank 0, the routing diagnostics of the windows routing_windows."""
    T, dev = cfg['block_size'], proc.device
    compiled_model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=dev)  # (sum of token losses, number of tokens)
    for windows in val_batches:
        x, y = (t.to(dev) for t in get_windows(val_data, windows, T))
        with ctx:
            _, loss = compiled_model(x, y)   # the mean over the scored tokens (padding has y = -1)
        n = (y != -1).sum().double()
        total += torch.stack([torch.where(n > 0, loss.double() * n, 0.0), n])
    if proc.ddp:
        torch.distributed.all_reduce(total)
    routing = None
    if cfg['log_routing'] and proc.master and cfg['residual'] != 'standard':
        x, y = get_windows(val_data, routing_windows, T)
        routing = routing_of_batch(raw_model, x.to(dev), y.to(dev), ctx)   # (the plain module: no graph to break)
    compiled_model.train()
    return (total[0] / total[1]).item(), routing


def train_step(step, run, data, rank_windows):
    """One optimizer step on this rank's windows (grad_accum micro-batches of batch_size). Returns the mean
    training loss and the gradient norm, both still on the device."""
    cfg, proc, model, optimizer, scaler = run.cfg, run.proc, run.model, run.optimizer, run.scaler
    T, B = cfg['block_size'], cfg['batch_size']
    grad_accum = len(rank_windows) // B
    loss_mean = torch.zeros((), device=proc.device)   # this rank's mean over the step's tokens
    for micro in range(grad_accum):
        x, y = get_windows(data, rank_windows[micro * B:(micro + 1) * B], T)
        if proc.device_type == 'cuda':   # pinned memory: the copy runs while the GPU works
            x, y = x.pin_memory(), y.pin_memory()
        x, y = x.to(proc.device, non_blocking=True), y.to(proc.device, non_blocking=True)
        if proc.ddp:   # all-reduce the gradients once per step, on the last micro-step, not after each one
            model.require_backward_grad_sync = micro == grad_accum - 1
        with run.ctx:
            _, loss = model(x, y)
            loss = loss / grad_accum   # a micro-batch's mean over its tokens: the summed gradients are the step mean's
        loss_mean += loss.detach()
        scaler.scale(loss).backward()     # float16: scaled up so that small gradients do not underflow
    scaler.unscale_(optimizer)            # (these scaler calls do nothing unless float16)
    norm = torch.nn.utils.clip_grad_norm_(run.raw_model.parameters(), cfg['grad_clip'] or float('inf'))
    # the divergence guard, on the device: the first non-finite loss / norm (float16: a norm is the scaler's business)
    run_control.note_nonfinite(run.first_nonfinite, step, loss_mean, norm, scaler.is_enabled())
    if scaler.is_enabled():
        scaler.step(optimizer)            # skipped if the gradients overflowed
        scaler.update()                   # ... and then the scale is halved
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_mean, norm


# -----------------------------------------------------------------------------
# The run

@dataclass(kw_only=True)
class Run:
    """What the loop works with. raw_model: the plain module (checkpoints, routing diagnostics; nanoGPT's
    name); compiled_model: raw_model compiled if asked (else raw_model itself), what evaluates; model: what
    trains (compiled_model, wrapped in DDP under torchrun)."""
    cfg: dict
    proc: object          # run_control.ThisProcess
    ctx: object
    raw_model: GPT
    compiled_model: object
    model: object
    optimizer: object
    scaler: object
    record: object        # run_dir.RunRecord: what rank 0 writes
    val_data: object
    val_batches: list
    routing_windows: list
    first_nonfinite: torch.Tensor   # (loss, norm) steps, then values: the first non-finite on this rank, -1 = never
    data_digest: str                # every step's windows so far (windows_digest)

    def agree_to_stop(self, step, stop_requested):
        """One all-reduce, where the loop reads the device anyway: stop (recorded) if any rank's loss or norm went
        non-finite; whether any rank got a stop signal (then all of them stop at this step)."""
        flags = torch.cat([self.first_nonfinite, self.first_nonfinite.new_tensor([int(stop_requested)])])
        if self.proc.ddp:
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        return run_control.should_stop(flags.tolist(), step, self.record.ckpt_path, self.proc.master)

    def evaluate_log_save(self, step, best_val, checkpoint, resumed):
        """Evaluate at `step`; checkpoint if asked (after the ranks have checked that nothing diverged);
        then log, so that a logged evaluation always has its checkpoint on disk. Returns the loss."""
        cfg, master = self.cfg, self.proc.master
        val_loss, routing = evaluate(self.compiled_model, self.raw_model, self.val_data, self.val_batches,
                                     self.routing_windows, cfg, self.proc, self.ctx)
        if not math.isfinite(val_loss):   # (recorded in the log as a divergence: a result, for study.py)
            run_control.stop_val_loss_diverged(val_loss, step, self.record.ckpt_path, master)
        if master:
            print(f"step {step}: val loss {val_loss:.4f}" + (' (eval_only: nothing trained or saved)'
                                                             if cfg['eval_only'] else ''), flush=True)
        if checkpoint:
            self.save(step, min(best_val, val_loss))
        if resumed or not cfg['eval_only']:   # eval_only from the initialisation writes nothing
            self.record.log(dict(step=step, tokens=step * cfg['total_batch_size'], val_loss=val_loss, routing=routing,
                                 data_digest=self.data_digest, **(dict(eval_only=True) if cfg['eval_only'] else {})))
        return val_loss

    def save(self, step, best):
        self.agree_to_stop(step, False)
        run_control.ranks_agree(self.raw_model, step, self.proc)   # (under DDP, one all_gather: rank 0's parameters?)
        self.record.save(dict(model=self.raw_model.state_dict(), optimizer=self.optimizer.state_dict(),
                              scaler=self.scaler.state_dict(), step=step, best_val_loss=best, config=self.cfg,
                              rng=run_files.rng_states(), data_digest=self.data_digest))


def set_up_run(cfg, proc):
    """Everything before the first step: the data and its arithmetic, the model built (the pairing's initialisation),
    run_dir.start_run, compiled, wrapped. Returns the run, where it starts (run_dir.Start) and the arithmetic."""
    ctx = nullcontext() if proc.dtype == torch.float32 else torch.autocast(device_type=proc.device_type, dtype=proc.dtype)
    grad_accum, windows_per_step = batch_arithmetic(cfg, proc.world, proc.master)
    train_data, val_data, cfg['data_id'] = read_dataset(cfg['data_dir'], cfg['dataset'])   # verified (prepare.py)
    n_windows, n_eval = count_windows(cfg, proc.master, windows_per_step, train_data, val_data)

    torch.manual_seed(cfg['seed'])  # the same on every rank: the initialisation is part of the pairing
    raw_model = build_model(cfg).to(proc.device)   # GPT, or TwoPhaseGPT / FusedGPT (depth_read)
    optimizer = raw_model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'], (cfg['beta1'], cfg['beta2']),
                                               proc.device_type)
    scaler = torch.amp.GradScaler(proc.device_type, init_scale=cfg['fp16_init_scale'], enabled=proc.dtype == torch.float16)
    digest_at = lambda step: functools.reduce(   # the digest of steps 0 .. step-1, rebuilt from the order
        windows_digest, (step_windows(s, n_windows, windows_per_step, cfg['seed']) for s in range(step)), DIGEST_START)
    start = run_dir.start_run(cfg, proc, raw_model, optimizer, scaler, digest_at,
                              dict(grad_accum=grad_accum, train_tokens=len(train_data), eval_windows=n_eval))
    # compile: two_phase, one region per AttnRes block, else the whole model (docs/performance.md)
    compiled_model = compile_model(raw_model) if cfg['compile'] else raw_model
    run = Run(cfg=cfg, proc=proc, ctx=ctx, raw_model=raw_model, compiled_model=compiled_model,
              model=run_control.wrap_ddp(compiled_model, proc), optimizer=optimizer, scaler=scaler, record=start.record,
              val_data=val_data, val_batches=eval_batches(n_eval, proc.rank, proc.world, cfg['eval_batch_size']),
              routing_windows=list(range(min(cfg['eval_batch_size'], n_eval))),   # the routing: the first val batch
              first_nonfinite=torch.full((4,), -1, dtype=torch.int64, device=proc.device), data_digest=start.data_digest)
    return run, start, (train_data, n_windows, windows_per_step, grad_accum)


def train(cfg, proc):
    """Train (or evaluate) one run. Returns the process's exit code: 0, or EXIT_STOPPED after a signal."""
    run, start, (train_data, n_windows, windows_per_step, grad_accum) = set_up_run(cfg, proc)
    step, best_val, resumed, B, T = start.step, start.best_val, start.resumed, cfg['batch_size'], cfg['block_size']
    if start.todo != 'train':   # eval_only, or a finished run (its final row, if a kill came before it)
        if start.todo == 'evaluate':
            run.evaluate_log_save(step, float('inf'), False, resumed)
        return 0
    stop, skips = run_control.StopSignals(), run_control.SkippedSteps(run.scaler)   # (signals now checkpoint)
    try:
        if step == 0:                        # the curves start at the untrained model
            best_val = run.evaluate_log_save(step, best_val, False, resumed)
        start_step, t_last, t_last_step = step, time.time(), step
        while step < cfg['max_iters']:
            lr = get_lr(step, cfg)
            for group in run.optimizer.param_groups:
                group['lr'] = lr
            # the paired data order: the step's M windows (the same for every arm and world size), then this rank's
            windows = step_windows(step, n_windows, windows_per_step, cfg['seed'])
            run.data_digest = windows_digest(run.data_digest, windows)   # chained with every step's before
            rank_windows = windows[proc.rank * grad_accum * B:(proc.rank + 1) * grad_accum * B]
            loss_mean, norm = train_step(step, run, train_data, rank_windows)
            skips.after(step, run.record.ckpt_path, proc.master)
            step += 1                          # from here: steps done (a row `step N` comes after N steps)

            stopping = False
            if step % cfg['log_interval'] == 0 or step == cfg['max_iters']:
                stopping = run.agree_to_stop(step, bool(stop.received))   # (reads the device: dt below is real)
                if proc.ddp:
                    torch.distributed.all_reduce(loss_mean)   # the sum of the ranks' means (divided below)
                t_now = time.time()
                dt, norm_value = (t_now - t_last) / (step - t_last_step), norm.item()
                mfu = (run.raw_model.estimate_mfu(cfg['total_batch_size'] // proc.world, dt, proc.peak_flops, T) if
                       proc.peak_flops and t_last_step != start_step else None)   # (the first interval: compilation)
                row = dict(step=step, tokens=step * cfg['total_batch_size'], train_loss=loss_mean.item() / proc.world,
                           lr=lr, norm=norm_value if math.isfinite(norm_value) else None, dt=dt,
                           tok_per_s=cfg['total_batch_size'] / dt, mfu=mfu, data_hash=windows_hash(windows),
                           data_digest=run.data_digest, **skips.log_fields())
                t_last, t_last_step = t_now, step
                if proc.master:
                    console.print_step(row, cfg['max_iters'])
                run.record.log(row)
            if step % cfg['eval_interval'] == 0 or step == cfg['max_iters']:
                # a stop by signal always checkpoints, whatever always_save_checkpoint says: that is its point
                best_val = min(best_val, run.evaluate_log_save(
                    step, best_val, run_dir.saves_checkpoint(step, cfg) or stopping, resumed))
                t_last, t_last_step = time.time(), step   # the evaluation's time is not training time
            elif stopping:
                run.save(step, best_val)
            if stopping and step < cfg['max_iters']:
                if proc.master:   # (said once the checkpoint is on disk)
                    print(stop.stopped_at(step, run.record.ckpt_path), flush=True)
                break
    finally:
        stop.restore()
        run.record.finish()
    return run_files.EXIT_STOPPED if step < cfg['max_iters'] else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
