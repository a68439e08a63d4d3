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


def test_the_command_writes_what_the_study_report_reads(trained, data_dir, tmp_path):
    from helpers import main_here
    root = tmp_path / 'study'
    for mode, (run, _) in trained.items():
        p = main_here(intervene.main, [f'--out_dir={run}', f'--data_dir={data_dir}', '--eval_tokens=512', '--batch_size=8',
                                       f'--json={run}/interventions.json'])
        assert p.returncode == 0 and list(intervene.TIES[mode])[0] in p.stdout, p.stdout + p.stderr
        for seed in (1, 2):   # the same numbers as two seeds, the second shifted: a paired table of two
            r = json.load(open(f'{run}/interventions.json'))
            r['seed'] = seed
            r['nll'] = {k: v + (seed - 1) * 0.01 * (k != 'as_trained') for k, v in r['nll'].items()}
            os.makedirs(root / 'runs' / f'{mode}_s{seed}')
            (root / 'runs' / f'{mode}_s{seed}' / 'interventions.json').write_text(json.dumps(r))
    os.makedirs(root / 'runs' / 'rd_attnres_s3')   # a run without its numbers: named, not counted
    text = intervene.report_section(str(root), 'runs', [f'runs/{n}' for n in sorted(os.listdir(root / 'runs'))])
    assert '| rd_attnres: v_as_qk | 2 |' in text and '| ctrl_heads: heads2_as_heads1 | 2 |' in text
    assert 'No interventions yet for 1 runs of rd_attnres or ctrl_heads here (runs/rd_attnres_s3)' in text


def test_a_model_trained_on_another_build_is_refused(trained, data_dir, tmp_path):
    from helpers import main_here
    run, _ = trained['rd_attnres']
    other = tmp_path / 'other'
    prepare.main(['--dataset', 'tiny', '--data_dir', str(other), '--num_proc', '1', '--val_fraction', '0.2'])
    p = main_here(intervene.main, [f'--out_dir={run}', f'--data_dir={other}'])
    assert p.returncode != 0 and 'is another build' in p.stderr + p.stdout
