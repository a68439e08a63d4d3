"""
The files of a run, each with one reader and one writer here; every other module asks this one
(docs/run_safety.md):

    out_dir/run.lock        held (flock) by the one process that writes here: lock_out_dir; under it,
                            remove_run_files (a scratch run's, or what a kill mid-write left)
    out_dir/config.json     the run's whole configuration: write_config / read_config, saved_config;
                            world_sizes (its record of the numbers of processes)
    out_dir/log.jsonl       one JSON row per log step and per evaluation: append_log, rewind_log / read_log
    out_dir/log.jsonl.torn  the torn last lines that the log's writer set aside before appending
    out_dir/ckpt.pt         model, optimizer, scaler, RNG states, step, with a checksum: save_checkpoint /
                            load_checkpoint, checkpoint_progress

Every whole file of a run, a build or a report is written by atomic_write: a temporary name, synced to
disk, then renamed, so that a reader (or a resumed run) sees the old file or the new one, never half of one. The
log is appended row by row instead: a line torn by a kill is dropped by its reader and set aside by its
writer before the next row. One message says that a write failed (write_failed). What state a run's
folder is in (finished, killed before its first checkpoint, what it holds) is run_dir.py's.

torch is imported inside the functions that need it: prepare.py (and its worker processes) and
study.py import this module and have no use for it.
"""

import errno
import hashlib
import json
import os
import shutil
import warnings

import numpy as np

from run_kit.common import gpt_config, model_problems

CONFIG, LOG, CHECKPOINT, LOCK = 'config.json', 'log.jsonl', 'ckpt.pt', 'run.lock'
FINAL = 'final.safetensors'   # a finished run's weights beside it (study.export_final; not committed), intervene.py reads them
TORN = LOG + '.torn'
RUN_FILES = (CHECKPOINT, LOG, CONFIG)   # the run's record (run.lock only says who writes here)
CHECKPOINT_KEYS = ('model', 'optimizer', 'scaler', 'step', 'best_val_loss', 'config', 'rng')
CHECKPOINT_OPTIONAL = ('data_digest',)   # (a checkpoint of an older train.py lacks it: the digest is recomputed)
# what a config.json must hold to be one that train.py wrote: the run can then be grouped, paired, labelled,
# and told finished or not
CONFIG_KEYS = {'residual': str, 'seed': int, 'max_iters': int, 'eval_interval': int, 'n_layer': int, 'n_head': int,
               'n_embd': int, 'block_size': int, 'total_batch_size': int}
# A run stopped by SIGTERM / SIGUSR1 writes its checkpoint and exits with this code (sysexits.h's EX_TEMPFAIL:
# "try again"); study.py and scripts/slurm_study.sh then run the same command again.
EXIT_STOPPED = 75
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)   # (EFBIG: a file size limit, as the tests cause it)
HELD_LOCKS = []   # the open lock files of this process: kept open, and so held, until it ends


class RunFileError(Exception):
    """A file of a run that cannot be read as what its name says; the message says why."""


# -----------------------------------------------------------------------------
# Writing a whole file, and what a failed write says

def atomic_write(path, data):
    """Write `data` (str, bytes, or a function that writes the file whose path it is given) to a temporary
    file of its own next to path, sync it to disk and rename it to path. On any failure, a full disk or a
    Ctrl-C alike, the temporary file is removed and the error raised again: path is then the old file, as it
    was. The temporary file is path.tmp, claimed exclusively; where another writer holds that name (two
    writers of one path at once), path.<pid>.<random>.tmp: two writers never write into one file."""
    claimed = []   # the temporary file's name, known before the file exists: a Ctrl-C can come at any point
    try:
        tmp = claim_temporary(path, claimed)
        if callable(data):
            data(tmp)
        else:
            with open(tmp, 'wb') as f:
                f.write(data.encode('utf-8') if isinstance(data, str) else data)
        sync_and_rename(tmp, path)
    except BaseException:
        for tmp in claimed:
            try:
                os.remove(tmp)
            except OSError:
                pass
        raise


