"""Tests of compare.py on small synthetic run directories whose numbers are known by hand."""

import json
import math
import os
import subprocess
import sys

import pytest

import compare
from helpers import make_run

PARENT_NLL = [3.30, 3.25, 3.28, 3.31, 3.27]
DELTAS = [-0.03, -0.02, -0.04, -0.01, -0.05]   # mean -0.03, sd sqrt(0.001/4) = 0.0158114


@pytest.fixture
def study(tmp_path):
    root = str(tmp_path)
    for seed, (p, d) in enumerate(zip(PARENT_NLL, DELTAS), start=1):
        make_run(root, f'attnres_s{seed}', 'attnres', seed, p)
        make_run(root, f'rd_s{seed}', 'rd_attnres', seed, p + d)
        make_run(root, f'standard_s{seed}', 'standard', seed, p + 0.1 * seed)   # attnres wins every pair
    return root


@pytest.mark.assignment5
def test_paired_table_matches_hand_computed_values(study, capsys):
    assert compare.main([os.path.join(study, '*'), '--json', os.path.join(study, 'r.json')]) == 0
    results = {(r['arm'], r['parent']): r for r in json.load(open(os.path.join(study, 'r.json')))}
    assert set(results) == {('attnres', 'standard'), ('rd_attnres', 'attnres')}
    rd = results[('rd_attnres', 'attnres')]
    assert [p['seed'] for p in rd['pairs']] == [1, 2, 3, 4, 5]
    assert [p['delta'] for p in rd['pairs']] == pytest.approx(DELTAS)
    assert rd['mean_delta'] == pytest.approx(-0.03), "concept 'the paired table': the mean of the deltas"
    assert rd['sd'] == pytest.approx(0.0158114, abs=1e-7), f"concept 'the paired table': sd is {rd['sd']}: the sample sd divides by n - 1"
    half = 2.776445 * 0.0158114 / math.sqrt(5)              # t(0.975, df=4) from a printed table
    assert rd['ci95'] == pytest.approx([-0.03 - half, -0.03 + half], abs=1e-6), \
        "concept 'the paired table': the interval is mean -/+ t(0.975, n - 1) * sd / sqrt(n)"
    assert rd['ppl_reduction_pct'] == pytest.approx(100 * (1 - math.exp(-0.03)))
    assert (rd['wins'], rd['n']) == (5, 5) and rd['sign_test_p'] == pytest.approx(2 / 32), \
        "concept 'the paired table': 5 wins of 5: the exact two-sided sign test gives p = 2 / 2^5"
    base = results[('attnres', 'standard')]
    assert base['mean_delta'] == pytest.approx(-0.3) and base['wins'] == 5
    out = capsys.readouterr().out
    assert '| 1 | 3.3000 | 3.2700 | -0.0300 |' in out and '5/5' in out and '2.96%' in out


@pytest.mark.assignment5
def test_statistics_against_known_values():
    assert compare.t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert compare.t_quantile(0.975, 9) == pytest.approx(2.2622, abs=1e-4)
    assert compare.t_quantile(0.975, 10**6) == pytest.approx(1.95996, abs=1e-4)
    assert compare.sign_test_p(10, 10) == pytest.approx(2 / 1024), "concept 'the statistics on other values': 10 wins of 10 (the paper's) give p = 2 / 2^10"
    assert compare.sign_test_p(3, 5) == 1.0 and compare.sign_test_p(1, 6) == pytest.approx(2 * 7 / 64), \
        "concept 'the statistics on other values': p = min(1, 2 * sum over i <= k of C(n, i) / 2^n), k = min(wins, n - wins)"


