"""
The paper's paired table (and plots) from run directories written by train.py.

    python compare.py out/*                       # every comparison the runs allow, as Markdown
    python compare.py out/* --step 1000           # at an earlier evaluation step (runs in progress too)
    python compare.py out/* --json results.json --plot plots/
    python compare.py out/* --pair rd_attnres:ctrl_heads    # also any two arms side by side
    python compare.py out/* --routing             # and how far apart each two-route run's routes read

Runs are grouped by model shape and budget, paired by seed, and each arm is compared with its
parent, the mode it changes in one respect (WHY_PARENT): attnres with standard, rd_attnres and the
controls with attnres. These are the paper's comparisons (ctrl_heads, this project's control, is
compared as the paper compares its controls). --pair ARM:BASE adds any other two modes, e.g.
rd_attnres:standard; such a table is labelled as not one of the paper's comparisons, with the changes
between the two modes (Δ = NLL(ARM) − NLL(BASE)). A pair must have the same
frozen configuration except `residual` (and output paths) and must have trained on the same windows
at every step (train.py logs a digest of every step's windows so far on each training and evaluation
row; logs written before it did have a fingerprint of each logged step's windows, which is checked
instead); otherwise it is refused: listed at the end of the report with the reason, while every valid
pair is still reported (--strict: exit non-zero).
"""

from run_kit.common import ctrl_c_while_starting  # first: a Ctrl-C while torch loads is one line, exit 130
ctrl_c_while_starting(__name__, 'compare.py')

import argparse
import glob
import json
import math
import os
import sys

from model import ATTENTION_ROUTES
from run_kit.common import FROZEN_ON_RESUME, GROUP_KEYS, WriteFailed, run_command
from run_kit.run_files import (LOG, RunFileError, atomic_write, describe_divergence, divergence_of, logged_evals,
                               read_config, read_log, write_failed)

# ctrl_mix is a removed mode (docs/controls.md): listed so that its committed logs still compare
PARENT = {'rd_attnres': 'attnres', 'ctrl_params': 'attnres', 'ctrl_dup': 'attnres', 'ctrl_fixed_v': 'attnres',
          'ctrl_heads': 'attnres', 'ctrl_mix': 'attnres', 'attnres': 'standard'}
WHY_PARENT = {
    'attnres': "Block AttnRes replaces the running sum with one learned read over the outputs of earlier AttnRes blocks",
    'rd_attnres': "RD-AttnRes gives attention's v its own route; tying the v route to the qk route gives attnres back",
    'ctrl_params': "the paper's control for rd_attnres's parameter count: attnres plus a gain per attention sublayer",
    'ctrl_dup': "the paper's control for rd_attnres's compute: attnres's read run twice with one pseudo-query",
    'ctrl_fixed_v': "the paper's control for a learned v route: rd_attnres with the v route fixed at the uniform average",
    'ctrl_heads': "this project's control: two learned routes that split attention by heads, not by role",
    'ctrl_mix': "a removed control, kept so that its committed logs compare (docs/controls.md)"}
ARM_ORDER = ['attnres', 'rd_attnres', 'ctrl_params', 'ctrl_dup', 'ctrl_fixed_v', 'ctrl_heads', 'ctrl_mix']
# what must be equal within a pair, besides the seed; residual is what differs
FROZEN = tuple(k for k in FROZEN_ON_RESUME + ('max_iters', 'eval_tokens', 'block_size', 'dtype')
               if k not in ('residual', 'seed'))


# -----------------------------------------------------------------------------
# Statistics (standard library only)

def _betacf(a, b, x):
    # continued fraction of the regularised incomplete beta function (modified Lentz)
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((qam + 2 * m) * (a + 2 * m)), -(a + m) * (qab + m) * x / ((a + 2 * m) * (qap + 2 * m))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def t_cdf(t, df):
    """P(T <= t) for Student's t with df degrees of freedom, via P(|T| > t) = I_x(df/2, 1/2), x = df/(df+t^2)."""
    if t == 0:
        return 0.5
    x = df / (df + t * t)
    ln = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - math.lgamma(0.5) + (df / 2) * math.log(x) + 0.5 * math.log1p(-x)
    a, b = df / 2, 0.5
    tail = math.exp(ln) * _betacf(a, b, x) / a if x < (a + 1) / (a + b + 2) else 1 - math.exp(ln) * _betacf(b, a, 1 - x) / b
    return 1 - 0.5 * tail if t >= 0 else 0.5 * tail


