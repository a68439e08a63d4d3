"""A newcomer's first hour: every command answers --help (the configurator scripts list their keys, read from
their source before torch loads), and the README's comparison after the quickstart runs as written."""

import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

import bench
import compare
import intervene
import sample
import train
from helpers import HERE, TINY, main_here, run_here, sample_here, train_here

CONFIGURED = {'train.py': train.DEFAULTS, 'sample.py': sample.DEFAULTS, 'bench.py': bench.DEFAULTS,
              'intervene.py': intervene.DEFAULTS}
EXPRESSIONS = {('bench.py', 'modes'): "','.join(RESIDUAL_MODES)"}   # defaults the help shows as written


def python(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=HERE, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS='1'))


@pytest.mark.parametrize('script', sorted(CONFIGURED))
def test_help_lists_every_key_with_its_default_before_torch_loads(script):
    # run as `python <script> --help` would, and then ask whether torch was imported on the way
    probe = (f"import runpy, sys\nsys.argv = [{script!r}, '--help']\ntry:\n    runpy.run_path({script!r}, "
             f"run_name='__main__')\nexcept SystemExit as e:\n    print('EXIT', e.code, 'torch' in sys.modules)")
    p = python('-c', probe)
    assert p.returncode == 0 and p.stdout.rstrip().endswith('EXIT 0 False'), p.stdout[-1000:] + p.stderr[-2000:]
    text = p.stdout.rstrip().rsplit('\nEXIT', 1)[0] + '\n'
    keys_part = text.split('\nkeys and their defaults')[1]
    assert text.startswith(f"usage: python {script} [config_file.py ...] [--key=value ...]")
    for key, value in CONFIGURED[script].items():
        shown = EXPRESSIONS.get((script, key), repr(value))
        assert re.search(rf"(^  |, ){re.escape(key)}={re.escape(shown)}(,|\s|$)", keys_part, re.M), (key, shown)
    keys_shown = re.findall(r"(?:^  |, )([a-z_0-9]+)=", keys_part, re.M)
    assert sorted(keys_shown) == sorted(CONFIGURED[script])          # every key once, and nothing else
    more = text.rstrip().rsplit('\n', 1)[-1]
    assert more.startswith('more: ')
    for path in re.findall(r"[\w/]+\.md", more):                     # where to read more exists
        assert os.path.exists(os.path.join(HERE, path)), path
    # -h is --help, also after a config file; it exits 0 and prints the same
    short = python(script, 'config/quickstart.py', '-h')
    assert short.returncode == 0 and short.stdout == text, short.stderr[-2000:]


def test_train_help_groups_the_keys_as_the_file_does_with_their_comments():
    text = python('train.py', '--help').stdout
    groups = [line for line in text.splitlines() if line and not line.startswith(' ')]
    headings = ['I/O', 'data', 'model', 'optimizer: AdamW, linear warmup then cosine decay to min_lr_ratio * learning_rate',
                'system']
    assert [g for g in groups if g in headings] == headings
    section = text.split('\ndata\n')[1].split('\nmodel\n')[0]      # the keys under "data" are the file's
    assert re.findall(r"^  (\w+)=", section, re.M) == ['dataset', 'data_dir', 'seed', 'total_batch_size', 'batch_size',
                                                        'block_size']
    assert re.search(r"^  seed=1 +initialisation and data order: what pairs two arms$", text, re.M)
    assert re.search(r"^  total_batch_size=524288 +tokens per optimizer step", text, re.M)   # 2 ** 19, evaluated
    # a comment that continues on the next line of the file continues in the help (bench.py's backend)
    bench_text = python('bench.py', '--help').stdout
    assert re.search(r"backend='inductor' +with compile: .*\n +.*no kernels built", bench_text)


