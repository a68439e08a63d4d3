"""
A run's start and its record, for train.py. start_run is the one door to a run: it claims the out_dir,
reads and checks the checkpoint, loads it, fixes the schedule, says what is left to do and begins the
record, in that order. The files it reads and writes there (run.lock, config.json, log.jsonl, ckpt.pt)
are run_files.py's formats (docs/run_safety.md).

An evaluation's row is appended only after its checkpoint is on disk, so a log that holds the
validation loss at max_iters means a finished run (is_finished). A resume rewinds the log to
the checkpoint's step: what was logged after it is trained again, on the same windows (bit-identically
on the CPU; on a GPU within what its kernels' nondeterminism allows, docs/gpus.md).
"""

import os
import secrets
import subprocess
from dataclasses import dataclass

from run_kit.common import FROZEN_ON_RESUME, fail, group_name
from run_kit.console import print_run_summary
from run_kit.run_files import (CHECKPOINT, LOCK, LOG, RUN_FILES, TORN, RunFileError, append_log, check_tensors,
                               checkpoint_progress, load_checkpoint, lock_out_dir, logged_evals, read_config, read_log,
                               remove_run_files, renamed_keys, rewind_log, save_checkpoint, saved_config, schedule_length,
                               set_rng_states, stored_digest, unknown_entries, world_sizes, write_config, write_failed)


@dataclass
class Start:
    """Where a run starts (start_run) and what is left to do there."""
    step: int           # the checkpoint's step; 0 from scratch
    best_val: float     # the best validation loss so far
    resumed: dict       # the checkpoint's configuration; {} from scratch
    data_digest: str    # every step's windows before `step` (train.windows_digest)
    record: object      # RunRecord: what rank 0 writes
    todo: str           # 'train'; 'evaluate' (eval_only, or the final row of a run killed before writing it); 'finished'