def t_quantile(prob, df):
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < prob else (lo, mid)
    return 0.5 * (lo + hi)


def sign_test_p(wins, n):
    """Exact two-sided sign test of `wins` out of n pairs that are not ties: the probability of a split at
    least this lopsided under a fair coin (p = 1 for n = 0)."""
    ### BEGIN SOLUTION 5
    k = min(wins, n - wins)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)
    ### END SOLUTION
    return p


def paired_stats(deltas):
    """The paper's numbers for paired differences Δ = NLL(child) - NLL(parent) (with --pair, the second mode
    named), one per seed: mean Δ, the sample sd of the Δs, a 95% t-interval for the mean, the perplexity reduction 1 - exp(mean Δ), wins (Δ < 0),
    ties (Δ = 0) and the exact two-sided sign test, which leaves the ties out: wins out of the n - ties
    pairs that are not ties. With one pair (n = 1) the sd and the interval are NaN and p = 1."""
    n = len(deltas)
    ### BEGIN SOLUTION 5
    mean = sum(deltas) / n
    sd = math.sqrt(sum((delta - mean) ** 2 for delta in deltas) / (n - 1)) if n > 1 else float('nan')
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n) if n > 1 else float('nan')
    wins = sum(delta < 0 for delta in deltas)
    ties = sum(delta == 0 for delta in deltas)   # neither a win nor a loss: the sign test has nothing to count
    p = sign_test_p(wins, n - ties)
    ### END SOLUTION
    return dict(n=n, mean_delta=mean, sd=sd, ci95=[mean - half, mean + half], ppl_reduction_pct=100 * (1 - math.exp(mean)),
                wins=wins, ties=ties, sign_test_p=p)


# -----------------------------------------------------------------------------
# Runs

class NotARun(Exception):
    """A path given as a run that cannot be read as one; the message says why."""


def load_run(path):
    """A run directory's configuration and log, read by run_files, or NotARun saying why it is not one (a
    plain file, a folder without config.json or log.jsonl, a config.json that is not the JSON train.py
    writes, a log with a bad line)."""
    if not os.path.isdir(path):
        raise NotARun("not a run directory (a file)" if os.path.exists(path) else "does not exist")
    try:
        config = read_config(path)
        rows = read_log(os.path.join(path, LOG))
    except RunFileError as e:
        raise NotARun(str(e)) from None
    except FileNotFoundError:
        raise NotARun(f"no {LOG}: the run has not logged anything yet") from None
    except (OSError, ValueError) as e:
        raise NotARun(f"{LOG} cannot be read ({type(e).__name__}: {e})") from None
    except SystemExit as e:               # read_log's message for a bad line
        raise NotARun(str(e)) from None
    hashes = {r['step']: r['data_hash'] for r in rows if 'data_hash' in r}
    digests = {r['step']: r['data_digest'] for r in rows if 'data_digest' in r}
    return dict(path=path, name=os.path.basename(os.path.normpath(path)), config=config, evals=logged_evals(rows),
                hashes=hashes, digests=digests, diverged=divergence_of(rows))


def load_runs(paths):
    """(the runs among paths, [(path, why it is not a run)] for the others)."""
    runs, skipped = [], []
    for path in paths:
        try:
            runs.append(load_run(path))
        except NotARun as e:
            skipped.append((path, str(e)))
    return runs, skipped


def skipped_lines(skipped):
    return '\n'.join(f"- {path}: {why}" for path, why in skipped) + '\n'


def group_label(config):
    """A comparison (a GROUP_KEYS group) as its table heading says it: shape, steps and tokens."""
    tokens = config['max_iters'] * config['total_batch_size']
    return f"{config['n_layer']}x{config['n_embd']} ({config['n_layer']} layers, d={config['n_embd']}), " \
           f"{config['max_iters']} steps = {tokens / 1e6:,.1f}M tokens"