@pytest.mark.parametrize('script,options', [
    ('prepare.py', ['--dataset', '--data_dir']), ('compare.py', ['--pair', '--plot', 'rd_attnres vs attnres: ']),
    ('study.py', ['run', 'report']), ('course.py', ['handout', 'check', 'grade']),
    # the measurements' scripts that docs/performance.md gives as commands
    ('scripts/profile_compiled_step.py', ['plain', 'two_phase']),
    ('scripts/cpu_threads.py', ['out_dir', 'sample_rounds', 'train_rounds']),
    ('scripts/nested_compile_region_gradients.py', ['nested_compile_region'])])
def test_argparse_commands_answer_help(script, options):
    for flag in ('--help', '-h'):
        p = python(script, flag)
        assert p.returncode == 0 and p.stdout.startswith('usage:'), p.stderr[-2000:]
        assert all(o in p.stdout for o in options), p.stdout


def readme_commands(section):
    """The commands of the first code block under the README heading `section`, as argv lists."""
    text = open(os.path.join(HERE, 'README.md'), encoding='utf-8').read()
    block = text.split(f'\n## {section}\n', 1)[1].split('```bash\n', 1)[1].split('```', 1)[0]
    return [shlex.split(line.split('#')[0]) for line in block.splitlines() if line.split('#')[0].strip()]


def readme_prose():
    """The README without its code blocks (compare.py's sample output there has lines that start with ###)."""
    text = open(os.path.join(HERE, 'README.md'), encoding='utf-8').read()
    return ''.join(part for i, part in enumerate(re.split(r'^```.*$', text, flags=re.M)) if i % 2 == 0)


def test_the_readme_opens_with_the_method_and_every_section_cited_elsewhere_exists():
    headings = re.findall(r'^## (.+)$', readme_prose(), re.M)
    assert headings[0].startswith('The method'), headings                # what and why before how to run it
    assert headings.index('The method in a few lines of math') < headings.index('Install') < headings.index('Quickstart')
    # the code and the other documents send readers to README sections by name: README, then the name in quotes
    cited = set()
    for folder, dirs, names in os.walk(HERE):
        dirs[:] = [d for d in dirs if not d.startswith('.') and d not in ('data', 'out', 'study', 'results')]
        for name in names:
            if name.endswith(('.py', '.md', '.sh')) and name != 'README.md':
                text = open(os.path.join(folder, name), encoding='utf-8').read()
                cited |= {(name, m) for m in re.findall(r'README(?::|\'s)?[^"\n]{0,20}?\\?"([^"\\\n]+)\\?"', text)}
    assert any(section == 'The method in a few lines of math' for _, section in cited)   # model.py's glossary
    assert [(name, section) for name, section in sorted(cited) if section not in headings] == []


def test_the_readmes_first_screen_starts_a_reader_and_its_reading_order_points_at_the_code():
    text = open(os.path.join(HERE, 'README.md'), encoding='utf-8').read()
    assert len(text.splitlines()) <= 260
    first_screen = '\n'.join(text.splitlines()[:40])
    assert 'python train.py config/quickstart.py' in first_screen and 'minutes' in first_screen
    # a reader offline meets the offline note before the first command that needs it
    assert text.index('HF_HUB_OFFLINE=1') < text.index('```bash') < text.index('python prepare.py')
    # "Three modes ... and four controls": model.py's, each named
    from model import CONTROLS, RESIDUAL_MODES
    assert len(CONTROLS) == 4 and len(set(RESIDUAL_MODES) - set(CONTROLS)) == 3
    assert 'Three modes' in first_screen and 'four controls' in first_screen
    assert all(f'`{mode}`' in first_screen for mode in RESIDUAL_MODES)
    # "The lesson is `model.py` (N lines) and `train.py` (M)": the two files' lengths today
    lesson = re.search(r'The lesson is `model.py` \((\d+) lines\) and `train.py` \((\d+)\)', text.replace('\n', ' '))
    assert lesson, first_screen
    for path, said in zip(('model.py', 'train.py'), lesson.groups()):
        assert len(open(os.path.join(HERE, path), encoding='utf-8').read().splitlines()) == int(said), (path, said)
    # "name (file.py:N)": line N of file.py defines name (a def or a class; Class.method: the method)
    refs = re.findall(r'`([\w.]+)`[^`(]{0,40}\((\w+\.py):(\d+)\)', first_screen)
    assert {f for _, f, _ in refs} >= {'model.py', 'train.py', 'compare.py'}, refs
    for name, path, line in refs:
        code = open(os.path.join(HERE, path), encoding='utf-8').read().splitlines()[int(line) - 1]
        assert re.match(rf'\s*(def|class) {re.escape(name.split(".")[-1])}\b', code), (name, path, line, code)