def start_run(cfg, proc, model, optimizer, scaler, digest_at, meta):
    """Start or resume the run of cfg in cfg['out_dir'], read top to bottom. model, optimizer and scaler are
    built by train.py (the seeded initialisation); digest_at(step) is the data digest of steps 0 .. step-1 from
    its data order; meta what the console and config.json say of the batch and data (grad_accum, train_tokens,
    eval_windows). Every refusal is a message before any of the run's files is changed or removed."""
    master, out_dir, ckpt_path = proc.master, cfg['out_dir'], os.path.join(cfg['out_dir'], CHECKPOINT)
    record, commit = RunRecord(cfg, master), git_commit() if master else None   # (what the record will say)

    # 1. claim the out_dir: rank 0 looks, holds the lock if the run writes, and decides scratch or resume
    has_ckpt = rank0_decides(lambda: os.path.exists(ckpt_path), proc)
    if cfg['init_from'] == 'resume' and not has_ckpt:
        fail(no_checkpoint(out_dir), master)   # (said before out_dir is made)
    if not cfg['eval_only'] or (has_ckpt and cfg['init_from'] != 'scratch'):   # eval_only of a checkpoint appends a row
        hold_out_dir(out_dir, proc)
    how, started, refusal = rank0_decides(lambda: how_to_start(cfg, has_ckpt), proc)
    cfg['init_from'] = how   # (recorded as it was resolved: 'auto' is scratch or resume)

    # 2. read the checkpoint: each rank its own copy where every rank's is rank 0's, else rank 0's, sent to all
    ckpt = None
    if how == 'resume':
        read = lambda: load_checkpoint(ckpt_path)
        ckpt = read() if checkpoint_copies(out_dir, proc) else rank0_decides(read, proc)
        started = dict(ckpt['config'])
        if unknown_entries(ckpt) and not cfg['eval_only']:   # (another version's state: resumed without it, the
            # run might not continue exactly; an evaluation reads only the weights)
            fail(f"cannot resume {ckpt_path}: it holds entries this train.py does not know "
                 f"({', '.join(unknown_entries(ckpt))}), written by another version of train.py or edited, and a "
                 "resume without them may not continue the run exactly. Resume it with the version that wrote it, "
                 "or start the run again in another out_dir; sample.py and intervene.py read its weights as they "
                 "are.", master)

    # 3. fix the LR schedule's length (a resume keeps the checkpoint's unless given), then refuse a run whose frozen
    # settings changed: a resume, or a run killed before its first checkpoint started again (one check)
    cfg['lr_decay_iters'] = (cfg['lr_decay_iters'] or started['lr_decay_iters']) if ckpt else schedule_length(cfg)
    changed = {k: (started.get(k), cfg.get(k)) for k in FROZEN_ON_RESUME
               if started and k in started and started.get(k) != cfg.get(k)}
    if changed and ckpt:
        fail(f"cannot resume {ckpt_path}: it was trained with another configuration "
             f"({describe_diff(changed, 'checkpoint', 'now')}). Use the checkpoint's values or another out_dir.", master)
    if changed:
        fail(f"{out_dir} holds a run with another configuration ({describe_diff(changed, 'that run', 'now')}). Use "
             "another out_dir, or --init_from=scratch --overwrite=True to replace it.", master)
    if refusal:
        fail(refusal, master)
    if cfg['max_iters'] > cfg['lr_decay_iters'] and not cfg['train_past_schedule'] and not cfg['eval_only']:
        fail(f"max_iters={cfg['max_iters']} runs past the end of the LR schedule (lr_decay_iters="
             f"{cfg['lr_decay_iters']}): the extra steps would train at the final LR. If that is what you "
             "want, add --train_past_schedule=True.", master)
    if how == 'scratch' and not cfg['eval_only'] and master:   # (a scratch run replaces what out_dir held)
        remove_run_files(out_dir)

    # 4. load: weights (checked against the model first), optimizer, scaler, random states, the data digest
    step, best_val, digest = 0, float('inf'), None
    if ckpt:
        ckpt['model'] = renamed_keys(model, ckpt['model'])   # a checkpoint of an older version: today's names
        check_tensors(model, {k: (tuple(t.shape), t.dtype) for k, t in ckpt['model'].items()}, ckpt_path)
        model.load_state_dict(ckpt['model'])
        optimizer.load_state_dict(ckpt['optimizer'])
        scaler.load_state_dict(ckpt['scaler'])
        set_rng_states(ckpt['rng'])
        step, best_val, digest = ckpt['step'], ckpt['best_val_loss'], ckpt.get('data_digest')
    if digest is None:   # from scratch, or a checkpoint written before runs kept one: from the order
        digest = digest_at(step)

    # 5. what is left to do
    resumed, todo, killed = (started if ckpt else {}), ('evaluate' if cfg['eval_only'] else 'train'), False
    if ckpt and not cfg['eval_only'] and step >= cfg['max_iters']:   # nothing to train: the record stays as it is
        killed = step == started['max_iters'] and not rank0_decides(lambda: is_finished(out_dir), proc)   # (rank 0's
        # disk decides for every rank) killed between the final save and its row
        todo = 'evaluate' if killed else 'finished'

    # 6. begin the record (rank 0): the log rewound to the checkpoint (what was logged after it is trained, or
    # evaluated, again; its rows are read, a bad line is a message, and written back whole, a torn last line set
    # aside); for a run that trains, wandb and config.json with the world sizes so far; then say it
    if master and resumed and (todo == 'train' or killed) and os.path.exists(record.log_path):
        rewind_log(record.log_path, step)
    if master and todo == 'train':
        import torch
        sizes = world_sizes(saved_config(out_dir) if resumed else None, step, proc.world)
        if cfg['wandb_log']:   # before config.json: the tracked run's id goes into it, so that a resume finds it
            record.tracker = start_wandb(cfg, resumed)
        write_config(out_dir, dict(
            cfg, git_commit=commit, torch_version=torch.__version__, world_size=proc.world, world_sizes=sizes,
            **meta, n_params=model.get_num_params(),
            device_name=torch.cuda.get_device_name(proc.device) if proc.device_type == 'cuda' else proc.device))
    if master:
        print_run_summary(cfg, model, meta['grad_accum'], proc, cfg['dtype_resolved'], meta['train_tokens'],
                          meta['eval_windows'], step, proc.peak_flops)
        if todo == 'finished':
            print(f"{out_dir}: already finished at step {step} (max_iters={cfg['max_iters']}); nothing to do, "
                  "nothing written", flush=True)
    return Start(step=step, best_val=best_val, resumed=resumed, data_digest=digest, record=record, todo=todo)


# -----------------------------------------------------------------------------
# What out_dir holds

def existing_run(out_dir):
    """What a run left in out_dir, with sizes (empty if nothing)."""
    return [f"{name} ({os.path.getsize(os.path.join(out_dir, name)):,} bytes)" for name in (*RUN_FILES, TORN)
            if os.path.exists(os.path.join(out_dir, name))]


def is_finished(out_dir):
    """A run is finished when its log holds the validation loss at its last step (config.json's max_iters):
    train.py logs that row only once the final checkpoint is on disk. Where a checkpoint is there, it must
    say the same (a log written by an older train.py, which logged the row first, can claim a save that
    failed). study.py skips a finished run; train.py completes one whose final row is missing."""
    try:
        max_iters = read_config(out_dir)['max_iters']
        logged = max_iters in logged_evals(read_log(os.path.join(out_dir, LOG)))
    except (OSError, RunFileError, SystemExit):
        return False
    ckpt = os.path.join(out_dir, CHECKPOINT)
    return logged and (not os.path.exists(ckpt) or checkpoint_progress(ckpt) == (max_iters, max_iters))