def pair_problem(a, b):
    """Why two runs cannot be a pair, or None."""
    diff = [k for k in FROZEN if a['config'].get(k) != b['config'].get(k)]
    if diff:
        listing = ', '.join(f"{k}: {a['config'].get(k)!r} vs {b['config'].get(k)!r}" for k in diff)
        return f"frozen configurations differ in {listing} (only residual may differ within a pair)"
    return data_problem(a, b)


def data_problem(a, b):
    """Why two runs did not train on the same windows, or None. Their data digests (train.py: every step's
    windows since step 0) are compared at every step both logged one; logs without them (written before
    train.py kept one) by the fingerprints of the logged steps' windows, every log_interval-th step only."""
    same = (f"train both arms with the same code, seed and data (git_commit {a['config'].get('git_commit')} vs "
            f"{b['config'].get('git_commit')}; changes not committed are not in it)")
    common = sorted(set(a['digests']) & set(b['digests']))
    first = next((s for s in common if a['digests'][s] != b['digests'][s]), None)
    if first is not None:
        last = max([s for s in common if s < first], default=None)   # (a log's step s: after steps 0 .. s-1)
        where = (f"agree at step {last} and differ at step {first}" if last is not None else
                 f"differ at step {first}, the first both logged")
        steps = f"step {first - 1}" if (last or 0) == first - 1 else f"one of the steps {last or 0} to {first - 1}"
        again = next((s for s in common if s > first and a['digests'][s] == b['digests'][s]), None)
        if again is not None:   # (a digest of every step so far, once it differs, differs at every later step)
            return (f"their data digests (of every step's windows so far) {where} and agree again at step {again}, "
                    "which digests of one run each cannot do: a log holds rows of another run (spliced or edited "
                    f"rows about step {first}). Compare the runs' own logs: {same}")
        return (f"they trained on different batches: their data digests (of every step's windows so far) {where}, so "
                f"{steps} trained on other windows. A pair must train on the same windows at every step: {same}")
    common = sorted(set(a['hashes']) & set(b['hashes']))
    bad = [s for s in common if a['hashes'][s] != b['hashes'][s]]
    if bad:
        return (f"they trained on different batches (data fingerprints differ at steps {bad[:5]}); a pair must share "
                f"seed and data: {same}")
    return None


def compare(runs, step=None, extra_pairs=()):
    """All comparisons (arm vs parent, then the extra (arm, parent) pairs, per shape and budget) that the
    runs allow, and the refused runs: [(run path, reason)]. One unpairable run never hides the pairs
    that are valid."""
    groups, refused = {}, []
    for run in runs:
        key = tuple(run['config'][k] for k in GROUP_KEYS)
        by_seed = groups.setdefault(key, {}).setdefault(run['config']['residual'], {})
        seed = run['config']['seed']
        if seed in by_seed:
            refused.append((run['path'], f"a second run of {run['config']['residual']} with seed {seed} and the "
                                         f"same shape and budget as {by_seed[seed]['path']}"))
            continue
        by_seed[seed] = run
    results, seen = [], set()
    for key in sorted(groups):
        by_mode = groups[key]
        for arm, parent in [(arm, PARENT[arm]) for arm in ARM_ORDER] + list(extra_pairs):
            if arm not in by_mode or parent not in by_mode:
                continue
            rows, skipped = [], []
            for seed in sorted(set(by_mode[arm]) & set(by_mode[parent])):
                arm_run, parent_run = by_mode[arm][seed], by_mode[parent][seed]
                problem = pair_problem(arm_run, parent_run)
                if problem:
                    if (arm_run['path'], parent_run['path']) not in seen:   # (said once, also when a run is in two comparisons)
                        refused.append((arm_run['path'], f"not paired with {parent_run['path']}: {problem}"))
                        seen.add((arm_run['path'], parent_run['path']))
                    continue
                at = step if step is not None else arm_run['config']['max_iters']
                if at not in arm_run['evals'] or at not in parent_run['evals']:
                    skipped.append(seed)
                    continue
                nll_arm, nll_parent = arm_run['evals'][at]['val_loss'], parent_run['evals'][at]['val_loss']
                rows.append(dict(seed=seed, parent_nll=nll_parent, arm_nll=nll_arm, delta=nll_arm - nll_parent,
                                 arm_run=arm_run['path'], parent_run=parent_run['path']))
            if rows:
                first = by_mode[arm][rows[0]['seed']]['config']
                results.append(dict(group=group_label(first), arm=arm, parent=parent,
                                    step=step if step is not None else first['max_iters'],
                                    pairs=rows, skipped_seeds=skipped, **paired_stats([r['delta'] for r in rows])))
    return results, groups, refused