@pytest.mark.assignment5
def test_statistics_of_three_pairs_by_hand():
    # deltas [0.0, -0.01, 0.04]: a tie is not a win, so wins = 1, ties = 1
    #   mean = 0.01   sd = sqrt(((-0.01)^2 + (-0.02)^2 + 0.03^2) / 2) = sqrt(0.0007) = 0.026458
    #   half-width = t(0.975, 2) * sd / sqrt(3) = 4.302653 * 0.026458 / 1.732051 = 0.065725
    #   sign test over the 2 pairs that are not ties: k = min(1, 1) = 1, p = min(1, 2 * (C(2, 0) + C(2, 1)) / 4) = 1
    r = compare.paired_stats([0.0, -0.01, 0.04])
    assert r['wins'] == 1, f"concept 'the statistics on other values': wins = {r['wins']}: a win is delta < 0, and a tie (delta = 0) is not one"
    assert r['ties'] == 1, f"concept 'the statistics on other values': ties = {r['ties']}: a tie is delta = 0"
    assert r['mean_delta'] == pytest.approx(0.01) and r['sd'] == pytest.approx(0.026458, abs=1e-6), \
        f"concept 'the statistics on other values': mean {r['mean_delta']}, sd {r['sd']}: the sample sd divides by n - 1"
    assert r['ci95'] == pytest.approx([0.01 - 0.065725, 0.01 + 0.065725], abs=1e-6), \
        "concept 'the statistics on other values': the interval is mean -/+ t(0.975, n - 1) * sd / sqrt(n)"
    assert r['sign_test_p'] == 1.0, f"concept 'the statistics on other values': p = {r['sign_test_p']} for 1 win of 2"


@pytest.mark.assignment5
def test_a_tie_is_neither_a_win_nor_a_loss():
    # five wins and a tie: the sign test counts the 5 wins among the 5 pairs that are not ties,
    # p = 2 / 2^5 = 0.0625; a tie counted as a loss would make it 5 wins of 6, p = 2 * (1 + 6) / 2^6 = 0.219
    r = compare.paired_stats([-0.01, -0.02, 0.0, -0.03, -0.01, -0.02])
    assert (r['n'], r['wins'], r['ties']) == (6, 5, 1), \
        f"concept 'the statistics on other values': n, wins, ties = {r['n']}, {r['wins']}, {r['ties']}: six pairs, five wins, one tie"
    assert r['sign_test_p'] == pytest.approx(2 / 32), \
        (f"concept 'the statistics on other values': p = {r['sign_test_p']:.4g} for 5 wins and a tie: the sign test leaves "
         "ties out (neither a win nor a loss), so it is 5 wins of the 5 pairs that are not ties, p = 2 / 2^5")
    r = compare.paired_stats([0.0, 0.0])
    assert (r['wins'], r['ties'], r['sign_test_p']) == (0, 2, 1.0), \
        "concept 'the statistics on other values': two ties leave no pair to the sign test: p = 1"


@pytest.mark.assignment5
def test_one_pair_has_no_spread_and_no_interval():
    # n = 1: the mean and the win are defined; the sd (n - 1 = 0) and the interval are not: NaN, and
    # the sign test of one pair says nothing (p = 1)
    try:
        r = compare.paired_stats([-0.03])
    except ZeroDivisionError as e:
        pytest.fail(f"concept 'one pair (n = 1)': paired_stats of one pair raised {e!r}: with n = 1 there is no "
                    "n - 1 to divide by; the sd and the interval are float('nan')")
    assert r['mean_delta'] == -0.03 and (r['wins'], r['n'], r['sign_test_p']) == (1, 1, 1.0), \
        "concept 'one pair (n = 1)': one pair has its mean and its win; its sign test says nothing (p = 1)"
    assert math.isnan(r['sd']) and all(math.isnan(x) for x in r['ci95']), \
        "concept 'one pair (n = 1)': with n = 1 there is no spread: sd and both ends of the interval are float('nan')"
    assert r['ppl_reduction_pct'] == pytest.approx(100 * (1 - math.exp(-0.03)))


def test_a_tie_is_shown_apart_from_the_wins(study, capsys):
    # a sixth seed whose arms end at the same NLL: 5 wins of the 5 pairs that are not ties, and the tie
    make_run(study, 'attnres_s6', 'attnres', 6, 3.3)
    make_run(study, 'rd_s6', 'rd_attnres', 6, 3.3)
    assert compare.main([os.path.join(study, '*')]) == 0
    rd = capsys.readouterr().out.split('### rd_attnres vs attnres')[1]
    assert '| 6 | 3.3000 | 3.3000 | +0.0000 |' in rd and '| 5/5 (1 tie) | 0.0625 |' in rd, rd
    assert compare.sign_count(3, 7, 2) == '3/5 (2 ties)' and compare.sign_count(4, 4, 0) == '4/4'


