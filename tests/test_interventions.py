"""Route interventions (intervene.py): tying a trained rd_attnres model's v route to its qk route is exactly
the parent architecture, Block AttnRes, carrying the same weights (the RD-AttnRes paper's statement); the
other ties change the model; the study's report turns each run's numbers into the paired summary."""

import json
import os

import pytest
import torch

import intervene
import prepare
from helpers import train_here


@pytest.fixture(scope='module')
def trained(data_dir, tmp_path_factory):
    """A tiny rd_attnres and a tiny ctrl_heads model, trained 12 steps: routes that have moved apart."""
    import sample
    out = {}
    for mode in ('rd_attnres', 'ctrl_heads'):
        run = str(tmp_path_factory.mktemp(mode))
        train_here(data_dir, run, f'--residual={mode}', '--max_iters=12', '--eval_interval=12', '--learning_rate=1e-2')
        out[mode] = (run, sample.load_model(dict(out_dir=run, weights=''))[0])
    return out


@pytest.mark.slow   # (trains two models: the trained fixture)
def test_tying_v_to_qk_is_exactly_the_parent_with_the_same_weights(trained, data_dir):
    from model import GPT, GPTConfig
    _, model = trained['rd_attnres']
    _, val, _ = prepare.read_dataset(data_dir, 'tiny')
    nlls = intervene.interventions(model, val, 512, 8)
    # the parent: an attnres model built from the same configuration, carrying every weight but the w_v
    parent = GPT(GPTConfig(**dict(vars(model.config), residual='attnres')))
    state = {k: v for k, v in model.state_dict().items() if not k.endswith('w_v')}
    parent.load_state_dict(state)
    assert nlls['v_as_qk'] == intervene.nll(parent.eval(), val, 512, 8, 'cpu')
    # the routes did move apart in training, so each tie changes the model
    apart = max((b.attn_read.w_v - b.attn_read.w_qk).abs().max().item() for b in model.transformer.h)
    assert apart > 1e-3
    assert nlls['v_as_qk'] != nlls['as_trained'] and nlls['qk_as_v'] not in (nlls['as_trained'], nlls['v_as_qk'])
    assert intervene.interventions(model, val, 512, 8) == nlls   # deterministic


@pytest.mark.slow   # (trains two models: the trained fixture)
def test_a_one_layer_tie_is_exactly_an_attnres_read_at_that_layer_only(trained, data_dir):
    import copy
    from model import GPT, GPTConfig
    _, model = trained['rd_attnres']
    _, val, _ = prepare.read_dataset(data_dir, 'tiny')
    nlls = intervene.interventions(model, val, 512, 8)
    L = model.config.n_layer
    assert L >= 2 and [k for k in nlls if '@' in k] == [f'{n}@{l}' for n in ('v_as_qk', 'qk_as_v') for l in range(L)]
    parent = GPT(GPTConfig(**dict(vars(model.config), residual='attnres')))
    parent.load_state_dict({k: v for k, v in model.state_dict().items() if not k.endswith('w_v')})
    trained_state = model.state_dict()
    for l in range(L):
        # the hybrid: the trained rd_attnres model with its block l replaced by the parent's (attnres: one read
        # feeds q, k and v there), every other block the trained model's own
        hybrid = copy.deepcopy(model)
        hybrid.transformer.h[l] = copy.deepcopy(parent.transformer.h[l])
        assert nlls[f'v_as_qk@{l}'] == intervene.nll(hybrid.eval(), val, 512, 8, 'cpu')
        # the tie touches layer l's read and nothing else: only its w_v (resp. w_qk) differs from the trained weights
        for name, (edited, source) in (('v_as_qk', ('w_v', 'w_qk')), ('qk_as_v', ('w_qk', 'w_v'))):
            twin = intervene.tied(model, intervene.TIES['rd_attnres'][name], [l]).state_dict()
            changed = [k for k in trained_state if not torch.equal(twin[k], trained_state[k])]
            # (layer 0's two pseudo-queries never move in training: its read has one source, no gradient reaches them)
            assert changed == ([f'transformer.h.{l}.attn_read.{edited}'] if l else []), changed
            key = f'transformer.h.{l}.attn_read.'
            assert torch.equal(twin[key + edited], trained_state[key + source])
        # by hand: layer l's qk pseudo-query copied onto its v route's
        manual = copy.deepcopy(model)
        with torch.no_grad():
            manual.transformer.h[l].attn_read.w_v.copy_(manual.transformer.h[l].attn_read.w_qk)
        assert nlls[f'v_as_qk@{l}'] == intervene.nll(manual.eval(), val, 512, 8, 'cpu')
    # layer 0's read has one source (the embedding), which every pseudo-query reads whole: its tie changes
    # nothing, and the all-layer tie is the tie of layers 1 .. L-1; every later layer's tie changes the model
    for name, ties in intervene.TIES['rd_attnres'].items():
        assert nlls[f'{name}@0'] == nlls['as_trained'], nlls
        assert nlls[name] == intervene.nll(intervene.tied(model, ties, range(1, L)).eval(), val, 512, 8, 'cpu')
        for l in range(1, L):
            assert nlls[f'{name}@{l}'] != nlls['as_trained'], (name, l, nlls)
    sums = intervene.layer_sums(nlls)
    assert sums['v_as_qk']['layers'] == L
    assert sums['v_as_qk']['sum_of_layers'] == pytest.approx(sum(nlls[f'v_as_qk@{l}'] - nlls['as_trained']
                                                                 for l in range(L)), abs=1e-12)
    assert sums['qk_as_v']['all_layers'] == nlls['qk_as_v'] - nlls['as_trained']
    # the control's halves, one layer at a time, the same way
    _, ctrl = trained['ctrl_heads']
    c = intervene.interventions(ctrl, val, 512, 8)
    for l in range(L):
        twin = intervene.tied(ctrl, {'w_heads2': 'w_heads1'}, [l])
        assert c[f'heads2_as_heads1@{l}'] == intervene.nll(twin.eval(), val, 512, 8, 'cpu')
        assert (c[f'heads2_as_heads1@{l}'] == c['as_trained']) == (l == 0), (l, c)