def pairs_of(run, groups, extra_pairs=()):
    """The other runs that `run` is paired with (as arm or as parent, same shape, budget and seed):
    [(arm, parent, the other run's path)]."""
    config = run['config']
    by_mode = groups.get(tuple(config[k] for k in GROUP_KEYS), {})
    out = []
    for arm, parent in list(PARENT.items()) + list(extra_pairs):
        other = parent if arm == config['residual'] else arm if parent == config['residual'] else None
        partner = by_mode.get(other, {}).get(config['seed']) if other else None
        if partner is not None and partner['path'] != run['path']:
            out.append((arm, parent, partner['path']))
    return out


def diverged_lines(runs, groups, extra_pairs=()):
    """A line per diverged run (train.py recorded it: run_files.record_divergence), with the pairs it breaks:
    Markdown list items, or ''."""
    lines = []
    for run in runs:
        if run.get('diverged'):
            broken = pairs_of(run, groups, extra_pairs)
            lines.append(f"- {run['path']} ({run['config']['residual']}, seed {run['config']['seed']}): "
                         f"{describe_divergence(run['diverged'])}; " +
                         ("breaks the pairs " + ', '.join(f"{a} vs {b} (with {p})" for a, b, p in broken)
                          if broken else "in no pair of these runs"))
    return '\n'.join(lines) + '\n' if lines else ''


def no_pair_reason(runs, groups, step=None):
    """Why runs that form no complete pair do not (the key that keeps them apart), for the message."""
    if len(groups) > 1:
        differ = [k for k in GROUP_KEYS if len({r['config'][k] for r in runs}) > 1]
        listing = '; '.join(f"{group_label(next(iter(next(iter(by_mode.values())).values()))['config'])}: "
                            f"{', '.join(sorted(by_mode))}" for by_mode in groups.values())
        return (f"they differ in shape or budget (" +
                ', '.join(f"{k} {sorted({r['config'][k] for r in runs})}" for k in differ) +
                f"), and a pair needs the same {', '.join(GROUP_KEYS)}. The groups: {listing}")
    by_mode = next(iter(groups.values()))
    pairs = [(arm, parent) for arm, parent in PARENT.items() if arm in by_mode and parent in by_mode]
    if not pairs:
        return (f"their residual modes ({', '.join(sorted(by_mode))}) hold no arm and its parent "
                f"({', '.join(f'{arm} vs {parent}' for arm, parent in PARENT.items())})")
    arm, parent = pairs[0]
    if not set(by_mode[arm]) & set(by_mode[parent]):
        return (f"the seed differs: {arm} has seeds {sorted(by_mode[arm])}, {parent} has {sorted(by_mode[parent])}, and a pair "
                "is an arm and its parent with the same seed")
    return ("no pair is evaluated at the step compared in both runs" +
            (f" ({step})" if step is not None else " (max_iters: use --step for runs in progress)") +
            ", or the pairs were refused (listed above)")


def lineage(mode):
    """mode, its parent, the parent's parent, ... down to standard."""
    chain = [mode]
    while chain[-1] in PARENT:
        chain.append(PARENT[chain[-1]])
    return chain


