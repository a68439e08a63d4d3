"""Tests of the course kit itself (course.py, course_grader.py, COURSE.md), as an instructor with a class would
use it: for every assignment the handout stubs it and every later one (and holds none of their solutions nor
any other way to pass), its public tests fail on the stub and pass with the solution put back, the solution
scores full marks, each planted mistake and each trivial non-solution is graded as it deserves, and students
who attack the grader (forged results, files written outside, another student's files, processes that
outlive grading, hidden checks read, loops, fork bombs, memory) get what their code earns honestly while
the rest of the class is unchanged."""

import csv
import json
import os
import re
import subprocess
import sys
import time

import pytest

import course
import course_grader
import course_worker

HERE = course.HERE

# Planted mistakes, each a case a student would make: (assignment, name, [(file, right text, wrong text)]).
# Each loses marks; those named MOST (conceptually wrong models that a grader by test count once scored
# high) lose most of their assignment's marks.
MOST = {'logits by matmul', 'V read from the QK route', 'V through norm_mlp', 'routes de-duplicated by query name',
        'running sums instead of increments', "one rank's share"}
# The wrong formulas among them keep at most a third of their assignment's marks. (The others compute the
# right function in a way the assignment rules out (a matmul), or fail only the case their concept is
# about (one pair).)
WRONG_FORMULA = {'scaled by 1/sqrt(d)', 'V read from the QK route', 'V through norm_mlp', 'routes de-duplicated by query name',
                 'running sums instead of increments', 'the embedding folded into the first block',
                 'the same permutation every epoch', "one rank's share", 'sd over n'}
# Trivial non-solutions, each the whole body of every region of the assignment (in file order): they must
# score 0 in every concept.
TRIVIAL = {
    1: {'uniform': [['    h = torch.stack([sum(x for x, _ in sources) / len(sources)] * len(queries))',
                     '    alpha = torch.full((len(queries), *x0.shape[:2], len(sources)), 1 / len(sources), dtype=x0.dtype)']],
        'zeros': [['    h = torch.zeros(len(queries), *x0.shape, dtype=x0.dtype)',
                   '    alpha = torch.zeros(len(queries), *x0.shape[:2], len(sources), dtype=x0.dtype)']],
        'identity': [['    h = x0.expand(len(queries), *x0.shape)',
                      '    alpha = torch.zeros(len(queries), *x0.shape[:2], len(sources), dtype=x0.dtype)',
                      '    alpha[..., 0] = 1']]},
    2: {'zeros': [['        queries = torch.zeros(len(self.routes), self.key_gain.numel(), dtype=self.key_gain.dtype)'],
                  ['        return torch.zeros_like(h[0]), torch.zeros_like(h[0])']],
        'identity': [['        queries = torch.stack([self.key_gain * 0 for _ in self.routes])'], ['        return h[0], h[-1]']],
        'constant': [['        queries = torch.stack([self.key_gain * 0 + 1 for _ in self.routes])'],
                     ['        return h[0] * 0 + 1, h[-1] * 0 + 1']]},
    3: {'identity': [['        h = embedding']], 'zeros': [['        h = embedding * 0']],
        'uniform': [['        h = self.final_read([source(embedding)], log)[0]']]},
    4: {'range': [['    out = list(range(windows_per_step))']], 'constant': [['    out = [0] * windows_per_step']],
        'one permutation': [['    out = window_order(n_windows, seed, 0)[:windows_per_step].tolist()']]},
    5: {'zeros': [['    p = 0.0'], ['    mean, sd, half, wins = 0.0, 0.0, 0.0, 0']],
        'constant': [['    p = 1.0'], ['    mean, sd, half, wins = 1.0, 1.0, 1.0, 1']],
        'first value': [['    p = 0.5'], ["    mean, sd, half, wins = deltas[0], float('nan'), float('nan'), 0"]]},
}
PLANTED = [
    (1, 'scaled by 1/sqrt(d)', [('model.py', '(x * w).sum(-1) for w in q', '(x * w).sum(-1) / math.sqrt(x.size(-1)) for w in q')]),
    (1, 'logits by matmul', [('model.py', 'torch.stack([(x * w).sum(-1) for w in q], -1)', '(x @ q.T)')]),
    (2, 'V read from the QK route', [('model.py', 'return x[0], x[-1]', 'return x[0], x[0]')]),
    (2, 'V through norm_mlp', [('model.py', 'return x[0], x[-1]', 'return x[0], self.norm_mlp(h[-1])')]),
    (2, 'routes de-duplicated by query name',
     [('model.py', 'for name in self.routes.values()]', 'for name in dict.fromkeys(self.routes.values())]')]),
    (3, 'running sums instead of increments', [('model.py', '                    finished.append(partial)\n',
                                                '                    finished.append(source(finished[-1][0] + partial[0]))\n')]),
    (3, 'the embedding folded into the first block', [('model.py', 'finished = [source(embedding)]', 'finished = []'),
                                                      ('model.py', 'partial = None                  #',
                                                       'partial = source(embedding)     #')]),
    (4, 'the same permutation every epoch', [('common.py', 'window_order(n_windows, seed, epoch)[offset',
                                              'window_order(n_windows, seed, 0)[offset')]),
    (4, "one rank's share", [('common.py', '.tolist())\n', ".tolist())\n    out = out[int(os.environ.get('RANK', 0))"
                                                          "::int(os.environ.get('WORLD_SIZE', 1))]\n")]),
    (5, 'sd over n', [('compare.py', '/ (n - 1)) if n > 1', '/ n) if n > 1')]),
    (5, 'crashes with one pair', [('compare.py', "/ (n - 1)) if n > 1 else float('nan')", '/ (n - 1))'),
                                  ('compare.py', "math.sqrt(n) if n > 1 else float('nan')", 'math.sqrt(n)')]),
]


