"""
What a trained model's two routes are worth: the validation NLL of the same weights with one route's
pseudo-query set to the other's, at evaluation only (docs/results.md, "Route interventions").

    python intervene.py --out_dir=out/quickstart                     # a finished run's final checkpoint
    python intervene.py --weights=study/runs/main_fp32/rd_attnres_s1/final.safetensors   # its export
    python intervene.py --out_dir=RUN --json=RUN/interventions.json  # also write the numbers (study.py reads them)
    python study.py intervene PLAN                                   # every two-route run of a study's plan

rd_attnres (the RD-AttnRes paper: tying the two routes' pseudo-queries recovers the parent architecture):
    as_trained   the routes as trained
    v_as_qk      every layer's v route reads with the qk route's pseudo-query: Block AttnRes's read, with the
                 trained weights (exactly an attnres model carrying them, tests/test_interventions.py)
    qk_as_v      the qk route reads with the v route's
ctrl_heads (the control's answer to the same question): heads2_as_heads1, heads1_as_heads2.
Each tie also one attention layer at a time: NAME@l (e.g. v_as_qk@3) ties layer l's read only, every other
layer as trained (at v_as_qk@l, exactly an rd_attnres model whose layer-l read is attnres's); --json records
with them, per tie, the sum over layers of the one-layer ΔNLL beside the all-layer ΔNLL (do the layers add up).
Each on the run's own validation windows (its eval_tokens, the first of val.bin of the data build it trained on,
as train.py evaluates), in float32, deterministic. ΔNLL = NLL(intervention) − NLL(as trained): what the model
loses when its two routes are made one.

Only a finished run's final model is measured: a run still training, stopped, or diverged is refused, naming the
step its checkpoint holds. The output (and --json) says which model was measured (its run, step, the checksum of
its checkpoint, its final validation loss as logged) and on which set; study.py's report checks each against the
run in its folder and sets apart numbers that are not that run's final model. Weights in a run's folder that are
not that run's model (trained with another configuration, or scoring another loss as trained than the run
logged at its end) are refused, saying what to do.
"""

from run_kit.common import ctrl_c_while_starting  # first: a Ctrl-C while torch loads is one line, exit 130
ctrl_c_while_starting(__name__, 'intervene.py')

import json
import math
import os
import sys

from configurator import configure, exit_on_help
exit_on_help(__name__, __file__, 'docs/results.md, "Route interventions"')   # before torch loads
import torch

from run_kit.common import WriteFailed, run_command
from run_kit.run_files import CONFIG, FINAL, LOG