def not_the_papers(arm, parent):
    """'' for an arm and its parent (the paper's comparisons); for any other two modes, a note that says so
    and how far apart they are."""
    if PARENT.get(arm) == parent:
        return ''
    a, b = lineage(arm), lineage(parent)
    if parent in a or arm in b:
        chain = a[:a.index(parent) + 1] if parent in a else b[:b.index(arm) + 1]
        how = (f"{'one change' if len(chain) == 2 else f'{len(chain) - 1} changes'} apart: {' → '.join(reversed(chain))}"
               + ("; Δ is the sum of those changes' effects" if len(chain) > 2 else "; Δ is the paper's with the other sign"))
    else:
        common = next(m for m in a if m in b)
        how = f"two changes of {common}: {common} → {arm} and {common} → {parent}; Δ compares the two changes"
    return f"(not one of the paper's comparisons, which compare each mode with its parent: {arm} and {parent} are {how})"


def sign_count(k, n, ties):
    """k pairs (the wins) out of the n - ties that are not ties, as the sign test counts them, and the ties if
    any: '5/9 (1 tie)'."""
    return f"{k}/{n - ties}" + (f" ({ties} tie{'s' if ties > 1 else ''})" if ties else '')


def markdown(results):
    out = []
    for r in results:
        out.append(f"### {r['arm']} vs {r['parent']}: {r['group']}, validation NLL at step {r['step']}\n")
        if not_the_papers(r['arm'], r['parent']):
            out.append(not_the_papers(r['arm'], r['parent']) + "\n")
        out.append(f"| seed | {r['parent']} | {r['arm']} | Δ |")
        out.append("|---:|---:|---:|---:|")
        for row in r['pairs']:
            out.append(f"| {row['seed']} | {row['parent_nll']:.4f} | {row['arm_nll']:.4f} | {row['delta']:+.4f} |")
        lo, hi = r['ci95']
        spread = (f"{r['sd']:.4f} | [{lo:+.4f}, {hi:+.4f}]" if r['n'] > 1 else "– | –")
        out.append("")
        out.append("| mean Δ | sd | 95% t-interval | ppl reduction | wins | sign test p |")
        out.append("|---:|---:|---:|---:|---:|---:|")
        out.append(f"| {r['mean_delta']:+.4f} | {spread} | {r['ppl_reduction_pct']:.2f}% "
                   f"| {sign_count(r['wins'], r['n'], r['ties'])} | {r['sign_test_p']:.3g} |")
        if r['n'] == 1:
            out.append("\n(one pair: no spread and no interval can be estimated from it; run more seeds)")
        if r['skipped_seeds']:
            out.append(f"\n(seeds {r['skipped_seeds']} left out: no evaluation at step {r['step']} in both runs yet)")
        out.append("")
    return '\n'.join(out)


def routing_table(runs, step=None):
    """For each run whose attention reads have two routes that differ (rd_attnres, ctrl_heads): how far
    apart they read at each layer (JS divergence in nats) and where each reads from at the last layer
    (mean source number: 0 = the embedding, n = AttnRes block n), at the step compared. Markdown, or '' if none."""
    rows, shallower = [], {}   # shallower[(arm, first, second, group)]: per run, (is `second` shallower at the last layer, config)
    for run in sorted(runs, key=lambda r: (r['config']['residual'], r['config']['seed'])):
        at = step if step is not None else run['config']['max_iters']
        summary = ((run['evals'].get(at) or {}).get('routing') or {}).get('summary')
        if not summary:
            continue
        js_key = next(k for k in summary[0] if k.startswith('js_'))
        first, second = js_key[3:].split('_')                      # the route names, e.g. qk and v
        js = [row[js_key] for row in summary]
        if not any(js):                                            # one route, or two that never separated
            continue
        last = summary[-1]
        rows.append(f"| {run['name']} | {at} | {' '.join(f'{j:.4f}' for j in js)} | {max(js):.4f} "
                    f"| {first} {last['depth_' + first]:.2f}, {second} {last['depth_' + second]:.2f} |")
        group = tuple(run['config'][k] for k in GROUP_KEYS)   # as compare() groups runs
        shallower.setdefault((run['config']['residual'], first, second, group), []).append(
            (last['depth_' + second] < last['depth_' + first], run['config']))
    if not rows:
        return ''
    groups = {key[3] for key in shallower}
    counts = [f"- {arm}{f' ({group_label(s[0][1])})' if len(groups) > 1 else ''}: {second} reads shallower than "
              f"{first} at the last layer in {sum(b for b, _ in s)} of the {len(s)} {arm} runs above"
              for (arm, first, second, _), s in sorted(shallower.items())]
    return '\n'.join(["### Routing of the two-route runs\n",
                      "| run | step | JS between the routes, layer 0, 1, ... (nats) | max JS | mean source index at the last layer |",
                      "|---|---:|---|---:|---|", *rows, "", *counts, ""])