def test_mismatched_pair_is_refused_with_the_differing_keys(tmp_path, capsys):
    root = str(tmp_path)
    make_run(root, 'attnres_s1', 'attnres', 1, 3.3)
    make_run(root, 'rd_s1', 'rd_attnres', 1, 3.2, learning_rate=1e-3, weight_decay=0.0)
    with pytest.raises(SystemExit, match='no complete pair'):
        compare.main([os.path.join(root, '*')])
    assert "differ in learning_rate: 0.001 vs 0.0006, weight_decay: 0.0 vs 0.1" in capsys.readouterr().out


def test_one_unpairable_run_does_not_hide_the_valid_pairs(study, capsys):
    # a sixth seed of rd_attnres run with another learning rate: reported as refused, at the end
    make_run(study, 'attnres_s6', 'attnres', 6, 3.3)
    make_run(study, 'rd_s6', 'rd_attnres', 6, 3.2, learning_rate=1e-3)
    assert compare.main([os.path.join(study, '*')]) == 0
    out = capsys.readouterr().out
    assert '| 5 | 3.2700 | 3.2200 | -0.0500 |' in out and '| 6 |' not in out.split('### Refused')[0]
    refused = out.split('### Refused')[1]
    assert 'rd_s6' in refused and 'learning_rate: 0.001 vs 0.0006' in refused and 'rd_s1' not in refused
    with pytest.raises(SystemExit, match='--strict: 1 runs could not be paired'):
        compare.main([os.path.join(study, '*'), '--strict'])


def test_a_torn_last_log_line_is_dropped_and_a_bad_line_named(study):
    path = os.path.join(study, 'rd_s1', 'log.jsonl')
    with open(path, 'a') as f:
        f.write('{"step": 100, "train_lo')           # killed while writing
    with pytest.warns(UserWarning, match='torn last line'):
        run = compare.load_run(os.path.join(study, 'rd_s1'))
    assert run['evals'][100]['val_loss'] == pytest.approx(3.27)
    lines = open(path).read().split('\n')
    lines[1] = lines[1][:20]                          # damage in the middle of the file: an error
    open(path, 'w').write('\n'.join(lines))
    with pytest.raises(compare.NotARun, match=r'rd_s1/log.jsonl, line 2: not valid JSON'):
        compare.load_run(os.path.join(study, 'rd_s1'))


def test_pair_that_saw_other_batches_is_refused(tmp_path):
    # logs written before train.py kept a data digest (as the committed study's): the fingerprints of the
    # logged steps are checked
    root = str(tmp_path)
    make_run(root, 'attnres_s1', 'attnres', 1, 3.3)
    path = make_run(root, 'rd_s1', 'rd_attnres', 1, 3.2)
    log = os.path.join(path, 'log.jsonl')
    text = open(log).read().replace('"1-50"', '"9-50"')
    open(log, 'w').write(text)
    results, _, refused = compare.compare([compare.load_run(os.path.join(root, n)) for n in ('attnres_s1', 'rd_s1')])
    assert results == [] and 'different batches' in refused[0][1] and 'differ at steps [50]' in refused[0][1]


def test_old_logs_without_a_digest_still_pair(tmp_path):
    root = str(tmp_path)
    make_run(root, 'attnres_s1', 'attnres', 1, 3.3)
    make_run(root, 'rd_s1', 'rd_attnres', 1, 3.2)
    runs = [compare.load_run(os.path.join(root, n)) for n in ('attnres_s1', 'rd_s1')]
    assert all(run['digests'] == {} and run['hashes'] for run in runs)
    results, _, refused = compare.compare(runs)
    assert refused == [] and [p['seed'] for p in results[0]['pairs']] == [1]


