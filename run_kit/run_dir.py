"""
A run's directory, for train.py: how a run claims its out_dir, starts or resumes in it, and what it
writes there while it trains. The files themselves (run.lock, config.json, log.jsonl, ckpt.pt), their
readers and writers, are run_files.py's (docs/run_safety.md).

An evaluation's row is appended only after its checkpoint is on disk, so a log that holds the
validation loss at max_iters means a finished run (run_files.is_finished). A resume rewinds the log to
the checkpoint's step: what was logged after it is trained again, bit-identically.
"""

import functools
import os
import secrets
import subprocess
import sys

from run_kit.common import DIGEST_START, FROZEN_ON_RESUME, detect_peak_flops, schedule_length, windows_digest
from run_kit.run_files import (CHECKPOINT, LOCK, LOG, RunFileError, append_log, check_tensors, existing_run,
                               killed_before_first_checkpoint, load_checkpoint, lock_out_dir, read_config, remove_run_files,
                               rewind_log, save_checkpoint, set_rng_states, stored_digest, write_config, write_failed,
                               is_finished, renamed_keys)


def fail(message, master=True):
    """Stop with a message. Under torchrun every rank usually meets the same error: only rank 0 says it."""
    raise SystemExit(message if master else 1)


def saved_config(out_dir):
    """out_dir/config.json, or None if there is none that train.py wrote."""
    try:
        return read_config(out_dir)
    except RunFileError:
        return None


def frozen_diff(then, cfg):
    """{key: (value then, value now)} for the keys that decide what a run's numbers mean (FROZEN_ON_RESUME)."""
    return {k: (then.get(k), cfg.get(k)) for k in FROZEN_ON_RESUME if k in then and then.get(k) != cfg.get(k)}


def describe_diff(diff, then, now):
    return ', '.join(f"{k}: {then} {a!r} vs {now} {b!r}" for k, (a, b) in diff.items())


def without_checkpoint(out_dir, found):
    """What out_dir holds when it has files of a run but no ckpt.pt, and the way on."""
    started = saved_config(out_dir)
    if started is None:
        return (f"{out_dir} holds files of a run without a readable config.json: {', '.join(found)}. Use another "
                "out_dir, or --init_from=scratch --overwrite=True to replace it.")
    if killed_before_first_checkpoint(out_dir, started):
        return (f"{out_dir} holds only the beginning of a run killed before its first checkpoint ({', '.join(found)}), "
                "nothing to resume. Start it again with --init_from=auto (same configuration) or replace it with "
                "--init_from=scratch --overwrite=True.")
    return (f"{out_dir} holds a run that got past its first checkpoint, but its ckpt.pt is gone ({', '.join(found)} "
            "are there): it cannot be continued, and starting it again would replace its log. To keep it, restore its "
            "ckpt.pt (or start the new run in another --out_dir); to replace it, --init_from=scratch --overwrite=True.")


def no_checkpoint(out_dir):
    found = existing_run(out_dir)
    return f"init_from='resume' but there is no {os.path.join(out_dir, CHECKPOINT)}" + (
        f": {without_checkpoint(out_dir, found)}" if found else "; start with --init_from=scratch (or auto)")


def hold_out_dir(out_dir, proc):
    """Hold out_dir (run.lock) on rank 0, or stop saying who holds it. Two runs started into one out_dir at
    the same moment would interleave their logs and overwrite each other's checkpoints: the second is
    refused, before it reads or writes anything there. Then what a run killed mid-write left is removed."""
    import torch
    master, holder = proc.master, None
    if master:
        try:
            holder = lock_out_dir(out_dir)
        except OSError as e:
            raise write_failed(os.path.join(out_dir, LOCK), e, "nothing was written", what=f"to {out_dir}",
                               then="run the same command again") from None
    if proc.ddp:   # every rank learns whether rank 0 got it
        busy = torch.tensor([int(holder is not None)], device=proc.device)
        torch.distributed.all_reduce(busy)
        holder = holder or ('another run' if busy.item() else None)
    if holder:
        fail(f"{out_dir} is in use by another run ({holder}). Two runs into one out_dir would mix their logs "
             "and checkpoints: wait for it to end, or use another --out_dir.", master)
    if master:   # (no other run can be writing them: we hold the lock)
        remove_run_files(out_dir, '.tmp')