def test_every_link_in_the_docs_leads_to_a_file():
    pages = ['README.md', 'COURSE.md', 'results/README.md'] + [f'docs/{n}' for n in os.listdir(os.path.join(HERE, 'docs'))
                                                               if n.endswith('.md')]
    broken = []
    for page in pages:
        if not os.path.exists(os.path.join(HERE, page)):
            continue                                                     # a course handout leaves results/ out
        text = open(os.path.join(HERE, page), encoding='utf-8').read()
        for link in re.findall(r'\]\(([^)\s]+)\)', re.sub(r'^```.*?^```', '', text, flags=re.M | re.S)):
            target = link.split('#')[0]
            if re.match(r'[a-z]+:', link) or not target:
                continue                                                 # a web address, or an anchor in the page
            path = os.path.normpath(os.path.join(HERE, os.path.dirname(page), target))
            top = os.path.relpath(path, HERE).split(os.sep)[0]
            if top in ('study', 'results') and not os.path.isdir(os.path.join(HERE, top)):
                continue                                                 # (not in a course handout)
            if not os.path.exists(path):
                broken.append(f"{page}: {link}")
    assert broken == []


def test_the_readmes_links_lead_to_files_and_its_test_command_is_the_one_ci_runs():
    links = [link for link in re.findall(r'\]\(([^)\s]+)\)', readme_prose()) if not re.match(r'[a-z]+:', link)]
    for link in links:
        assert '#' not in link, link                                     # a path, not an anchor that can move
        if link.split('/')[0] + '/' in ('study/', 'results/') and not os.path.isdir(os.path.join(HERE, link.split('/')[0])):
            continue                                                     # a course handout leaves these folders out
        assert os.path.isfile(os.path.join(HERE, link)), link
    pages = {f'docs/{name}' for name in os.listdir(os.path.join(HERE, 'docs')) if name.endswith('.md')}
    assert sorted(pages - set(links)) == []                              # every page of docs/ is linked
    # .ci/run ends with the README's test command, as written there
    ci = [line for line in open(os.path.join(HERE, '.ci', 'run'), encoding='utf-8').read().splitlines() if line.strip()]
    tests = [' '.join(argv) for argv in readme_commands('Tests')]
    assert ci[-1] == 'python -m pytest -q -n auto --dist loadfile' and ci[-1] in tests
    assert 'python -m pytest -q -n auto -m not slow' in tests                # the fast tier, after an edit
    assert 'sudo apt-get install -y bubblewrap && python -m pip install -r requirements.txt' in tests