def put_back(folder, n, mistakes=(), bodies_of=None):
    """Write the reference solution of assignment n between the student's markers (or the given bodies:
    {file: [the lines of each region]}), then plant mistakes."""
    for f in course.files_of(n):
        mine = open(os.path.join(HERE, f)).read().split('\n')
        bodies = [mine[first + 1:last] for a, first, last in course.regions('\n'.join(mine)) if a == n]
        bodies = bodies_of[f] if bodies_of else bodies
        path = os.path.join(folder, f)
        theirs = open(path).read().split('\n')
        spots = [(first, last) for a, first, last in course.regions('\n'.join(theirs), course.ANSWER_BEGIN,
                                                                     course.ANSWER_END) if a == n]
        assert len(spots) == len(bodies) > 0
        for (first, last), body in sorted(zip(spots, bodies), reverse=True):
            theirs[first + 1:last] = body
        text = '\n'.join(theirs)
        for file, right, wrong in mistakes:
            if file == f:
                assert text.count(right) == 1, (f, right)
                text = text.replace(right, wrong)
        with open(path, 'w') as out:
            out.write(text)


def solution_lines(n, path):
    text = open(path).read()
    lines = text.split('\n')
    return [lines[i].strip() for a, first, last in course.regions(text) if a == n
            for i in range(first + 1, last) if lines[i].strip() and not lines[i].strip().startswith('#')]


def check(folder, n):
    p = subprocess.run([sys.executable, 'course.py', 'check', str(n)], cwd=folder, capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, OMP_NUM_THREADS='1'))
    return p.returncode, p.stdout.strip().splitlines()[-1], p.stdout


@pytest.fixture(scope='module')
def handouts(tmp_path_factory):
    root = tmp_path_factory.mktemp('handouts')
    for n in course.ASSIGNMENTS:
        course.handout(n, str(root / f'h{n}'))
    return root


@pytest.mark.parametrize('n', sorted(course.ASSIGNMENTS))
def test_handout_stubs_this_and_every_later_assignment(handouts, tmp_path, n):
    import shutil
    out = str(shutil.copytree(handouts / f'h{n}', tmp_path / f'h{n}'))   # (the handouts are shared)
    for later in range(n, max(course.ASSIGNMENTS) + 1):
        for f in course.files_of(later):
            text = open(os.path.join(out, f)).read()
            assert f'raise NotImplementedError("assignment {later}:' in text
            assert not any(line in text for line in solution_lines(later, os.path.join(HERE, f)) if len(line) > 25)
    for earlier in range(1, n):   # the course goes in order: the earlier ones are given
        for f in course.files_of(earlier):
            assert solution_lines(earlier, os.path.join(HERE, f))[0] in open(os.path.join(out, f)).read()
    files = {os.path.relpath(os.path.join(d, f), out) for d, _, names in os.walk(out) for f in names}
    assert files == set(course.handout_files())                       # the explicit list, nothing else
    assert not files & {'course_grader.py', 'course_worker.py', 'test_hidden.py', 'test_course.py', 'bench.py'}
    assert not any(f.startswith(('results/', 'study/', 'scripts/')) for f in files)
    everything = ''.join(open(os.path.join(out, f), errors='replace').read() for f in files if f.endswith(('.py', '.md')))
    assert not any(course.BEGIN.match(line) for line in everything.split('\n'))
    # every public test fails on the stub, with its message
    code, summary, stdout = check(out, n)
    assert code != 0 and re.search(r'\d+ failed', summary) and 'passed' not in summary, stdout[-3000:]
    assert f'NotImplementedError: assignment {n}:' in stdout
    # the solution of n alone (the later ones still stubs): every public test passes
    put_back(out, n)
    code, summary, stdout = check(out, n)
    assert code == 0 and 'failed' not in summary, stdout[-3000:]