@pytest.mark.slow   # (trains two models: the trained fixture)
def test_the_command_writes_what_the_study_report_reads(trained, data_dir, tmp_path):
    import shutil
    from helpers import main_here
    root = tmp_path / 'study'
    for mode, (run, _) in trained.items():
        # no --eval_tokens nor --dataset nor --data_dir: the run's own (its configuration's)
        p = main_here(intervene.main, [f'--out_dir={run}', '--batch_size=8', f'--json={run}/interventions.json'])
        assert p.returncode == 0 and list(intervene.TIES[mode])[0] in p.stdout, p.stdout + p.stderr
        assert 'the final model of' in p.stdout and 'the run’s own evaluation set' in p.stdout, p.stdout
        r = json.load(open(f'{run}/interventions.json'))
        assert r['eval_tokens'] == 512 and r['model']['step'] == 12 and r['model']['final'] is True
        assert r['model']['checkpoint_sha256'] and r['eval']['windows'] == 512 // 32
        # the one-layer ties beside the all-layer ones, and per tie the sum of its one-layer Δ beside the whole's
        L = json.load(open(f'{run}/config.json'))['n_layer']
        for name in intervene.TIES[mode]:
            one = [r['nll'][f'{name}@{l}'] - r['nll']['as_trained'] for l in range(L)]
            assert r['layer_sums'][name] == dict(all_layers=r['nll'][name] - r['nll']['as_trained'],
                                                 sum_of_layers=pytest.approx(sum(one), abs=1e-12), layers=L)
            assert f'{name}@{L - 1}' in p.stdout and 'sum of its' in p.stdout, p.stdout
        for seed in (1, 2):   # the same run as two seeds, the second's numbers shifted: a paired table of two
            folder = root / 'runs' / f'{mode}_s{seed}'
            os.makedirs(folder)
            shutil.copy(f'{run}/log.jsonl', folder)
            json.dump(dict(json.load(open(f'{run}/config.json')), seed=seed), open(folder / 'config.json', 'w'))
            r['seed'] = seed
            r['nll'] = {k: v + (seed - 1) * 0.01 * (k != 'as_trained') for k, v in r['nll'].items()}
            (folder / 'interventions.json').write_text(json.dumps(r))
    # a finished run without its numbers and without weights: named, not counted
    os.makedirs(root / 'runs' / 'rd_attnres_s3')
    for name in ('config.json', 'log.jsonl'):
        shutil.copy(os.path.join(trained['rd_attnres'][0], name), root / 'runs' / 'rd_attnres_s3')
    figures = []
    text = intervene.report_section(str(root), 'runs', [f'runs/{n}' for n in sorted(os.listdir(root / 'runs'))],
                                    figures=figures)
    assert '| rd_attnres: v_as_qk | 2 |' in text and '| ctrl_heads: heads2_as_heads1 | 2 |' in text, text
    assert 'No interventions yet for 1 runs of rd_attnres or ctrl_heads here (runs/rd_attnres_s3)' in text
    assert 'step 12 (final), checkpoint ' in text
    # each layer's tie paired over the two seeds, and the layers' sum beside the whole, per mode
    assert text.count('one layer at a time: NAME@l ties') == 2 and '| 0 | ' in text and text.count('| rd_attnres: v_as_qk | 2 | ') == 2
    # beside each layer the JS its log recorded (the real runs' logs hold routing): a number, and the ρ line
    last = next(l for l in text.splitlines() if l.startswith(f'| {L - 1} | '))
    assert float(last.rsplit('|', 2)[1]) >= 0 and text.count("Spearman's rank correlation") == 2, text
    assert sorted(m for m, _ in figures) == ['ctrl_heads', 'rd_attnres']
    png = intervene.layer_map_figure(*figures[0], str(tmp_path / 'map.png'))
    assert open(png, 'rb').read(4) == b'\x89PNG'