@pytest.mark.slow
def test_the_readmes_comparison_after_the_quickstart_runs_as_written(data_dir, tmp_path, monkeypatch):
    """README "The comparison", at a tiny size: the quickstart's run and its parent trained as written, then
    compare.py on the two finds the pair and writes the plot it names."""
    commands = readme_commands('The comparison')
    assert [c[:2] for c in commands] == [['python', 'train.py'], ['python', 'compare.py']]
    monkeypatch.chdir(tmp_path)          # the README's relative out/ paths land in the test's folder
    os.symlink(os.path.join(HERE, 'config'), 'config')
    quickstart = ['config/quickstart.py', *TINY]   # the quickstart's run, tiny
    run_here(quickstart, data_dir, 'out/quickstart')
    train_argv = commands[0][2:]
    out_dir = next(a.split('=', 1)[1] for a in train_argv if a.startswith('--out_dir='))
    p = run_here([*train_argv[:1], *TINY, *train_argv[1:]], data_dir, out_dir)   # the README's flags come last
    assert 'attnres |' in p.stdout
    p = main_here(compare.main, commands[1][2:])
    assert p.returncode == 0, p.stderr
    assert '### rd_attnres vs attnres:' in p.stdout and "not one of the paper's" not in p.stdout
    assert re.search(r"^\| 1 \| \d+\.\d{4} \| \d+\.\d{4} \| [+-]\d\.\d{4} \|$", p.stdout, re.M)   # seed 1's pair
    plot_dir = commands[1][commands[1].index('--plot') + 1]
    curves = glob.glob(os.path.join(plot_dir, 'curves_rd_attnres_vs_attnres_*.png'))
    assert len(curves) == 1 and os.path.getsize(curves[0]) > 1000 and f"wrote {curves[0]}" in p.stdout


@pytest.mark.slow
def test_compare_names_the_pair_for_two_modes_that_are_not_parent_and_child(data_dir, tmp_path):
    rd, standard, attnres = (str(tmp_path / name) for name in ('quickstart', 'standard', 'attnres'))
    run_here([], data_dir, rd)
    run_here(['--residual=standard'], data_dir, standard)
    p = main_here(compare.main, [rd, standard])
    assert p.returncode == 1 and '--pair rd_attnres:standard' in p.stderr and 'rd_attnres vs attnres' in p.stderr
    hint = p.stderr
    # what the message says, done: the pair named, labelled as not the paper's comparison
    p = main_here(compare.main, [rd, standard, '--pair', 'rd_attnres:standard'])
    assert p.returncode == 0 and '### rd_attnres vs standard:' in p.stdout
    assert ("not one of the paper's comparisons, which compare each mode with its parent: rd_attnres and standard "
            "are 2 changes apart: standard → attnres → rd_attnres; Δ is the sum of those changes' effects") in p.stdout
    # ... or the parent trained, as it says (the same config, --residual=attnres, its own folder)
    assert '--residual=attnres --out_dir=<its own folder>' in hint
    run_here(['--residual=attnres'], data_dir, attnres)
    p = main_here(compare.main, [rd, standard, attnres])
    assert p.returncode == 0 and '### rd_attnres vs attnres:' in p.stdout and '### attnres vs standard:' in p.stdout
    assert "not one of the paper's" not in p.stdout
    # a parent pair named the other way round is labelled too (its Δ has the other sign); a mode that does
    # not exist is a message
    p = main_here(compare.main, [rd, attnres, '--pair', 'attnres:rd_attnres'])
    assert p.returncode == 0 and '### attnres vs rd_attnres:' in p.stdout
    assert "attnres and rd_attnres are one change apart: attnres → rd_attnres; Δ is the paper's with the other sign" in p.stdout
    p = main_here(compare.main, [rd, attnres, '--pair', 'rd_atnres:attnres'])
    assert p.returncode == 1 and 'rd_atnres is not a residual mode' in p.stderr and 'ctrl_heads' in p.stderr


