"""
The paired study at CPU scale (README: "Results at CPU scale"): the paired protocol (README: "Training") shrunk to a
2-core machine, on real English text that ships in Debian packages.

    apt-get install python3.11-doc bible-kjv       # the corpus: Python's reST docs + the King James Bible
    python study.py corpus                         # -> data/study_src/corpus.jsonl -> data/study/*.bin
    nohup python study.py run > study.log 2>&1 &   # every run in order; a restart skips finished runs
    python study.py report                         # tables and plots into study/

Order of the runs: five seeds x {attnres, rd_attnres} (pairs complete early), then five seeds of
standard, then the early budget: attnres and the paper's three controls, five seeds each. Then a
second set on a rebuilt corpus: ctrl_mix and its attnres parents (five seeds), then the noise floor:
attnres vs ctrl_dup in float32 (three seeds; ctrl_dup in bf16 for seed 1). Every run is a
plain `python train.py config/study_cpu.py --residual=... --seed=...` into study/runs/<budget>/<mode>_s<seed>;
an interrupted run resumes from its checkpoint. Only config.json and log.jsonl are committed.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

from common import atomic_write_text, read_log

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = [1, 2, 3, 4, 5]
EARLY_ITERS = 100   # the early budget of the controls (the main budget is config/study_cpu.py's max_iters)
NOISE_SEEDS = [1, 2, 3]
# budget folder -> the arguments it adds to config/study_cpu.py
BUDGETS = {'main': [], 'early': [f'--max_iters={EARLY_ITERS}'], 'early2': [f'--max_iters={EARLY_ITERS}'],
           'early2_fp32': [f'--max_iters={EARLY_ITERS}', '--dtype=float32'], 'main_fp32': ['--dtype=float32']}
PY_DOCS = '/usr/share/doc/python3.11/html/_sources'


def queue():
    runs = []
    for seed in SEEDS:
        runs += [('main', mode, seed) for mode in ('attnres', 'rd_attnres')]
    runs += [('main', 'standard', seed) for seed in SEEDS]
    for seed in SEEDS:
        runs += [('early', mode, seed) for mode in ('attnres', 'ctrl_params', 'ctrl_dup', 'ctrl_fixed_v')]
    # Second set (README: "The second set"), on a rebuilt corpus: ctrl_mix with its own attnres
    # parents, and the noise floor: attnres vs ctrl_dup in bf16 and in float32. Whole seeds first.
    for seed in SEEDS:
        runs += [('early2', 'attnres', seed), ('early2', 'ctrl_mix', seed)]
    runs.append(('early2', 'ctrl_dup', 1))     # the bf16 reference of the noise floor on this corpus
    for seed in NOISE_SEEDS[:2]:
        runs += [('early2_fp32', 'attnres', seed), ('early2_fp32', 'ctrl_dup', seed)]
    # Third set (README: "The third set"): float32 at the main budget, whole seeds first, so that an
    # interrupted study still has complete triples; then the third seed of the float32 noise floor.
    for seed in SEEDS:
        runs += [('main_fp32', mode, seed) for mode in ('attnres', 'rd_attnres', 'ctrl_heads')]
    runs += [('early2_fp32', 'attnres', NOISE_SEEDS[2]), ('early2_fp32', 'ctrl_dup', NOISE_SEEDS[2])]
    return runs


def run_dir(budget, mode, seed):
    return os.path.join(HERE, 'study', 'runs', budget, f'{mode}_s{seed}')


def is_finished(path):
    try:
        with open(os.path.join(path, 'config.json')) as f:
            max_iters = json.load(f)['max_iters']
        rows = read_log(os.path.join(path, 'log.jsonl'))
        return any(r.get('step') == max_iters and 'val_loss' in r for r in rows)
    except (OSError, ValueError, KeyError):
        return False


def kjv_chapters():
    """The King James Bible from Debian's bible-kjv, one document per chapter."""
    out = subprocess.run(['bible', '-f', 'Genesis 1:1-Revelation 22:21'], capture_output=True, text=True,
                         check=True).stdout
    chapters = {}
    for line in out.splitlines():
        m = re.match(r'^(\w+?)(\d+):(\d+) (.*)$', line)  # "Ge1:1 In the beginning ..."
        if m:
            chapters.setdefault((m.group(1), int(m.group(2))), []).append(m.group(4))
    return ['\n'.join(verses) for verses in chapters.values()]


def corpus():
    if not os.path.isdir(PY_DOCS) or not shutil.which('bible'):
        raise SystemExit("the study corpus needs Debian's packages: apt-get install python3.11-doc bible-kjv")
    docs = [open(p, encoding='utf-8').read() for p in sorted(glob.glob(f'{PY_DOCS}/**/*.rst.txt', recursive=True))]
    bible = kjv_chapters()
    os.makedirs(os.path.join(HERE, 'data', 'study_src'), exist_ok=True)
    path = os.path.join(HERE, 'data', 'study_src', 'corpus.jsonl')
    atomic_write_text(path, ''.join(json.dumps({'text': text}) + '\n' for text in docs + bible))
    print(f"{path}: {len(docs)} Python documentation pages + {len(bible)} Bible chapters")
    subprocess.run([sys.executable, os.path.join(HERE, 'prepare.py'), '--input', path, '--name', 'study',
                    '--val_fraction', '0.05', '--data_dir', os.path.join(HERE, 'data')], check=True)


def run_all():
    for budget, mode, seed in queue():
        path = run_dir(budget, mode, seed)
        if is_finished(path):
            print(f"done already: {path}", flush=True)
            continue
        args = [sys.executable, os.path.join(HERE, 'train.py'), os.path.join(HERE, 'config', 'study_cpu.py'),
                f'--residual={mode}', f'--seed={seed}', f'--out_dir={path}', *BUDGETS[budget]]
        if os.path.exists(os.path.join(path, 'ckpt.pt')):
            args.append('--init_from=resume')
        elif os.path.exists(os.path.join(path, 'log.jsonl')):
            args.append('--overwrite=True')  # killed before its first checkpoint: start it again
        print(f"running: {' '.join(args[2:])}", flush=True)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, 'train.out'), 'a') as log:
            subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, check=True, cwd=HERE)


def report():
    import compare
    out = os.path.join(HERE, 'study')
    for budget in BUDGETS:
        runs = glob.glob(os.path.join(out, 'runs', budget, '*'))
        if not runs:
            continue
        # the first set's plots sit in study/plots/, the second set's in study/plots/<budget>/ (same run names)
        plots = os.path.join(out, 'plots', *([] if budget in ('main', 'early') else [budget]))
        argv = runs + ['--json', os.path.join(out, f'results_{budget}.json'), '--plot', plots]
        print(f"## {budget} budget\n")
        compare.main(argv)


if __name__ == '__main__':
    commands = {'corpus': corpus, 'run': run_all, 'report': report}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        raise SystemExit(f"usage: python study.py {{{'|'.join(commands)}}}")
    commands[sys.argv[1]]()