@pytest.mark.slow   # (trains two models: the trained fixture)
def test_a_model_trained_on_another_build_is_refused(trained, data_dir, tmp_path):
    from helpers import main_here
    run, _ = trained['rd_attnres']
    other = tmp_path / 'other'
    prepare.main(['--dataset', 'tiny', '--data_dir', str(other), '--num_proc', '1', '--val_fraction', '0.2'])
    p = main_here(intervene.main, [f'--out_dir={run}', f'--data_dir={other}'])
    assert p.returncode != 0 and 'is another build' in p.stderr + p.stdout


# ---------------------------------------------------------------------------------------------
# Which model a run's numbers are of: the report keeps only its run's final model on the run's own set

def numbers_of(run_dir, **model):
    """An interventions.json as intervene.py writes it for the finished run in run_dir (its final model, its own
    evaluation set), with `model`'s keys changed."""
    from run_kit.run_files import read_config
    config = read_config(run_dir)   # (as the report reads it: its schedule's length resolved)
    final = [r for r in map(json.loads, open(os.path.join(run_dir, 'log.jsonl'))) if 'val_loss' in r][-1]
    record = dict(run=run_dir, step=config['max_iters'], max_iters=config['max_iters'], final=True,
                  file=os.path.join(run_dir, 'ckpt.pt'), config_sha256=intervene.config_hash(config),
                  checkpoint_sha256=None, val_loss=final['val_loss'])
    record.update(model)
    return dict(residual=config['residual'], seed=config['seed'], data_id=config.get('data_id'),
                eval_tokens=config['eval_tokens'], nll=dict(as_trained=3.3, v_as_qk=3.35, qk_as_v=3.4), model=record)