def test_windows_that_differ_at_a_step_no_row_logs_are_refused(tmp_path):
    # log_interval 10: rows at steps 0 (evaluation), 10 and 20; the arms' windows differ at step 3 only, so
    # every logged step's fingerprint agrees, and only the digest (of every step's windows so far) tells
    root = str(tmp_path)
    windows = lambda s: [7 * s, 7 * s + 1]
    make_run(root, 'attnres_s1', 'attnres', 1, 3.3, steps=(0, 10, 20), windows=windows)
    make_run(root, 'rd_s1', 'rd_attnres', 1, 3.2, steps=(0, 10, 20), windows=lambda s: [5, 6] if s == 3 else windows(s))
    runs = [compare.load_run(os.path.join(root, n)) for n in ('attnres_s1', 'rd_s1')]
    assert runs[0]['hashes'] == runs[1]['hashes'] and runs[0]['digests'][0] == runs[1]['digests'][0]
    results, _, refused = compare.compare(runs)
    assert results == [] and refused[0][0] == os.path.join(root, 'rd_s1'), refused
    said = refused[0][1]
    assert 'different batches' in said and 'agree at step 0 and differ at step 10' in said and 'steps 0 to 9' in said, said
    assert 'train both arms with the same code, seed and data (git_commit abc vs abc;' in said, said
    # the fingerprints alone (a log without digests) could not tell
    for run in runs:
        run['digests'] = {}
    assert compare.compare(runs)[2] == []
    # the steps named: from the last step where the digests agree (or step 0) to the one before the first that differs
    run = lambda digests: dict(config={}, hashes={}, digests=digests)
    said = compare.data_problem(run({10: 'a', 11: 'b'}), run({10: 'a', 11: 'c'}))
    assert 'agree at step 10 and differ at step 11, so step 10 trained on other windows' in said, said
    said = compare.data_problem(run({10: 'a', 20: 'b'}), run({10: 'c', 20: 'd'}))
    assert 'differ at step 10, the first both logged, so one of the steps 0 to 9 trained on other windows' in said, said
    # digests that differ and then agree again are not two runs' own: a log holds rows of another run
    said = compare.data_problem(run({10: 'a', 20: 'b', 30: 'c'}), run({10: 'a', 20: 'x', 30: 'c'}))
    assert 'agree at step 10 and differ at step 20 and agree again at step 30' in said and 'another run' in said, said
    assert 'trained on other windows' not in said, said


def test_earlier_step_and_runs_in_progress(study, tmp_path):
    results, _, _ = compare.compare([compare.load_run(os.path.join(study, n)) for n in os.listdir(study)], step=50)
    rd = next(r for r in results if r['arm'] == 'rd_attnres')
    assert rd['step'] == 50 and rd['mean_delta'] == pytest.approx(-0.03)   # curves shifted by a constant
    # a run in progress (no eval at its max_iters yet) is left out of the final table, and said so
    path = os.path.join(study, 'rd_s5', 'log.jsonl')
    rows = [json.loads(line) for line in open(path)]
    open(path, 'w').write(''.join(json.dumps(r) + '\n' for r in rows if r['step'] < 100))
    results, _, _ = compare.compare([compare.load_run(os.path.join(study, n)) for n in os.listdir(study)])
    rd = next(r for r in results if r['arm'] == 'rd_attnres')
    assert rd['n'] == 4 and rd['skipped_seeds'] == [5]


def test_different_budgets_are_different_groups(tmp_path):
    root = str(tmp_path)
    make_run(root, 'attnres_s1', 'attnres', 1, 3.3)
    make_run(root, 'ctrl_s1', 'ctrl_dup', 1, 3.3, steps=(0, 50))     # a shorter budget: no parent there
    with pytest.raises(SystemExit, match='no complete pair'):
        compare.main([os.path.join(root, '*')])


@pytest.mark.slow
def test_plots_are_written(study, tmp_path):
    # the temporary files of writes killed before their rename (0 bytes, as a kill -9 leaves them) are removed
    out = str(tmp_path / 'plots')
    os.makedirs(out)
    for stale in ('routing_rd_s1.png.tmp', 'curves_x.png.123.abcd1234.tmp'):
        open(os.path.join(out, stale), 'w').close()
    compare.main([os.path.join(study, '*'), '--plot', out])
    names = sorted(os.listdir(out))
    assert 'curves_rd_attnres_vs_attnres_rd_s1.png' in names
    assert sum(n.startswith('routing_rd_s') for n in names) == 5
    assert all(os.path.getsize(os.path.join(out, n)) > 10_000 for n in names)
    m = compare.routing_matrix(json.loads(open(os.path.join(study, 'rd_s1', 'log.jsonl')).readline())['routing']['alpha'], 'v')
    assert m[0][0] == 1.0 and math.isnan(m[0][1]) and m[1] == [0.7, 0.3]


