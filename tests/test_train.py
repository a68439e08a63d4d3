"""Tests of train.py, configurator.py, config/ and sample.py: the paired protocol, exact resume,
DDP equivalence and the errors a user meets. Every run here is a real `python train.py` process on
the CPU with a tiny model on the built-in corpus."""

import glob
import json
import os
import sys

os.environ.setdefault('HF_HUB_OFFLINE', '1')

import pytest
import torch

from configurator import configure
import compare
from train import DIGEST_START
from run_kit.run_files import divergence, load_checkpoint, save_checkpoint
import train
from helpers import HERE, python, read_log, run, run_here, sample_here, train_here


# ---------------------------------------------------------------------------------------------
# Configuration

def test_configure_applies_files_then_overrides(tmp_path):
    cfg_file = tmp_path / 'c.py'
    cfg_file.write_text("n_layer = 3\nlearning_rate = 1\nresidual = 'attnres'\n_private = 5\n")
    cfg = configure(train.DEFAULTS, [str(cfg_file), '--n_layer=5', '--residual=standard', '--compile=True'])
    assert cfg['n_layer'] == 5 and cfg['residual'] == 'standard' and cfg['compile'] is True
    assert cfg['learning_rate'] == 1.0 and isinstance(cfg['learning_rate'], float)


@pytest.mark.parametrize('argv, message', [
    (['--learnig_rate=1e-3'], "unknown config key 'learnig_rate'.*did you mean learning_rate"),
    (['--n_layer=2.5'], "'n_layer' in --n_layer must be a int"),
    (['--compile=1'], "'compile' in --compile must be a bool"),
    (['--n_layer'], 'must look like --key=value'),
    (['no_such_file.py'], "cannot read config file 'no_such_file.py'"),
])
def test_configure_rejects_bad_input(argv, message):
    with pytest.raises(SystemExit, match=message):
        configure(train.DEFAULTS, argv)


def test_unknown_key_in_config_file(tmp_path):
    (tmp_path / 'c.py').write_text("n_layers = 3\n")
    with pytest.raises(SystemExit, match=r"unknown config key 'n_layers' in .*c.py; did you mean n_layer"):
        configure(train.DEFAULTS, [str(tmp_path / 'c.py')])


def load_config(path):
    return configure(train.DEFAULTS, [path])


@pytest.mark.parametrize('group', [
    ['baseline_120m', 'attnres_120m', 'rd_120m'],
    ['baseline_343m', 'attnres_343m', 'rd_343m'],
    ['attnres_120m_early', 'rd_120m_early', 'ctrl_params_120m_early', 'ctrl_dup_120m_early',
     'ctrl_fixed_v_120m_early', 'ctrl_heads_120m_early'],
])
def test_config_files_of_a_group_differ_only_in_residual(group):
    configs = {name: load_config(os.path.join(HERE, 'config', name + '.py')) for name in group}
    residuals = set()
    for name, cfg in configs.items():
        diff = {k for k in cfg if cfg[k] != configs[group[0]][k]} - {'residual', 'out_dir'}
        assert diff == set(), (name, diff)
        assert name in cfg['out_dir'] and '{seed}' in cfg['out_dir']
        residuals.add(cfg['residual'])
    assert len(residuals) == len(group)


def test_paper_configs_follow_the_recipe():
    paths = glob.glob(os.path.join(HERE, 'config', '*_[13]*.py'))
    assert len(paths) == 12, paths      # baseline, attnres, rd at 120m and 343m; the six early-budget arms at 120m
    for path in paths:
        cfg = load_config(path)
        assert cfg['total_batch_size'] == 2 ** 19 and cfg['block_size'] == 1024 and cfg['dataset'] == 'fineweb_edu'
        size = '343m' if '343m' in path else '120m'
        assert (cfg['n_layer'], cfg['n_embd'], cfg['learning_rate']) == \
            {'120m': (12, 768, 6e-4), '343m': (24, 1024, 3e-4)}[size]
        if 'early' not in path:   # 2.0B tokens
            assert abs(cfg['max_iters'] * cfg['total_batch_size'] - 2.0e9) < cfg['total_batch_size']
        else:                     # the controls' early budget (docs/method.md): 0.5B tokens, 954 steps
            assert cfg['max_iters'] == 954 and abs(cfg['max_iters'] * cfg['total_batch_size'] - 0.5e9) < 2 ** 19
        # the rest of the recipe (docs/training.md, "Recipe"; the early budget's warmup: docs/method.md): warmup,
        # cosine to 10%, AdamW's, the clip, bf16, compile
        assert (cfg['warmup_iters'] == (100 if 'early' in path else 250), cfg['min_lr_ratio'], cfg['beta1'], cfg['beta2'], cfg['weight_decay'],
                cfg['grad_clip'], cfg['compile']) == (True, 0.1, 0.9, 0.95, 0.1, 1.0, True), path
        assert cfg['dtype'] in ('auto', 'bfloat16'), path


