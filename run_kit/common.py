"""
What the scripts share (nanochat keeps the same kind of helpers in its common.py):

  - the keys that define a run: MODEL_KEYS, FROZEN_ON_RESUME, GROUP_KEYS (a comparison),
    model_problems; the model they describe: gpt_config, build_model; train.py's configuration checked: validate
  - fail: how a run stops with a message (under torchrun, said by rank 0 alone); run_command: how a command
    ends a failed write or a Ctrl-C, in one line with an exit status of its own; ctrl_c_while_starting: the
    same Ctrl-C while the command is still importing (torch), before run_command is there to catch it

The files of a run (config.json, log.jsonl, ckpt.pt, the lock, atomic writes) are run_files.py's.
train.py, sample.py, bench.py, compare.py, study.py, prepare.py and run_files.py import from here; none
of them imports train.py but study.py's time estimate. torch is imported inside the functions that need
it, because prepare.py's worker processes import this module too and have no use for it.
"""

import os
import sys

H100_PEAK_FLOPS = 989e12   # H100 SXM (and H200, H800: the same tensor cores); the paper's budget assumes it
# the model's shape: a checkpoint can only be loaded into a model built from these
MODEL_KEYS = ('n_layer', 'n_head', 'n_embd', 'block_size', 'residual', 'attnres_block_size')
# what decides what a run's numbers mean (the model, the data and its order, the schedule, the precision,
# the evaluation set): a resumed run must not change them, and the two arms of a pair must agree on all of
# them but `residual` (compare.py). docs/training.md ("Resume") lists the keys that may change.
FROZEN_ON_RESUME = MODEL_KEYS + ('seed', 'dataset', 'data_id', 'total_batch_size', 'lr_decay_iters',
                                 'warmup_iters', 'learning_rate', 'min_lr_ratio', 'weight_decay', 'beta1',
                                 'beta2', 'grad_clip', 'dtype_resolved', 'eval_tokens')
# a comparison: the runs that may pair, one shape and budget. compare.py groups runs by these; a run's Weights &
# Biases group (wandb_group='') is named after them (group_name)
DEPTH_READS = ('plain', 'two_phase', 'fused')   # depth_read: how the reads are computed (the same function)
GROUP_KEYS = ('n_layer', 'n_head', 'n_embd', 'block_size', 'max_iters')


def group_name(cfg):
    """The comparison a run belongs to, as a name: 12x768h12_1024ctx_3815steps (GROUP_KEYS)."""
    return f"{cfg['n_layer']}x{cfg['n_embd']}h{cfg['n_head']}_{cfg['block_size']}ctx_{cfg['max_iters']}steps"


def fail(message, master=True):
    """Stop with a message. Under torchrun every rank usually meets the same error: only rank 0 says it."""
    raise SystemExit(message if master else 1)


# -----------------------------------------------------------------------------
# The model a run's configuration describes, and its keys checked

def gpt_config(cfg):
    """The GPTConfig of a run's configuration: its MODEL_KEYS; the vocabulary is GPTConfig's."""
    from model import GPTConfig
    return GPTConfig(**{k: cfg[k] for k in MODEL_KEYS})


def build_model(cfg):
    """The model of a run's configuration (gpt_config, and depth_read): GPT, or TwoPhaseGPT where
    depth_read='two_phase', FusedGPT where 'fused' (the same function and parameters, the reads computed per
    AttnRes block: fast_read/). On the
    current device (torch.device('meta') for a model without memory)."""
    from fast_read.fused_read import FusedGPT
    from fast_read.two_phase_read import TwoPhaseGPT
    from model import GPT
    kind = {'two_phase': TwoPhaseGPT, 'fused': FusedGPT}.get(cfg.get('depth_read'), GPT)
    return kind(gpt_config(cfg))


def model_problems(cfg):
    """What is wrong with the model keys of a configuration ([] if nothing): train.py's own (validate)
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


# train.py's other keys (the model's are model_problems', as a saved model's are)
POSITIVE = ('ddp_timeout', 'eval_interval', 'log_interval', 'eval_batch_size', 'total_batch_size', 'batch_size')
NON_NEGATIVE = ('max_iters', 'lr_decay_iters', 'warmup_iters', 'eval_tokens', 'learning_rate', 'weight_decay',
                'grad_clip', 'peak_flops')


def validate(cfg):
    """Check every key of train.py's configuration that can be checked without data or a device, and fill in
    out_dir's {keys}, so that a bad value is a message before anything is written (a rerun with the value fixed
    then starts cleanly). The rest is checked where it is used: the device and dtype by
    run_control.start_processes, the batch arithmetic and the data by train.py, the out_dir by run_dir.start_run."""
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
    if cfg.get('depth_read', 'plain') not in DEPTH_READS:
        bad.append(f"depth_read={cfg['depth_read']!r} is not one of {', '.join(DEPTH_READS)}")
    bad += model_problems(cfg)
    if bad:
        raise SystemExit("bad configuration: " + '; '.join(bad))
    if cfg['warmup_iters'] >= max(cfg['max_iters'], 1) and not cfg['eval_only'] and os.environ.get('RANK', '0') == '0':
        print(f"note: warmup_iters={cfg['warmup_iters']} >= max_iters={cfg['max_iters']}: the whole run is warmup "
              "(the learning rate never reaches its peak, nor decays)", file=sys.stderr)


# -----------------------------------------------------------------------------
# How a command ends: a failed write and a Ctrl-C are one line each, with an exit status of their own

EXIT_WRITE = 74          # sysexits.h's EX_IOERR: a file the command writes could not be (a full disk, a size limit)
EXIT_INTERRUPTED = 130   # 128 + SIGINT, what a shell reports for a command ended by Ctrl-C


class WriteFailed(Exception):
    """A file that a command writes could not be written; the message says what failed, what is kept and what
    to do (run_files.write_failed's)."""


def ctrl_c_while_starting(module_name, name):
    """Called by a script as its first statement: until its main starts (run_command), a Ctrl-C ends it at once
    in one line with EXIT_INTERRUPTED. Importing torch takes seconds, and a KeyboardInterrupt raised inside
    it is a traceback nothing could catch; nothing has been written by then. Only a script run as a program
    (module_name '__main__': not one imported by study.py, a test or a spawned worker), and only where Ctrl-C
    has Python's own handler (a background job started with SIGINT ignored keeps it ignored)."""
    import signal
    if module_name != '__main__' or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return

    def starting(signum, frame):
        os.write(2, f"{name}: stopped by Ctrl-C while starting; nothing was written\n".encode())
        os._exit(EXIT_INTERRUPTED)   # at once: no exit handlers half-run under a module half-imported
    starting.while_starting = True
    signal.signal(signal.SIGINT, starting)


def run_command(main, argv, name, on_ctrl_c):
    """A command's main(argv) as its process runs it: main's exit status, or a failed write (WriteFailed) or a
    Ctrl-C said in one line on stderr with EXIT_WRITE or EXIT_INTERRUPTED, never a traceback. on_ctrl_c: what
    the interrupted command leaves behind. Ctrl-C is Python's own KeyboardInterrupt again from here on
    (ctrl_c_while_starting's handler was for the imports)."""
    import signal
    import sys
    try:
        if getattr(signal.getsignal(signal.SIGINT), 'while_starting', False):
            signal.signal(signal.SIGINT, signal.default_int_handler)
        return main(argv)
    except WriteFailed as e:
        print(f"{name}: {e}", file=sys.stderr, flush=True)
        return EXIT_WRITE
    except KeyboardInterrupt:
        print(f"{name}: stopped by Ctrl-C; {on_ctrl_c}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
