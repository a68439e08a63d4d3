"""
A run's directory, for train.py: how a run claims its out_dir, starts or resumes in it, and what it
keeps there (docs/run_safety.md):

    out_dir/run.lock      held (flock) by the one process writing here, for its whole life
    out_dir/config.json   the run's whole configuration, written when it starts
    out_dir/log.jsonl     one JSON row per log step and per evaluation, appended
    out_dir/ckpt.pt       model, optimizer, scaler, RNG states and step, with a checksum

An evaluation's row is appended only after its checkpoint is on disk, so a log that holds the
validation loss at max_iters means a finished run (study.py reads it so). A resume rewinds the log to
the checkpoint's step: what was logged after it is trained again, bit-identically.
"""

import json
import os
import secrets
import subprocess
import sys

from common import (FROZEN_ON_RESUME, atomic_write_text, check_tensors, has_eval, load_checkpoint, lock_folder,
                    read_log, save_checkpoint, schedule_length, set_rng_states)

RUN_FILES = ('ckpt.pt', 'log.jsonl', 'config.json')
CHECKPOINT_KEYS = ('model', 'optimizer', 'scaler', 'step', 'best_val_loss', 'config', 'rng')
HELD_LOCKS = []   # the open lock files of this process: kept open, and so held, until it ends


def fail(message, master=True):
    """Stop with a message. Under torchrun every rank usually meets the same error: only rank 0 says it."""
    raise SystemExit(message if master else 1)


def existing_run(out_dir):
    """What a previous run left in out_dir (empty if nothing)."""
    return [f"{name} ({os.path.getsize(os.path.join(out_dir, name)):,} bytes)" for name in RUN_FILES
            if os.path.exists(os.path.join(out_dir, name))]


def remove_run_files(out_dir, suffix=''):
    for name in RUN_FILES:
        if os.path.exists(os.path.join(out_dir, name + suffix)):
            os.remove(os.path.join(out_dir, name + suffix))


def read_run_config(out_dir):
    """out_dir/config.json as a dict, or None if it is missing or unreadable."""
    try:
        with open(os.path.join(out_dir, 'config.json'), encoding='utf-8') as f:
            saved = json.load(f)
        return saved if isinstance(saved, dict) else None
    except (OSError, ValueError):
        return None


def frozen_diff(saved, cfg):
    """{key: (saved value, value now)} for the keys that decide what a run's numbers mean (FROZEN_ON_RESUME)."""
    return {k: (saved.get(k), cfg.get(k)) for k in FROZEN_ON_RESUME if k in saved and saved.get(k) != cfg.get(k)}


def describe_diff(diff, then, now):
    return ', '.join(f"{k}: {then} {a!r} vs {now} {b!r}" for k, (a, b) in diff.items())


def killed_before_first_checkpoint(out_dir, saved):
    """Whether out_dir's log is only the beginning of a run killed before its first checkpoint: no step
    logged at or past the step of its first checkpoint (its first evaluation, or max_iters)."""
    try:
        steps = [r['step'] for r in read_log(os.path.join(out_dir, 'log.jsonl'))]
    except FileNotFoundError:
        steps = []
    except (OSError, ValueError, TypeError, KeyError, SystemExit):
        return False
    try:
        first = saved['max_iters'] if not saved.get('always_save_checkpoint', True) else \
            min(saved['eval_interval'], saved['max_iters'])
    except (KeyError, TypeError):
        return False
    return all(s < first for s in steps)


def lock_out_dir(out_dir):
    """Hold out_dir for this process's whole life (a process that runs train.main again into the same
    out_dir, a notebook say, holds it already). Returns None, or a line saying who holds it."""
    path = os.path.abspath(os.path.join(out_dir, 'run.lock'))
    if any(os.path.abspath(held.name) == path and os.path.exists(path) and os.path.samefile(held.name, path)
           for held in HELD_LOCKS):
        return None
    f, holder = lock_folder(out_dir, 'run.lock')
    if f is not None:
        HELD_LOCKS.append(f)
    return holder