def test_the_docs_parameter_counts_are_the_models():
    # docs/training.md's counts of the paper shapes and the README's of the quickstart, as model.py counts them
    # (built on the meta device: no memory, the same parameters)
    import re
    from model import GPT, GPTConfig
    from run_kit.common import MODEL_KEYS

    def count(name):
        cfg = load_config(os.path.join(HERE, 'config', name + '.py'))
        with torch.device('meta'):
            return GPT(GPTConfig(**{k: cfg[k] for k in MODEL_KEYS})).get_num_params()
    text = ' '.join(open(os.path.join(HERE, 'docs', 'training.md'), encoding='utf-8').read().split())
    said = re.search(r'120m: standard ([\d,]+), attnres \+ ([\d,]+) .*?rd_attnres \+ ([\d,]+) more .*?343m: standard '
                     r'([\d,]+), attnres \+ ([\d,]+), rd_attnres \+ ([\d,]+) more', text)
    assert said, 'the parameter counts of docs/training.md, "Recipe"'
    said = [int(n.replace(',', '')) for n in said.groups()]
    for size, (std, attnres, rd) in (('120m', said[:3]), ('343m', said[3:])):
        counts = [count(f'baseline_{size}'), count(f'attnres_{size}'), count(f'rd_{size}')]
        assert counts == [std, std + attnres, std + attnres + rd], (size, counts)
    method = ' '.join(open(os.path.join(HERE, 'docs', 'method.md'), encoding='utf-8').read().split())
    assert f"have {said[0] / 1e6:.1f}M and {said[3] / 1e6:.1f}M (standard residual)" in method
    readme = ' '.join(open(os.path.join(HERE, 'README.md'), encoding='utf-8').read().split())
    assert f"{count('quickstart') / 1e6:.1f}M parameters, most of them the tied embedding" in readme


# ---------------------------------------------------------------------------------------------
# Data order and schedule

@pytest.mark.assignment4
def test_data_order_is_a_seeded_permutation_of_whole_windows():
    n, per_step = 50, 8
    seen = [w for s in range(7) for w in train.step_windows(s, n, per_step, seed=3)]  # 56 = one epoch and a bit
    assert sorted(seen[:n]) == list(range(n)), "concept 'the exact order: each epoch a seed-keyed permutation, steps crossing epochs': an epoch takes each window once"
    assert seen == [w for s in range(7) for w in train.step_windows(s, n, per_step, seed=3)]
    assert seen != [w for s in range(7) for w in train.step_windows(s, n, per_step, seed=4)], \
        "concept 'the exact order: each epoch a seed-keyed permutation, steps crossing epochs': the order depends on the seed (window_order(n_windows, seed, epoch))"
    assert seen[n:] != seen[:6], "concept 'the exact order: each epoch a seed-keyed permutation, steps crossing epochs': the next epoch is another permutation (window_order of epoch 1)"
    assert all(isinstance(w, int) for w in seen), "concept 'the exact order: each epoch a seed-keyed permutation, steps crossing epochs': return a list of Python ints"


@pytest.mark.assignment4
def test_data_order_by_hand():
    # 5 windows, M = 3 per step: the order is the epochs' permutations one after another,
    #   epoch 0 = window_order(5, seed, 0) = [a0, a1, a2, a3, a4], epoch 1 = window_order(5, seed, 1) = [b0, ...]
    #   step 0 = [a0, a1, a2]   step 1 = [a3, a4, b0] (it crosses into epoch 1)   step 2 = [b1, b2, b3]
    a, b = train.window_order(5, 1, 0).tolist(), train.window_order(5, 1, 1).tolist()
    for step, expected in enumerate(([a[0], a[1], a[2]], [a[3], a[4], b[0]], [b[1], b[2], b[3]])):
        got = train.step_windows(step, 5, 3, seed=1)
        assert list(got) == expected, (f"concept 'the exact order: each epoch a seed-keyed permutation, steps crossing epochs': step {step} of 5 windows, 3 per step, gave {list(got)}, not "
                                       f"{expected}: positions [step*M, (step+1)*M) of epoch 0's permutation, then "
                                       "epoch 1's, ...")