def saves_checkpoint(step, cfg):
    """Whether the loop checkpoints at an evaluation step when no stop signal came (train.py): at every
    evaluation with always_save_checkpoint, else at the last step only."""
    return step == cfg['max_iters'] or bool(cfg.get('always_save_checkpoint', True) and step % cfg['eval_interval'] == 0)


def killed_before_first_checkpoint(out_dir, config):
    """Whether out_dir's log is only the beginning of a run (of `config`) killed (or stopped by a full disk or a
    divergence) before its first checkpoint: no step logged past the step of its first checkpoint (its first
    evaluation, or max_iters), and no evaluation at that step. Such a run can start again from scratch without
    losing anything trained."""
    try:
        rows = read_log(os.path.join(out_dir, LOG))
    except FileNotFoundError:
        rows = []
    except (OSError, SystemExit):
        return False
    try:
        first = next(s for s in (min(config['eval_interval'], config['max_iters']), config['max_iters'])
                     if saves_checkpoint(s, config))
    except (KeyError, TypeError, ZeroDivisionError):   # (a config.json from elsewhere: eval_interval 0)
        return False
    # At the first checkpoint's step the training row (and a divergence's row) is logged before the save, the
    # evaluation's row only after it: without that row, the save failed (a full disk) or never came.
    return all(r['step'] < first or (r['step'] == first and 'val_loss' not in r) for r in rows)


# -----------------------------------------------------------------------------
# The steps of start_run

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
    def hold():
        try:
            holder = lock_out_dir(out_dir)
        except OSError as e:
            raise write_failed(os.path.join(out_dir, LOCK), e, "nothing was written", what=f"to {out_dir}",
                               then="run the same command again") from None
        if holder:
            fail(f"{out_dir} is in use by another run ({holder}). Two runs into one out_dir would mix their logs "
                 "and checkpoints: wait for it to end, or use another --out_dir.")
        remove_run_files(out_dir, '.tmp')   # (no other run can be writing them: we hold the lock)
    rank0_decides(hold, proc)


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


def how_to_start(cfg, has_ckpt):
    """How the run starts in out_dir, on rank 0 (rank0_decides): (how, started, refusal). how is 'scratch' or
    'resume'; started is the configuration of a run found there without a checkpoint (auto; start_run refuses it
    if its frozen settings differ), refusal a message start_run raises after that check. init_from:
    scratch: never replaces a run by mistake, it needs an empty out_dir or --overwrite=True.
    resume:  needs out_dir/ckpt.pt (start_run has checked that it is there).
    auto:    resume when there is a checkpoint (a different run is refused there), start from scratch when
             out_dir holds no run, and start again from scratch when it holds only the beginning of this
             same run, killed before its first checkpoint (nothing trained is lost). Anything else (a
             finished run whose checkpoint is gone, say) is refused: only --overwrite removes a run's files."""
    out_dir, found = cfg['out_dir'], existing_run(cfg['out_dir'])
    if cfg['init_from'] == 'auto':
        if has_ckpt or not found or cfg['eval_only']:
            return ('resume' if has_ckpt else 'scratch'), None, None
        started = saved_config(out_dir)
        killed = started is not None and killed_before_first_checkpoint(out_dir, started)
        return 'scratch', started, None if killed else without_checkpoint(out_dir, found)
    if cfg['init_from'] == 'resume' or cfg['eval_only'] or not found or cfg['overwrite']:
        return cfg['init_from'], None, None
    how = ("--init_from=resume (or auto)" if has_ckpt else
           "it has no checkpoint yet (killed before its first one): --init_from=auto starts it again"
           if killed_before_first_checkpoint(out_dir, saved_config(out_dir) or cfg) else
           "its ckpt.pt is gone, so it cannot be continued")
    fail(f"{out_dir} already holds a run: {', '.join(found)}. To continue it: {how}. To start a new run: "
         "another --out_dir. To replace it: --overwrite=True.")


def checkpoint_copies(out_dir, proc):
    """Whether every rank's out_dir/ckpt.pt is rank 0's (the checksum stored in it; shared storage, or a copy
    on each node): then each rank reads its own, memory-mapped, so that the ranks of a node share one read of
    the file. Otherwise the ranks that hold no copy or another one get rank 0's checkpoint from it (start_run)."""
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


def git_commit():
    try:
        return subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True, timeout=5,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


class RunRecord:
    """What rank 0 writes as a run goes, through run_files: log.jsonl's rows (and Weights & Biases'), the
    checkpoints (start_run begins the record: the log rewound, config.json). Other ranks get one that writes
    nothing."""

    def __init__(self, cfg, master):
        self.cfg, self.master, self.tracker = cfg, master, None
        self.log_path, self.ckpt_path = (os.path.join(cfg['out_dir'], n) for n in (LOG, CHECKPOINT))

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
    group = cfg['wandb_group'] or group_name(cfg)
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