def test_numbers_that_are_not_the_runs_final_model_are_set_apart(tmp_path):
    from helpers import make_run
    root, runs = str(tmp_path), tmp_path / 'runs'
    dirs = {s: make_run(str(runs), f'rd_attnres_s{s}', 'rd_attnres', s, 3.3 + 0.01 * s) for s in range(1, 9)}
    dirs[9] = make_run(str(runs), 'rd_attnres_s9', 'rd_attnres', 9, 3.4, steps=(0, 50), max_iters=100)  # training
    write = lambda s, r: (runs / f'rd_attnres_s{s}' / 'interventions.json').write_text(json.dumps(r))
    write(1, numbers_of(dirs[1]))                                         # its final model: kept
    write(2, numbers_of(dirs[2], step=50))                                # a checkpoint before the end
    write(3, numbers_of(dirs[3], val_loss=3.9))                           # a run since replaced
    write(4, numbers_of(dirs[4]))                                         # ... and then the run diverged
    with open(os.path.join(dirs[4], 'log.jsonl'), 'a') as f:
        f.write(json.dumps(dict(step=100, diverged=dict(what='training loss', first_step=99, value='nan'))) + '\n')
    legacy = {k: v for k, v in numbers_of(dirs[5]).items() if k != 'model'}
    write(5, legacy)                                                      # says nothing of its model
    write(6, dict(legacy, seed=6, same_log_as='runs/rd_attnres_s6: 5 log rows equal'))   # a rerun checked row by row
    write(7, dict(numbers_of(dirs[7]), eval_tokens=512))                  # another evaluation set
    write(8, numbers_of(dirs[8]))                                         # the folder's run replaced, same loss
    config = json.load(open(os.path.join(dirs[8], 'config.json')))
    json.dump(dict(config, learning_rate=1e-4), open(os.path.join(dirs[8], 'config.json'), 'w'))
    write(9, numbers_of(dirs[9], step=50))
    text = intervene.report_section(root, 'runs', [f'runs/rd_attnres_s{s}' for s in range(1, 10)], 'CMD')
    assert '| rd_attnres: v_as_qk | 2 |' in text, text                   # seeds 1 and 6, nothing else
    assert '| 1 | step 100 (final) | 3.3000 |' in text and '| 6 | final, of a rerun with an equal log |' in text
    apart = {line.split(':')[0][2:]: line for line in text.splitlines() if line.startswith('- runs/')}
    assert sorted(apart) == [f'runs/rd_attnres_s{s}' for s in (2, 3, 4, 5, 7, 8, 9)], text
    assert 'it measured step 50, not the run\'s final model (step 100)' in apart['runs/rd_attnres_s2']
    assert 'it measured another run: that run\'s final validation loss was 3.9000' in apart['runs/rd_attnres_s3']
    assert 'the run diverged (non-finite training loss' in apart['runs/rd_attnres_s4']
    assert 'does not say which model it measured' in apart['runs/rd_attnres_s5']
    assert "not the run's own evaluation set" in apart['runs/rd_attnres_s7']
    assert 'another configuration in this folder' in apart['runs/rd_attnres_s8']
    assert 'the run is not finished' in apart['runs/rd_attnres_s9']
    # a rerun's log row count no longer that of the run's log (the run there replaced since): not its numbers
    with open(os.path.join(dirs[6], 'log.jsonl'), 'a') as f:
        f.write(json.dumps(dict(step=100, eval_only=True, val_loss=3.0)) + '\n')
    text = intervene.report_section(root, 'runs', ['runs/rd_attnres_s6'], 'CMD')
    assert 'does not say which model it measured' in text and '| 6 |' not in text


@pytest.mark.slow
def test_a_run_still_training_or_diverged_is_refused_and_a_finished_one_measured(data_dir, tmp_path):
    import signal
    import time
    from helpers import main_here, run_here, start
    from run_kit.run_files import CHECKPOINT, checkpoint_progress
    out = str(tmp_path / 'run')
    proc = start(['--residual=rd_attnres', '--max_iters=12', '--eval_interval=4'], data_dir, out)
    deadline = time.time() + 300
    while (checkpoint_progress(os.path.join(out, CHECKPOINT)) or (0,))[0] < 4:   # its first checkpoint, step 4
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGSTOP)   # held between two steps: still training, as far as its files say
    try:
        args = [f'--out_dir={out}', '--batch_size=8', f'--json={out}/interventions.json']
        p = main_here(intervene.main, args)
        assert p.returncode == 1 and 'is not finished (its checkpoint holds step' in p.stderr and 'of 12)' in p.stderr, \
            p.stdout + p.stderr
        assert not os.path.exists(f'{out}/interventions.json')
    finally:
        proc.send_signal(signal.SIGCONT)
    assert proc.wait(timeout=300) == 0, proc.communicate()
    # what it says to do: the same command once the run has finished
    p = main_here(intervene.main, args)
    assert p.returncode == 0 and 'the final model of' in p.stdout, p.stdout + p.stderr
    assert json.load(open(f'{out}/interventions.json'))['model']['step'] == 12
    # a diverged run: refused, naming the divergence
    bad = str(tmp_path / 'bad')
    run_here(['--residual=rd_attnres', '--learning_rate=1e30', '--warmup_iters=1', '--max_iters=8', '--eval_interval=4'],
             data_dir, bad, expect_ok=False)
    p = main_here(intervene.main, [f'--out_dir={bad}'])
    assert p.returncode == 1 and 'diverged (non-finite' in p.stderr and 'has no trained model' in p.stderr, p.stderr