def write_json(path, results):
    """The numbers as JSON; a NaN (the sd and interval of a single pair) is written as null, valid JSON."""

    def clean(x):
        if isinstance(x, float) and math.isnan(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        return [clean(v) for v in x] if isinstance(x, list) else x
    atomic_write(path, json.dumps(clean(results), indent=2))


def written(path, write, kept, then):
    """write() of the file or folder `path`; a write that fails (a full disk, a file size limit, no permission) as
    WriteFailed, the one line its command ends with: what failed, what is kept (kept), what to do (then)."""
    try:
        return write()
    except OSError as e:
        raise WriteFailed(write_failed(path, e, kept, then=then, elsewhere='a path').code) from None


# -----------------------------------------------------------------------------
# Plots (matplotlib is imported only here)

def routing_matrix(alpha_rows, route):
    """Attention sublayers x depth sources; NaN where a layer has fewer sources."""
    rows = [r['alpha'] for r in alpha_rows if r['route'] == route]
    width = max(len(a) for a in rows)
    return [a + [float('nan')] * (width - len(a)) for a in rows]


def plot(results, groups, out_dir, also=()):
    """The plots, written into out_dir, and those that each of `also` (a function of out_dir that writes its
    own and returns their paths) draws there. A write killed before its rename leaves its temporary file
    (atomic_write's NAME.png.tmp): the next plot removes them, holding the folder (an flock on it) so that
    another report plotting there at the same moment keeps its own; while one does, none is removed."""
    import fcntl
    os.makedirs(out_dir, exist_ok=True)
    folder = os.open(out_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
            for tmp in glob.glob(os.path.join(glob.escape(out_dir), '*.png.tmp')) + \
                    glob.glob(os.path.join(glob.escape(out_dir), '*.png.*.tmp')):
                os.remove(tmp)
        except BlockingIOError:
            pass
        return plot_into(results, groups, out_dir) + [p for draw in also for p in draw(out_dir)]
    finally:
        os.close(folder)   # (the flock goes with it)


def plot_into(results, groups, out_dir):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    written = []
    loaded = {run['path']: run for by_mode in groups.values() for by_seed in by_mode.values() for run in by_seed.values()}
    for r in results:
        tag = f"{r['arm']}_vs_{r['parent']}_{r['pairs'][0]['arm_run'].rstrip('/').split('/')[-1]}"
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
        for i, pair in enumerate(r['pairs']):
            color = f"C{i}"
            curves = {}
            for which in ('parent', 'arm'):
                run = loaded[pair[f'{which}_run']]
                steps = sorted(s for s in run['evals'] if s > 0)
                curves[which] = {s: run['evals'][s]['val_loss'] for s in steps}
                ax1.plot([run['evals'][s]['tokens'] / 1e6 for s in steps], [curves[which][s] for s in steps],
                         color=color, ls='--' if which == 'parent' else '-',
                         label=f"seed {pair['seed']} {r[which]}")
            common = sorted(set(curves['arm']) & set(curves['parent']))
            ax2.plot(common, [curves['arm'][s] - curves['parent'][s] for s in common], color=color, marker='.',
                     label=f"seed {pair['seed']}")
        ax1.set(xlabel='training tokens (M)', ylabel='validation NLL (nats/token)',
                title=f"{r['arm']} (solid) vs {r['parent']} (dashed)")
        ax1.legend(fontsize=7, ncol=2)
        ax2.axhline(0, color='k', lw=0.8)
        ax2.set(xlabel='step', ylabel=f"Δ = NLL({r['arm']}) − NLL({r['parent']})", title='paired difference over training')
        ax2.legend(fontsize=7)
        fig.suptitle(r['group'], fontsize=9)
        path = os.path.join(out_dir, f"curves_{tag}.png")
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format='png'))
        plt.close(fig)
        written.append(path)
    for by_mode in groups.values():
        for mode in [m for m, routes in ATTENTION_ROUTES.items() if len(routes) == 2]:   # two attention routes
            for seed, run in sorted(by_mode.get(mode, {}).items()):
                routed = [(s, e['routing']) for s, e in sorted(run['evals'].items()) if e.get('routing')]
                if not routed:
                    continue
                written += plot_routing(plt, run, routed, out_dir)
    return written