def rank0_decides(decide, proc):
    """decide() on rank 0 alone, its answer (or its refusal) on every rank. Under torchrun each node may keep
    an out_dir of its own on a disk of its own: ranks that each looked at their own would start from different
    states (one resumes at step 800, another from scratch) and then diverge, or hang where their loops differ."""
    if not proc.ddp:
        return decide()
    import torch
    box = [None]
    if proc.master:
        try:
            box[0] = ('ok', decide())
        except SystemExit as e:
            box[0] = ('fail', e.code)
    torch.distributed.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == 'fail':
        raise SystemExit(value if proc.master else 1)
    return value


def claim_out_dir(cfg, proc):
    """Hold out_dir (a run that writes), then decide how this run starts in it; init_from is resolved to
    'scratch' or 'resume'. Rank 0 decides from its out_dir, for every rank (rank0_decides).
    scratch: never replaces a run by mistake, it needs an empty out_dir or --overwrite=True.
    resume:  needs out_dir/ckpt.pt (checked in resume()).
    auto:    resume when there is a checkpoint (a different run is refused there), start from scratch when
             out_dir holds no run, and start again from scratch when it holds only the beginning of this
             same run, killed before its first checkpoint (nothing trained is lost). Anything else (a
             finished run whose checkpoint is gone, say) is refused: only --overwrite removes a run's files.
    Returns whether every rank holds rank 0's checkpoint itself (checkpoint_copies; True from scratch)."""
    master, out_dir = proc.master, cfg['out_dir']
    has_ckpt = rank0_decides(lambda: os.path.exists(os.path.join(out_dir, CHECKPOINT)), proc)
    if cfg['init_from'] == 'resume' and not has_ckpt:
        fail(no_checkpoint(out_dir), master)   # (said before out_dir is made)
    # what writes holds out_dir: training, and eval_only from a checkpoint (it appends a row to the log)
    if not cfg['eval_only'] or (has_ckpt and cfg['init_from'] != 'scratch'):
        hold_out_dir(out_dir, proc)
    cfg['init_from'] = rank0_decides(lambda: how_to_start(cfg, has_ckpt, master), proc)
    return checkpoint_copies(out_dir, proc) if cfg['init_from'] == 'resume' else True


def how_to_start(cfg, has_ckpt, master):
    """'scratch' or 'resume' for claim_out_dir (rank 0), or a refusal; a scratch run's old files are removed."""
    out_dir = cfg['out_dir']
    found = existing_run(out_dir)
    if cfg['init_from'] == 'auto':
        if has_ckpt or not found or cfg['eval_only']:
            return 'resume' if has_ckpt else 'scratch'
        started = saved_config(out_dir)
        diff = frozen_diff(started or {}, dict(cfg, lr_decay_iters=schedule_length(cfg)))
        if diff:
            fail(f"{out_dir} holds a run with another configuration ({describe_diff(diff, 'that run', 'now')}). Use "
                 "another out_dir, or --init_from=scratch --overwrite=True to replace it.", master)
        if started is None or not killed_before_first_checkpoint(out_dir, started):
            fail(without_checkpoint(out_dir, found), master)
    elif cfg['init_from'] != 'scratch' or cfg['eval_only'] or not found:
        return cfg['init_from']
    elif not cfg['overwrite']:
        how = ("--init_from=resume (or auto)" if has_ckpt else
               "it has no checkpoint yet (killed before its first one): --init_from=auto starts it again"
               if killed_before_first_checkpoint(out_dir, saved_config(out_dir) or cfg) else
               "its ckpt.pt is gone, so it cannot be continued")
        fail(f"{out_dir} already holds a run: {', '.join(found)}. To continue it: {how}. To start a new run: "
             "another --out_dir. To replace it: --overwrite=True.", master)
    remove_run_files(out_dir)
    return 'scratch'