def test_the_console_rounds_and_says_what_its_numbers_are(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    p = run_here(['--cpu_threads=2', '--max_iters=2'], data_dir, out)
    assert '2 torch threads (cpu_threads)' in p.stdout
    assert 'no mfu: no peak FLOP/s known for cpu (set peak_flops to see it)' in p.stdout
    steps = [line for line in p.stdout.splitlines() if line.startswith('step ') and '|' in line]
    assert steps and all('mfu' not in line and line.endswith('(recent pace)') for line in steps)
    s = sample_here(f'--out_dir={out}', '--start=The tuple', '--num_samples=1', '--max_new_tokens=4',
                    '--show_routing=True')
    assert s.returncode == 0, s.stderr
    assert re.search(r"best val loss \d+\.\d{4}\)", s.stdout), s.stdout[:300]
    legend = ' '.join(s.stdout.split())                                   # (the legend is wrapped)
    assert "their mean over the prompt's 2 tokens" in legend               # "The tuple": 2 GPT-2 tokens
    assert 'The last row, sublayer 4 final, is the read after the last sublayer' in legend
    assert re.search(r"^sublayer  4 final", s.stdout, re.M)



def test_the_readmes_sample_output_is_what_the_quickstart_prints(data_dir, tmp_path, monkeypatch):
    """README "What the output means": its sample holds every line the quickstart prints before its first
    step line, in order, and a step line with the fields the console prints (at a tiny size: the numbers differ)."""
    text = open(os.path.join(HERE, 'README.md'), encoding='utf-8').read()
    sample = text.split('\n## What the output means\n', 1)[1].split('```\n', 1)[1].split('```', 1)[0].splitlines()
    monkeypatch.chdir(tmp_path)
    os.symlink(os.path.join(HERE, 'config'), 'config')
    p = run_here(['config/quickstart.py', *TINY], data_dir, str(tmp_path / 'out'))
    printed = p.stdout.splitlines()
    head = printed[:printed.index(next(line for line in printed if line.startswith('step 0: val loss')))]
    readme_head = sample[:sample.index(next(line for line in sample if line.startswith('step 0: val loss')))]
    first = lambda lines: [' '.join(line.split()[:1 if line[0].isalpha() else 3]) for line in lines]
    assert first(readme_head) == first(head), (readme_head, head)        # every summary line, none left out
    fields = lambda line: re.findall(r'\| ([a-z/]+) ', line)
    step_line = next(line for line in printed if line.startswith('step ') and '|' in line)
    assert fields(sample[-1]) == fields(step_line) and sample[-1].endswith('(recent pace)'), (sample[-1], step_line)

# The record of measurements: results/ holds the raw output of what the docs report, results/README.md
# indexes it (what made each file: command, code, date, machine, the page that cites it)
RESULTS = os.path.join(HERE, 'results')


def expand_braces(pattern):
    """'a{b,c}d{e,f}' -> ['abde', 'abdf', 'acde', 'acdf'], as the shell writes several files in one name."""
    m = re.search(r'\{([^{}]*)\}', pattern)
    if not m:
        return [pattern]
    return [name for alt in m.group(1).split(',') for name in expand_braces(pattern[:m.start()] + alt + pattern[m.end():])]


def results_cited():
    """{a `results/...` path as the project's pages and code write it: the files that write it}; the folder
    itself, /elsewhere/results/ paths and a commit's `C:results/...` (history: git_cited) are not citations."""
    import course
    cited = {}
    for f in course.project_files():
        if f.startswith(('results/', 'study/runs/')) or not f.endswith(('.md', '.py', '.sh')):
            continue
        for path in re.findall(r"(?<![\w/.:-])results/[\w.{},*-]+", open(os.path.join(HERE, f), encoding='utf-8').read()):
            cited.setdefault(path.rstrip('.,'), set()).add(f)
    return cited


def test_every_measurement_the_docs_cite_exists_and_the_index_lists_each_file():
    if not os.path.isdir(RESULTS):
        pytest.skip("a course handout holds no results/ (course.NOT_HANDED_OUT): the measurements stay with the project")
    cited = results_cited()
    assert len(cited) > 20                                                # (the search finds what the docs cite)
    matched = set()
    for path, where in sorted(cited.items()):
        names = [g for p in expand_braces(path) for g in glob.glob(os.path.join(HERE, p))]
        assert names, f"{sorted(where)} cite {path}, which names no file"
        matched |= {os.path.relpath(n, RESULTS) for n in names if os.path.isfile(n)}
        # a folder of one run's raw output is cited whole and indexed by its own README.md
        matched |= {os.path.relpath(n, RESULTS) for n in names
                    if os.path.isdir(n) and os.path.isfile(os.path.join(n, 'README.md'))}
    present = set(os.listdir(RESULTS)) - {'README.md'}
    # a file no page cites is not kept (git keeps it)
    assert present <= matched, f"in results/ but cited by no page: {sorted(present - matched)}"
    # the index: one row per file (or per group of files), the files in its first column
    index = open(os.path.join(RESULTS, 'README.md'), encoding='utf-8').read()
    rows = [line.split('|')[1] for line in index.splitlines() if line.startswith('| `')]
    listed = [name for cell in rows for name in re.findall(r'`([^`]+)`', cell)]
    assert len(listed) == len(set(listed)), 'a file listed twice'
    assert set(listed) == present, (f"not in results/README.md: {sorted(present - set(listed))}; "
                                    f"listed but not in results/: {sorted(set(listed) - present)}")
    for line in index.splitlines():                                      # each row says what made its files
        if line.startswith('| `'):
            cells = [c.strip() for c in line.strip('|').split('|')]
            assert len(cells) == 6 and all(cells), line
            assert re.search(r'\b[0-9a-f]{7}\b', cells[3]) and re.search(r'\b2026-\d\d-\d\d\b', cells[4]), line
            assert re.search(r'docs/\w+\.md', cells[5]), line


def test_measurements_of_code_no_longer_here_are_cited_where_git_keeps_them():
    # a page cites what left results/ as `git show COMMIT:results/FILE`: that commit holds that file
    import course
    if not os.path.isdir(os.path.join(HERE, '.git')) and not os.path.isfile(os.path.join(HERE, '.git')):
        pytest.skip("not a git checkout (a course handout): history is the project's")
    cited = {m for f in course.project_files() if f.endswith('.md')
             for m in re.findall(r"git show ([0-9a-f]{7,40}):(results/[\w.-]+)", open(os.path.join(HERE, f), encoding='utf-8').read())}
    assert cited
    for commit, path in sorted(cited):
        p = subprocess.run(['git', 'cat-file', '-e', f'{commit}:{path}'], cwd=HERE, capture_output=True)
        assert p.returncode == 0, f"{commit}:{path} is not in git"


def test_model_py_stands_alone_and_one_function_builds_a_run_s_model():
    # the lesson file is read on its own, as nanoGPT's is: it imports torch and the standard library only
    import ast
    tree = ast.parse(open(os.path.join(HERE, 'model.py')).read())
    imported = {alias.name.split('.')[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split('.')[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {'torch', *sys.stdlib_module_names}, f"model.py imports {sorted(imported)}"
    # a run's model is built in one place (run_kit/common.build_model): the vocabulary is typed once, in GPTConfig
    from fast_read.two_phase_read import TwoPhaseGPT
    from model import GPT
    from run_kit.common import build_model
    typed = [path for path in glob.glob(os.path.join(HERE, '**', '*.py'), recursive=True)
             if '50304' in open(path).read() and '.venv' not in path and f'{os.sep}tests{os.sep}' not in path]
    assert [os.path.relpath(p, HERE) for p in typed] == ['model.py']
    cfg = dict(n_layer=1, n_head=2, n_embd=8, block_size=8, residual='rd_attnres', attnres_block_size=2)
    assert type(build_model(cfg)) is GPT and type(build_model(dict(cfg, depth_read='two_phase'))) is TwoPhaseGPT


def test_train_py_imports_few_project_names_the_lesson_before_the_machinery():
    # a reader of train.py sees what the lesson is made of first, then the machinery to skip (the reading order on the README's first screen)
    import ast
    source = open(os.path.join(HERE, 'train.py'), encoding='utf-8').read()
    ours = ('model', 'prepare', 'run_kit', 'fast_read', 'configurator')
    imports = [n for n in ast.parse(source).body if isinstance(n, ast.ImportFrom) and n.module.split('.')[0] in ours]
    assert sum(len(n.names) for n in imports) <= 20, [a.name for n in imports for a in n.names]
    lesson, machinery = source.index('# what the lesson is made of'), source.index('# machinery a reader may skip')
    first_machinery = min(source.index(m) for m in ('from run_kit import', 'from fast_read'))
    assert lesson < source.index('from model import') < machinery < first_machinery


def run_kit_files_crossed(data_dir, out_dir, *args):
    """train.main from its start to the first training step, traced: the run_kit/ files its calls go into, in
    order, one entry per stay (the step-0 evaluation's routing diagnostics aside: routing.py measures the model)."""
    class FirstStep(Exception):
        pass
    stays = []

    def trace(frame, event, arg):
        if event != 'call':
            return
        path, name = frame.f_code.co_filename, frame.f_code.co_name
        if f'{os.sep}run_kit{os.sep}' in path and not name.startswith('<') and not path.endswith('routing.py'):
            if not stays or stays[-1] != os.path.basename(path):
                stays.append(os.path.basename(path))
        if path == train.__file__ and name == 'train_step':
            raise FirstStep
    sys.setprofile(trace)
    try:
        train_here(data_dir, out_dir, *args)
    except FirstStep:
        pass
    finally:
        sys.setprofile(None)
    return stays


def test_a_run_starts_through_one_door_not_a_walk_between_files(data_dir, tmp_path):
    # starting a run (from scratch, and resumed) reads top to bottom: the configuration checked, this process set up,
    # the model built, then run_dir.start_run, which asks run_files for the formats it reads and writes. Its calls
    # cross from one run_kit file to another at most 10 times; each file is entered at most 3 times.
    out = str(tmp_path / 'run')
    scratch = run_kit_files_crossed(data_dir, out, '--lr_decay_iters=8')
    assert train_here(data_dir, out, '--lr_decay_iters=8', '--init_from=auto') == 0   # (4 steps, checkpoints at 2 and 4)
    resumed = run_kit_files_crossed(data_dir, out, '--lr_decay_iters=8', '--max_iters=8', '--init_from=resume')
    for stays in (scratch, resumed):
        assert len(stays) - 1 <= 10 and max(map(stays.count, stays)) <= 3, stays


def test_the_readmes_results_are_the_committed_studys():
    # the README's table of the CPU study, row by row, as compare.paired_stats gives it from the committed logs'
    # final validation losses (float32: study/runs/main_fp32; the bf16 row: study/runs/main)
    if not os.path.isdir(os.path.join(HERE, 'study', 'runs')):
        pytest.skip("no study/runs here (a course handout leaves the study out)")
    text = open(os.path.join(HERE, 'README.md'), encoding='utf-8').read().replace('−', '-')
    rows = re.findall(r'^\| (\w+) - (\w+)( \(bf16\))? \| ([+-][\d.]+) \| \[([+-][\d.]+), ([+-][\d.]+)\] \| (\d+)/(\d+) \|$',
                      text, re.M)
    assert len(rows) == 4, rows

    from run_kit.run_files import LOG, read_log

    def final_val(folder):
        return [r['val_loss'] for r in read_log(os.path.join(folder, LOG)) if 'val_loss' in r][-1]
    for child, parent, bf16, mean, low, high, wins, n in rows:
        runs = os.path.join(HERE, 'study', 'runs', 'main' if bf16 else 'main_fp32')
        seeds = [s for s in range(1, 11) if all(os.path.isdir(os.path.join(runs, f'{m}_s{s}')) for m in (child, parent))]
        assert seeds, (child, parent)
        deltas = [final_val(os.path.join(runs, f'{child}_s{s}')) - final_val(os.path.join(runs, f'{parent}_s{s}'))
                  for s in seeds]
        got = compare.paired_stats(deltas)
        assert (f"{got['mean_delta']:+.4f}", f"{got['ci95'][0]:+.4f}", f"{got['ci95'][1]:+.4f}", got['wins'], got['n']) \
            == (mean, low, high, int(wins), int(n)), (child, parent, got)