def plot_routing(plt, run, routed, out_dir):
    """Heatmaps of the two routes of the attention read (qk and v, or heads1 and heads2) at the last
    evaluation, and the JS divergence between them per layer over training."""
    last_step, last = routed[-1]
    first, second = ATTENTION_ROUTES[run['config']['residual']]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5), constrained_layout=True)
    for ax, route in zip(axes[:2], (first, second)):
        m = routing_matrix(last['alpha'], route)
        im = ax.imshow(m, vmin=0, vmax=1, cmap='viridis', aspect='auto')
        ax.set_xticks(range(len(m[0])))
        ax.set_yticks(range(len(m)))
        ax.set(xlabel='source (0 = embedding, n = AttnRes block n, last: partial)',
               ylabel='attention layer', title=f"{route} route: α at step {last_step}")
        for i, row in enumerate(m):
            for j, a in enumerate(row):
                if a == a:  # not NaN
                    ax.text(j, i, f"{a:.2f}", ha='center', va='center', fontsize=6, color='w' if a < 0.5 else 'k')
    fig.colorbar(im, ax=axes[1], fraction=0.05)
    layers = [row['layer'] for row in last['summary']]
    for layer in layers:
        ax = axes[2]
        ax.plot([s for s, _ in routed], [rt['summary'][layer][f'js_{first}_{second}'] for _, rt in routed],
                label=f"layer {layer}")
    axes[2].set(xlabel='step', ylabel='JS divergence (nats)', title=f'{first} vs {second} route, per attention layer')
    axes[2].legend(fontsize=6, ncol=2)
    fig.suptitle(f"{run['name']} ({run['config']['residual']}, seed {run['config']['seed']})", fontsize=9)
    path = os.path.join(out_dir, f"routing_{run['name']}.png")
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format='png'))
    plt.close(fig)
    return [path]


def unchecked_lines(results, runs):
    """The pairs of results whose data order could not be checked: no step of the two logs has a data digest
    or a data fingerprint in both (logs of a train.py that kept neither), as lines; '' if none."""
    by_path = {run['path']: run for run in runs}
    lines = []
    for r in results:
        for row in r['pairs']:
            a, b = by_path[row['arm_run']], by_path[row['parent_run']]
            if not set(a['digests']) & set(b['digests']) and not set(a['hashes']) & set(b['hashes']):
                lines.append(f"- {row['arm_run']} and {row['parent_run']} ({r['arm']} vs {r['parent']}, seed "
                             f"{row['seed']}): unpaired-unchecked, neither log holds a data digest or fingerprint at "
                             "a step of the other's, so whether they trained on the same windows is not known")
    return '\n'.join(dict.fromkeys(lines)) + '\n' if lines else ''