def claim_out_dir(cfg, procs):
    """Hold out_dir (a writing run), then decide how this run starts in it; init_from is resolved to
    'scratch' or 'resume'.
    scratch: never replaces a run by mistake, it needs an empty out_dir or --overwrite=True.
    resume:  needs out_dir/ckpt.pt (checked in resume()).
    auto:    resume when there is a checkpoint (a different run is refused there), start from scratch when
             out_dir holds no run, and start again from scratch when it holds only the beginning of this
             same run, killed before its first checkpoint (nothing trained is lost). Anything else (a
             finished run whose checkpoint is gone, say) is refused: only --overwrite removes a run's files."""
    import torch
    master, out_dir = procs.master, cfg['out_dir']
    if cfg['init_from'] == 'resume' and not os.path.exists(os.path.join(out_dir, 'ckpt.pt')):
        fail(no_checkpoint(out_dir), master)   # (said before out_dir is made)
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
            remove_run_files(out_dir, '.tmp')
    found = existing_run(out_dir)
    has_ckpt = os.path.exists(os.path.join(out_dir, 'ckpt.pt'))
    if cfg['init_from'] == 'auto':
        cfg['init_from'] = 'resume' if has_ckpt else 'scratch'
        if has_ckpt or not found or cfg['eval_only']:
            return
        started = read_run_config(out_dir)
        if started is not None and not all(isinstance(started.get(k), int) for k in ('max_iters', 'eval_interval')):
            started = None   # not a config.json of train.py
        diff = frozen_diff(started or {}, dict(cfg, lr_decay_iters=schedule_length(cfg)))
        if started is None or diff:
            what = (f"a run with another configuration ({describe_diff(diff, 'that run', 'now')})" if diff
                    else f"files of a run without a readable config.json: {', '.join(found)}")
            fail(f"{out_dir} holds {what}. Use another out_dir, or --init_from=scratch --overwrite=True to "
                 "replace it.", master)
        if not killed_before_first_checkpoint(out_dir, started):
            fail(f"{out_dir} holds a run that got past its first checkpoint, but its ckpt.pt is gone ({', '.join(found)} "
                 "are there): it cannot be continued, and starting it again would replace its log. To keep it, "
                 "restore its ckpt.pt (or start the new run in another --out_dir); to replace it, "
                 "--init_from=scratch --overwrite=True.", master)
    elif cfg['init_from'] != 'scratch' or cfg['eval_only'] or not found:
        return
    elif not cfg['overwrite']:
        how = ("--init_from=resume (or auto)" if has_ckpt else
               "it has no checkpoint yet (killed before its first one): --init_from=auto starts it again"
               if killed_before_first_checkpoint(out_dir, read_run_config(out_dir) or cfg) else
               "its ckpt.pt is gone, so it cannot be continued")
        fail(f"{out_dir} already holds a run: {', '.join(found)}. To continue it: {how}. To start a new run: "
             "another --out_dir. To replace it: --overwrite=True.", master)
    if master:
        remove_run_files(out_dir)


def no_checkpoint(out_dir):
    started = existing_run(out_dir)
    return f"init_from='resume' but there is no {os.path.join(out_dir, 'ckpt.pt')}" + (
        f": {out_dir} holds only the beginning of a run killed before its first checkpoint "
        f"({', '.join(started)}), nothing to resume. Start it again with --init_from=auto (same configuration) "
        "or replace it with --init_from=scratch --overwrite=True" if started
        else "; start with --init_from=scratch (or auto)")


def resume(cfg, model, optimizer, scaler, master):
    """Restore model, optimizer, scaler and RNG states from out_dir/ckpt.pt (checksum verified).
    Returns (step, best validation loss, the checkpoint's configuration)."""
    import torch
    ckpt_path = os.path.join(cfg['out_dir'], 'ckpt.pt')
    if not os.path.exists(ckpt_path):
        fail(no_checkpoint(cfg['out_dir']), master)
    ckpt = load_checkpoint(ckpt_path)
    missing = [k for k in CHECKPOINT_KEYS if k not in ckpt] + ([] if isinstance(ckpt.get('config'), dict) else ['config'])
    missing += [] if isinstance(ckpt.get('model'), dict) and all(isinstance(t, torch.Tensor) for t in ckpt['model'].values()) \
        else ['model']
    if missing:
        fail(f"{ckpt_path} is not a checkpoint of train.py: it lacks {', '.join(dict.fromkeys(missing))}. It was left "
             "as it is; resume from a copy, or start the run again in another out_dir.", master)
    saved = dict(ckpt['config'])
    saved['lr_decay_iters'] = schedule_length(saved)
    if not cfg['lr_decay_iters']:  # not given now: the schedule the run started with
        cfg['lr_decay_iters'] = saved['lr_decay_iters']
    diff = frozen_diff(saved, cfg)
    if diff:
        fail(f"cannot resume {ckpt_path}: it was trained with another configuration "
             f"({describe_diff(diff, 'checkpoint', 'now')}). Use the checkpoint's values or another out_dir.", master)
    check_tensors(model, {k: (tuple(t.shape), t.dtype) for k, t in ckpt['model'].items()}, ckpt_path)
    model.load_state_dict(ckpt['model'])
    optimizer.load_state_dict(ckpt['optimizer'])
    scaler.load_state_dict(ckpt['scaler'])
    set_rng_states(ckpt['rng'])
    return ckpt['step'], ckpt['best_val_loss'], saved