def test_release_stubs_all_five(tmp_path):
    assert course.main(['release', str(tmp_path / 'release')]) == 0
    for n in course.ASSIGNMENTS:
        for f in course.files_of(n):
            assert f'raise NotImplementedError("assignment {n}:' in open(tmp_path / 'release' / f).read()


def make_class(handouts, tmp_path, n, students):
    """A class folder: students = {name: mistakes (None: the stub, unsolved) or {file: region bodies}},
    each a copy of handout n."""
    import shutil
    root = tmp_path / f'class{n}'
    for name, mistakes in students.items():
        shutil.copytree(handouts / f'h{n}', root / name)
        if isinstance(mistakes, dict):
            put_back(str(root / name), n, bodies_of=mistakes)
        elif mistakes is not None:
            put_back(str(root / name), n, mistakes)
    return root


def concepts_of(n):
    return course_grader.concepts(n)


@pytest.mark.parametrize('n', sorted(course.ASSIGNMENTS))
def test_a_class_is_graded_by_concepts(handouts, tmp_path, n):
    students = {'solution': [], 'unsolved': None}
    students.update({re.sub(r'\W+', '_', name): mistakes for a, name, mistakes in PLANTED if a == n})
    files = course.files_of(n)
    students.update({'trivial_' + name.replace(' ', '_'): {files[0]: bodies} for name, bodies in TRIVIAL[n].items()})
    most = {re.sub(r'\W+', '_', name) for name in MOST}
    wrong = {re.sub(r'\W+', '_', name) for name in WRONG_FORMULA}
    root = make_class(handouts, tmp_path, n, students)
    grades, gradescope = tmp_path / 'grades', tmp_path / 'gradescope'
    rows = dict(course.grade(n, str(root), out_dir=str(grades), gradescope=str(gradescope), jobs=2))
    total = sum(c.marks for c in concepts_of(n))
    assert rows['solution']['score'] == rows['solution']['total'] == total, rows['solution']['feedback']
    for name, r in rows.items():
        assert r['total'] == total and r['status'] == 'graded', (name, r['feedback'])
        if name.startswith('trivial_') or name == 'unsolved':      # nothing for a non-solution, in any concept
            assert r['score'] == 0 and not any(r['marks'].values()), (name, r['feedback'])
        elif name != 'solution':   # each planted mistake loses marks; the MOST ones more than half
            assert r['score'] < (total / 2 if name in most else total), (name, r['feedback'])
            assert r['score'] <= (total / 3 if name in wrong else total), (name, r['feedback'])
            assert 'hint:' in r['feedback']
    with open(grades / f'gradebook_assignment{n}.csv') as f:
        book = list(csv.DictReader(f))
    assert [b['student'] for b in book] == sorted(students)
    assert all(int(b['total']) == rows[b['student']]['score'] and int(b['max']) == total for b in book)
    for name in students:   # Gradescope: every student's results.json, with the top-level score
        results = json.load(open(gradescope / name / 'results.json'))
        assert results['score'] == rows[name]['score'] and sum(t['max_score'] for t in results['tests']) == total
        assert json.load(open(grades / f'{name}.results.json')) == results