@pytest.mark.slow
def test_ctrl_c_in_sample_is_one_line(data_dir, tmp_path):
    from helpers import run_here
    from test_study import interrupted
    out = str(tmp_path / 'run')
    run_here(['--max_iters=2'], data_dir, out)
    fifo = str(tmp_path / 'prompt')
    os.mkfifo(fifo)   # the prompt file: sample.py waits on it, inside its main, once the model is loaded
    interrupted([os.path.join(os.path.dirname(intervene.__file__), 'sample.py'), f'--out_dir={out}',
                 f'--start=FILE:{fifo}', '--device=cpu'], fifo, 'sample.py: stopped by Ctrl-C; nothing was written')


def test_the_layer_map_pairs_each_layers_tie_over_the_seeds_and_sets_the_sum_beside_the_whole():
    # three seeds, two layers: layer 0's tie costs 0.01, 0.02, 0.03; layer 1's nothing; all layers at once 0.05.
    # The routes' JS per layer from seeds 1 and 2's logs; seed 3's log recorded none
    routing = {1: {0: (0.30, 1.0, 0.5), 1: (0.10, 1.0, 0.9)}, 2: {0: (0.20, 1.0, 0.6), 1: (0.12, 1.0, 0.9)}, 3: {}}
    by_seed = {}
    for s, d0 in ((1, 0.01), (2, 0.02), (3, 0.03)):
        nll = {'as_trained': 3.0, 'v_as_qk': 3.05, 'qk_as_v': 3.1,
               'v_as_qk@0': 3.0 + d0, 'v_as_qk@1': 3.0, 'qk_as_v@0': 3.0 - d0, 'qk_as_v@1': 3.02}
        by_seed[s] = (nll, 'final', routing[s])
    by_seed[4] = ({'as_trained': 3.0, 'v_as_qk': 3.9, 'qk_as_v': 3.9}, 'final', {})   # all layers only: not in the map
    lines = intervene.layer_map('rd_attnres', by_seed)
    text = '\n'.join(lines)
    assert 'the 3 seeds measured at every layer (1, 2, 3)' in text, text
    half = 4.302652729911275 * 0.01 / 3 ** 0.5   # t(0.975, 2) · sd / √n
    row0 = next(l for l in lines if l.startswith('| 0 |'))
    assert row0 == (f"| 0 | +0.0200 | [{0.02 - half:+.4f}, {0.02 + half:+.4f}] | 3/3 | "
                    f"-0.0200 | [{-0.02 - half:+.4f}, {-0.02 + half:+.4f}] | 0/3 | 0.25 |"), row0
    row1 = next(l for l in lines if l.startswith('| 1 |'))
    assert row1.startswith('| 1 | +0.0000 | [+0.0000, +0.0000] | 0/0 (3 ties) |') and row1.endswith(' | 0.11 |'), row1
    # ρ over the (layer, seed) pairs that have both: JS 0.30, 0.20, 0.10, 0.12 against v_as_qk's Δ 0.01, 0.02, 0,
    # 0 (ranks 3, 2, 0, 1 against 2, 3, 0.5, 0.5): 3.5 / √(5 · 4.5) = 0.738; qk_as_v's Δ −0.01, −0.02, 0.02, 0.02
    # (ranks 1, 0, 2.5, 2.5): −0.738
    assert 'v_as_qk@l ρ = +0.74 (n = 4); qk_as_v@l ρ = -0.74 (n = 4).' in text, text
    # a layer whose ties change nothing in any seed (a read of the embedding alone) is left out of ρ, and said
    still = {s: ({**v[0], 'qk_as_v@1': 3.0}, *v[1:]) for s, v in by_seed.items()}
    text = '\n'.join(intervene.layer_map('rd_attnres', still))
    assert ("pair (not layer 1, whose ties change nothing in any seed): v_as_qk@l ρ = - (n = 2); "
            "qk_as_v@l ρ = - (n = 2).") in text, text   # (two pairs left: too few)
    # v_as_qk: all layers +0.05, the layers' sum +0.02 on average (−0.04, −0.03, −0.02 per seed): they interact
    assert '| rd_attnres: v_as_qk | 3 | +0.0500 | +0.0200 | -0.0400, -0.0300, -0.0200 |' in text, text
    # without any routing in the logs: no JS in the rows, no ρ line
    bare = '\n'.join(intervene.layer_map('rd_attnres', {s: (v[0], v[1], {}) for s, v in by_seed.items()}))
    assert 'ρ =' not in bare and '| 0/3 | - |' in bare, bare
    assert intervene.layer_map('rd_attnres', {4: by_seed[4]}) == []   # no seed measured per layer: no map