def unrelated_arms(groups, n_runs):
    """For runs of one shape and budget holding two or more modes of which none is another's parent (e.g.
    the quickstart's rd_attnres and a standard run): a message naming the --pair that compares them, or ''."""
    if len(groups) != 1:
        return ''
    modes = [m for m in ['standard'] + ARM_ORDER if m in next(iter(groups.values()))]
    if len(modes) < 2 or any(PARENT.get(m) in modes for m in modes):
        return ''
    pairs = [f"--pair {a}:{b}" for i, a in enumerate(modes) for b in modes[:i]][::-1]
    return (f"found {n_runs} runs but no complete pair: their residual modes ({', '.join(sorted(modes))}) hold no arm "
            f"and its parent ({', '.join(f'{a} vs {p}' for a, p in PARENT.items() if a != 'ctrl_mix')}): compare.py "
            f"pairs each mode with its parent. Compare them anyway with "
            f"{' or '.join(pairs)} (not one of the paper's comparisons), or train the parent: python train.py "
            f"<the same config> --residual={PARENT.get(modes[-1], 'standard')} --out_dir=<its own folder>")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="each mode's parent (the paper's comparisons):\n" + '\n'.join(
                                     f"  {arm} vs {PARENT[arm]}: {WHY_PARENT[arm]}" for arm in ARM_ORDER))
    ap.add_argument('runs', nargs='+', help="run directories (globs are expanded)")
    ap.add_argument('--step', type=int, help="compare at this evaluation step instead of the last (max_iters)")
    ap.add_argument('--json', help="also write the numbers to this JSON file")
    ap.add_argument('--plot', help="write PNG plots into this directory")
    ap.add_argument('--strict', action='store_true', help="exit non-zero if any run could not be paired")
    ap.add_argument('--pair', action='append', default=[], metavar='ARM:BASE',
                    help="also compare ARM with BASE, e.g. rd_attnres:ctrl_heads (repeatable)")
    ap.add_argument('--routing', action='store_true',
                    help="also print how far apart the two routes of each two-route run read, per layer")
    args = ap.parse_args(argv)
    extra = [tuple(p.split(':')) for p in args.pair]
    if any(len(p) != 2 or not all(p) for p in extra):
        raise SystemExit(f"--pair takes ARM:BASE, two residual modes, e.g. rd_attnres:ctrl_heads; got {args.pair}")
    unknown = sorted({m for p in extra for m in p} - set(PARENT) - {'standard'})
    if unknown:
        raise SystemExit(f"--pair: {', '.join(unknown)} is not a residual mode; the modes: standard, "
                         f"{', '.join(ARM_ORDER)}")
    extra = [p for p in dict.fromkeys(extra) if PARENT.get(p[0]) != p[1]]   # an arm and its parent is compared anyway
    paths = sorted({p for pattern in args.runs for p in (glob.glob(pattern) or [pattern])})
    runs, skipped = load_runs(paths)
    if not runs:
        raise SystemExit(f"no run directories (with config.json and log.jsonl) among {args.runs}"
                         + (":\n" + skipped_lines(skipped) if skipped else ''))
    results, groups, refused = compare(runs, args.step, extra)
    if results:
        print(markdown(results))
    routing = routing_table(runs, args.step) if args.routing else ''
    if routing:
        print(routing)
    if refused:
        print(f"### Refused ({len(refused)} runs left out of every table above)\n")
        print('\n'.join(f"- {path}: {reason}" for path, reason in refused) + '\n')
    diverged = diverged_lines(runs, groups, extra)
    if diverged:
        print(f"### Diverged (kept as results: no evaluation at the last step)\n\n{diverged}")
    unchecked = unchecked_lines(results, runs)
    if unchecked:
        print(f"### Unchecked (in the tables above, their data order not verified)\n\n{unchecked}")
    if skipped:
        print(f"### Skipped ({len(skipped)} paths that are not runs)\n\n" + skipped_lines(skipped))
    if not results and unrelated_arms(groups, len(runs)):
        raise SystemExit(unrelated_arms(groups, len(runs)))
    if not results:
        raise SystemExit(f"found {len(runs)} runs but no complete pair: {no_pair_reason(runs, groups, args.step)}")
    again = "run the same command again"
    if args.json:
        written(args.json, lambda: write_json(args.json, results), f"{args.json} is as it was", again)
    if args.plot:
        for path in written(args.plot, lambda: plot(results, groups, args.plot),
                            "the plots written before it are whole, the others as they were", again):
            print(f"wrote {path}")
    if refused and args.strict:
        raise SystemExit(f"--strict: {len(refused)} runs could not be paired (listed above)")
    return 0


if __name__ == '__main__':
    sys.exit(run_command(main, sys.argv[1:], 'compare.py', "it writes nothing but --json and --plot, each file whole "
                                                           "or not at all"))