def checkpoint_copies(out_dir, proc):
    """Whether every rank's out_dir/ckpt.pt is rank 0's (the checksum stored in it; shared storage, or a copy
    on each node): then each rank reads its own, memory-mapped, so that the ranks of a node share one read of
    the file. Otherwise the ranks that hold no copy or another one get rank 0's checkpoint from it (resume)."""
    if not proc.ddp:
        return True
    import socket
    import torch
    mine = (socket.gethostname(), stored_digest(os.path.join(out_dir, CHECKPOINT)))
    every = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(every, mine)
    others = [f"rank {r} on {host} ({'another checkpoint' if digest else 'none'})"
              for r, (host, digest) in enumerate(every) if digest != every[0][1]]
    if others and proc.master:
        print(f"resuming from rank 0's {os.path.join(out_dir, CHECKPOINT)}; these ranks' out_dir holds another or no "
              f"ckpt.pt, so rank 0 sends them its checkpoint: {', '.join(others)}", flush=True)
    return not others


def resume(cfg, model, optimizer, scaler, proc, every_rank_has_it, step_windows):
    """Restore model, optimizer, scaler and RNG states from rank 0's out_dir/ckpt.pt (checksum and keys
    verified): read by every rank from its own copy, or sent by rank 0 where a rank's copy is missing or
    another (checkpoint_copies). Returns (step, best validation loss, the checkpoint's configuration, the
    run's data digest). The digest is the checkpoint's: what the run trained on. A checkpoint written before
    train.py kept one has none; its digest is then rebuilt from step_windows(s), the windows of step s, for
    every step before the checkpoint's (the order follows from frozen keys, so these are the windows it
    trained on unless the code of the order changed in between)."""
    master, ckpt_path = proc.master, os.path.join(cfg['out_dir'], CHECKPOINT)

    def load():
        if not os.path.exists(ckpt_path):
            fail(no_checkpoint(cfg['out_dir']), master)
        return load_checkpoint(ckpt_path)
    ckpt = load() if every_rank_has_it else rank0_decides(load, proc)
    resumed = dict(ckpt['config'])          # the configuration the checkpoint was written with
    resumed['lr_decay_iters'] = schedule_length(resumed)
    if not cfg['lr_decay_iters']:  # not given now: the schedule the run started with
        cfg['lr_decay_iters'] = resumed['lr_decay_iters']
    diff = frozen_diff(resumed, cfg)
    if diff:
        fail(f"cannot resume {ckpt_path}: it was trained with another configuration "
             f"({describe_diff(diff, 'checkpoint', 'now')}). Use the checkpoint's values or another out_dir.", master)
    ckpt['model'] = renamed_keys(model, ckpt['model'])   # a checkpoint of an older version: today's names
    check_tensors(model, {k: (tuple(t.shape), t.dtype) for k, t in ckpt['model'].items()}, ckpt_path)
    model.load_state_dict(ckpt['model'])
    optimizer.load_state_dict(ckpt['optimizer'])
    scaler.load_state_dict(ckpt['scaler'])
    set_rng_states(ckpt['rng'])
    digest = ckpt.get('data_digest')
    if digest is None:   # (one step's M windows at a time: no list of them all)
        digest = functools.reduce(windows_digest, map(step_windows, range(ckpt['step'])), DIGEST_START)
    return ckpt['step'], ckpt['best_val_loss'], resumed, digest


def world_sizes(before, step, world):
    """The numbers of processes a run has trained on, [{step, world_size}, ...] from the step each began: the
    resumed run's list (config.json of a run written before there was one: its world_size, from step 0), with
    this one added if it differs. A checkpoint of 2 processes resumed on 1 trains the same batches (the data
    order does not depend on it), but its timings and its numerics (the order of reductions) do."""
    sizes = list((before or {}).get('world_sizes') or
                 ([dict(step=0, world_size=before['world_size'])] if isinstance((before or {}).get('world_size'), int)
                  else []))
    if not sizes or sizes[-1].get('world_size') != world:
        sizes.append(dict(step=step, world_size=world))
    return sizes