def claim_temporary(path, claimed=None):
    """A new, empty file next to path that no other writer has: path.tmp if it is free (the name a reader
    of the folder knows as a write in progress), else path.<pid>.<random>.tmp. Created with O_EXCL, so two
    writers never share one. claimed (a list) is given each name before the file is created and loses it
    again if another writer has it: an interrupt that comes as the file is created, before its name is
    returned, still leaves the name with the caller, who removes the file."""
    import secrets
    claimed = [] if claimed is None else claimed
    for tmp in [path + '.tmp'] + [f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp" for _ in range(100)]:
        claimed.append(tmp)
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            claimed.pop()
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name next to {path}")


def sync_and_rename(tmp, path):
    """Rename a finished temporary file to its final name, its content synced to disk first, and the folder's
    entry after (without the syncs, a power cut soon after the rename can leave an empty file under the name)."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:   # a file system whose folders cannot be synced: the rename stands anyway
        pass


def free_bytes(path):
    """Free space where path is (or would be): its nearest folder that exists."""
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    return folder, shutil.disk_usage(folder).free


def write_failed(path, error, kept, what=None, need='', then='continue with --init_from=auto', elsewhere='an out_dir'):
    """A failed write as the message a user sees (a SystemExit to raise). A full disk, or a file size limit,
    says what failed, what is kept, what is needed and free, and what to do once there is room; anything
    else (no permission, a read-only file system, a file where a folder should be) says to write elsewhere.
    torch.save reports a failed write as a RuntimeError, without an errno: that is a full disk too."""
    what = what or path
    reason = getattr(error, 'strerror', None) or (str(error).strip().splitlines() or [type(error).__name__])[-1]
    code = getattr(error, 'errno', None)
    if code is not None and code not in DISK_FULL:
        return SystemExit(f"cannot write {what} ({reason}): {kept}. Choose {elsewhere} that this user can write to.")
    folder, free = free_bytes(path)
    return SystemExit(f"could not write {what} ({reason}): {kept}. {need + '; ' if need else ''}{folder} has "
                      f"{free / 1e6:,.0f} MB free. Make room, then {then}.")


def kept_checkpoint(ckpt_path):
    """What a run that stops without saving leaves behind, said as it is."""
    return (f"the last good checkpoint, {ckpt_path}, is kept" if os.path.exists(ckpt_path)
            else f"no checkpoint was written ({ckpt_path} does not exist)")


# -----------------------------------------------------------------------------
# The lock: one writer per folder

def lock_folder(folder, name):
    """Take an exclusive flock on folder/name, written with who holds it: (the open lock file, None), or
    (None, a line saying who holds it) when another process does. The kernel releases the lock when the
    file is closed or the process ends, however it ends: a crash leaves no stale lock. A write that fails
    (a full disk) leaves no lock file it created."""
    import fcntl
    import socket
    import sys
    import time
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    created = not os.path.exists(path)
    f = open(path, 'a+')
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or 'a process that has just started'
        f.close()
        return None, holder
    try:
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                f"{' '.join(sys.argv)}\n")
        f.flush()
    except OSError:
        if created:
            os.remove(path)
        try:
            f.close()
        except OSError:   # closing flushes again, which fails again
            pass
        raise
    return f, None


def lock_out_dir(out_dir):
    """Hold out_dir for this process's whole life (a process that runs train.main again into the same
    out_dir, a notebook say, holds it already). Returns None, or a line saying who holds it."""
    path = os.path.abspath(os.path.join(out_dir, LOCK))
    if any(os.path.abspath(held.name) == path and os.path.exists(path) and os.path.samefile(held.name, path)
           for held in HELD_LOCKS):
        return None
    f, holder = lock_folder(out_dir, LOCK)
    if f is not None:
        HELD_LOCKS.append(f)
    return holder


def remove_run_files(out_dir, suffix=''):
    """Remove the run's files (suffix '.tmp': what a run killed mid-write left). Only under the lock."""
    for name in (*RUN_FILES, TORN):
        if os.path.exists(os.path.join(out_dir, name + suffix)):
            os.remove(os.path.join(out_dir, name + suffix))


# -----------------------------------------------------------------------------
# config.json

