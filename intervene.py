"""
What a trained model's two routes are worth: the validation NLL of the same weights with one route's
pseudo-query set to the other's, at evaluation only (docs/results.md, "Route interventions").

    python intervene.py --out_dir=out/quickstart                     # a run's checkpoint
    python intervene.py --weights=study/runs/main_fp32/rd_attnres_s1/final.safetensors --dataset=study
    python intervene.py --out_dir=RUN --json=RUN/interventions.json  # also write the numbers (study.py reads them)

rd_attnres (the RD-AttnRes paper: tying the two routes' pseudo-queries recovers the parent architecture):
    as_trained   the routes as trained
    v_as_qk      every layer's v route reads with the qk route's pseudo-query: Block AttnRes's read, with the
                 trained weights (exactly an attnres model carrying them, tests/test_interventions.py)
    qk_as_v      the qk route reads with the v route's
ctrl_heads (the control's answer to the same question): heads2_as_heads1, heads1_as_heads2.
Each on the run's fixed validation windows (the first eval_tokens of val.bin, as train.py evaluates), in
float32, deterministic. ΔNLL = NLL(intervention) − NLL(as trained): what the model loses when its two
routes are made one.
"""

import json
import math
import os
import sys

from configurator import configure, exit_on_help
exit_on_help(__name__, __file__, 'docs/results.md, "Route interventions"')   # before torch loads
import torch

from model import ATTENTION_ROUTES

DEFAULTS = dict(
    out_dir='',            # a run directory: its ckpt.pt
    weights='',            # or a .safetensors file written by sample.py --export (or study.py)
    data_dir='data',
    dataset='',            # '' = the run's (from its config.json), else e.g. 'study'
    eval_tokens=131072,    # the first eval_tokens of val.bin (the CPU study's: 512 windows of 256)
    batch_size=32,
    json='',               # also write the results here
    same_as='',            # with out_dir: a run directory whose log this run's must equal row for row (a retrained
                           # run checked against the committed one before its weights stand for it)
    device='cpu',
)
# intervention -> {pseudo-query: the pseudo-query whose numbers it takes}, per mode
TIES = {
    'rd_attnres': {'v_as_qk': {'w_v': 'w_qk'}, 'qk_as_v': {'w_qk': 'w_v'}},
    'ctrl_heads': {'heads2_as_heads1': {'w_heads2': 'w_heads1'}, 'heads1_as_heads2': {'w_heads1': 'w_heads2'}},
}


def tied(model, ties):
    """A copy of model whose attention reads use, for each pseudo-query named in ties, another one's numbers."""
    import copy
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for block in twin.transformer.h:
            for name, other in ties.items():
                getattr(block.attn_read, name).copy_(getattr(block.attn_read, other))
    return twin