def git_commit():
    try:
        return subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True, timeout=5,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


class RunRecord:
    """What rank 0 writes about a run, through run_files: config.json, log.jsonl (and Weights & Biases), the
    checkpoint. Other ranks get one that writes nothing."""

    def __init__(self, cfg, master):
        self.cfg, self.master, self.tracker = cfg, master, None
        self.log_path, self.ckpt_path = (os.path.join(cfg['out_dir'], n) for n in (LOG, CHECKPOINT))

    def start(self, step, resumed, proc, meta):
        """A run that trains: the log rewound to the checkpoint, the tracker started, config.json written."""
        import torch
        if not self.master:
            return
        if resumed:
            self.rewind(step)
        if self.cfg['wandb_log']:   # before config.json: the tracked run's id goes into it, so that a resume finds it
            self.tracker = start_wandb(self.cfg, resumed)
        write_config(self.cfg['out_dir'], dict(
            self.cfg, git_commit=git_commit(), torch_version=torch.__version__, world_size=proc.world,
            world_sizes=world_sizes(saved_config(self.cfg['out_dir']) if resumed else None, step, proc.world),
            device_name=torch.cuda.get_device_name(proc.device) if proc.device_type == 'cuda' else proc.device, **meta))

    def rewind(self, step):
        """The log up to the checkpoint's step: what was logged after it is trained again. Its rows are read
        (a bad line is a message) and written back whole (a torn last line set aside)."""
        if self.master and os.path.exists(self.log_path):
            rewind_log(self.log_path, step)

    def log(self, row):
        """Append a row to log.jsonl (and send it to the tracker)."""
        if not self.master:
            return
        append_log(self.log_path, row)
        if self.tracker is not None:
            self.tracker.log(wandb_row(row), step=row['step'])

    def save(self, state):
        if self.master:
            save_checkpoint(state, self.ckpt_path)

    def finish(self):
        if self.tracker is not None:
            self.tracker.finish()


# -----------------------------------------------------------------------------
# Weights & Biases (nanoGPT's wandb_log / wandb_project / wandb_run_name), imported only when on

def start_wandb(cfg, resumed):
    """One tracked run per training run: the arms of a comparison share a group (shape and budget),
    each is named after its out_dir and tagged with its mode and seed, so that pairs line up in the
    dashboard. The run's id is kept in config.json and the checkpoints: a resume continues it."""
    import wandb
    cfg['wandb_run_id'] = resumed.get('wandb_run_id') or secrets.token_hex(4)   # a new run's id: 8 hex digits
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
        elif key not in ('step', 'data_hash', 'data_digest', 'eval_only') and value is not None:
            out[f"train/{key}" if key != 'tokens' else key] = value
    return out


# -----------------------------------------------------------------------------
# The console