def schedule_length(cfg):
    """The LR schedule's length in steps: lr_decay_iters, where 0 means "follow max_iters". The one place
    that says so: a run's start fixes it (run_dir.start_run), and the readers here of configurations written
    before it was fixed (they kept the 0) resolve it the same way."""
    return cfg.get('lr_decay_iters') or cfg['max_iters']


def write_config(out_dir, config):
    path = os.path.join(out_dir, CONFIG)
    try:
        atomic_write(path, json.dumps(config, indent=2) + '\n')
    except OSError as e:
        raise write_failed(path, e, f"{CONFIG} is as it was") from None


def read_config(out_dir):
    """out_dir/config.json as train.py wrote it (its schedule's length resolved: configs of older runs kept
    0, "follow max_iters"), or RunFileError saying why it is not one."""
    try:
        with open(os.path.join(out_dir, CONFIG), encoding='utf-8') as f:
            config = json.load(f)
    except FileNotFoundError:
        raise RunFileError(f"no {CONFIG}: not a run of train.py, or one that has not started") from None
    except (OSError, ValueError) as e:   # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        raise RunFileError(f"{CONFIG} cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(config, dict):
        raise RunFileError(f"{CONFIG} holds a {type(config).__name__}, not the object train.py writes")
    bad = [k for k, kind in CONFIG_KEYS.items() if not isinstance(config.get(k), kind) or isinstance(config.get(k), bool)]
    if bad:
        raise RunFileError(f"{CONFIG} lacks {', '.join(bad)} (or has the wrong type): not written by train.py")
    config['lr_decay_iters'] = schedule_length(config)
    return config


def saved_config(out_dir):
    """out_dir/config.json, or None if there is none that train.py wrote."""
    try:
        return read_config(out_dir)
    except RunFileError:
        return None


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


# -----------------------------------------------------------------------------
# log.jsonl: appended row by row; a kill mid-write tears the last line

def _decode(line):
    """A log line's JSON value; UnicodeDecodeError or JSONDecodeError (both ValueErrors) if it has none."""
    return json.loads(line.decode('utf-8'))


def split_torn(data):
    """(the log's whole lines, its torn last line or b''). A complete log ends with a newline. What follows
    the last newline is torn unless it is whole JSON (the kill came between a row and its newline)."""
    end = data.rfind(b'\n') + 1
    tail = data[end:]
    if not tail.strip():
        return data, b''
    try:
        _decode(tail)
        return data, b''
    except ValueError:
        return data[:end], tail


def read_log(path):
    """The rows of a log.jsonl. A torn last line is dropped with a warning (the step it belonged to is
    simply not logged). Any other bad line is an error that names the file and the line."""
    with open(path, 'rb') as f:
        body, torn = split_torn(f.read())
    if torn:
        warnings.warn(f"{path}: dropped a torn last line ({len(torn)} bytes, no newline): the run was killed "
                      "while writing it")
    rows = []
    for number, line in enumerate(body.split(b'\n'), 1):
        if not line.strip():
            continue
        try:
            row = _decode(line)
        except ValueError as e:
            what = 'not UTF-8' if isinstance(e, UnicodeDecodeError) else f'not valid JSON ({e.msg})'
            raise SystemExit(f"{path}, line {number}: {what}; fix or remove that line") from None
        if not isinstance(row, dict) or not isinstance(row.get('step'), int) or isinstance(row['step'], bool):
            raise SystemExit(f"{path}, line {number}: not a row of train.py's log (a JSON object with a step); "
                             "fix or remove that line")
        rows.append(row)
    disorder = log_disorder(rows)
    if disorder:
        warnings.warn(f"{path}: {disorder}. Where a step has two rows of one kind, readers take the later one "
                      "(a log written by one train.py never has such rows: was it edited, or two logs joined?)")
    return rows


def log_kind(row):
    """What a log row is: 'train' (a log step), 'eval', 'eval_only' or 'diverged'."""
    if 'diverged' in row:
        return 'diverged'
    if 'val_loss' in row:
        return 'eval_only' if row.get('eval_only') else 'eval'
    return 'train'