@pytest.mark.assignment4
def test_data_order_is_the_whole_step_whatever_the_processes(monkeypatch):
    # the order of a step is all ranks' windows together; train.py splits them after. So it must not
    # depend on how many processes there are, or which one asks
    alone = [train.step_windows(s, 50, 8, seed=3) for s in range(10)]
    for rank, world in ((1, 2), (3, 8)):
        for key, value in dict(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE=world).items():
            monkeypatch.setenv(key, str(value))
        assert [train.step_windows(s, 50, 8, seed=3) for s in range(10)] == alone, \
            f"concept 'the same order on any number of processes': rank {rank} of {world} got another order: return the whole step, whoever asks"
    assert all(len(w) == 8 for w in alone), "concept 'the same order on any number of processes': a step is all M windows, not one rank's share"


def test_lr_warmup_starts_above_zero_and_decays_to_ten_percent():
    cfg = dict(learning_rate=1.0, warmup_iters=10, max_iters=100, lr_decay_iters=0, min_lr_ratio=0.1)
    lrs = [train.get_lr(i, cfg) for i in range(101)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[100] == pytest.approx(0.1) and all(a >= b for a, b in zip(lrs[9:], lrs[10:]))


# ---------------------------------------------------------------------------------------------
# Paired arms

def test_two_arms_of_one_seed_are_paired(data_dir, tmp_path):
    # learning_rate=0: one step leaves the initial parameters in the checkpoint
    out = {m: str(tmp_path / m) for m in ('attnres', 'rd_attnres', 'standard')}
    for mode, path in out.items():
        run_here([f'--residual={mode}', '--max_iters=2', '--learning_rate=0.0', '--seed=7'], data_dir, path)
    states = {m: torch.load(os.path.join(p, 'ckpt.pt'), weights_only=False)['model'] for m, p in out.items()}
    for a in out:
        for b in out:
            for k in set(states[a]) & set(states[b]):
                assert torch.equal(states[a][k], states[b][k]), (a, b, k)
    logs = {m: read_log(p) for m, p in out.items()}
    hashes = {m: [r['data_hash'] for _, r in sorted(logs[m][0].items())] for m in out}
    assert hashes['attnres'] == hashes['rd_attnres'] == hashes['standard'] and len(hashes['attnres']) == 2
    # the data digest, on every training and evaluation row: the same in every arm, and the training and
    # evaluation rows of a step agree; it changes from step to step
    digests = {m: [(s, r['data_digest']) for rows in logs[m] for s, r in sorted(rows.items())] for m in out}
    assert digests['attnres'] == digests['rd_attnres'] == digests['standard']
    assert {s: d for s, d in digests['attnres']} == {0: DIGEST_START, 1: logs['attnres'][0][1]['data_digest'],
                                                       2: logs['attnres'][1][2]['data_digest']}
    assert len({d for _, d in digests['attnres']}) == 3
    # the fixed validation set: attnres and rd_attnres are the same function at init, so the same loss
    assert logs['attnres'][1][0]['val_loss'] == pytest.approx(logs['rd_attnres'][1][0]['val_loss'], abs=1e-6)
    other = str(tmp_path / 'other_seed')
    run_here(['--residual=attnres', '--max_iters=2', '--learning_rate=0.0', '--seed=8'], data_dir, other)
    assert [r['data_hash'] for _, r in sorted(read_log(other)[0].items())] != hashes['attnres']
    assert read_log(other)[0][2]['data_digest'] != logs['attnres'][0][2]['data_digest']


@pytest.mark.slow
def test_arms_whose_windows_differ_at_a_step_no_row_logs_are_not_paired(data_dir, tmp_path, monkeypatch):
    # log_interval = eval_interval = 10: rows at steps 0 and 10 only. The rd_attnres arm trains step 3 on other
    # windows (another code's order): step 10's fingerprint (of step 9) agrees, and only the digest tells
    args = ['--max_iters=10', '--log_interval=10', '--eval_interval=10', '--seed=3']
    out = {name: str(tmp_path / name) for name in ('attnres', 'rd_attnres', 'rd_attnres_again')}
    run_here(['--residual=attnres', *args], data_dir, out['attnres'])
    order = train.step_windows
    with monkeypatch.context() as m:
        m.setattr(train, 'step_windows', lambda step, n, per_step, seed: order(step, n, per_step, seed + (step == 3)))
        run_here(['--residual=rd_attnres', *args], data_dir, out['rd_attnres'])
    (ta, va), (tr, vr) = read_log(out['attnres']), read_log(out['rd_attnres'])
    assert sorted(ta) == [10] and sorted(va) == [0, 10] and ta[10]['data_hash'] == tr[10]['data_hash']
    runs = [compare.load_run(out[name]) for name in ('attnres', 'rd_attnres')]
    results, _, refused = compare.compare(runs)
    assert results == [] and len(refused) == 1, refused
    said = refused[0][1]
    assert 'agree at step 0 and differ at step 10, so one of the steps 0 to 9 trained on other windows' in said, said
    assert 'train both arms with the same code' in said, said
    # what it says, done: the arm trained again with the other's code, the same seed and data, pairs
    run_here(['--residual=rd_attnres', *args], data_dir, out['rd_attnres_again'])
    results, _, refused = compare.compare([runs[0], compare.load_run(out['rd_attnres_again'])])
    assert refused == [] and [p['seed'] for p in results[0]['pairs']] == [3]


@pytest.mark.slow
@pytest.mark.assignment4
def test_ddp_on_two_processes_equals_one_process_with_accumulation(data_dir, tmp_path):
    args = ['--residual=rd_attnres', '--batch_size=2', '--max_iters=3', '--eval_interval=3']
    run(args, data_dir, str(tmp_path / 'one'))   # 256 / (2 * 32) = 4 micro-steps in one process
    torchrun = (sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2')
    run(args, data_dir, str(tmp_path / 'two'), launcher=torchrun)  # 2 micro-steps in each of 2
    (t1, v1), (t2, v2) = read_log(str(tmp_path / 'one')), read_log(str(tmp_path / 'two'))
    assert json.load(open(tmp_path / 'two' / 'config.json'))['world_size'] == 2
    for s in (1, 2, 3):
        assert t1[s]['data_hash'] == t2[s]['data_hash']
        assert t1[s]['train_loss'] == pytest.approx(t2[s]['train_loss'], abs=1e-5)
    for s in (0, 3):
        assert v1[s]['val_loss'] == pytest.approx(v2[s]['val_loss'], abs=1e-5)


# ---------------------------------------------------------------------------------------------
# Exact resume and safety

@pytest.mark.slow
def test_resume_equals_an_uninterrupted_run(data_dir, tmp_path):
    full, half = str(tmp_path / 'full'), str(tmp_path / 'half')
    args = ['--residual=rd_attnres', '--lr_decay_iters=6', '--eval_interval=3']
    run_here(args + ['--max_iters=6'], data_dir, full)
    run_here(args + ['--max_iters=3'], data_dir, half)
    run_here(args + ['--max_iters=6', '--init_from=resume'], data_dir, half)
    (tf, vf), (th, vh) = read_log(full), read_log(half)
    assert sorted(tf) == sorted(th) == [1, 2, 3, 4, 5, 6] and sorted(vf) == sorted(vh) == [0, 3, 6]
    assert [tf[s]['train_loss'] for s in tf] == [th[s]['train_loss'] for s in tf]
    assert [vf[s]['val_loss'] for s in vf] == [vh[s]['val_loss'] for s in vf]
    # the data digest goes on from the checkpoint's: every row's is the uninterrupted run's
    assert [tf[s]['data_digest'] for s in tf] == [th[s]['data_digest'] for s in tf]
    assert [vf[s]['data_digest'] for s in vf] == [vh[s]['data_digest'] for s in vf]
    a = torch.load(os.path.join(full, 'ckpt.pt'), weights_only=False)
    b = torch.load(os.path.join(half, 'ckpt.pt'), weights_only=False)
    assert a['step'] == b['step'] == 6 and a['data_digest'] == b['data_digest'] == tf[6]['data_digest']
    assert all(torch.equal(a['model'][k], b['model'][k]) for k in a['model'])
    assert not glob.glob(os.path.join(half, '*.tmp'))


@pytest.mark.slow
def test_a_checkpoint_without_a_data_digest_resumes_with_the_digest_of_its_steps(data_dir, tmp_path):
    # a checkpoint written before train.py kept the digest: the resumed run rebuilds it from the order
    full, old = str(tmp_path / 'full'), str(tmp_path / 'old')
    args = ['--lr_decay_iters=6', '--eval_interval=3']
    run_here(args + ['--max_iters=6'], data_dir, full)
    run_here(args + ['--max_iters=3'], data_dir, old)
    path = os.path.join(old, 'ckpt.pt')
    ckpt = load_checkpoint(path)
    assert ckpt.pop('data_digest') == read_log(full)[0][3]['data_digest']
    save_checkpoint(ckpt, path)
    run_here(args + ['--max_iters=6', '--init_from=resume'], data_dir, old)
    digests = [[(s, r['data_digest']) for rows in read_log(run) for s, r in sorted(rows.items())] for run in (old, full)]
    assert digests[0] == digests[1] and len(digests[0]) == 6 + 3
    assert load_checkpoint(path)['data_digest'] == read_log(full)[0][6]['data_digest']


def test_resume_refuses_another_mode_or_shape(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    run_here(['--residual=attnres', '--max_iters=2'], data_dir, out)
    for bad, word in (['--residual=rd_attnres', 'residual'], ['--n_embd=64', 'n_embd'], ['--seed=2', 'seed']):
        p = run_here(['--residual=attnres', '--max_iters=4', '--init_from=resume', bad], data_dir, out, expect_ok=False)
        assert p.returncode != 0 and 'cannot resume' in p.stderr and word in p.stderr, p.stderr[-1000:]


def test_non_finite_loss_stops_without_saving(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    p = run_here(['--learning_rate=1e30', '--warmup_iters=1', '--eval_interval=1', '--max_iters=10'], data_dir, out,
                 expect_ok=False)
    assert p.returncode != 0 and 'non-finite' in p.stderr and 'no checkpoint was written' in p.stderr, p.stderr[-1500:]
    assert not os.path.exists(os.path.join(out, 'ckpt.pt'))   # nothing diverged was written
    # a result: recorded in the log (what, which value, the step it was first seen and the one it was noticed at)
    record = divergence(out)
    assert record['value'] in ('nan', 'inf', '-inf') and record['step'] == 1, record
    assert f"non-finite {record['what']}" in p.stderr and f"at step {record['first_step']}" in p.stderr
    # its advice, followed: a lower learning rate, here, replacing the diverged run
    assert '--init_from=scratch --overwrite=True' in p.stderr
    run_here(['--init_from=scratch', '--overwrite=True', '--eval_interval=1', '--max_iters=2'], data_dir, out)
    assert divergence(out) is None and json.load(open(os.path.join(out, 'config.json')))['learning_rate'] == 3e-3


def test_divergence_after_a_checkpoint_keeps_that_checkpoint(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    run_here(['--max_iters=2', '--lr_decay_iters=6'], data_dir, out)
    path = os.path.join(out, 'ckpt.pt')
    ckpt = load_checkpoint(path)
    for state in ckpt['optimizer']['state'].values():   # a NaN optimizer moment (checksum valid): the next update is NaN
        state['exp_avg'].fill_(float('nan'))
    save_checkpoint(ckpt, path)
    p = run_here(['--max_iters=6', '--eval_interval=4', '--init_from=resume'], data_dir, out, expect_ok=False)
    assert p.returncode != 0 and 'non-finite training loss at step 3, noticed at step 4' in p.stderr, p.stderr[-1500:]
    assert divergence(out) == dict(step=4, what='training loss', first_step=3, value='nan')   # recorded: a result
    kept = torch.load(path, weights_only=False)
    assert kept['step'] == 2 and all(torch.isfinite(v).all() for v in kept['model'].values())


def test_a_non_finite_validation_loss_stops_the_run_recorded_and_keeps_the_last_checkpoint(data_dir, tmp_path,
                                                                                             monkeypatch):
    out, real, losses = str(tmp_path / 'run'), train.evaluate, []

    def evaluate(*args):   # the evaluation at step 4 (the third: steps 0, 2, 4) comes out NaN
        loss, routing = real(*args)
        losses.append(loss)
        return (float('nan') if len(losses) == 3 else loss), routing
    monkeypatch.setattr(train, 'evaluate', evaluate)
    with pytest.raises(SystemExit) as stopped:
        train_here(data_dir, out, '--max_iters=6', '--eval_interval=2', '--lr_decay_iters=6')
    assert 'non-finite validation loss nan at step 4: stopped without saving' in str(stopped.value), stopped.value
    assert divergence(out) == dict(step=4, what='validation loss', first_step=4, value='nan')   # a result, for study.py
    assert load_checkpoint(os.path.join(out, 'ckpt.pt'))['step'] == 2


def test_missing_data_says_which_prepare_command_to_run(tmp_path):
    p = run_here([], str(tmp_path / 'nodata'), str(tmp_path / 'run'), expect_ok=False)
    assert p.returncode != 0 and 'python prepare.py --dataset tiny' in p.stderr


def test_config_json_records_the_run(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    run_here(['--max_iters=2', '--residual=ctrl_fixed_v'], data_dir, out)
    meta = json.load(open(os.path.join(out, 'config.json')))
    assert meta['residual'] == 'ctrl_fixed_v' and meta['world_size'] == 1
    assert meta['torch_version'] == torch.__version__ and 'git_commit' in meta
    _, val = read_log(out)
    summary = val[2]['routing']['summary']
    # one summary row per layer, each with both routes' mean depths, the v route's that of a uniform read
    assert len(summary) == 2 and all(isinstance(r['depth_v'], float) and isinstance(r['depth_qk'], float) for r in summary)
    v_routes = [r['alpha'] for r in val[2]['routing']['alpha'] if r['route'] == 'v']
    assert len(v_routes) == 2 and all(a == pytest.approx([1 / len(a)] * len(a), abs=1e-4) for a in v_routes)  # frozen at uniform


# ---------------------------------------------------------------------------------------------
# sample.py

@pytest.mark.slow
def test_sample_generates_and_shows_routing(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    run_here(['--max_iters=2'], data_dir, out)
    args = [f'--out_dir={out}', '--start=The', '--num_samples=2', '--max_new_tokens=12', '--seed=3',
            '--show_routing=True', '--device=cpu']
    a, b = python('sample.py', *args), sample_here(*args)   # a process of its own, and this one: the same samples
    assert a.returncode == 0, a.stderr[-2000:]
    assert a.stdout == b.stdout                          # seeded: reproducible
    assert 'qk' in a.stdout and 'final' in a.stdout and a.stdout.count('----') >= 2
    bad = sample_here(f'--out_dir={tmp_path}/none')
    assert bad.returncode != 0 and 'no checkpoint' in bad.stderr


@pytest.mark.slow
def test_a_compiled_two_phase_run_trains_what_the_eager_plain_read_trains(data_dir, tmp_path):
    # compile=True with depth_read='two_phase' (one compiled region per AttnRes block, S = 3 over 4 sublayers:
    # a block opening on attention, a short one opening on an MLP) against the eager plain read: the same
    # windows, and losses, gradient norms and validation losses equal to float32 rounding
    shape = ['--residual=rd_attnres', '--attnres_block_size=3', '--log_routing=True']
    run(shape, data_dir, str(tmp_path / 'eager'))
    run([*shape, '--compile=True', '--depth_read=two_phase'], data_dir, str(tmp_path / 'compiled'))
    (te, ve), (tc, vc) = read_log(str(tmp_path / 'eager')), read_log(str(tmp_path / 'compiled'))
    assert sorted(te) == sorted(tc) == [1, 2, 3, 4] and sorted(ve) == sorted(vc) == [0, 2, 4]
    for s in te:
        assert te[s]['data_hash'] == tc[s]['data_hash']
        assert tc[s]['train_loss'] == pytest.approx(te[s]['train_loss'], rel=1e-5, abs=1e-6)
        assert tc[s]['norm'] == pytest.approx(te[s]['norm'], rel=1e-4, abs=1e-6)
    for s in ve:
        assert vc[s]['val_loss'] == pytest.approx(ve[s]['val_loss'], rel=1e-5, abs=1e-6)
        numbers = [[r[k] for r in v[s]['routing']['summary'] for k in sorted(r)] for v in (ve, vc)]
        assert numbers[1] == pytest.approx(numbers[0], rel=1e-3, abs=1e-5)   # recorded with the plain read