def format_duration(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def print_step(row, max_iters):
    """A log row as one console line: the mean of the steps since the previous line; mfu only where it is
    known (a GPU whose peak FLOP/s is known, or peak_flops; never the first interval, which holds compilation)."""
    mfu, norm = row['mfu'], row['norm']
    print(f"step {row['step']:5d} | loss {row['train_loss']:.4f} | lr {row['lr']:.2e} | "
          f"norm {norm if norm is not None else float('nan'):.3f} | dt {row['dt'] * 1000:.0f}ms | "
          f"tok/s {row['tok_per_s']:,.0f}" + ('' if mfu is None else f" | mfu {100 * mfu:.1f}%")
          + (f" | skipped {row['skipped_steps']}" if 'skipped_steps' in row else '')
          + f" | eta {format_duration((max_iters - row['step']) * row['dt'])} (recent pace)", flush=True)


def print_run_summary(cfg, model, grad_accum, proc, dt_name, train_tokens, n_eval, step):
    """A few lines that matter; the whole configuration is in out_dir/config.json."""
    import torch
    T = cfg['block_size']
    print(f"{cfg['residual']} | {cfg['n_layer']} layers x {cfg['n_embd']} ({cfg['n_head']} heads), "
          f"attnres_block_size {cfg['attnres_block_size']}, context {T} | "
          f"{model.get_num_params() / 1e6:.2f}M parameters | seed {cfg['seed']}")
    print(f"batch: {grad_accum} micro-steps x {proc.world} processes x {cfg['batch_size']} x {T} = "
          f"{cfg['total_batch_size']:,} tokens per step | {cfg['max_iters']} steps = "
          f"{cfg['max_iters'] * cfg['total_batch_size'] / 1e6:,.1f}M tokens | LR {cfg['learning_rate']:g}, "
          f"warmup {cfg['warmup_iters']}, schedule {cfg['lr_decay_iters']} steps")
    print(f"data: {cfg['data_dir']}/{cfg['dataset']} ({train_tokens:,} train tokens, {n_eval} validation windows) | "
          f"{proc.device}, {dt_name}{', compiled' if cfg['compile'] else ''}")
    if not cfg['eval_only']:
        peak = cfg['peak_flops'] or detect_peak_flops(proc.device)
        n = torch.get_num_threads()
        threads = f"{n} torch thread{'s' if n > 1 else ''} (cpu_threads) | " if proc.device_type == 'cpu' else ''
        print(f"{threads}step lines: the mean since the line before, eta at that pace (it follows the machine's "
              "load) | " + ("mfu: model FLOPs utilisation" if peak else
                            f"no mfu: no peak FLOP/s known for {proc.device} (set peak_flops to see it)"))
    print(f"eval_only: evaluates {'the checkpoint in ' + cfg['out_dir'] if step else 'the initialisation'} and "
          f"writes {'one eval_only row to log.jsonl' if step else 'nothing'}" if cfg['eval_only'] else
          f"writes to {cfg['out_dir']} (config.json, log.jsonl, ckpt.pt)"
          + (f" | resumed at step {step}" if step else ''), flush=True)
    sys.stdout.flush()


# -----------------------------------------------------------------------------
# What train.py does besides training: a run with nothing to train, a log step's row

def nothing_to_train(run, step, resumed):
    """eval_only, or a run already at max_iters: evaluate or say so. Returns the exit code, or None to train."""
    cfg = run.cfg
    if cfg['eval_only']:  # evaluate what there is (the checkpoint, or the initialisation), log, exit
        run.evaluate_log_save(step, float('inf'), False, resumed)
        return 0
    if resumed and step >= cfg['max_iters']:   # nothing to train: the record stays as it is
        if step == resumed['max_iters'] and not is_finished(cfg['out_dir']):   # killed between the final save and its row
            run.record.rewind(step)
            run.evaluate_log_save(step, float('inf'), False, resumed)
        elif run.proc.master:
            print(f"{cfg['out_dir']}: already finished at step {step} (max_iters={cfg['max_iters']}); nothing to "
                  "do, nothing written", flush=True)
        return 0
    return None


def step_row(step, cfg, proc, raw_model, loss_sum, norm, lr, dt, first_interval, peak, data_hash, data_digest,
             skips):
    """The log row of a log step (the one read-back of the device since the last one: the loss)."""
    import math
    import torch
    if proc.ddp:
        torch.distributed.all_reduce(loss_sum)
    train_loss = loss_sum.item() / proc.world   # .item() waits for the device, so dt is real
    mfu = (raw_model.estimate_mfu(cfg['total_batch_size'] // proc.world, dt, peak, cfg['block_size'])
           if peak and not first_interval else None)   # (the first interval includes torch.compile's compilation)
    norm_value = norm.item()
    return dict(step=step, tokens=step * cfg['total_batch_size'], train_loss=train_loss, lr=lr,
                norm=norm_value if math.isfinite(norm_value) else None, dt=dt, tok_per_s=cfg['total_batch_size'] / dt,
                mfu=mfu, data_hash=data_hash, data_digest=data_digest, **skips.log_fields())