def log_disorder(rows):
    """What is out of order or repeated in a log's rows ('' if nothing), line numbers counted over the rows. A
    log step's row and its evaluation's share a step; an eval_only row evaluates a checkpoint that may be older
    than the last logged step: neither is out of order."""
    said, last, seen = [], None, {}
    for number, row in enumerate(rows, 1):
        kind = log_kind(row)
        if kind == 'eval_only':
            continue
        if (row['step'], kind) in seen:
            said.append(f"step {row['step']} has two {kind} rows (rows {seen[row['step'], kind]} and {number})")
        elif last is not None and row['step'] < last[0]:
            said.append(f"row {number} (step {row['step']}) comes after step {last[0]} (row {last[1]}): out of order")
        seen[row['step'], kind] = number
        if last is None or row['step'] >= last[0]:
            last = (row['step'], number)
    return '; '.join(said[:3]) + (f" (and {len(said) - 3} more)" if len(said) > 3 else '')


def repair_log(path):
    """Before the log is written to: a torn last line is moved to log.jsonl.torn (its bytes kept, with a
    warning) and cut off, and a whole last row without its newline gets one. A row appended after a torn
    line would otherwise be glued to it: one bad line in the middle, which every reader refuses."""
    try:
        f = open(path, 'rb+')
    except FileNotFoundError:
        return
    with f:
        size = f.seek(0, os.SEEK_END)
        if size > 0:
            f.seek(size - 1)
        if size == 0 or f.read(1) == b'\n':   # the common case: one byte read
            return
        f.seek(0)
        body, torn = split_torn(f.read())
        if not torn:
            f.write(b'\n')
            return
        aside = os.path.join(os.path.dirname(path), TORN)
        with open(aside, 'ab') as out:   # first: a full disk here leaves the log as it was
            out.write(torn + b'\n')
        f.truncate(len(body))
    warnings.warn(f"{path}: a torn last line ({len(torn)} bytes, no newline: the run was killed while writing it) "
                  f"was moved to {aside} before the log was written to")


def append_log(path, row):
    """Append one row to log.jsonl (after repair_log). A failed write (a full disk) is a message; the line
    it may have cut is set aside by the next writer."""
    try:
        repair_log(path)
        with open(path, 'a') as f:
            f.write(json.dumps(row) + '\n')
    except OSError as e:
        kept = kept_checkpoint(os.path.join(os.path.dirname(path), CHECKPOINT))
        raise write_failed(path, e, f"the log of step {row['step']} may end in a cut line; {kept}") from None


def rewind_log(path, step):
    """Keep only the rows up to `step` (a resume trains what came after its checkpoint again), rewritten whole."""
    try:
        repair_log(path)
        rows = [r for r in read_log(path) if r['step'] <= step]
        atomic_write(path, ''.join(json.dumps(r) + '\n' for r in rows))
    except OSError as e:
        raise write_failed(path, e, f"{LOG} is as it was") from None


def record_divergence(out_dir, step, what, first_step, value):
    """A diverged run is a result: its log ends in a row that says so (what went non-finite, at which step
    first, its value), appended at the step it was noticed. A resume rewinds it away with what came after
    the checkpoint, as any row past the checkpoint (a diverged run stops without saving)."""
    append_log(os.path.join(out_dir, LOG), dict(step=step, diverged=dict(what=what, first_step=first_step,
                                                                        value=value)))


def divergence(out_dir):
    """The record of out_dir's run if it diverged (the last row of its log says so): {step, what, first_step,
    value}; else None."""
    try:
        return divergence_of(read_log(os.path.join(out_dir, LOG)))
    except (OSError, SystemExit):
        return None


def divergence_of(rows):
    """divergence() of a log's rows."""
    if not rows or not isinstance(rows[-1].get('diverged'), dict):
        return None
    return dict(rows[-1]['diverged'], step=rows[-1]['step'])


def describe_divergence(d):
    return (f"non-finite {d.get('what')} ({d.get('value')}) at step {d.get('first_step')}, noticed at step "
            f"{d.get('step')}")