def test_feedback_names_the_concept_and_the_students_line_never_a_hidden_value(handouts, tmp_path):
    n = 5
    root = make_class(handouts, tmp_path, n, {'sd_over_n': [m for a, name, m in PLANTED if name == 'sd over n'][0],
                                              'broken': [], 'raises': []})
    for name, line in (('broken', '    mean = = 0\n'), ('raises', '    mean = {}["no such key"]\n')):
        path = root / name / 'compare.py'
        text = open(path).read()
        marker = '    ### BEGIN YOUR CODE (assignment 5)\n'
        path.write_text(text.replace(marker, marker + line, 1) if name == 'broken' else
                        text.replace('    mean = sum(deltas) / n\n', line, 1))
    rows = dict(course.grade(n, str(root)))
    feedback = rows['sd_over_n']['feedback']
    assert 'FAIL 0/2  the paired table' in feedback and 'sd is not what it should be' in feedback
    said = '\n'.join(line for line in feedback.split('\n') if 'hint:' not in line)
    assert not re.search(r'\d\.\d{3,}', said)             # no expected value, in any form
    broken = rows['broken']['feedback']
    their = open(root / 'broken' / 'compare.py').read().split('\n').index('    mean = = 0') + 1
    assert re.search(rf"SyntaxError: .*your compare.py, line {their}: mean = = 0", broken), broken
    raises = rows['raises']['feedback']
    their = open(root / 'raises' / 'compare.py').read().split('\n').index('    mean = {}["no such key"]') + 1
    assert 'KeyError' in raises and f'your compare.py, line {their}: mean = {{}}["no such key"]' in raises, raises


ATTACKS = {
    # forged results: the worker's own functions replaced, and pytest's reports (the attack on a grader
    # that runs the tests in the process that records them)
    'forger': """    import _pytest.reports, course_worker, sys
    _pytest.reports.TestReport.passed = property(lambda self: True)
    course_worker.run_probe = lambda *a: ({}, {'stats': {}})
    sys.modules['course_worker'].PROBES.clear()
    mean, sd, half, wins = 0.0, 0.0, 0.0, 0
""",
    # files written outside its folder: the instructor's project, the output folder, every /tmp it can see
    'writer': """    import os
    for d in (%(here)r, %(out)r, %(class)r, '/tmp', os.path.expanduser('~')):
        try:
            open(os.path.join(d, 'pwned.txt'), 'w').write('6/6')
        except OSError:
            pass
    mean, sd, half, wins = 0.0, 0.0, 0.0, 0
""",
    # another student's files, found through the grader's processes
    'prowler': """    import os, glob
    for cwd in glob.glob('/proc/*/cwd'):
        for f in glob.glob(os.path.join(cwd, '**', 'compare.py'), recursive=True):
            try:
                open(f, 'w').write('PWNED = 1\\n')
            except OSError:
                pass
    for f in glob.glob(%(class)r + '/*/compare.py'):
        try:
            open(f, 'w').write('PWNED = 1\\n')
        except OSError:
            pass
    mean, sd, half, wins = 0.0, 0.0, 0.0, 0
""",
    # a process that outlives grading and rewrites its row later
    'lingerer': """    import subprocess, sys
    code = "import time, os\\ntime.sleep(4)\\nopen(%(out)r + '/lingerer.results.json', 'w').write('{\\"score\\": 6}')"
    try:
        subprocess.Popen([sys.executable, '-c', code, 'rdattnres-lingerer'], start_new_session=True)
    except OSError:
        pass
    mean, sd, half, wins = 0.0, 0.0, 0.0, 0
""",
    # the hidden checks read or imported, their files searched for
    'reader': """    import glob, os
    found = [f for f in (%(here)r + '/course_grader.py', %(here)r + '/test_hidden.py') if os.path.exists(f)]
    found += [f for f in glob.glob('/grade/**', recursive=True) + glob.glob('/tmp/**', recursive=True)
              if 'hidden' in f or 'grader' in f or 'test_course' in f]
    try:
        import test_hidden
        found.append('import')
    except ImportError:
        pass
    raise RuntimeError('found: ' + repr(found))
""",
    'fork_bomb': """    import os
    for _ in range(10000):
        try:
            if os.fork() == 0:
                import time
                time.sleep(30)
                os._exit(0)
        except OSError:
            break
    mean, sd, half, wins = 0.0, 0.0, 0.0, 0
""",
    'hog': """    blocks = [bytearray(2 ** 30) for _ in range(64)]
    mean, sd, half, wins = 0.0, 0.0, 0.0, 0
""",
    'loop': """    while True:
        pass
""",
}


