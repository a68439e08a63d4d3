"""
What train.py prints: a run's summary before its first step, and a log row as one line. Rank 0 only
(train.py calls these where proc.master); the whole configuration is in out_dir/config.json, every row
in out_dir/log.jsonl.
"""

import sys

from run_kit.run_files import CHECKPOINT, CONFIG, LOG


def format_duration(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def print_step(row, max_iters):
    """A log row as one console line: the last step's loss and gradient norm, the mean time per step since the
    previous line (dt, tok/s and the eta at that pace); mfu only where it is known (a GPU whose peak FLOP/s is
    known, or peak_flops; never the first interval, which holds compilation)."""
    mfu, norm = row['mfu'], row['norm']
    print(f"step {row['step']:5d} | loss {row['train_loss']:.4f} | lr {row['lr']:.2e} | "
          f"norm {norm if norm is not None else float('nan'):.3f} | dt {row['dt'] * 1000:.0f}ms | "
          f"tok/s {row['tok_per_s']:,.0f}" + ('' if mfu is None else f" | mfu {100 * mfu:.1f}%")
          + (f" | skipped {row['skipped_steps']}" if 'skipped_steps' in row else '')
          + f" | eta {format_duration((max_iters - row['step']) * row['dt'])} (recent pace)", flush=True)


def print_run_summary(cfg, model, grad_accum, proc, dt_name, train_tokens, n_eval, step, peak):
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
        n = torch.get_num_threads()
        threads = f"{n} torch thread{'s' if n > 1 else ''} (cpu_threads) | " if proc.device_type == 'cpu' else ''
        print(f"{threads}step lines: that step's loss and norm, the mean time per step since the line before, eta at "
              "that pace (it follows the machine's load) | " + ("mfu: model FLOPs utilisation" if peak else
                            f"no mfu: no peak FLOP/s known for {proc.device} (set peak_flops to see it)"))
    print(f"eval_only: evaluates {'the checkpoint in ' + cfg['out_dir'] if step else 'the initialisation'} and "
          f"writes {f'one eval_only row to {LOG}' if step else 'nothing'}" if cfg['eval_only'] else
          f"writes to {cfg['out_dir']} ({CONFIG}, {LOG}, {CHECKPOINT})"
          + (f" | resumed at step {step}" if step else ''), flush=True)
    sys.stdout.flush()