def logged_evals(rows):
    """{step: row} of the validation losses of training in log rows (an eval_only row is not one)."""
    return {r['step']: r for r in rows if 'val_loss' in r and not r.get('eval_only')}


# -----------------------------------------------------------------------------
# ckpt.pt: torch.save of tensors and plain values, with a checksum of the whole content

def content_digest(obj):
    """SHA-256 over everything a checkpoint (or an exported weights file) holds: every tensor's dtype, shape
    and bytes, every other value's repr, in order. Stored with the file and recomputed on load, so a flipped
    byte anywhere in the tensors (which torch.load does not notice) or an edited value is caught."""
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
    """The bytes of all tensors in a nested structure, each storage counted once: about the size of its
    checkpoint file. (torch.save writes a storage once however many tensors share it: the tied embedding
    and output weights are one. Counted twice, a tiny model's 19.7 MB checkpoint "needed" 26 MB.)"""
    import torch
    seen = {}

    def walk(x):
        if isinstance(x, torch.Tensor):
            storage = x.untyped_storage()
            seen[(x.device, storage.data_ptr())] = storage.nbytes()
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
    walk(obj)
    return sum(seen.values())


def save_checkpoint(obj, path):
    """torch.save with a checksum of the content, through atomic_write. A write that fails (a full disk)
    leaves the previous checkpoint as it was and says how much space a checkpoint needs."""
    import gc
    import torch
    obj = on_host(obj)   # the one device-to-host copy: hashed, then written as it is
    try:
        atomic_write(path, lambda tmp: torch.save(dict(obj, sha256=content_digest(obj)), tmp))
        return
    except (OSError, RuntimeError) as e:   # torch.save reports a failed write as a RuntimeError
        # a copy without the traceback, which holds torch.save's open file: its blocks, though the file is
        # removed, are freed only once it is closed. Measured before that, the free space reads as 0.
        error = OSError(e.errno, e.strerror) if isinstance(e, OSError) else RuntimeError(str(e))
    gc.collect()
    raise write_failed(path, error, "the partial file was removed and the previous checkpoint, if any, is kept",
                       what=f"the checkpoint {path}",
                       need=f"A checkpoint of this run needs about {tensor_bytes(obj) / 1e6:,.0f} MB") from None


def on_host(obj):
    """obj with every tensor copied to the CPU (tensors already there kept as they are)."""
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: on_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(on_host(v) for v in obj)
    return obj