def lingering(marker):
    found = []
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            if marker in open(f'/proc/{pid}/cmdline', 'rb').read().decode(errors='replace'):
                found.append(pid)
        except OSError:
            pass
    return found


def test_attacks_earn_what_their_code_earns_and_the_class_is_unchanged(handouts, tmp_path):
    n = 5
    out = tmp_path / 'grades'
    out.mkdir()
    classroom = tmp_path / f'class{n}'
    students = {name: None for name in ATTACKS}
    students.update({'good': [], 'zz_victim': []})
    # right code that ends its process, or loops, with one pair: the sandbox shared by the concepts ends at
    # that concept, the concepts after it run again in a new one, so only the one-pair concept is lost
    one_pair = '    mean = sum(deltas) / n\n'
    students.update({'exits_with_one_pair': [('compare.py', one_pair, "    if n == 1: __import__('os')._exit(3)\n" + one_pair)],
                     'loops_with_one_pair': [('compare.py', one_pair, '    while n == 1: pass\n' + one_pair)]})
    root = make_class(handouts, tmp_path, n, students)
    for name, code in ATTACKS.items():
        path = root / name / 'compare.py'
        text = open(path).read().split('\n')
        begins = [i for i, line in enumerate(text) if line.strip() == '### BEGIN YOUR CODE (assignment 5)']
        ends = [i for i, line in enumerate(text) if line.strip() == '### END YOUR CODE (assignment 5)']
        first, last = begins[1], ends[1]          # paired_stats' region (the first is sign_test_p's)
        body = (code % {'here': HERE, 'out': str(out), 'class': str(classroom)}).rstrip('\n').split('\n')
        text[first + 1:last] = body
        path.write_text('\n'.join(text))
    before = {f: os.path.getmtime(os.path.join(HERE, f)) for f in course.project_files()}
    rows = dict(course.grade(n, str(root), out_dir=str(out), limit=6, jobs=2))
    total = sum(c.marks for c in concepts_of(n))
    for name in ATTACKS:
        assert rows[name]['score'] == 0 and rows[name]['total'] == total, (name, rows[name]['feedback'])
    assert rows['good']['score'] == rows['zz_victim']['score'] == total, rows['zz_victim']['feedback']
    one_pair = {c.name: c.marks for c in concepts_of(n)}['one pair (n = 1)']
    for name in ('exits_with_one_pair', 'loops_with_one_pair'):
        assert rows[name]['marks']['one pair (n = 1)'] == 0, rows[name]['feedback']
        assert rows[name]['score'] == total - one_pair, rows[name]['feedback']
    assert rows['loops_with_one_pair']['status'] == 'timed out' and rows['exits_with_one_pair']['status'] == 'graded'
    assert 'did not finish' in rows['loop']['feedback'] and rows['loop']['status'] == 'timed out'
    assert 'found: []' in rows['reader']['feedback'], rows['reader']['feedback']
    time.sleep(6)   # longer than the lingerer would have waited
    assert not lingering('rdattnres-lingerer')
    assert json.load(open(out / 'lingerer.results.json'))['score'] == 0
    with open(out / f'gradebook_assignment{n}.csv') as f:
        book = {b['student']: int(b['total']) for b in csv.DictReader(f)}
    assert book == {name: r['score'] for name, r in rows.items()}
    assert not os.path.exists(os.path.join(HERE, 'pwned.txt')) and not (out / 'pwned.txt').exists()
    assert not (classroom / 'pwned.txt').exists() and not os.path.exists('/tmp/pwned.txt')
    assert before == {f: os.path.getmtime(os.path.join(HERE, f)) for f in course.project_files()}
    assert 'PWNED' not in (root / 'zz_victim' / 'compare.py').read_text()


def test_without_a_sandbox_grading_refuses_unless_trusted(handouts, tmp_path, monkeypatch):
    root = make_class(handouts, tmp_path, 5, {'good': []})
    monkeypatch.setattr(course_grader.shutil, 'which', lambda name: None)
    with pytest.raises(SystemExit, match='apt-get install bubblewrap'):
        course.grade(5, str(root))
    rows = dict(course.grade(5, str(root), trusted=True))
    assert rows['good']['score'] == rows['good']['total']