@pytest.mark.slow
def test_a_second_plotter_keeps_the_first_ones_temporary_files(study, tmp_path):
    # while another process holds the plots folder (plotting there), a report removes none of its files
    import fcntl
    out = str(tmp_path / 'plots')
    os.makedirs(out)
    theirs = os.path.join(out, 'routing_rd_s1.png.tmp')
    open(theirs, 'w').close()
    holder = subprocess.Popen([sys.executable, '-c', 'import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); '
                               'fcntl.flock(fd, fcntl.LOCK_EX); print("held", flush=True); time.sleep(60)', out],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'held'
        compare.main([os.path.join(study, '*'), '--plot', out])
        assert os.path.exists(theirs) and os.path.getsize(os.path.join(out, 'routing_rd_s1.png')) > 10_000
    finally:
        holder.kill()
        holder.wait()
    compare.main([os.path.join(study, '*'), '--plot', out])   # once it is gone, the next report removes it
    assert not os.path.exists(theirs)


def test_any_two_arms_side_by_side(tmp_path, capsys):
    # rd_attnres vs ctrl_heads (both children of attnres): the comparison that separates roles from "two reads"
    root = str(tmp_path)
    ctrl = [0.01, -0.01, 0.0, 0.02, -0.02]
    for seed, (p, d, c) in enumerate(zip(PARENT_NLL, DELTAS, ctrl), start=1):
        make_run(root, f'attnres_s{seed}', 'attnres', seed, p)
        make_run(root, f'rd_s{seed}', 'rd_attnres', seed, p + d)
        make_run(root, f'heads_s{seed}', 'ctrl_heads', seed, p + c)
    out = os.path.join(root, 'r.json')
    assert compare.main([os.path.join(root, '*'), '--pair', 'rd_attnres:ctrl_heads', '--json', out]) == 0
    results = {(r['arm'], r['parent']): r for r in json.load(open(out))}
    assert set(results) == {('rd_attnres', 'attnres'), ('ctrl_heads', 'attnres'), ('rd_attnres', 'ctrl_heads')}
    side = results[('rd_attnres', 'ctrl_heads')]
    assert [p['delta'] for p in side['pairs']] == pytest.approx([d - c for d, c in zip(DELTAS, ctrl)])
    assert '### rd_attnres vs ctrl_heads' in capsys.readouterr().out
    with pytest.raises(SystemExit, match='ARM:BASE'):
        compare.main([os.path.join(root, '*'), '--pair', 'rd_attnres'])


def test_routing_table_shows_the_runs_whose_two_routes_separated():
    def run(name, residual, js_key, js, depths, step=100):
        a, b = js_key[3:].split('_')
        summary = [{'layer': i, js_key: j, f'depth_{a}': depths[0], f'depth_{b}': depths[1]} for i, j in enumerate(js)]
        return dict(name=name, config=dict(residual=residual, seed=1, max_iters=100, n_layer=8, n_head=4, n_embd=128,
                                           block_size=256, total_batch_size=4096),
                    evals={step: dict(step=step, val_loss=3.0, routing=dict(summary=summary))})
    runs = [run('rd_s1', 'rd_attnres', 'js_qk_v', [0.0, 0.0125, 0.0309], (1.89, 1.31)),
            run('heads_s1', 'ctrl_heads', 'js_heads1_heads2', [0.0, 0.0053, 0.001], (1.48, 1.39)),
            run('attnres_s1', 'attnres', 'js_qk_v', [0.0, 0.0, 0.0], (1.2, 1.2)),        # one route: left out
            run('rd_s2', 'rd_attnres', 'js_qk_v', [0.0, 0.5, 0.5], (1.0, 0.0), step=50)]  # not evaluated at 100
    table = compare.routing_table(runs).splitlines()
    rows = [line for line in table if line.startswith('| rd_') or line.startswith('| heads_') or line.startswith('| attnres_')]
    assert rows == ['| heads_s1 | 100 | 0.0000 0.0053 0.0010 | 0.0053 | heads1 1.48, heads2 1.39 |',
                    '| rd_s1 | 100 | 0.0000 0.0125 0.0309 | 0.0309 | qk 1.89, v 1.31 |']
    assert '| rd_s2 | 50 | 0.0000 0.5000 0.5000 | 0.5000 | qk 1.00, v 0.00 |' in compare.routing_table(runs, step=50)
    assert compare.routing_table(runs[2:3]) == ''
    # the count per arm: is the second route shallower at the last layer? (a tie is not shallower)
    runs += [run('rd_s3', 'rd_attnres', 'js_qk_v', [0.0, 0.1, 0.1], (1.0, 1.5)),
             run('rd_s4', 'rd_attnres', 'js_qk_v', [0.0, 0.1, 0.1], (1.2, 1.2))]
    table = compare.routing_table(runs)
    assert '- rd_attnres: v reads shallower than qk at the last layer in 1 of the 3 rd_attnres runs above' in table
    assert '- ctrl_heads: heads2 reads shallower than heads1 at the last layer in 1 of the 1 ctrl_heads runs above' in table
    # runs of another shape or budget are counted apart, and the line says which
    other = run('rd_big', 'rd_attnres', 'js_qk_v', [0.0, 0.1, 0.1], (2.0, 1.0))
    other['config']['n_layer'] = 12
    table = compare.routing_table(runs + [other])
    assert ('- rd_attnres (12x128 (12 layers, d=128), 100 steps = 0.4M tokens): v reads shallower than qk at the '
            'last layer in 1 of the 1 rd_attnres runs above') in table
    assert ('- rd_attnres (8x128 (8 layers, d=128), 100 steps = 0.4M tokens): v reads shallower than qk at the '
            'last layer in 1 of the 3 rd_attnres runs above') in table


@pytest.mark.parametrize('second, said', [
    (('attnres_s2', 'attnres', 2, 3.3, {}), "the seed differs: attnres has seeds [2], standard has [1]"),
    (('rd_s1', 'rd_attnres', 1, 3.3, {}), "their residual modes (rd_attnres, standard) hold no arm and its parent"),
    (('attnres_s1', 'attnres', 1, 3.3, dict(steps=(0, 50))), "they differ in shape or budget (max_iters [50, 100])"),
])
def test_no_complete_pair_says_which_key_keeps_the_runs_apart(tmp_path, second, said):
    root = str(tmp_path)
    make_run(root, 'standard_s1', 'standard', 1, 3.4)
    name, mode, seed, nll, more = second
    make_run(root, name, mode, seed, nll, **more)
    with pytest.raises(SystemExit) as e:
        compare.main([os.path.join(root, '*')])
    assert 'found 2 runs but no complete pair: ' + said in str(e.value), str(e.value)


def test_a_diverged_run_is_listed_with_the_pairs_it_breaks(tmp_path, capsys):
    root = str(tmp_path)
    for seed in (1, 2):
        make_run(root, f'standard_s{seed}', 'standard', seed, 3.4)
        make_run(root, f'attnres_s{seed}', 'attnres', seed, 3.3)
    log = os.path.join(root, 'attnres_s2', 'log.jsonl')
    rows = [json.loads(line) for line in open(log)]
    rows = [r for r in rows if r['step'] <= 50] + [dict(step=60, diverged=dict(what='training loss', first_step=57,
                                                                                value='nan'))]
    open(log, 'w').write(''.join(json.dumps(r) + '\n' for r in rows))
    assert compare.main([os.path.join(root, '*')]) == 0
    out = capsys.readouterr().out
    assert '### Diverged' in out and 'non-finite training loss (nan) at step 57, noticed at step 60' in out
    assert f"breaks the pairs attnres vs standard (with {os.path.join(root, 'standard_s2')})" in out
    assert '(seeds [2] left out' in out