DEFAULTS = dict(
    out_dir='',            # a finished run's directory: its final ckpt.pt
    weights='',            # or a .safetensors file written by sample.py --export (or study.py: RUN/final.safetensors)
    data_dir='',           # '' = the run's (its configuration's data_dir)
    dataset='',            # '' = the run's (its configuration's), else e.g. 'study'
    eval_tokens=0,         # 0 = the run's own: its eval_tokens, the first of val.bin (the CPU study's: 131072)
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


def tied(model, ties, layers=None):
    """A copy of model whose attention reads use, for each pseudo-query named in ties, another one's numbers:
    at every layer, or at the attention layers listed in `layers` only (the others as trained)."""
    import copy
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for l, block in enumerate(twin.transformer.h):
            if layers is not None and l not in layers:
                continue
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
    """{intervention: NLL} of a rd_attnres or ctrl_heads model, as_trained first, then each all-layer tie, then
    each tie at one layer at a time (NAME@l, l = 0 .. n_layer - 1)."""
    mode = model.config.residual
    if mode not in TIES:
        raise SystemExit(f"a {mode} model has no two routes to tie: interventions are for "
                         f"{' and '.join(TIES)} models")
    model = model.float().eval().to(device)
    out = {'as_trained': nll(model, val, eval_tokens, batch_size, device)}
    for name, ties in TIES[mode].items():
        out[name] = nll(tied(model, ties), val, eval_tokens, batch_size, device)
    for name, ties in TIES[mode].items():
        for l in range(model.config.n_layer):
            out[f'{name}@{l}'] = nll(tied(model, ties, [l]), val, eval_tokens, batch_size, device)
    return out


def layer_sums(nlls):
    """{tie: dict(all_layers=ΔNLL of the all-layer tie, sum_of_layers=the sum of its one-layer ΔNLLs, layers=how
    many)} from interventions()' numbers: whether the layers' effects add up to the whole or interact."""
    out = {}
    for name in nlls:
        if name == 'as_trained' or '@' in name:
            continue
        one = [v - nlls['as_trained'] for k, v in nlls.items() if k.split('@')[0] == name and '@' in k]
        out[name] = dict(all_layers=nlls[name] - nlls['as_trained'], sum_of_layers=math.fsum(one), layers=len(one))
    return out


def config_hash(config):
    """Which run a configuration is, as a digest: the keys that say what its numbers mean (frozen on a resume)
    and its budget. Recorded with the numbers; the report compares it with the configuration in the run's folder."""
    import hashlib
    from run_kit.common import FROZEN_ON_RESUME
    keys = sorted(set(FROZEN_ON_RESUME) | {'max_iters'})
    return hashlib.sha256(json.dumps({k: config.get(k) for k in keys}, sort_keys=True, default=str).encode()).hexdigest()


def differences(model_config, run_config):
    """Where a model's own configuration (its checkpoint's, or its export's header) and its run's config.json
    differ on the keys config_hash digests: [(key, the model's, the run's)]. A key the model's does not hold is
    not compared (an export of an older sample.py holds fewer)."""
    from run_kit.common import FROZEN_ON_RESUME
    keys = sorted(set(FROZEN_ON_RESUME) | {'max_iters'})
    return [(k, model_config[k], run_config.get(k)) for k in keys if k in model_config and model_config[k] != run_config.get(k)]


# |NLL as trained - the run's logged final validation loss| of the run's own final model: both are train.evaluate
# on the same windows, so a float32 run's agree to rounding (another batch size sums in another order); a run
# trained under bf16 or fp16 autocast logged its loss in that precision, measured here in float32
AS_TRAINED_TOL = dict(float32=1e-4, other=0.02)


def not_the_runs(folder='its folder', train='python study.py run <plan>', measure='python study.py intervene <plan>'):
    """What to do when the weights in a run's folder are not that run's model (nothing measured from them can
    stand for the run); study.py intervene names its plan's commands."""
    return (f"Its numbers are not written. Put that run's own checkpoint back, or train the run again (a study's "
            f"run: move {folder} aside, then {train} trains it and {measure} measures it)")


def final_model(run_dir, from_checkpoint=True):
    """What run_dir's final model is, or SystemExit saying why there is none to measure (a run that diverged,
    or that is not finished: still training, stopped, killed; from_checkpoint: a finished run whose checkpoint is
    damaged): dict(config, step, val_loss, data_digest), the step and validation loss of its last evaluation as
    logged."""
    from run_kit.run_files import (CHECKPOINT, LOG, RunFileError, checkpoint_progress, describe_divergence, divergence,
                                   logged_evals, read_config, read_log)
    from run_kit.run_dir import is_finished
    try:
        config = read_config(run_dir)
    except RunFileError as e:
        raise SystemExit(f"{run_dir} is not a run that can be measured: {e}") from None
    ckpt = checkpoint_progress(os.path.join(run_dir, CHECKPOINT))
    held = f"its checkpoint holds step {ckpt[0]}" if ckpt else "it has no readable checkpoint"
    diverged = divergence(run_dir)
    if diverged:
        raise SystemExit(f"{run_dir} diverged ({describe_divergence(diverged)}): it has no trained model ({held}, the "
                         "last good one, not a result). A diverged run has no interventions; the study's report lists "
                         "it with the pairs it breaks.")
    try:
        logged = logged_evals(read_log(os.path.join(run_dir, LOG)))
    except (OSError, SystemExit):   # (no log, or one that cannot be read: not finished, as is_finished says)
        logged = {}
    damaged = ckpt is None and os.path.exists(os.path.join(run_dir, CHECKPOINT)) and config['max_iters'] in logged
    if damaged and from_checkpoint:   # (finished, as its log says: "not finished" would send the user round in a loop)
        raise SystemExit(f"{os.path.join(run_dir, CHECKPOINT)} cannot be read: the file is damaged (the run's log says "
                         f"it finished at step {config['max_iters']}); it was left as it is. Measure the run's export "
                         f"if it has one (python intervene.py --weights={os.path.join(run_dir, FINAL)}), or train the "
                         "run again in another out_dir (a study's run: move its folder aside, then python study.py run "
                         "<plan>).")
    if not damaged and not is_finished(run_dir):
        raise SystemExit(f"{run_dir} is not finished ({held} of {config['max_iters']}): measured now, its numbers would "
                         f"be that step's, not the trained model's. Run this command again once the run has finished "
                         "(a stopped run continues with train.py --init_from=auto, or study.py run).")
    final = logged[config['max_iters']]
    return dict(config=config, step=config['max_iters'], val_loss=final['val_loss'], data_digest=final.get('data_digest'))


def run_beside(weights):
    """The run folder a weights file lies in (study.py exports RUN/final.safetensors), or None."""
    folder = os.path.dirname(os.path.abspath(weights))
    return folder if os.path.exists(os.path.join(folder, CONFIG)) else None


def which_model(cfg, saved):
    """(the record of the model to measure, the run's configuration or {}): its run folder, step, whether it is
    the run's final model, its checkpoint's checksum, the run's final validation loss as logged. Refuses a model
    that is not a finished run's final one where that can be told: from its run folder (--out_dir, or the folder
    an export lies in) or from the export's header (study.py's exports say what they were derived from)."""
    from run_kit.run_files import CHECKPOINT, stored_digest
    source = saved.get('source') if isinstance(saved.get('source'), dict) else {}
    run_dir = cfg['out_dir'] or run_beside(cfg['weights'])
    record = dict(run=None, step=saved.get('step'), max_iters=source.get('max_iters'), final=None,
                  file=os.path.abspath(cfg['weights'] or os.path.join(cfg['out_dir'], CHECKPOINT)),
                  config_sha256=source.get('config_sha256'), checkpoint_sha256=source.get('checkpoint_sha256'),
                  val_loss=source.get('val_loss'))
    if record['max_iters'] is not None:
        record['final'] = record['step'] == record['max_iters']
    if not run_dir:
        return record, dict(source)   # (an export on its own: what its header says)
    final = final_model(run_dir, from_checkpoint=bool(cfg['out_dir']))
    config = final['config']
    record.update(run=os.path.abspath(run_dir), max_iters=final['step'], final=record['step'] == final['step'])
    wrong = differences(saved, config)
    if wrong:   # (a checkpoint or export put in the folder of another run: its numbers would be reported as this run's)
        raise SystemExit(f"{record['file']} is not the model of the run in {run_dir}: it was trained with "
                         + ', '.join(f"{k}={m!r} ({CONFIG} there: {r!r})" for k, m, r in wrong) + f". {not_the_runs()}.")
    why = None
    if not record['final']:
        why = f"it holds step {record['step']} of that run, whose final model is step {final['step']}"
    elif record['config_sha256'] not in (None, config_hash(config)):
        why = "it was exported from a run of another configuration in that folder (since replaced)"
    elif record['val_loss'] not in (None, final['val_loss']):
        why = (f"it was exported from a run whose final validation loss was {record['val_loss']:.4f}; the run there "
               f"now logged {final['val_loss']:.4f} (it was replaced since)")
    if why:
        raise SystemExit(f"{cfg['weights'] or cfg['out_dir']} is not the final model of the run in {run_dir}: {why}. "
                         f"Measure the run itself: python intervene.py --out_dir={run_dir}")
    if cfg['out_dir']:
        record['checkpoint_sha256'] = stored_digest(os.path.join(run_dir, CHECKPOINT))
    record.update(config_sha256=config_hash(config), val_loss=final['val_loss'])
    return record, config


def main(argv):
    import prepare
    import sample
    from run_kit.run_files import atomic_write, write_failed
    cfg = configure(DEFAULTS, argv)
    if not cfg['out_dir'] and not cfg['weights']:
        raise SystemExit("give a trained model: --out_dir=<run directory> or --weights=<file>.safetensors")
    torch.use_deterministic_algorithms(True)
    checked = same_log(cfg['out_dir'], cfg['same_as']) if cfg['same_as'] else None
    if cfg['out_dir']:
        final_model(cfg['out_dir'])   # before its checkpoint is read: a run still training, stopped or diverged
    model, saved, origin = sample.load_model(dict(out_dir=cfg['out_dir'], weights=cfg['weights']))
    measured, run = which_model(cfg, saved)
    run = {**saved, **run}   # the run's configuration where known (config.json, the checkpoint's, an export's source)
    dataset = cfg['dataset'] or run.get('dataset')
    if not dataset:
        raise SystemExit(f"{origin} does not say which data it was trained on: give --dataset (and --data_dir)")
    eval_tokens = cfg['eval_tokens'] or run.get('eval_tokens')
    if not eval_tokens:
        raise SystemExit(f"{origin} does not say which evaluation set its run used: give --eval_tokens=<the run's "
                         "eval_tokens> (its config.json has it)")
    data_dir = cfg['data_dir'] or run.get('data_dir') or 'data'
    _, val, data_id = prepare.read_dataset(data_dir, dataset)
    if saved.get('data_id') not in (None, data_id):
        raise SystemExit(f"{data_dir}/{dataset} is another build (data_id {data_id}) than the one the model was "
                         f"trained on ({saved['data_id']}): its validation tokens are not the run's. Point --data_dir "
                         "at that build (docs/results.md says how the CPU study's builds are made)")
    T = model.config.block_size
    windows = min((len(val) - 1) // T, eval_tokens // T)
    own = run.get('eval_tokens') in (None, eval_tokens)
    evaluated = dict(dataset=dataset, data_id=data_id, eval_tokens=eval_tokens, windows=windows, block_size=T,
                     runs_own=own and run.get('eval_tokens') is not None)
    nlls = interventions(model, val, eval_tokens, cfg['batch_size'], cfg['device'])
    if measured['final'] and evaluated['runs_own'] and measured['val_loss'] is not None:
        # the run's own final model on the run's own windows gives the loss the run logged, or it is another model
        tol = AS_TRAINED_TOL['float32' if run.get('dtype_resolved', 'float32') == 'float32' else 'other']
        if not abs(nlls['as_trained'] - measured['val_loss']) <= tol:
            raise SystemExit(f"{origin} is not the model of the run in {measured['run'] or 'its header'}: on that "
                             f"run's own evaluation set it scores {nlls['as_trained']:.5f}, and the run logged "
                             f"{measured['val_loss']:.5f} for its final model (more than {tol:g} apart). {not_the_runs()}.")
    which = ("the final model" if measured['final'] else f"step {measured['step']} (whether it is its run's final "
             "model is not known: the file is not in its run's folder nor says so)" if measured['final'] is None
             else f"step {measured['step']}, not the final model")
    print(f"{saved['residual']} model from {origin}: {which}" +
          (f" of {measured['run']}" if measured['run'] else ''))
    whose = ('the run’s own evaluation set' if evaluated['runs_own'] else 'not the run’s own evaluation set' if not own
             else 'the run’s evaluation set not known')
    print(f"on {dataset} validation (data_id {data_id}): the first {windows * T:,} tokens ({windows} windows of {T}), "
          f"{whose}; float32")
    for name, value in nlls.items():
        print(f"{name:18s} NLL {value:.5f}" + ('' if name == 'as_trained' else f"   Δ {value - nlls['as_trained']:+.5f}"))
    sums = layer_sums(nlls)
    for name, s in sums.items():
        print(f"{name:18s} Δ all layers at once {s['all_layers']:+.5f}, sum of its {s['layers']} one-layer Δ "
              f"{s['sum_of_layers']:+.5f}")
    if cfg['json']:
        text = json.dumps(dict(residual=saved['residual'], seed=saved.get('seed'), data_id=data_id,
                               eval_tokens=eval_tokens, nll=nlls, layer_sums=sums, model=measured, eval=evaluated,
                               **(dict(same_log_as=checked) if checked else {})), indent=1) + '\n'
        try:
            atomic_write(cfg['json'], text)
        except OSError as e:
            raise WriteFailed(write_failed(cfg['json'], e, f"{cfg['json']} is as it was", then="run the same command "
                                           "again", elsewhere="a path").code) from None
        print(f"wrote {cfg['json']}")
    return 0


def same_log(out_dir, reference):
    """Refuse unless out_dir's log holds reference's rows (training loss, gradient norm, data fingerprint,
    validation loss), value for value: then a retrained run's weights are the reference run's. Returns a note."""
    from run_kit.run_files import read_log
    if not out_dir:
        raise SystemExit("--same_as compares a run's log: give the run with --out_dir")
    keys = ('step', 'train_loss', 'norm', 'data_hash', 'val_loss')
    rows = [[{k: r.get(k) for k in keys} for r in read_log(os.path.join(d, LOG))] for d in (out_dir, reference)]
    if rows[0] != rows[1]:
        first = next((i for i, (a, b) in enumerate(zip(*rows)) if a != b), min(map(len, rows)))
        raise SystemExit(f"{out_dir} is not a rerun of {reference}: their logs part at row {first + 1} "
                         f"({rows[0][first] if first < len(rows[0]) else 'none'} vs "
                         f"{rows[1][first] if first < len(rows[1]) else 'none'})")
    return f"{reference}: {len(rows[1])} log rows equal"


# -----------------------------------------------------------------------------
# The study's report: a table per seed and the paired summary, from each run's interventions.json, each checked
# against the run in its folder

JSON = 'interventions.json'


def checkpoint_here(run_dir, config):
    """(finished, digest, damage) of the run in run_dir for the report: whether its log holds its final
    evaluation (and its checkpoint, where one is readable, that step: run_dir.is_finished); the checksum of its
    ckpt.pt recomputed from the content (None: no file, or damaged); why it is damaged (None: intact or absent).
    The checksum stored inside the file is not trusted alone: a flipped byte keeps it."""
    from run_kit.run_files import CHECKPOINT, LOG, logged_evals, read_log, verified_digest
    from run_kit.run_dir import is_finished
    ckpt = os.path.join(run_dir, CHECKPOINT)
    digest, damage = verified_digest(ckpt) if os.path.exists(ckpt) else (None, None)
    finished = is_finished(run_dir)
    if not finished and damage:   # (a damaged checkpoint does not make a finished run unfinished: its log says)
        try:
            finished = config['max_iters'] in logged_evals(read_log(os.path.join(run_dir, LOG)))
        except (OSError, SystemExit):
            pass
    return finished, digest, damage


def measured_problem(r, run_dir, path, config, checkpoint):
    """Why the numbers r (a run's interventions.json) are not its run's final model measured on the run's own
    evaluation set, or None. path: the run as the report names it (relative to the study's root); checkpoint:
    checkpoint_here's (finished, digest, damage)."""
    from run_kit.run_files import LOG, describe_divergence, divergence, logged_evals, read_log
    finished, digest, damage = checkpoint
    if (r.get('residual'), r.get('seed')) != (config['residual'], config['seed']):
        return (f"it measured a {r.get('residual')} model of seed {r.get('seed')}; the run is {config['residual']} "
                f"seed {config['seed']}")
    diverged = divergence(run_dir)
    if diverged:
        return f"the run diverged ({describe_divergence(diverged)}): it has no trained model to measure"
    if not finished:
        return "the run is not finished: it has no final model yet"
    rows = read_log(os.path.join(run_dir, LOG))
    final = logged_evals(rows)[config['max_iters']]
    if r.get('eval_tokens') != config.get('eval_tokens') or r.get('data_id') not in (None, config.get('data_id')):
        return (f"it measured the first {r.get('eval_tokens')} tokens of data build {r.get('data_id')}, not the run's "
                f"own evaluation set (its first {config.get('eval_tokens')} of build {config.get('data_id')})")
    m = r.get('model')
    rerun = (r.get('same_log_as') or '').split(':')[0]
    rerun = bool(rerun) and os.path.normpath(rerun) in (os.path.normpath(path), os.path.normpath(run_dir))
    if not isinstance(m, dict):
        # written before intervene.py said which model it measured: only a rerun checked row for row against this
        # run's log (--same_as) names it, and only while this log is the one it was checked against
        if rerun and r['same_log_as'].endswith(f": {len(rows)} log rows equal"):
            return None
        return "it does not say which model it measured (written by an older intervene.py)"
    if m.get('step') != config['max_iters']:
        return f"it measured step {m.get('step')}, not the run's final model (step {config['max_iters']})"
    if m.get('val_loss') is None:
        return "it does not say which run it measured (an export outside its run's folder)"
    if m['val_loss'] != final['val_loss']:
        return (f"it measured another run: that run's final validation loss was {m['val_loss']:.4f}, this run's is "
                f"{final['val_loss']:.4f} (the numbers of a run since replaced)")
    here = m.get('run') is not None and os.path.realpath(m['run']) == os.path.realpath(run_dir)
    if here and m.get('config_sha256') != config_hash(config):
        return "it measured a run of another configuration in this folder (since replaced)"
    if here and m.get('checkpoint_sha256') and digest is not None and digest != m['checkpoint_sha256']:
        return "it measured another checkpoint than this run's final one (since replaced)"
    return None   # (a checkpoint damaged since: intervene.py verified it when it measured; model_label says so)


def model_label(r, run_dir, damage=None):
    """Which model the numbers are of, in a few words, for the report's table; damage: why the run's ckpt.pt
    is damaged now (the numbers were measured from it intact: intervene.py verifies what it loads)."""
    from run_kit.run_files import CHECKPOINT
    m = r.get('model')
    if not isinstance(m, dict):
        label = "final, of a rerun with an equal log"
    elif m.get('run') and os.path.realpath(m['run']) != os.path.realpath(run_dir) and r.get('same_log_as'):
        label = f"step {m['step']} (final), of a rerun with an equal log"
    else:
        digest = m.get('checkpoint_sha256')
        label = f"step {m['step']} (final)" + (f", checkpoint {digest[:8]}" if digest else '')
    return label + (f"; its {CHECKPOINT} since damaged: {damage}" if damage else '')


def run_state(root, path):
    """(state, detail) of a plan's run for its interventions: ('numbers', (mode, seed, nll, label, routing)) where its
    interventions.json is its final model's; ('apart', why) where that file is not; else, for a run of a two-route
    mode, 'measure' (finished, its weights here: ckpt.pt or final.safetensors), 'no_weights', 'unfinished' or
    'diverged'; (None, None) for anything else (not a run yet, one route)."""
    from run_kit.run_files import CHECKPOINT, RunFileError, divergence, read_config
    run_dir = os.path.join(root, path)
    try:
        config = read_config(run_dir)
    except RunFileError:
        return None, None
    found = os.path.join(run_dir, JSON)
    if os.path.exists(found):
        try:
            with open(found) as f:
                r = json.load(f)
            nll = {n: float(r['nll'][n]) for n in ['as_trained', *TIES[r['residual']]]}
            nll.update({k: float(v) for k, v in r['nll'].items()            # the one-layer ties, where measured
                        if k.partition('@')[0] in TIES[r['residual']] and k.partition('@')[2].isdigit()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return 'apart', f"{JSON} cannot be read as intervene.py's ({type(e).__name__})"
        checkpoint = checkpoint_here(run_dir, config)
        why = measured_problem(r, run_dir, path, config, checkpoint)
        if why is None:
            return 'numbers', (config['residual'], config['seed'], nll, model_label(r, run_dir, checkpoint[2]),
                               final_routing(run_dir, config))
        return 'apart', why
    if config.get('residual') not in TIES:
        return None, None
    if divergence(run_dir):
        return 'diverged', None
    finished, _, damage = checkpoint_here(run_dir, config)
    if not finished:
        return 'unfinished', None
    has_weights = os.path.exists(os.path.join(run_dir, FINAL)) or (os.path.exists(os.path.join(run_dir, CHECKPOINT))
                                                                    and not damage)
    return ('measure' if has_weights else 'no_weights'), None


def final_routing(run_dir, config):
    """{attention layer: (JS divergence between its two routes, mean depth of the first, of the second)} of the
    run's final model, as its log's final evaluation recorded them (run_kit/routing.routing_summary, the first
    validation batch); {} where the log holds none."""
    from run_kit.run_files import LOG, logged_evals, read_log
    try:
        row = logged_evals(read_log(os.path.join(run_dir, LOG))).get(config['max_iters'], {})
        out = {}
        for r in row.get('routing', {}).get('summary', []):
            js = next(k for k in r if k.startswith('js_'))
            first, second = js.split('_')[1:]
            out[int(r['layer'])] = (float(r[js]), float(r[f'depth_{first}']), float(r[f'depth_{second}']))
        return out
    except (OSError, SystemExit, StopIteration, KeyError, TypeError, ValueError, AttributeError):
        return {}   # (a log without routing, or not as train.py writes it: the map shows no descriptive column)


def report_section(root, folder, runs, command='python study.py intervene <plan>', figures=None):
    """Markdown for study.py report: the interventions of the plan's runs in `folder` (`runs`: their paths relative
    to root), each checked against the run in its folder; numbers that are not that run's final model on its own
    evaluation set are set apart, saying why; the two-route runs without numbers are named, with `command`, which
    measures them ('' where there is nothing to say). figures: a list, given, to which (mode, by_seed) is added
    for each mode with a layer map (layer_map_figure draws it)."""
    from compare import paired_stats, sign_count
    rows, apart, waiting = {}, [], {'measure': [], 'no_weights': [], 'unfinished': []}
    for path in runs:
        state, detail = run_state(root, path)
        if state == 'numbers':
            mode, seed, nll, label, routing = detail
            rows.setdefault(mode, {})[seed] = (nll, label, routing)
        elif state == 'apart':
            apart.append((path, detail))
        elif state in waiting:
            waiting[state].append(path)
    if not rows and not apart and not any(waiting.values()):
        return ''
    out = [f"### Route interventions ({folder})\n",
           "Validation NLL of the trained weights with one route's pseudo-query set to the other's (intervene.py); "
           "Δ = NLL(intervention) − NLL(as trained), > 0: the model loses by it. Each run's final model, on the run's "
           "own evaluation set (its eval_tokens of the data build it trained on), float32.\n"]
    for mode, by_seed in sorted(rows.items()):
        names = list(TIES[mode])
        out.append(f"| {mode} seed | model | as trained | " + ' | '.join(f"{n} | Δ" for n in names) + ' |')
        out.append('|---:|---|---:|' + '---:|---:|' * len(names))
        for seed in sorted(by_seed):
            v, label = by_seed[seed][:2]
            out.append(f"| {seed} | {label} | {v['as_trained']:.4f} | " +
                       ' | '.join(f"{v[n]:.4f} | {v[n] - v['as_trained']:+.4f}" for n in names) + ' |')
        out.append('')
        out.append('| intervention | n | mean Δ | sd | 95% CI | Δ > 0 | sign test p |')
        out.append('|---|---:|---:|---:|---|---:|---:|')
        for n in names:
            deltas = [by_seed[s][0][n] - by_seed[s][0]['as_trained'] for s in sorted(by_seed)]
            st = paired_stats(deltas)
            out.append(f"| {mode}: {n} | {st['n']} | {st['mean_delta']:+.4f} | {fmt(st['sd'])} | "
                       f"[{fmt(st['ci95'][0], '+.4f')}, {fmt(st['ci95'][1], '+.4f')}] | "
                       f"{sign_count(sum(d > 0 for d in deltas), st['n'], st['ties'])} | {fmt(st['sign_test_p'], '.3g')} |")
        out.append('')
        lines = layer_map(mode, by_seed)
        out += lines
        if lines and figures is not None:
            figures.append((mode, by_seed))
    if apart:
        out.append(f"Set apart (not in the tables: its {JSON} is not the run's final model on its own evaluation set):\n" +
                   '\n'.join(f"- {path}: {why}" for path, why in apart) + '\n')
    todo = waiting['measure'] + [p for p, _ in apart if run_state_weights(root, p)]
    if todo:
        out.append(f"Not measured yet: {len(todo)} runs ({todo[0]}{', …' if len(todo) > 1 else ''}): `{command}` "
                   f"measures them from their weights (ckpt.pt, or final.safetensors) and writes each {JSON}.\n")
    if waiting['no_weights']:
        n = waiting['no_weights']
        out.append(f"No interventions yet for {len(n)} runs of {' or '.join(TIES)} here ({n[0]}{', …' if len(n) > 1 else ''}) "
                   "and no weights to measure (ckpt.pt and final.safetensors are not committed): train such a run again "
                   "into another folder, then `python intervene.py --out_dir=<the rerun> --same_as=<the run> "
                   f"--json=<the run>/{JSON}` checks the rerun's log against the run's, row for row, and measures it "
                   "(docs/results.md, \"Route interventions\").\n")
    if waiting['unfinished']:
        n = waiting['unfinished']
        out.append(f"Not finished: {len(n)} runs of {' or '.join(TIES)} ({n[0]}{', …' if len(n) > 1 else ''}), "
                   "measured once they have finished.\n")
    return '\n'.join(out) + '\n'


def layer_map(mode, by_seed):
    """Markdown lines: per attention layer l and tie, the paired ΔNLL of tying layer l only (NAME@l) over the seeds
    measured at every layer, beside the layer's descriptive routing (the JS divergence between its two routes as
    the final evaluation logged it, mean over those seeds); the rank correlation of the two over layers and seeds;
    and the sum of the one-layer Δs beside the all-layer Δ (do the layers add up). by_seed: {seed: (nll, label,
    routing)}, routing as final_routing gives it."""
    from compare import paired_stats, sign_count
    m = map_numbers(mode, by_seed)
    if m is None:
        return []
    names, seeds, layers = m['names'], m['seeds'], m['layers']
    out = [f"Where {mode} uses its routes, one layer at a time: NAME@l ties attention layer l's read only, every "
           f"other layer as trained; Δ per seed, paired over the {len(seeds)} seed{'s' * (len(seeds) > 1)} measured "
           f"at every layer ({', '.join(map(str, seeds))}); a layer carries an effect only where its CI excludes 0. "
           "JS: the Jensen-Shannon divergence (nats) between the layer's two routes' depth distributions in the final "
           "evaluation's first batch, mean over the same seeds: descriptive, not causal.\n",
           '| layer | ' + ' | '.join(f"{n}@l: mean Δ | 95% CI | Δ > 0" for n in names) + ' | JS |',
           '|---:|' + '---:|---|---:|' * len(names) + '---:|']
    for l in layers:
        cells = []
        for n in names:
            deltas = m['deltas'][n][l]
            st = paired_stats(deltas)
            cells.append(f"{st['mean_delta']:+.4f} | [{fmt(st['ci95'][0], '+.4f')}, {fmt(st['ci95'][1], '+.4f')}] | "
                         f"{sign_count(sum(d > 0 for d in deltas), st['n'], st['ties'])}")
        js = list(m['js'][l].values())
        out.append(f"| {l} | " + ' | '.join(cells) + f" | {fmt(math.fsum(js) / len(js) if js else None, '.3g')} |")
    # (a layer whose ties change nothing in any seed, as a read of the embedding alone: its routes are one read,
    # JS 0 and Δ 0 by construction, which would count for the correlation without telling anything)
    chosen = [l for l in layers if any(d != 0 for n in names for d in m['deltas'][n][l])]
    pairs = {n: [(m['js'][l][s], by_seed[s][0][f'{n}@{l}'] - by_seed[s][0]['as_trained']) for l in chosen
                 for s in seeds if s in m['js'][l] and f'{n}@{l}' in by_seed[s][0]] for n in names}
    if any(pairs.values()):
        skipped = sorted(set(layers) - set(chosen))
        out += ['', "Causal against descriptive: Spearman's rank correlation between a layer's JS and its one-layer "
                "Δ, over every (layer, seed) pair" + (f" (not layer{'s' * (len(skipped) > 1)} "
                f"{', '.join(map(str, skipped))}, whose ties change nothing in any seed)" if skipped else '') + ": " + '; '.join(
                    f"{n}@l ρ = {fmt(rank_correlation(*zip(*pairs[n])), '+.2f')} (n = {len(pairs[n])})"
                    for n in names if pairs[n]) + '.']
    out += ['', '| tie | seeds | mean Δ, all layers tied | mean sum of one-layer Δs | sum − all, per seed |',
            '|---|---:|---:|---:|---|']
    sums = [layer_sums(by_seed[s][0]) for s in seeds]
    for n in names:
        pairs = [(t[n]['all_layers'], t[n]['sum_of_layers']) for t in sums if t[n]['layers'] == len(layers)]
        if pairs:
            out.append(f"| {mode}: {n} | {len(pairs)} | {math.fsum(a for a, _ in pairs) / len(pairs):+.4f} | "
                       f"{math.fsum(b for _, b in pairs) / len(pairs):+.4f} | "
                       f"{', '.join(f'{b - a:+.4f}' for a, b in pairs)} |")
    return out + ['']


def map_numbers(mode, by_seed):
    """What the layer map shows, or None where no seed was measured at every layer: dict(names, seeds, layers,
    deltas={tie: {layer: [Δ per seed]}}, js={layer: {seed: its JS, where its log recorded it}})."""
    seeds = [s for s in sorted(by_seed) if any('@' in k for k in by_seed[s][0])]
    if not seeds:
        return None
    names = list(TIES[mode])
    layers = sorted({int(k.partition('@')[2]) for s in seeds for k in by_seed[s][0] if '@' in k})
    deltas = {n: {l: [by_seed[s][0][f'{n}@{l}'] - by_seed[s][0]['as_trained'] for s in seeds
                      if f'{n}@{l}' in by_seed[s][0]] for l in layers} for n in names}
    routing = {s: (by_seed[s][2] if len(by_seed[s]) > 2 else {}) for s in seeds}
    js = {l: {s: routing[s][l][0] for s in seeds if l in routing[s]} for l in layers}
    return dict(names=names, seeds=seeds, layers=layers, deltas=deltas, js=js)


def rank_correlation(xs, ys):
    """Spearman's ρ: the Pearson correlation of the ranks (ties share their mean rank); None where either side
    is constant or there are fewer than 3 pairs."""
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    if len(xs) < 3:
        return None
    a, b = ranks(list(xs)), ranks(list(ys))
    ma, mb = math.fsum(a) / len(a), math.fsum(b) / len(b)
    saa, sbb = math.fsum((x - ma) ** 2 for x in a), math.fsum((y - mb) ** 2 for y in b)
    if saa == 0 or sbb == 0:
        return None
    return math.fsum((x - ma) * (y - mb) for x, y in zip(a, b)) / math.sqrt(saa * sbb)


def layer_map_figure(mode, by_seed, path):
    """The layer map as a figure at path: per attention layer, each tie's mean one-layer ΔNLL with its 95% CI
    as bars, and the routes' JS divergence (mean over the seeds) on a second axis."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from compare import paired_stats
    from run_kit.run_files import atomic_write
    m = map_numbers(mode, by_seed)
    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    width = 0.8 / len(m['names'])
    for i, n in enumerate(m['names']):
        st = [paired_stats(m['deltas'][n][l]) for l in m['layers']]
        mean = [s['mean_delta'] for s in st]
        low = [s['mean_delta'] - s['ci95'][0] if s['ci95'][0] is not None and not math.isnan(s['ci95'][0]) else 0
               for s in st]
        ax.bar([l + (i - (len(m['names']) - 1) / 2) * width for l in m['layers']], mean, width, yerr=low,
               capsize=3, color=f'C{i}', label=f'{n}@l (mean Δ, 95% CI)')
    ax.axhline(0, color='k', lw=0.8)
    ax.set(xlabel='attention layer l (tied alone)', ylabel='ΔNLL (nats/token)', xticks=m['layers'],
           title=f"{mode}: one-layer ties over {len(m['seeds'])} seed{'s' * (len(m['seeds']) > 1)}")
    js = [(l, math.fsum(m['js'][l].values()) / len(m['js'][l])) for l in m['layers'] if m['js'][l]]
    if js:
        twin = ax.twinx()
        twin.plot([l for l, _ in js], [v for _, v in js], 'k.--', label='JS between the routes (descriptive)')
        twin.set_ylabel('JS divergence (nats)')
        twin.set_ylim(bottom=0)
        twin.legend(loc='upper right', fontsize=7)
    ax.legend(loc='upper left', fontsize=7)
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format='png'))
    plt.close(fig)
    return path


def run_state_weights(root, path):
    """Whether a run set apart can be measured again here: finished, not diverged, its weights in its folder."""
    from run_kit.run_files import CHECKPOINT, divergence
    from run_kit.run_dir import is_finished
    run_dir = os.path.join(root, path)
    return (is_finished(run_dir) and not divergence(run_dir) and
            any(os.path.exists(os.path.join(run_dir, f)) for f in (CHECKPOINT, FINAL)))


def fmt(x, spec='.4f'):
    return '-' if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


if __name__ == '__main__':
    sys.exit(run_command(main, sys.argv[1:], 'intervene.py', "nothing was written (--json is written whole or not "
                                                             "at all)"))