def test_rank_correlation_is_spearmans_on_ranks_not_values():
    x = [1, 2, 3, 4, 5]
    assert intervene.rank_correlation(x, [v ** 3 for v in x]) == pytest.approx(1.0)   # monotone: 1 (Pearson: < 1)
    assert intervene.rank_correlation(x, [-v for v in x]) == pytest.approx(-1.0)
    # 1 2 3 4 5 against 2 1 4 3 5: 1 − 6·Σd²/(n(n²−1)) = 1 − 6·4/120 = 0.8
    assert intervene.rank_correlation(x, [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    # ties share their mean rank: 1 1 2 → ranks 0.5 0.5 2 against 0 1 2: 1.5 / √(1.5 · 2)
    assert intervene.rank_correlation([1, 1, 2], [1, 2, 3]) == pytest.approx(1.5 / 3 ** 0.5)
    assert intervene.rank_correlation([1, 2, 3], [4, 4, 4]) is None   # a constant side: no correlation to speak of
    assert intervene.rank_correlation([1, 2], [1, 2]) is None          # two pairs: too few


def test_final_routing_reads_the_final_evaluations_routes_and_nothing_from_a_bad_log(tmp_path):
    config = {'max_iters': 4}
    row = {'step': 4, 'val_loss': 3.0, 'routing': {'summary': [
        {'layer': 0, 'js_qk_v': 0.0, 'depth_qk': 0.0, 'depth_v': 0.0},
        {'layer': 1, 'js_qk_v': 0.25, 'depth_qk': 0.5, 'depth_v': 0.75}]}}
    early = dict(row, step=2, routing={'summary': [{'layer': 1, 'js_qk_v': 0.9, 'depth_qk': 0.1, 'depth_v': 0.2}]})
    (tmp_path / 'log.jsonl').write_text(json.dumps(early) + '\n' + json.dumps(row) + '\n')
    assert intervene.final_routing(str(tmp_path), config) == {0: (0.0, 0.0, 0.0), 1: (0.25, 0.5, 0.75)}
    for bad in ('{"step": 4, "val_loss": 3.0, "routing": {"summary": [{"layer": "x"}]}}\n',   # not as train.py writes it
                '{"step": 4, "val_loss": 3.0, "routing": 7}\n', 'not json\n',
                json.dumps(early) + '\n'):   # no final evaluation row
        (tmp_path / 'log.jsonl').write_text(bad)
        assert intervene.final_routing(str(tmp_path), config) == {}, bad
    os.remove(tmp_path / 'log.jsonl')
    assert intervene.final_routing(str(tmp_path), config) == {}


def test_the_layer_map_figure_is_a_png_with_a_bar_per_layer_and_tie(tmp_path):
    by_seed = {s: ({'as_trained': 3.0, 'v_as_qk@0': 3.0 + 0.01 * s, 'v_as_qk@1': 3.0, 'qk_as_v@0': 3.0,
                    'qk_as_v@1': 3.01}, 'final', {0: (0.0, 0, 0), 1: (0.1 * s, 1, 1)}) for s in (1, 2)}
    path = intervene.layer_map_figure('rd_attnres', by_seed, str(tmp_path / 'layer_map_rd_attnres.png'))
    assert open(path, 'rb').read(8) == b'\x89PNG\r\n\x1a\n' and os.listdir(tmp_path) == ['layer_map_rd_attnres.png']
    one = intervene.layer_map_figure('rd_attnres', {1: by_seed[1]}, str(tmp_path / 'one.png'))   # one seed: no CI
    assert open(one, 'rb').read(4) == b'\x89PNG'