def load_tensors_only(path, mmap=False):
    """torch.load of tensors and plain values only (weights_only=True), onto the CPU. Older checkpoints kept
    numpy's RNG state as a uint32 array: its reconstruction is allowed, nothing else."""
    import torch
    legacy = [np._core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(legacy):
        return torch.load(path, map_location='cpu', weights_only=True, mmap=mmap)


def load_checkpoint(path):
    """A checkpoint of train.py, loaded onto the CPU (the caller moves what it needs), its checksum verified
    and its keys checked. Only tensors and plain values are loaded (weights_only=True): a file that holds
    other Python objects, which unpickling could run as code, is refused before anything in it runs. A
    damaged file is an error that leaves the file as it is."""
    import pickle
    import torch
    left = "It was left as it is; resume from a copy, or start the run again in another out_dir."
    try:   # memory-mapped: the ranks of a node that resume from one file share its pages, not a copy each
        ckpt = load_tensors_only(path, mmap=True)
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
        raise SystemExit(f"{path} is not a checkpoint of train.py (a {type(ckpt).__name__}, not a dict). {left}")
    stored = ckpt.pop('sha256', None)
    if stored is None:
        warnings.warn(f"{path} has no checksum (written by an older train.py): not verified")
    elif stored != content_digest(ckpt):
        raise SystemExit(f"{path} is damaged: its content does not match the checksum written with it. {left}")
    missing = [k for k in CHECKPOINT_KEYS if k not in ckpt] + ([] if isinstance(ckpt.get('config'), dict) else ['config'])
    if not (isinstance(ckpt.get('model'), dict) and all(isinstance(t, torch.Tensor) for t in ckpt['model'].values())):
        missing.append('model')
    if missing:
        raise SystemExit(f"{path} is not a checkpoint of train.py: it lacks {', '.join(dict.fromkeys(missing))}. {left}")
    if isinstance(ckpt['config'].get('max_iters'), int):   # (as read_config: older ones kept 0)
        ckpt['config']['lr_decay_iters'] = schedule_length(ckpt['config'])
    unknown = unknown_entries(ckpt)
    if unknown:   # (the weights are read as they are; a resume refuses it: run_dir.start_run)
        warnings.warn(f"{path} holds entries that this version's readers do not know ({', '.join(unknown)}): written "
                      "by another version of train.py, or edited. They are ignored here.")
    return ckpt


def unknown_entries(ckpt):
    """The names in a checkpoint that this train.py neither writes nor reads (another version's, or an edit)."""
    return sorted(str(k) for k in ckpt if k not in CHECKPOINT_KEYS + CHECKPOINT_OPTIONAL)


def verified_digest(path):
    """(the checksum a checkpoint was written with, None) where its content still gives that checksum (recomputed:
    every tensor read, a few seconds a GB), else (None, why): damaged or unreadable; (None, None): no checksum."""
    try:
        ckpt = load_tensors_only(path, mmap=True)
        stored = ckpt.pop('sha256', None)
    except Exception as e:
        return None, f"it cannot be read ({type(e).__name__})"
    if stored is None:   # (written by an older train.py: nothing to verify it against, nothing known damaged)
        return None, None
    if stored != content_digest(ckpt):
        return None, "its content no longer matches the checksum written with it (damaged)"
    return str(stored), None


def stored_digest(path):
    """The checksum a checkpoint was written with, or None (no file, an unreadable one): which checkpoint it is,
    read without loading its tensors (memory-mapped)."""
    try:
        return str(load_tensors_only(path, mmap=True)['sha256'])
    except Exception:
        return None


def checkpoint_progress(path):
    """(step, max_iters) that a checkpoint was written at and for, or None if there is no readable one. Reads
    only the small pickled part: the tensors are memory-mapped, not loaded (a 343M run's checkpoint is 4 GB)."""
    try:
        ckpt = load_tensors_only(path, mmap=True)
        return int(ckpt['step']), int(ckpt['config']['max_iters'])
    except Exception:   # missing, damaged, not a checkpoint: not a finished run's checkpoint
        return None


# -----------------------------------------------------------------------------
# A saved model (a checkpoint's, or an exported weights file's), checked before anything is allocated for it

def model_config(saved, source):
    """The GPTConfig that a saved configuration describes, checked as train.py checks its keys
    (common.model_problems): a file from anyone may say anything."""
    if not isinstance(saved, dict):
        raise SystemExit(f"{source} holds no model configuration (a {type(saved).__name__})")
    bad = model_problems(saved)
    if bad:
        raise SystemExit(f"{source}: its model configuration is not valid ({'; '.join(bad)}); the file is damaged "
                         "or was not written by this project")
    return gpt_config(saved)


# What older versions named each route's pseudo-query (model.ATTENTION_ROUTES today: w_<route>), and the read's
# gain (key_gain, today source_gain): their checkpoints and exports load under today's names (renamed_keys)
OLD_NAMES = dict(qk='attn_query', v='value_query', heads1='attn_query', heads2='heads2_query', mlp='mlp_query',
                 final='final_query')


def renamed_keys(model, state):
    """`state` ({tensor name: anything}, a checkpoint's or an export's) with the names older versions gave the
    read points' pseudo-queries and gain replaced by `model`'s. Every other name passes through, and so does
    an old name whose new one is there too (check_tensors then names it as not this model's)."""
    new = {}
    for prefix, module in model.named_modules():
        if hasattr(module, 'routes'):   # a read point (model.DepthRead)
            new.update({f'{prefix}.{OLD_NAMES[route]}': f'{prefix}.{name}' for route, name in module.routes.items()})
            new[f'{prefix}.key_gain'] = f'{prefix}.source_gain'
    return {(new[k] if k in new and new[k] not in state else k): v for k, v in state.items()}


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