def logged_eval(cfg, step):
    """Whether out_dir's log holds the validation loss at `step`."""
    try:
        rows = read_log(os.path.join(cfg['out_dir'], 'log.jsonl'))
    except FileNotFoundError:
        return False
    return has_eval(rows, step)


def git_commit():
    try:
        return subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True, timeout=5,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def disk_failure(path, e, what):
    """A failed write as a message: what failed, what is kept, what to do."""
    import shutil
    folder = os.path.dirname(os.path.abspath(path))
    free = shutil.disk_usage(folder).free if os.path.isdir(folder) else 0
    return SystemExit(f"could not write {path} ({e.strerror or e}; {folder} has {free / 1e6:,.0f} MB free): {what}. "
                      "Make room, then continue with --init_from=auto.")


class RunRecord:
    """What rank 0 writes about a run: config.json, log.jsonl (and Weights & Biases), the checkpoint.
    Other ranks get one that writes nothing."""

    def __init__(self, cfg, master):
        self.cfg, self.master, self.tracker = cfg, master, None
        self.log_path, self.ckpt_path = (os.path.join(cfg['out_dir'], n) for n in ('log.jsonl', 'ckpt.pt'))

    def start(self, step, saved, procs, meta):
        """A run that trains: the log rewound to the checkpoint, the tracker started, config.json written."""
        import torch
        if not self.master:
            return
        if saved and os.path.exists(self.log_path):
            # forget what was logged after the checkpoint (and a line torn by a crash): it is trained again
            rows = [r for r in read_log(self.log_path) if r['step'] <= step]
            self.write_text(self.log_path, ''.join(json.dumps(r) + '\n' for r in rows))
        if self.cfg['wandb_log']:   # before config.json: the tracked run's id goes into it, so that a resume finds it
            self.tracker = start_wandb(self.cfg, saved)
        meta = dict(self.cfg, git_commit=git_commit(), torch_version=torch.__version__, world_size=procs.world,
                    device_name=torch.cuda.get_device_name(procs.device) if procs.device_type == 'cuda' else procs.device,
                    **meta)
        self.write_text(os.path.join(self.cfg['out_dir'], 'config.json'), json.dumps(meta, indent=2) + '\n')

    def write_text(self, path, text):
        try:
            atomic_write_text(path, text)
        except OSError as e:
            if os.path.exists(path + '.tmp'):
                os.remove(path + '.tmp')
            raise disk_failure(path, e, f"{os.path.basename(path)} is as it was") from None

    def log(self, row):
        """Append a row to log.jsonl (and send it to the tracker)."""
        if not self.master:
            return
        try:
            with open(self.log_path, 'a') as f:
                f.write(json.dumps(row) + '\n')
        except OSError as e:   # a torn last line is dropped by the next reader, and the resume rewinds past it
            raise disk_failure(self.log_path, e, f"the log of step {row['step']} may be cut short; the checkpoint "
                                                 f"{self.ckpt_path} is kept") from None
        if self.tracker is not None:
            self.tracker.log(wandb_row(row), step=row['step'])

    def save(self, state):
        if self.master:
            save_checkpoint(state, self.ckpt_path)

    def finish(self):
        if self.tracker is not None:
            self.tracker.finish()


def kept_checkpoint(ckpt_path):
    """What a run that stops without saving leaves behind, said as it is."""
    return (f"the last good checkpoint, {ckpt_path}, is kept" if os.path.exists(ckpt_path)
            else f"no checkpoint was written ({ckpt_path} does not exist)")


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
# The console

def format_duration(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def print_step(row, max_iters):
    """A log row as one console line."""
    mfu, norm = row['mfu'], row['norm']
    print(f"step {row['step']:5d} | loss {row['train_loss']:.4f} | lr {row['lr']:.2e} | "
          f"norm {norm if norm is not None else float('nan'):.3f} | dt {row['dt'] * 1000:.0f}ms | "
          f"tok/s {row['tok_per_s']:,.0f} | mfu {'-' if mfu is None else f'{100 * mfu:.1f}%'}"
          + (f" | skipped {row['skipped_steps']}" if 'skipped_steps' in row else '')
          + f" | eta {format_duration((max_iters - row['step']) * row['dt'])}", flush=True)


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
    sys.stdout.flush()