def test_grading_holds_on_a_busy_machine(handouts, tmp_path):
    # the limits are CPU time, not wall time: an honest class graded while every core is busy
    root = make_class(handouts, tmp_path, 5, {'good': []})
    burners = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(2 * (os.cpu_count() or 2))]
    try:
        rows = dict(course.grade(5, str(root), limit=20))
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert rows['good']['score'] == rows['good']['total'], rows['good']['feedback']


STUBBED = {1: [('model', None, 'depth_read')], 2: [('model', 'DepthRead', 'forward'), ('model', 'Block', 'attn_inputs')],
           3: [('model', 'GPT', 'forward_depth_routed')], 4: [('common', None, 'step_windows')],
           5: [('compare', None, 'sign_test_p'), ('compare', None, 'paired_stats')]}


def test_no_function_in_a_handout_passes_the_assignment_it_stubs(handouts, monkeypatch):
    # every function of a handout's Python files, put in place of one function it stubs (same number of
    # parameters; the assignment's other functions stubbed as in the handout), must fail every concept:
    # the release ships no other way to an answer
    import ast
    import importlib
    import inspect
    import textwrap
    import torch

    def stubbed(*args, **kwargs):
        raise NotImplementedError("a stub")

    def passes(concept, targets):
        for description, probe, args, inputs, compare, reference in concept.probes:
            try:
                with monkeypatch.context() as m:
                    for owner, name, fn in targets:
                        m.setattr(owner, name, fn)
                    with torch.random.fork_rng():
                        got = course_worker.run_probe(probe, args, inputs)
            except (Exception, SystemExit):
                return False
            with torch.random.fork_rng():
                ref = course_worker.run_probe(probe, *(reference or (args, inputs)))
            if compare(got, ref):
                return False
        return True

    for n in course.ASSIGNMENTS:
        folder = handouts / f'h{n}'
        candidates = []
        for f in course.handout_files():
            if f.endswith('.py'):
                source = open(folder / f).read()
                candidates += [(f, node.name, textwrap.dedent(ast.get_source_segment(source, node)))
                               for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)]
        owners = [(getattr(importlib.import_module(m), cls) if cls else importlib.import_module(m), name)
                  for m, cls, name in STUBBED[n]]
        tried = 0
        for i, (owner, name) in enumerate(owners):
            module = importlib.import_module(STUBBED[n][i][0])
            arity = len(inspect.signature(getattr(owner, name)).parameters)
            for f, fname, source in candidates:
                scope = dict(vars(module))
                try:
                    exec(compile(source, f, 'exec'), scope)
                    fn = scope[fname]
                    if len(inspect.signature(fn).parameters) != arity:
                        continue
                except (Exception, SystemExit):
                    continue
                tried += 1
                targets = [(o, nm, fn if j == i else stubbed) for j, (o, nm) in enumerate(owners)]
                for concept in concepts_of(n):
                    assert not passes(concept, targets), \
                        f"{f}:{fname} in place of {name} passes assignment {n}'s '{concept.name}'"
        assert tried > 0


def test_a_cut_or_garbled_answer_stream_keeps_only_the_whole_answers():
    import torch
    frames = [course_worker.frame({'0/h': torch.ones(3)}, {'results': [{'ok': True}]}),
              course_worker.frame({}, {'results': [{'ok': False, 'error': 'E'}]})]
    stream = b''.join(frames)
    assert [meta for _, meta in course_worker.read_answers(stream)] == [{'results': [{'ok': True}]},
                                                                        {'results': [{'ok': False, 'error': 'E'}]}]
    cut = course_worker.read_answers(stream[:-5])          # the process ended while writing the second
    assert len(cut) == 1 and torch.equal(cut[0][0]['0/h'], torch.ones(3))
    for bad in (b'', b'\x00' * 3, (2 ** 60).to_bytes(8, 'little') + b'x', b'\xff' * 64):
        assert course_worker.read_answers(bad) == []
    garbled = frames[0] + frames[1][:8] + b'{' * (len(frames[1]) - 8)
    assert len(course_worker.read_answers(garbled)) == 1
    concept = course_grader.concepts(5)[0]                 # answers that are not one result per probe
    assert course_grader.judge(concept, ({}, {'results': 'all passed'}), 0) == \
        (False, ["the code's answers could not be read"])


def test_help_exits_zero():
    p = subprocess.run([sys.executable, os.path.join(HERE, 'course.py'), '--help'], capture_output=True, text=True)
    assert p.returncode == 0 and 'grade' in p.stdout