def nll(model, val, eval_tokens, batch_size, device):
    """Mean NLL per token over the first eval_tokens // T windows of val: train.py's evaluation (train.evaluate,
    its windows and batches), as a run's logged validation loss is computed."""
    from contextlib import nullcontext
    import train
    from run_kit.run_control import ThisProcess
    T = model.config.block_size
    n = min((len(val) - 1) // T, eval_tokens // T)
    cfg = dict(block_size=T, log_routing=False, residual=model.config.residual)
    loss, _ = train.evaluate(model, model, val, train.eval_batches(n, 0, 1, batch_size), [], cfg,
                             ThisProcess(False, 0, 1, device, torch.device(device).type), nullcontext())
    model.eval()   # (evaluate hands the model back in training mode)
    return loss


def interventions(model, val, eval_tokens, batch_size, device='cpu'):
    """{intervention: NLL} of a rd_attnres or ctrl_heads model, as_trained first."""
    mode = model.config.residual
    if mode not in TIES:
        raise SystemExit(f"a {mode} model has no two routes to tie: interventions are for "
                         f"{' and '.join(TIES)} models")
    model = model.float().eval().to(device)
    out = {'as_trained': nll(model, val, eval_tokens, batch_size, device)}
    for name, ties in TIES[mode].items():
        out[name] = nll(tied(model, ties), val, eval_tokens, batch_size, device)
    return out


def main(argv):
    import prepare
    import sample
    cfg = configure(DEFAULTS, argv)
    if not cfg['out_dir'] and not cfg['weights']:
        raise SystemExit("give a trained model: --out_dir=<run directory> or --weights=<file>.safetensors")
    torch.use_deterministic_algorithms(True)
    checked = same_log(cfg['out_dir'], cfg['same_as']) if cfg['same_as'] else None
    model, saved, origin = sample.load_model(dict(out_dir=cfg['out_dir'], weights=cfg['weights']))
    dataset = cfg['dataset'] or saved.get('dataset')
    if not dataset:
        raise SystemExit(f"{origin} does not say which data it was trained on: give --dataset (and --data_dir)")
    _, val, data_id = prepare.read_dataset(cfg['data_dir'], dataset)
    if saved.get('data_id') not in (None, data_id):
        raise SystemExit(f"{cfg['data_dir']}/{dataset} is another build (data_id {data_id}) than the one the model was "
                         f"trained on ({saved['data_id']}): its validation tokens are not the run's. Point --data_dir "
                         "at that build (docs/results.md says how the CPU study's builds are made)")
    nlls = interventions(model, val, cfg['eval_tokens'], cfg['batch_size'], cfg['device'])
    print(f"{saved['residual']} model from {origin}, {dataset} validation, float32")
    for name, value in nlls.items():
        print(f"{name:18s} NLL {value:.5f}" + ('' if name == 'as_trained' else f"   Δ {value - nlls['as_trained']:+.5f}"))
    if cfg['json']:
        from run_kit.run_files import atomic_write
        atomic_write(cfg['json'], json.dumps(dict(residual=saved['residual'], seed=saved.get('seed'), data_id=data_id,
                                                  eval_tokens=cfg['eval_tokens'], nll=nlls,
                                                  **(dict(same_log_as=checked) if checked else {})), indent=1) + '\n')
        print(f"wrote {cfg['json']}")
    return 0


def same_log(out_dir, reference):
    """Refuse unless out_dir's log holds reference's rows (training loss, gradient norm, data fingerprint,
    validation loss), value for value: then a retrained run's weights are the reference run's. Returns a note."""
    from run_kit.run_files import read_log
    if not out_dir:
        raise SystemExit("--same_as compares a run's log: give the run with --out_dir")
    keys = ('step', 'train_loss', 'norm', 'data_hash', 'val_loss')
    rows = [[{k: r.get(k) for k in keys} for r in read_log(os.path.join(d, 'log.jsonl'))] for d in (out_dir, reference)]
    if rows[0] != rows[1]:
        first = next((i for i, (a, b) in enumerate(zip(*rows)) if a != b), min(map(len, rows)))
        raise SystemExit(f"{out_dir} is not a rerun of {reference}: their logs part at row {first + 1} "
                         f"({rows[0][first] if first < len(rows[0]) else 'none'} vs "
                         f"{rows[1][first] if first < len(rows[1]) else 'none'})")
    return f"{reference}: {len(rows[1])} log rows equal"


# -----------------------------------------------------------------------------
# The study's report: a table per seed and the paired summary, from each run's interventions.json

def report_section(root, folder, runs):
    """Markdown for study.py report: the interventions of the runs of `folder` (paths relative to root) that
    have an interventions.json; a line naming the runs of a two-route mode that have none."""
    from compare import paired_stats, sign_count
    rows, missing = {}, []
    for path in runs:
        found = os.path.join(root, path, 'interventions.json')
        try:
            with open(found) as f:
                r = json.load(f)
            rows.setdefault(r['residual'], {})[int(r['seed'])] = r['nll']
        except (OSError, ValueError, KeyError, TypeError):
            if any(os.path.basename(path).startswith(mode + '_s') for mode in TIES):
                missing.append(path)
    if not rows and not missing:
        return ''
    out = [f"### Route interventions ({folder})\n",
           "Validation NLL of the trained weights with one route's pseudo-query set to the other's (intervene.py); "
           "Δ = NLL(intervention) − NLL(as trained), > 0: the model loses by it.\n"]
    for mode, by_seed in sorted(rows.items()):
        names = list(TIES[mode])
        out.append(f"| {mode} seed | as trained | " + ' | '.join(f"{n} | Δ" for n in names) + ' |')
        out.append('|---:|---:|' + '---:|---:|' * len(names))
        for seed in sorted(by_seed):
            v = by_seed[seed]
            out.append(f"| {seed} | {v['as_trained']:.4f} | " +
                       ' | '.join(f"{v[n]:.4f} | {v[n] - v['as_trained']:+.4f}" for n in names) + ' |')
        out.append('')
        out.append('| intervention | n | mean Δ | sd | 95% CI | Δ > 0 | sign test p |')
        out.append('|---|---:|---:|---:|---|---:|---:|')
        for n in names:
            deltas = [by_seed[s][n] - by_seed[s]['as_trained'] for s in sorted(by_seed)]
            st = paired_stats(deltas)
            out.append(f"| {mode}: {n} | {st['n']} | {st['mean_delta']:+.4f} | {fmt(st['sd'])} | "
                       f"[{fmt(st['ci95'][0], '+.4f')}, {fmt(st['ci95'][1], '+.4f')}] | "
                       f"{sign_count(sum(d > 0 for d in deltas), st['n'], st['ties'])} | {fmt(st['sign_test_p'], '.3g')} |")
        out.append('')
    if missing:
        out.append(f"No interventions yet for {len(missing)} runs of {' or '.join(TIES)} here ({missing[0]}"
                   f"{', …' if len(missing) > 1 else ''}): they need the run's final "
                   "weights (final.safetensors, written by study.py when a run finishes, not committed) and "
                   "`python intervene.py --weights=<run>/final.safetensors --dataset=study --json=<run>/interventions.json`.\n")
    return '\n'.join(out) + '\n'


def fmt(x, spec='.4f'):
    return '-' if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
