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
import pathlib
import re
import subprocess
import sys
import time

import pytest

import course
from course_kit import grader as course_grader
from course_kit import worker as course_worker

HERE = course.HERE

# Planted mistakes, each a case a student would make: (assignment, name, [(file, right text, wrong text)], the
# concepts it loses). The concepts are named by their names' first part (short()): a mistake loses exactly
# the marks of the concepts it breaks, the ones the student's own check reports failed
# (test_course_check.py), and keeps the others, since each concept's probe isolates what it names.
# Trivial non-solutions, each the whole body of every region of the assignment (in file order): they must
# score 0 in every concept.
TRIVIAL = {
    1: {'uniform': [['    h = torch.stack([sum(b for b, _ in sources) / len(sources)] * len(w))',
                     '    alpha = torch.full((len(w), *b0.shape[:2], len(sources)), 1 / len(sources), dtype=b0.dtype)']],
        'zeros': [['    h = torch.zeros(len(w), *b0.shape, dtype=b0.dtype)',
                   '    alpha = torch.zeros(len(w), *b0.shape[:2], len(sources), dtype=b0.dtype)']],
        'identity': [['    h = b0.expand(len(w), *b0.shape)',
                      '    alpha = torch.zeros(len(w), *b0.shape[:2], len(sources), dtype=b0.dtype)',
                      '    alpha[..., 0] = 1']]},
    2: {'zeros': [['        return torch.zeros(len(self.routes), self.source_gain.numel(), dtype=self.source_gain.dtype)'],
                  ['        return torch.zeros_like(h[0]), torch.zeros_like(h[0])']],
        'identity': [['        return torch.stack([self.source_gain * 0 for _ in self.routes])'], ['        return h[0], h[-1]']],
        'constant': [['        return torch.stack([self.source_gain * 0 + 1 for _ in self.routes])'],
                     ['        return h[0] * 0 + 1, h[-1] * 0 + 1']]},
    3: {'identity': [['        h = embedding']], 'zeros': [['        h = embedding * 0']],
        'uniform': [['        h = self.final_read([source(embedding)], log)[0]']]},
    4: {'range': [['    out = list(range(windows_per_step))']], 'constant': [['    out = [0] * windows_per_step']],
        'one permutation': [['    out = window_order(n_windows, seed, 0)[:windows_per_step].tolist()']]},
    5: {'zeros': [['    p = 0.0'], ['    mean, sd, half, wins, ties, p = 0.0, 0.0, 0.0, 0, 0, 0.0']],
        'constant': [['    p = 1.0'], ['    mean, sd, half, wins, ties, p = 1.0, 1.0, 1.0, 1, 1, 1.0']],
        'first value': [['    p = 0.5'], ["    mean, sd, half, wins, ties, p = deltas[0], float('nan'), float('nan'), 0, 0, 0.5"]]},
}
EQUATIONS, SPECIFIED = "the read's equations", "the read as specified"
QUERIES, INPUTS = "one pseudo-query per route", "the attention inputs"
INCREMENTS, READS, LEARNS = ("sources are increments", "every read point reads its sources and is recorded",
                             "every pseudo-query learns")
ORDER, ANYWHERE = "the exact order", "the same order on any number of processes"
TABLE, OTHER, ONE_PAIR = "the paired table", "the statistics on other values", "one pair (n = 1)"
PLANTED = [
    (1, 'scaled by 1/sqrt(d)', [('model.py', '(b * w_r).sum(-1) for w_r in w',
                                  '(b * w_r).sum(-1) / math.sqrt(b.size(-1)) for w_r in w')], {EQUATIONS}),
    (1, 'scores by matmul', [('model.py', 'torch.stack([(b * w_r).sum(-1) for w_r in w])',
                               '(b @ w.T).permute(2, 0, 1)')], {SPECIFIED}),
    (1, 'sources scored unnormalised', [('model.py', 'for w_r in w]) * inv_rms[..., 0]', 'for w_r in w])')],
     {EQUATIONS}),
    (2, 'v read from the qk route', [('model.py', 'return x[0], x[-1]', 'return x[0], x[0]')], {INPUTS}),
    (2, 'v through norm_mlp', [('model.py', 'return x[0], x[-1]', 'return x[0], self.norm_mlp(h[-1])')], {INPUTS}),
    (2, 'routes de-duplicated by pseudo-query name',
     [('model.py', 'for name in self.routes.values()]', 'for name in dict.fromkeys(self.routes.values())]')], {QUERIES}),
    (2, 'source gain left out', [('model.py', 'for name in self.routes.values()]) * self.source_gain',
                               'for name in self.routes.values()])')], {QUERIES}),
    (3, 'running sums instead of increments', [('model.py', '                finished.append(partial)\n',
                                                '                finished.append(source(finished[-1][0] + partial[0]))\n')],
     {INCREMENTS}),
    (3, 'the embedding folded into the first block', [('model.py', 'finished = [source(embedding)]', 'finished = []'),
                                                      ('model.py', 'partial = None                  #',
                                                       'partial = source(embedding)     #')], {INCREMENTS, READS}),
    (3, 'the last, shorter block left out of the final read',
     [('model.py', '        if partial is not None:         # the last AttnRes block may be shorter than S\n'
                   '            finished.append(partial)\n', '')], {INCREMENTS, READS, LEARNS}),
    (3, 'sources cut from the graph', [('model.py', '                finished.append(partial)\n',
                                        '                finished.append(source(partial[0].detach()))\n')], {LEARNS}),
    (3, 'the log not passed to the reads', [('model.py', 'self.read_point(l)(sources, log)', 'self.read_point(l)(sources)')],
     {READS}),
    (4, 'the same permutation every epoch', [('train.py', 'window_order(n_windows, seed, epoch)[offset',
                                              'window_order(n_windows, seed, 0)[offset')], {ORDER}),
    (4, "one rank's share", [('train.py', '.tolist())\n', ".tolist())\n    env = __import__('os').environ\n"
                                                          "    out = out[int(env.get('RANK', 0))::int(env.get('WORLD_SIZE', 1))]\n")],
     {ANYWHERE}),
    (4, 'steps wrap within their epoch', [('train.py', 'epoch, offset = divmod(first + len(out), n_windows)',
                                           'epoch, offset = first // n_windows, (first + len(out)) % n_windows')], {ORDER}),
    (5, 'sd over n', [('compare.py', '/ (n - 1)) if n > 1', '/ n) if n > 1')], {TABLE, OTHER}),
    (5, 'crashes with one pair', [('compare.py', "/ (n - 1)) if n > 1 else float('nan')", '/ (n - 1))'),
                                  ('compare.py', "math.sqrt(n) if n > 1 else float('nan')", 'math.sqrt(n)')], {ONE_PAIR}),
    (5, 'one-sided sign test', [('compare.py', 'p = min(1.0, 2 * sum(', 'p = min(1.0, sum(')], {TABLE, OTHER, ONE_PAIR}),
    (5, 'a tie counted as a loss', [('compare.py', 'p = sign_test_p(wins, n - ties)', 'p = sign_test_p(wins, n)')], {OTHER}),
]


def short(concept_name):
    """A concept's name as the planted-mistake table names it: its first part."""
    return concept_name.split(':')[0].split(',')[0]


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
    """The lines of assignment n's solution in a file, and of the code given with it (WITH SOLUTION n)."""
    text = open(path).read()
    lines = text.split('\n')
    spans = course.regions(text) + course.regions(text, course.WITH_BEGIN, course.WITH_END)
    return [lines[i].strip() for a, first, last in spans if a == n
            for i in range(first + 1, last) if lines[i].strip() and not lines[i].strip().startswith('#')]


def check(folder, n):
    p = subprocess.run([sys.executable, 'course.py', 'check', str(n)], cwd=folder, capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, OMP_NUM_THREADS='1'))
    return p.returncode, p.stdout.strip().splitlines()[-1], p.stdout


def searchable_by_everyone(path, opened):
    """Every folder above path made searchable by every user (o+x: its entries can be reached by name, not
    listed), each one changed noted in `opened` as (folder, mode) to be closed again."""
    path = os.path.abspath(path)
    while path != '/':
        path = os.path.dirname(path)
        mode = os.stat(path).st_mode
        if not mode & 0o001:
            os.chmod(path, mode | 0o001)
            opened.append((path, mode))


@pytest.fixture
def reachable():
    """This Python (the venv's and the interpreter behind it) and its packages reachable by every user for the
    test's duration, and a folder of the test's own that every user can reach, which it returns: an instructor's
    laptop and Gradescope's image have them so, but a venv in a checkout under root's home or a `mktemp -d`
    folder (0700) must be opened to be searched; it is closed after, whether the test passed or not. The folder
    is made in the machine's temporary folder, not under pytest's (which every pytest session that starts makes
    0700 again, under a grading in progress). The project's own files are not opened: a test that runs them as
    another user runs a copy of them there (kit_copy)."""
    import shutil
    import tempfile
    opened = []
    shared = tempfile.mkdtemp(prefix='rd-attnres-test-')
    os.chmod(shared, 0o777)
    if os.geteuid() == 0:
        folders = course_grader.python_paths()
        for path in (sys.executable, os.path.realpath(sys.executable), *(os.path.join(f, 'x') for f in folders),
                     os.path.join(shared, 'x')):
            searchable_by_everyone(path, opened)
    try:
        yield pathlib.Path(shared)
    finally:
        for path, mode in reversed(opened):
            os.chmod(path, mode)
        shutil.rmtree(shared, ignore_errors=True)


def kit_copy(folder):
    """What grading needs (course.AUTOGRADER_FILES: course.py, the grader, its worker and the instructor's
    reference) copied into folder, readable by every user: another account runs this copy, never the checkout,
    which may lie in a folder only its owner can enter."""
    import shutil
    for f in course.AUTOGRADER_FILES:
        os.makedirs(os.path.join(folder, os.path.dirname(f)), exist_ok=True)
        shutil.copyfile(os.path.join(HERE, f), os.path.join(folder, f))
    return folder


@pytest.fixture(scope='module')
def handouts(tmp_path_factory):
    root = tmp_path_factory.mktemp('handouts')
    for n in course.ASSIGNMENTS:
        course.handout(n, str(root / f'h{n}'))
    return root


@pytest.mark.slow
@pytest.mark.parametrize('n', sorted(course.ASSIGNMENTS))
def test_handout_stubs_this_and_every_later_assignment(handouts, tmp_path, n):
    import shutil
    out = str(shutil.copytree(handouts / f'h{n}', tmp_path / f'h{n}'))   # (the handouts are shared)
    files = {os.path.relpath(os.path.join(d, f), out) for d, _, names in os.walk(out) for f in names}
    for later in range(n, max(course.ASSIGNMENTS) + 1):
        for f in course.files_of(later):
            text = open(os.path.join(out, f)).read()
            assert f"raise NotImplementedError({course.not_written(later)!r})" in text
        for f in files:   # no line of its solution anywhere, nor of the code given with it
            if f.endswith('.py') and os.path.exists(os.path.join(HERE, f)):
                text = open(os.path.join(out, f)).read()
                assert not any(line in text for line in solution_lines(later, os.path.join(HERE, f)) if len(line) > 25), f
    for earlier in range(1, n):   # the course goes in order: the earlier ones are given
        for f in course.files_of(earlier):
            assert solution_lines(earlier, os.path.join(HERE, f))[0] in open(os.path.join(out, f)).read()
    assert files == set(course.handout_files())                       # the list, nothing else
    assert not any(f.startswith(course.INSTRUCTOR_ONLY) for f in files) and 'tests/test_model.py' not in files
    assert not any(f.startswith(('results/', 'study/')) for f in files)
    everything = ''.join(open(os.path.join(out, f), errors='replace').read() for f in files if f.endswith(('.py', '.md')))
    assert not any(course.BEGIN.match(line) or course.WITH_BEGIN.match(line) for line in everything.split('\n'))
    assert 'For instructors' not in open(os.path.join(out, 'COURSE.md')).read()
    # every public test fails on the stub, with its message
    code, summary, stdout = check(out, n)
    assert code != 0 and re.search(r'\d+ failed', summary) and 'passed' not in summary, stdout[-3000:]
    assert f'NotImplementedError: assignment {n}:' in stdout
    # the solution of n alone (the later ones still stubs): every public test passes
    put_back(out, n)
    code, summary, stdout = check(out, n)
    assert code == 0 and 'failed' not in summary, stdout[-3000:]


@pytest.mark.slow
def test_a_finished_assignment_leaves_only_the_later_assignments_stubs(handouts, tmp_path):
    # every stub a handout holds is a marked one of its assignment or a later one (listed in COURSE.md, graded):
    # once the student's lines are in, the only code that raises "not written" is a later assignment's, between
    # its markers; the code given with a solution (the two-phase read) is whole in every handout, made of the
    # student's own functions where the solution is not given yet
    import ast
    import shutil
    for n in course.ASSIGNMENTS:
        out = shutil.copytree(handouts / f'h{n}', tmp_path / f'h{n}')
        put_back(str(out), n)
        for f in course.handout_files():
            if not f.endswith('.py'):
                continue
            text = (out / f).read_text()
            assert not any(course.HANDOUT_LINE.match(line) for line in text.split('\n')), f
            lines = text.split('\n')
            marked = {i for a, first, last in course.regions(text, course.ANSWER_BEGIN, course.ANSWER_END)
                      if a > n for i in range(first, last + 1)}
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.Raise) and 'NotImplementedError' in ast.get_source_segment(text, node):
                    assert node.lineno - 1 in marked, f"handout {n}, {f}, line {node.lineno}: {lines[node.lineno - 1]}"


@pytest.mark.slow
@pytest.mark.parametrize('n', [1, 3])
def test_a_finished_assignment_passes_the_two_phase_reads_tests(handouts, tmp_path, n):
    # the tests of the code given with assignments 1 and 3 (the two-phase read), in the handout of n with the
    # student's lines in: each passes, is skipped because the handout holds no two-phase computation (its
    # TwoPhaseGPT is the plain read, the student's own), or fails with a later assignment's stub message. (The
    # rest of a handout's suite: its assignment's tests, test_handout_stubs_this_and_every_later_assignment.)
    import shutil
    out = shutil.copytree(handouts / f'h{n}', tmp_path / f'h{n}')
    put_back(str(out), n)
    p = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-rfs', '--tb=line',
                        'test_model.py', 'tests/test_compiled_read.py', '-k', 'two_phase or compiled'],
                       cwd=out, capture_output=True, text=True, timeout=900, env=dict(os.environ, OMP_NUM_THREADS='1'))
    summary = p.stdout.strip().split('\n')[-1]
    assert 'error' not in summary and re.search(r'\d+ (passed|failed)', summary), p.stdout[-3000:]
    failed = [line for line in p.stdout.split('\n') if re.match(r'^\S+\.py:\d+: ', line)]   # (--tb=line: one a failure)
    count = re.search(r'(\d+) failed', summary)
    assert len(failed) == (int(count.group(1)) if count else 0), p.stdout[-3000:]
    later = [f'NotImplementedError: assignment {a}: not written yet' for a in course.ASSIGNMENTS if a > n]
    assert all(any(x in line for x in later) for line in failed), failed
    assert all("comes with assignment 3's solution" in line for line in p.stdout.split('\n') if line.startswith('SKIPPED'))
    if n == 3:   # (handout 1: TwoPhaseGPT is the plain read, which is assignment 3's, still a stub there)
        assert not failed and 'passed' in summary and 'skipped' in summary, p.stdout[-3000:]


@pytest.mark.slow
def test_release_stubs_all_five(tmp_path):
    assert course.main(['release', str(tmp_path / 'release')]) == 0
    for n in course.ASSIGNMENTS:
        for f in course.files_of(n):
            assert f"raise NotImplementedError({course.not_written(n)!r})" in open(tmp_path / 'release' / f).read()


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


@pytest.mark.slow
@pytest.mark.parametrize('n', sorted(course.ASSIGNMENTS))
def test_a_class_is_graded_by_concepts(handouts, tmp_path, n):
    students = {'solution': [], 'unsolved': None}
    students.update({re.sub(r'\W+', '_', name): mistakes for a, name, mistakes, _ in PLANTED if a == n})
    loses = {re.sub(r'\W+', '_', name): lost for a, name, _, lost in PLANTED if a == n}
    files = course.files_of(n)
    students.update({'trivial_' + name.replace(' ', '_'): {files[0]: bodies} for name, bodies in TRIVIAL[n].items()})
    root = make_class(handouts, tmp_path, n, students)
    grades, gradescope = tmp_path / 'grades', tmp_path / 'gradescope'
    rows = dict(course.grade(n, str(root), out_dir=str(grades), gradescope=str(gradescope), jobs=2))
    total = sum(c.marks for c in concepts_of(n))
    assert rows['solution']['score'] == rows['solution']['total'] == total, rows['solution']['feedback']
    for name, r in rows.items():
        assert r['total'] == total and r['status'] == 'graded', (name, r['feedback'])
        lost = {short(c.name) for c in concepts_of(n) if r['marks'][c.name] == 0}
        assert all(r['marks'][c.name] in (0, c.marks) for c in concepts_of(n))
        if name.startswith('trivial_') or name == 'unsolved':      # nothing for a non-solution, in any concept
            assert r['score'] == 0 and not any(r['marks'].values()), (name, r['feedback'])
        elif name != 'solution':   # each planted mistake loses exactly the concepts the table names
            assert lost == loses[name], (name, r['feedback'])
            assert all(short(c) in {short(x.name) for x in concepts_of(n)} for c in loses[name])
            assert 'hint:' in r['feedback']
    with open(grades / f'gradebook_assignment{n}.csv') as f:
        book = list(csv.DictReader(f))
    assert [b['student'] for b in book] == sorted(students)
    assert all(int(b['total']) == rows[b['student']]['score'] and int(b['max']) == total for b in book)
    for name in students:   # Gradescope: every student's results.json, with the top-level score
        results = json.load(open(gradescope / name / 'results.json'))
        assert results['score'] == rows[name]['score'] and sum(t['max_score'] for t in results['tests']) == total
        assert json.load(open(grades / f'{name}.results.json')) == results


@pytest.mark.slow
def test_feedback_names_the_concept_and_the_students_line_never_a_hidden_value(handouts, tmp_path):
    n = 5
    root = make_class(handouts, tmp_path, n, {'sd_over_n': [m for a, name, m, _ in PLANTED if name == 'sd over n'][0],
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
    assert re.search(rf"SyntaxError: .*your compare.py, line {their}: \[from the submission: mean = = 0\]", broken), broken
    raises = rows['raises']['feedback']
    their = open(root / 'raises' / 'compare.py').read().split('\n').index('    mean = {}["no such key"]') + 1
    assert 'KeyError' in raises and f'your compare.py, line {their}: [from the submission: mean = {{}}["no such key"]]' in raises, raises


ATTACKS = {
    # forged results: the worker's own functions replaced, and pytest's reports (the attack on a grader
    # that runs the tests in the process that records them)
    'forger': """    import _pytest.reports, course_worker, sys
    _pytest.reports.TestReport.passed = property(lambda self: True)
    course_worker.run_probe = lambda *a: ({}, {'stats': {}})
    sys.modules['course_worker'].PROBES.clear()
    mean, sd, half, wins, ties, p = 0.0, 0.0, 0.0, 0, 0, 1.0
""",
    # files written outside its folder: the instructor's project, the output folder, every /tmp it can see
    'writer': """    import os
    for d in (%(here)r, %(out)r, %(class)r, '/tmp', os.path.expanduser('~')):
        try:
            open(os.path.join(d, 'pwned.txt'), 'w').write('6/6')
        except OSError:
            pass
    mean, sd, half, wins, ties, p = 0.0, 0.0, 0.0, 0, 0, 1.0
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
    mean, sd, half, wins, ties, p = 0.0, 0.0, 0.0, 0, 0, 1.0
""",
    # a process that outlives grading and rewrites its row later
    'lingerer': """    import subprocess, sys
    code = "import time, os\\ntime.sleep(4)\\nopen(%(out)r + '/lingerer.results.json', 'w').write('{\\"score\\": 6}')"
    try:
        subprocess.Popen([sys.executable, '-c', code, 'rdattnres-lingerer'], start_new_session=True)
    except OSError:
        pass
    mean, sd, half, wins, ties, p = 0.0, 0.0, 0.0, 0, 0, 1.0
""",
    # the hidden checks read or imported, their files searched for (by name: a package's file whose name
    # merely contains 'grader', such as torch's upgrader_models under a venv in /tmp, is not one of them)
    'reader': """    import glob, os
    found = [f for f in (%(here)r + '/course_kit/grader.py', %(here)r + '/tests/test_hidden.py') if os.path.exists(f)]
    found += [f for f in glob.glob('/grade/**', recursive=True) + glob.glob('/tmp/**', recursive=True)
              if f.endswith(('course_kit/grader.py', 'test_hidden.py', 'test_course.py'))]
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
    mean, sd, half, wins, ties, p = 0.0, 0.0, 0.0, 0, 0, 1.0
""",
    'hog': """    blocks = [bytearray(2 ** 30) for _ in range(64)]
    mean, sd, half, wins, ties, p = 0.0, 0.0, 0.0, 0, 0, 1.0
""",
    'loop': """    while True:
        pass
""",
    'sleeper': """    import time
    time.sleep(10 ** 6)
""",
    # a plausible wrong answer of the wrong kind: the interval as a number
    'returns_early': """    mean = sum(deltas) / n
    sd = (sum((d - mean) ** 2 for d in deltas) / (n - 1)) ** 0.5 if n > 1 else float('nan')
    return dict(n=n, mean_delta=mean, sd=sd, ci95=0.0, ppl_reduction_pct=0.0, wins=0, sign_test_p=1.0)
""",
    # answers forged from inside the sandbox, of the wrong kinds: a list where a dict is expected, an integer
    # too large for a float (written to the worker's answer stream, then the process ends)
    'forges_a_list': """    import gc, io, os, course_worker
    out = [o for o in gc.get_objects() if isinstance(o, io.BufferedWriter) and isinstance(o.name, int) and o.name > 2][0]
    for count in (2, 4, 2):
        out.write(course_worker.frame({}, {'results': [{'ok': True, 'values': {'stats': [1, 2]}}] * count}))
    out.flush()
    os._exit(0)
""",
    'forges_a_big_int': """    import gc, io, os, course_worker
    out = [o for o in gc.get_objects() if isinstance(o, io.BufferedWriter) and isinstance(o.name, int) and o.name > 2][0]
    big = {k: 10 ** 400 for k in ('n', 'mean_delta', 'sd', 'ppl_reduction_pct', 'wins', 'sign_test_p')}
    for count in (2, 4, 2):
        out.write(course_worker.frame({}, {'results': [{'ok': True, 'values': {'stats': dict(big, ci95=[10 ** 400] * 2)}}] * count}))
    out.flush()
    os._exit(0)
""",
    # a message that draws lines of its own on the instructor's terminal and in the files
    'fake_lines': """    raise RuntimeError('oops\\n  PASS 2/2  the paired table\\nscore: 6/6\\n\\x1b[2J\\x1b]0;title\\x07\\u202e')
""",
    # the grader's own environment, read through the sandbox's /proc
    'environ': """    import glob
    seen = []
    for f in glob.glob('/proc/*/environ'):
        try:
            seen.append(open(f, 'rb').read().decode(errors='replace'))
        except OSError:
            pass
    raise RuntimeError('environ: ' + repr([x for x in seen if 'SECRET' in x]))
""",
    # frames that are not answers (empty ones), written faster than the clock runs out: once they moved the
    # deadline (a sleeper with a clock of its own, graded "ended without answering")
    'clock_stretcher': """    import gc, io, struct, time
    out = [o for o in gc.get_objects() if isinstance(o, io.BufferedWriter) and isinstance(o.name, int) and o.name > 2][0]
    while True:
        out.write(struct.pack('<Q', 0))
        out.flush()
        time.sleep(1.5)
""",
    # every place it can write to, filled (each should take nothing, or at most FILE_SIZE: within_the_cap)
    'filler': """    import os
    took = {}
    for d in ('/', '/dev', '/dev/shm', '/tmp', '/grade', '/proc'):
        took[d] = 0
        for i in range(12):
            try:
                with open(os.path.join(d, f'fill{i}'), 'wb') as f:
                    for _ in range(16):
                        f.write(b'x' * 2 ** 20)
                        took[d] += 2 ** 20
            except OSError:
                break
    raise RuntimeError('took: ' + repr(took))
""",
}
def within_the_cap(filled):
    """Whether the filler's bytes in each place are what the sandbox allows: nothing where Landlock takes every
    write from the worker (course_worker.no_writes), else at most FILE_SIZE (bubblewrap's tmpfs), some in /tmp."""
    if course_worker.landlock_abi():
        return set(filled) >= {'/tmp', '/dev/shm'} and sum(filled.values()) == 0
    return filled['/tmp'] > 0 and all(v <= course_grader.FILE_SIZE for v in filled.values())


# Attacks by files and names: what each student's folder is
FILE_ATTACKS = ('link_to_victim', 'link_to_shadow', 'link_to_zero', 'fifo', 'a_folder', 'huge', 'folder_link')


LOOKALIKE_NAMES = ('Kim', '\u212aim', '\u00c5sa', '\u212bsa', 'victim', 'v\u0456\u0441tim', 'Victim')


def lingering(marker):
    found = []
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            if marker in open(f'/proc/{pid}/cmdline', 'rb').read().decode(errors='replace'):
                found.append(pid)
        except OSError:
            pass
    return found


def gone(found, bound):
    """Whether found() is empty, polled until it is or `bound` seconds pass (an event, not a guess at a delay)."""
    until = time.time() + bound
    while found() and time.time() < until:
        time.sleep(0.1)
    return not found()


def hostile_class(handouts, tmp_path, out, attacks=ATTACKS, file_attacks=FILE_ATTACKS, names=True, links=True,
                  pairs=True, more=None):
    """A class of assignment 5: honest students, a victim, one student per attack by code (in paired_stats'
    region), by files (links, a FIFO, a folder, a huge file, a linked folder) and by names; a plain file and a
    stray project file (sample.py) beside the students; with links, dave's compare.py hard-linked by zz_linker."""
    n = 5
    classroom = tmp_path / f'class{n}'
    students = {name: None for name in attacks}
    students.update({'good': [], 'zz_victim': []})
    if links:
        students.update({'dave': [], 'zz_linker': []})
    students.update({name: [] for name in file_attacks})
    if names:   # names a spreadsheet would run, two that differ only in Unicode normalisation, and look-alikes:
        # the Kelvin sign, the Angstrom sign (NFKC), Cyrillic letters, another case
        students.update({'=1+1': [], '@SUM(1)': [], '-2+3': [], 'caf\u00e9': [], 'cafe\u0301': []})
        students.update({name: [] for name in LOOKALIKE_NAMES})
    # right code that ends its process, or loops, with one pair: the sandbox shared by the concepts ends at
    # that concept, the concepts after it run again in a new one, so only the one-pair concept is lost
    one_pair = '    mean = sum(deltas) / n\n'
    if pairs:
        students.update({'exits_with_one_pair': [('compare.py', one_pair, "    if n == 1: __import__('os')._exit(3)\n" + one_pair)],
                         'loops_with_one_pair': [('compare.py', one_pair, '    while n == 1: pass\n' + one_pair)]})
    root = make_class(handouts, tmp_path, n, students)
    for name, code in attacks.items():
        path = root / name / 'compare.py'
        text = open(path).read().split('\n')
        begins = [i for i, line in enumerate(text) if line.strip() == '### BEGIN YOUR CODE (assignment 5)']
        ends = [i for i, line in enumerate(text) if line.strip() == '### END YOUR CODE (assignment 5)']
        first, last = begins[1], ends[1]          # paired_stats' region (the first is sign_test_p's)
        body = (code % {'here': HERE, 'out': str(out), 'class': str(classroom), **(more or {})}).rstrip('\n').split('\n')
        text[first + 1:last] = body
        path.write_text('\n'.join(text))
    for name in file_attacks:
        path = root / name / 'compare.py'
        if name == 'folder_link':
            import shutil
            shutil.rmtree(root / name)
            os.symlink('zz_victim', root / name)
            continue
        text = path.read_bytes()
        path.unlink()
        if name.startswith('link_to_'):
            os.symlink({'link_to_victim': '../zz_victim/compare.py', 'link_to_shadow': '/etc/shadow',
                        'link_to_zero': '/dev/zero'}[name], path)
        elif name == 'fifo':
            os.mkfifo(path)
        elif name == 'a_folder':
            path.mkdir()
        elif name == 'huge':   # the solution, then 5 MB of comment (sparse: no disk used)
            with open(path, 'wb') as f:
                f.write(text + b'\n#')
                f.truncate(5 * 2 ** 20)
    if links:   # (ln -f class/dave/compare.py class/zz_linker/compare.py)
        (root / 'zz_linker' / 'compare.py').unlink()
        os.link(root / 'dave' / 'compare.py', root / 'zz_linker' / 'compare.py')
    (root / 'notes.txt').write_text('not a student')
    (root / 'sample.py').write_text('# a stray file named like one of the project\'s\n')
    return root


@pytest.mark.slow
def test_attacks_earn_what_their_code_earns_and_the_class_is_unchanged(handouts, tmp_path, capsys, monkeypatch):
    import ast
    n, limit = 5, 2   # seconds of CPU time per concept (honest code needs a few ms): the loops and sleeps end sooner
    out = tmp_path / 'grades'
    out.mkdir()
    monkeypatch.setenv('COURSE_SECRET', 'hunter2')     # (the grader's environment never reaches the sandbox)
    root = hostile_class(handouts, tmp_path, out)
    classroom = root
    before = project_times()
    capsys.readouterr()
    # Gradescope's files go to a disk that fills up after a few students: what could be written is, the gradebook
    # (on another disk) holds every row, and the run ends with one line that says so
    from run_kit.run_files import atomic_write as real_write
    full, budget = tmp_path / 'full_disk', [20_000]

    def on_a_small_disk(path, data):
        if str(path).startswith(str(full)):
            size = len(data.encode() if isinstance(data, str) else data)
            if size > budget[0]:
                raise OSError(28, 'No space left on device')
            budget[0] -= size
        return real_write(path, data)
    monkeypatch.setattr('run_kit.run_files.atomic_write', on_a_small_disk)
    with pytest.raises(course.NotWritten) as said:
        course.grade(n, str(root), out_dir=str(out), limit=limit, jobs=2, gradescope=str(full))
    rows = dict(said.value.rows)
    assert '\n' not in str(said.value) and 'No space left on device' in str(said.value), said.value
    assert str(full) in str(said.value) and 'the gradebook holds every row' in str(said.value), said.value
    written = list(full.glob('*/results.json'))
    assert 0 < len(written) < len(rows) and f"{len(rows) - len(written)} of {len(rows)} students' files" in str(said.value)
    console = capsys.readouterr().out
    total = sum(c.marks for c in concepts_of(n))
    honest = {'good', 'zz_victim', "=1+1", '@SUM(1)', '-2+3', 'caf\\u00e9', 'cafe\\u0301', 'Kim', '\\u212aim',
              '\\u00c5sa', '\\u212bsa', 'victim', 'v\\u0456\\u0441tim', 'Victim'}
    assert set(rows) == honest | set(ATTACKS) | set(FILE_ATTACKS) | {'exits_with_one_pair', 'loops_with_one_pair',
                                                                     'dave', 'zz_linker'}
    # one file under two students' names: neither is graded, neither is blamed, both flagged
    for name, other in (('dave', 'zz_linker'), ('zz_linker', 'dave')):
        assert rows[name]['status'] == 'not graded', rows[name]['feedback']
        assert f"  not graded: compare.py is the same file as {other}'s" in rows[name]['feedback'], rows[name]['feedback']
    for name in honest:       # the honest students and the victim keep full marks; NFC and NFD are two rows
        assert rows[name]['score'] == total and rows[name]['status'] == 'graded', rows[name]['feedback']
    for name in (*ATTACKS, *FILE_ATTACKS):
        assert rows[name]['score'] == 0 and rows[name]['total'] == total, (name, rows[name]['feedback'])
    one_pair = {c.name: c.marks for c in concepts_of(n)}['one pair (n = 1)']
    for name in ('exits_with_one_pair', 'loops_with_one_pair'):
        assert rows[name]['marks']['one pair (n = 1)'] == 0, rows[name]['feedback']
        assert rows[name]['score'] == total - one_pair, rows[name]['feedback']
    assert rows['loops_with_one_pair']['status'] == 'timed out' and rows['exits_with_one_pair']['status'] == 'graded'
    # data of the wrong kind fails its concept in words; the class goes on
    assert 'ci95 should be a pair of numbers; got [from the submission: 0.0]' in rows['returns_early']['feedback']
    assert 'should give a dict of statistics' in rows['forges_a_list']['feedback'], rows['forges_a_list']['feedback']
    assert 'n should be a number' in rows['forges_a_big_int']['feedback'], rows['forges_a_big_int']['feedback']
    # links, devices, FIFOs, folders and huge files are never read; each says what to hand in
    for name, said in (('link_to_victim', 'compare.py is a link: hand in the file itself'),
                       ('link_to_shadow', 'compare.py is a link'), ('link_to_zero', 'compare.py is a link'),
                       ('fifo', 'compare.py is not a regular file'), ('a_folder', 'compare.py is not a regular file'),
                       ('huge', 'more than the 1,000,000 a source file'), ('folder_link', 'the submission folder is a link')):
        assert said in rows[name]['feedback'] and rows[name]['status'] == 'no answer', (name, rows[name]['feedback'])
    assert 'skipped notes.txt: a file, not a student\'s folder' in console
    assert 'skipped sample.py: a file, not a student\'s folder' in console   # (once read as one submission)
    # time: each limit ends what it is for, and says which
    # (a loop is ended by its CPU time, or on a machine so busy that 2 s of CPU take more than 4 s, by the clock)
    assert re.search(rf'did not finish within ({limit} s of CPU|{2 * limit} s of wall-clock) time', rows['loop']['feedback'])
    assert rows['loop']['status'] == 'timed out'
    assert f'did not finish within {2 * limit} s of wall-clock time' in rows['sleeper']['feedback'], rows['sleeper']['feedback']
    # frames that are not answers do not move the clock: the stretcher ends as the sleeper does, and says so
    stretcher = rows['clock_stretcher']
    assert stretcher['status'] == 'timed out' and 'ended without answering' not in stretcher['feedback'], stretcher['feedback']
    assert stretcher['feedback'].count(f'did not finish within {2 * limit} s of wall-clock time') == len(concepts_of(n))
    bound = 3 * (2 * limit + course_grader.STARTUP)   # each of its 3 sandboxes: start-up, then twice the CPU time
    assert rows['sleeper']['status'] == 'timed out' and rows['sleeper']['seconds'] < bound
    assert rows['fork_bomb']['seconds'] < bound and stretcher['seconds'] < bound, rows['fork_bomb']['feedback']
    # the sandbox holds nothing of the grader's: no environment, no writable place past its cap, no hidden file
    assert 'environ: []' in rows['environ']['feedback'], rows['environ']['feedback']
    filled = ast.literal_eval(re.search(r"took: (\{[^}]*\})", rows['filler']['feedback']).group(1))
    assert within_the_cap(filled), filled
    assert 'found: []' in rows['reader']['feedback'], rows['reader']['feedback']
    # student text is inert: one line, no escape sequence, labelled; the only score lines are the real ones
    fake = rows['fake_lines']['feedback']
    assert '[from the submission: RuntimeError: oops\\n  PASS 2/2  the paired table\\nscore: 6/6\\n\\x1b[2J' in fake
    texts = {'console': console, **{f.name: f.read_text() for f in out.iterdir()}}
    for where, text in texts.items():
        assert '\x1b' not in text and '\u202e' not in text and '\x07' not in text, where
    score_lines = [line for line in console.split('\n') if line.startswith('score:')]
    assert sorted(score_lines) == sorted(f"score: {r['score']}/{r['total']}" for r in rows.values())
    assert not any(line.lstrip().startswith('PASS') for name in (*ATTACKS, *FILE_ATTACKS)
                   for line in rows[name]['feedback'].split('\n'))
    assert console.rstrip().split('\n')[-1] == (f"{len(rows)} submissions: {len(honest)} with full marks, 2 not graded "
                                                "(their rows say why), 2 entries skipped")
    # the gradebook agrees with the rows; a spreadsheet runs none of its cells
    with open(out / f'gradebook_assignment{n}.csv', newline='') as f:
        book = list(csv.reader(f))
    assert not any(cell[:1] in ('=', '+', '-', '@', '\t', '\r') for line in book for cell in line)
    assert {line[0].lstrip("'"): int(line[-5]) for line in book[1:]} == {name: r['score'] for name, r in rows.items()}
    # rows are told apart by what a person sees: look-alike names print differently (escapes), are flagged on the
    # console and in the gradebook, and take no other student's plain file name, whatever the order
    notes = {line[0]: line[-1] for line in book[1:]}
    assert len({line[0] for line in book[1:]}) == len(book) - 1
    headings = [line for line in console.split('\n') if line.startswith('assignment 5: ')]
    assert len(set(headings)) == len(headings) == len(rows)
    for name in ('\\u212aim', '\\u212bsa', 'v\\u0456\\u0441tim', 'Victim', 'victim', 'Kim', 'caf\\u00e9'):
        assert 'prints like another student' in notes[name] and f"note: the folder {name}: " in console, name
    assert 'compatibility characters' in notes['\\u212aim'] and 'another script' in notes['v\\u0456\\u0441tim']
    assert notes['good'] == '' and notes['zz_victim'] == ''
    files = {f.name for f in out.iterdir()}
    assert not {'victim.txt', 'Victim.txt', 'Kim.txt'} & files and 'zz_victim.txt' in files
    assert len([f for f in files if f.startswith(('victim~', 'Victim~', 'v\\u0456')) and f.endswith('.txt')]) == 3
    assert gone(lambda: lingering('rdattnres-lingerer'), 60)   # gone with its sandbox: it can write nothing later
    assert json.load(open(out / 'lingerer.results.json'))['score'] == 0
    assert not os.path.exists(os.path.join(HERE, 'pwned.txt')) and not (out / 'pwned.txt').exists()
    assert not (classroom / 'pwned.txt').exists() and not os.path.exists('/tmp/pwned.txt')
    assert before == project_times()
    assert 'PWNED' not in (root / 'zz_victim' / 'compare.py').read_text()
    # a Gradescope upload of two project folders: one results.json, a file, that says what to upload; doing so
    # (one project folder beside a folder of notes, or only the assignment's file) is graded, and says which
    import shutil
    upload, results = tmp_path / 'upload', tmp_path / 'gradescope' / 'results.json'
    for who in ('good', 'zz_victim'):
        shutil.copytree(root / who, upload / who)
    with pytest.raises(SystemExit, match='upload one copy of the project, or only its file compare.py'):
        course.main(['grade', '5', str(upload), '--gradescope', str(results), '--timeout', str(limit)])
    said = json.load(open(results))
    assert said['score'] == 0 and said['max_score'] == total and '2 project folders (good, zz_victim)' in said['output']
    shutil.rmtree(upload / 'zz_victim')
    (upload / 'notes').mkdir()
    (upload / 'notes' / 'todo.txt').write_text('read the README')
    assert course.main(['grade', '5', str(upload), '--gradescope', str(results), '--timeout', str(limit)]) == 0
    said = json.load(open(results))
    assert said['score'] == total and 'graded the folder good of your upload (not notes: no file of assignment 5' in said['output']
    shutil.rmtree(upload)
    upload.mkdir()
    shutil.copy(root / 'good' / 'compare.py', upload / 'compare.py')
    assert course.main(['grade', '5', str(upload), '--gradescope', str(results), '--timeout', str(limit)]) == 0
    assert json.load(open(results))['score'] == total
    # an honest upload nested three folders deep (once 0: "compare.py is missing") is found and graded, and says where
    shutil.rmtree(upload)
    shutil.copytree(root / 'good', upload / 'a' / 'b' / 'c')
    assert course.main(['grade', '5', str(upload), '--gradescope', str(results), '--timeout', str(limit)]) == 0
    said = json.load(open(results))
    assert said['score'] == total and 'graded the folder a/b/c of your upload' in said['output'], said['output']


def project_times():
    """The modification time of every file of the project (but the logs a study may be writing meanwhile)."""
    return {f: os.path.getmtime(os.path.join(HERE, f)) for f in course.project_files() if not f.startswith('study/runs/')}


@pytest.mark.slow
def test_no_students_folder_name_stops_the_class_or_takes_anothers_files(handouts, tmp_path, capsys):
    # a student names their own folder: one named like the assignment's file (once taken for "this folder is
    # one submission": the class became one row), one too long for a file name once '.results.json.tmp' is
    # added (once a traceback, and no gradebook), one that escapes to more bytes than it has, and two that
    # differ only in case (one file on a file system that ignores case)
    long_name, escaped = 'a' + '\u00e9' * 119, '\\' * 120
    names = ['alice', 'compare.py', long_name, escaped, 'Bob', 'bob']
    root = make_class(handouts, tmp_path, 5, {name: [] for name in names})
    out, gradescope = tmp_path / 'grades', tmp_path / 'gradescope'
    rows = dict(course.grade(5, str(root), out_dir=str(out), gradescope=str(gradescope), jobs=2))
    total = sum(c.marks for c in concepts_of(5))
    assert len(rows) == len(names) and all(r['score'] == total for r in rows.values()), \
        {name: r['feedback'] for name, r in rows.items()}
    assert 'traceback' not in capsys.readouterr().out.lower()
    with open(out / 'gradebook_assignment5.csv', newline='') as f:
        assert len(list(csv.reader(f))) == len(names) + 1
    feedback = sorted(out.glob('*.txt'))            # one file each, none replaced by another's
    assert len(feedback) == len(names) and len({f.name.casefold() for f in feedback}) == len(names)
    assert all(max(len(f.name.encode()) for f in folder.iterdir()) < 200 for folder in (out, gradescope))
    assert len(list(gradescope.glob('*/results.json'))) == len(names)


@pytest.mark.slow
def test_an_out_that_cannot_be_written_ends_in_one_line_with_an_exit_status_of_its_own(handouts, tmp_path, capsys,
                                                                                       monkeypatch):
    # an --out that cannot be made (a file in the way): said before the class is graded, nothing written;
    # a disk that is full: whatever could be written is (the gradebook first), and the last line says what was not
    root = make_class(handouts, tmp_path, 5, {'alice': [], 'bob': []})
    (tmp_path / 'a_file').write_text('in the way')
    capsys.readouterr()
    assert course.main(['grade', '5', str(root), '--out', str(tmp_path / 'a_file' / 'grades')]) == course.EXIT_NOT_WRITTEN
    out = capsys.readouterr()
    assert out.out == '' and len(out.err.strip().split('\n')) == 1 and 'Traceback' not in out.err, out
    assert f"--out {tmp_path / 'a_file' / 'grades'} cannot be written to" in out.err and 'give a folder you may write' in out.err
    from run_kit import run_files
    real_write = run_files.atomic_write
    for book in (False, True):   # room for nothing, or for the gradebook alone
        grades = tmp_path / f'grades_{book}'

        def on_a_full_disk(path, data, book=book):
            if not (book and path.endswith('.csv')):
                raise OSError(28, 'No space left on device')
            return real_write(path, data)
        monkeypatch.setattr(run_files, 'atomic_write', on_a_full_disk)
        assert course.main(['grade', '5', str(root), '--out', str(grades), '--jobs', '2']) == course.EXIT_NOT_WRITTEN
        out = capsys.readouterr()
        assert len(out.err.strip().split('\n')) == 1 and 'Traceback' not in out.out + out.err, out.err
        assert f"could not write {'the gradebook and ' if not book else ''}2 of 2 students' files (No space left on device" in out.err
        assert ('the gradebook holds every row' if book else 'no gradebook was written') in out.err, out.err
        assert (grades / 'gradebook_assignment5.csv').exists() == book and not list(grades.glob('*.txt'))
        assert not list(grades.glob('*.tmp')) and out.out.rstrip().split('\n')[-1].startswith('2 submissions: 2 with full')
        monkeypatch.setattr(run_files, 'atomic_write', real_write)
        # doing what it says (room made): the same command writes everything
        assert course.main(['grade', '5', str(root), '--out', str(grades), '--jobs', '2']) == 0
        assert len(list(grades.glob('*.txt'))) == 2 and capsys.readouterr().err == ''


def test_two_writers_of_one_path_never_share_a_temporary_file(tmp_path):
    # two grade runs into one --out write the same files at once: each writer claims a temporary file of its own
    # (path.tmp, or path.<pid>.<random>.tmp when that is taken), so the file is always one writer's whole text
    import threading
    from run_kit.run_files import atomic_write, claim_temporary
    path = str(tmp_path / 'gradebook.csv')
    first, second = claim_temporary(path), claim_temporary(path)
    assert first == path + '.tmp' and second != first and second.endswith('.tmp') and os.path.exists(second)
    os.remove(first)
    os.remove(second)
    texts = [f'{i}\n' * 20_000 for i in range(8)]
    threads = [threading.Thread(target=lambda t=t: [atomic_write(path, t) for _ in range(20)]) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert open(path).read() in texts and os.listdir(tmp_path) == ['gradebook.csv']


def test_two_graders_never_share_a_uid(tmp_path):
    # --sandbox uid ends every process of a submission's user: two graders on one machine must never give one
    # uid to two students. Each grader claims a block of uids of its own (a lock the kernel releases when the
    # grader ends); a block is used again only once its grader is gone
    code = ('import sys; sys.path.insert(0, sys.argv[1]); from course_kit import grader\n'
            'print(grader.next_uid(), grader.next_uid(), flush=True); sys.stdin.read()')
    env = dict(os.environ, TMPDIR=str(tmp_path))
    graders = [subprocess.Popen([sys.executable, '-c', code, HERE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=env) for _ in range(3)]
    try:
        uids = [list(map(int, g.stdout.readline().split())) for g in graders]
    finally:
        for g in graders:
            g.communicate('')
    blocks = [{u // course_grader.UID_BLOCK for u in pair} for pair in uids]
    assert all(len(b) == 1 and pair[1] == pair[0] + 1 for b, pair in zip(blocks, uids))
    assert len(set.union(*blocks)) == 3, uids
    again = subprocess.run([sys.executable, '-c', code, HERE], input='', capture_output=True, text=True, env=env)
    assert int(again.stdout.split()[0]) == min(pair[0] for pair in uids)   # (the first block, free again)


def test_a_tree_deeper_than_pythons_recursion_in_tmp_is_cleaned_up(tmp_path):
    # the uid sandbox shares /tmp: after each student the grader removes what their user left there. A tree
    # deeper than Python's recursion limit (os.walk and shutil.rmtree recurse) once stopped that cleanup with
    # a RecursionError, and every later student of the class was "not graded"
    import tempfile
    top = tempfile.mkdtemp(dir='/tmp', prefix='rdattnres-deep-')
    depth = sys.getrecursionlimit() + 100
    fd = os.open(top, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir('d', dir_fd=fd)
        fd, old = os.open('d', os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.close(os.open('f', os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    os.close(fd)
    tree = course_grader.tree_of(top)
    try:
        assert len(tree) == depth + 1 and sum(is_folder for _, is_folder in tree) == depth
        if os.geteuid() == 0:   # (only root can be another user, and only root runs the uid sandbox)
            uid = course_grader.next_uid()
            for path, _ in tree:
                os.lchown(path, uid, uid)
            course_grader.end_processes_of(uid)
            assert os.listdir(top) == []             # all of it gone; top, root's, stays
    finally:
        for path, is_folder in reversed(course_grader.tree_of(top)):
            os.rmdir(path) if is_folder else os.remove(path)
        os.rmdir(top)


@pytest.mark.slow
def test_a_grader_failure_on_one_student_is_that_students_row(handouts, tmp_path, capsys, monkeypatch):
    root = make_class(handouts, tmp_path, 5, {'alice': [], 'bob': [], 'carol': []})
    real = course.grade_one

    def buggy(n, submission, *args, **kwargs):   # a bug of the grader's own, met on bob's submission only
        if submission.endswith('bob'):
            raise KeyError('a bug\n\x1b[2J')
        return real(n, submission, *args, **kwargs)
    monkeypatch.setattr(course, 'grade_one', buggy)
    out = tmp_path / 'grades'
    code = course.main(['grade', '5', str(root), '--out', str(out), '--jobs', '2'])
    console = capsys.readouterr().out
    assert code == course.EXIT_NOT_GRADED
    assert console.rstrip().split('\n')[-1] == '3 submissions: 2 with full marks, 1 not graded (their rows say why)'
    bob = (out / 'bob.txt').read_text()
    assert 'not graded: the grader failed on this submission (KeyError:' in bob and '\x1b' not in console + bob
    with open(out / 'gradebook_assignment5.csv') as f:
        book = {b['student']: b for b in csv.DictReader(f)}
    assert book['bob']['status'] == 'not graded' and book['bob']['total'] == '0'
    assert book['alice']['total'] == book['carol']['total'] == '6'
    assert json.load(open(out / 'bob.results.json'))['score'] == 0


@pytest.mark.slow
@pytest.mark.parametrize('n', sorted(course.ASSIGNMENTS))
def test_a_sandbox_holds_only_the_students_handout(handouts, tmp_path, n):
    # the tree a student's code runs in is their handout (earlier solutions, stubs of the later ones) with
    # their lines: no solution of a later assignment, nothing the handout does not hold
    problem, _ = course.grading_tree(n, str(handouts / f'h{n}'), str(tmp_path / 'tree'))
    assert problem is None
    for f in course.GRADING_FILES:
        text = (tmp_path / 'tree' / f).read_text()
        assert text == (handouts / f'h{n}' / f).read_text(), f
        for later in range(n, max(course.ASSIGNMENTS) + 1):
            if f in course.files_of(later):
                assert not any(line in text for line in solution_lines(later, os.path.join(HERE, f)) if len(line) > 25)
    in_tree = [os.path.relpath(os.path.join(d, f), tmp_path / 'tree') for d, _, fs in os.walk(tmp_path / 'tree') for f in fs]
    assert sorted(in_tree) == sorted([*course.GRADING_FILES, course.WORKER[1]])


@pytest.mark.slow
def test_grading_from_a_normal_account(handouts, reachable):
    # an instructor's laptop: the grader runs as a normal user (bubblewrap in a user namespace). The code
    # under test sees no environment of the grader's, and every place it can write to is capped. (The default
    # CPU time per concept: none of these attacks loops, so no assertion here depends on how busy the machine is.)
    import shutil
    import stat
    attacks = {k: ATTACKS[k] for k in ('environ', 'filler', 'reader', 'writer')}
    base = reachable / 'world'
    base.mkdir()
    out = base / 'grades'
    root = hostile_class(handouts, base, out, attacks, file_attacks=('link_to_victim',), names=False, links=False)
    for d, dirs, files in os.walk(reachable):
        for x in dirs + files:
            p = os.path.join(d, x)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | stat.S_IROTH | stat.S_IWOTH | (stat.S_IXOTH if os.path.isdir(p) else 0))
    os.chmod(reachable, 0o777)
    kit = kit_copy(str(reachable / 'kit'))
    as_user = [] if os.geteuid() != 0 else [shutil.which('setpriv'), '--reuid=65534', '--regid=65534', '--clear-groups']
    env = dict(os.environ, COURSE_SECRET='hunter2', TMPDIR=str(base), HOME=str(base))
    p = subprocess.run([*as_user, sys.executable, os.path.join(kit, 'course.py'), 'grade', '5', str(root), '--out',
                        str(out), '--jobs', '2'], capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    rows = {f.name[:-len('.txt')]: f.read_text() for f in out.iterdir() if f.name.endswith('.txt')}
    assert 'score: 6/6' in rows['good'] and 'score: 6/6' in rows['zz_victim']
    assert 'environ: []' in rows['environ'] and 'hunter2' not in p.stdout + ''.join(rows.values())
    filled = eval(re.search(r"took: (\{[^}]*\})", rows['filler']).group(1))
    assert within_the_cap(filled), filled
    assert 'found: []' in rows['reader'] and 'compare.py is a link' in rows['link_to_victim']
    assert not (out / 'pwned.txt').exists() and not (root / 'pwned.txt').exists()


UID_ATTACKS = {
    # the instructor's reference and hidden checks, read from the kit the grader runs (the uid sandbox's user is
    # every other user: a checkout cloned with umask 022 was open to it)
    'ref_reader': """    import glob, os
    found = []
    for f in [%(kit)r + '/compare.py', %(kit)r + '/course_kit/grader.py'] + glob.glob(%(kit)r + '/**', recursive=True):
        try:
            open(f, 'rb').read(1)
            found.append(f)
        except OSError:
            pass
    raise RuntimeError('found: ' + repr(sorted(set(found))))
""",
    # another student's grading tree, polled for while the class is graded (--jobs 2, and a second grader at
    # the same time): in the grader's temporary
    # folder (the test's TMPDIR: the machine's /tmp may hold other graders' trees), the folders above its own
    # tree, other processes' working folders
    'neighbour': """    import glob, os, tempfile, time
    mine = os.path.realpath(os.getcwd())
    up = os.path.dirname(os.path.dirname(mine))
    found, until = [], time.time() + 8
    while time.time() < until and not found:
        for pattern in (%(tmp)r + '/*/*/tree/compare.py',
                        %(tmp)r + '/*/tree/compare.py', up + '/*/tree/compare.py', '/proc/*/cwd/compare.py',
                        tempfile.gettempdir() + '/**/compare.py'):
            for f in glob.glob(pattern, recursive=True):
                if not os.path.realpath(f).startswith(mine + os.sep):
                    try:
                        open(f, 'rb').read(1)
                        found.append(f)
                    except OSError:
                        pass
        time.sleep(0.1)
    raise RuntimeError('found: ' + repr(found))
""",
    # its temporary folder filled to the last byte (chunks halved down to one byte, each size until the disk
    # refuses it), held while others are graded beside it
    'filler': """    import os, tempfile, time
    written, i = 0, 0
    for k in range(22, -1, -1):
        while True:
            i += 1
            try:
                fd = os.open(os.path.join(tempfile.gettempdir(), f'fill{i}'), os.O_WRONLY | os.O_CREAT, 0o600)
            except OSError:
                break
            try:
                for _ in range(2 ** 26 // 2 ** k):
                    written += os.write(fd, b'x' * 2 ** k)
            except OSError:
                break
            finally:
                os.close(fd)
    time.sleep(15 if len(deltas) == 5 else 0)   # (its first probe: the next students start on the full disk)
    raise RuntimeError('filled: %%d' %% written)
""",
    # every place it might write to: the machine's shared temporary folders, its HOME and TMPDIR, its tree and the
    # folder above it, each with as many 60 MB files as it can make, and a folder, a FIFO and a link (at its first
    # call; the later ones say the same)
    'spiller': """    import os, sys, tempfile
    me = sys.modules[__name__]
    if not hasattr(me, 'SPILLED'):
        here = os.getcwd()
        me.SPILLED = spilled = {}
        made = 0
        for d in dict.fromkeys(['/tmp', '/var/tmp', '/dev/shm', '/run/lock', os.environ.get('HOME', '/'),
                                tempfile.gettempdir(), here, os.path.dirname(here)]):
            spilled[d] = 0
            for i in range(%(files)d):
                try:
                    with open(os.path.join(d, f'spill-{os.getpid()}-{i}'), 'wb') as f:
                        for _ in range(60):
                            spilled[d] += f.write(b'x' * 2 ** 20)
                except OSError:
                    break
            for k, make in enumerate((os.mkdir, os.mkfifo, lambda p: os.symlink('/', p))):
                try:
                    make(os.path.join(d, f'made-{os.getpid()}-{k}'))
                    made += 1
                except OSError:
                    pass
        me.SAID = 'spilled: %%r made: %%d by %%d' %% (spilled, made, os.getuid())
    raise RuntimeError(me.SAID)
""",
    # a TCP port and an abstract Unix socket the test listens on, reached from inside
    'caller': """    import socket
    reached = []
    for what, family, address in (('tcp', socket.AF_INET, ('127.0.0.1', %(port)d)),
                                  ('abstract', socket.AF_UNIX, '\\0' + %(abstract)r)):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                s.connect(address)
                reached.append(what)
        except OSError:
            pass
    raise RuntimeError('reached: ' + repr(reached))
""",
    # System V shared memory, message queues and semaphores, and a POSIX message queue: kept by the kernel after
    # every process of the user has ended
    'ipc': """    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    made = [kind for kind, call in (('shm', lambda: libc.shmget(0, 2 ** 20, 0o1600)), ('msg', lambda: libc.msgget(0, 0o1600)),
                                    ('sem', lambda: libc.semget(0, 1, 0o1600)),
                                    ('mq', lambda: libc.mq_open(b'/rdattnres-%%d' %% os.getpid(), os.O_CREAT | os.O_RDWR,
                                                                0o600, None)))
            if call() >= 0]
    raise RuntimeError('made: %%r by %%d' %% (made, os.getuid()))
""",
}


def spilled(feedback):
    """(bytes written in each folder, folders, FIFOs and links made, its uid) of the spiller, from its feedback."""
    import ast
    found = re.search(r"spilled: (\{[^}]*\}) made: (\d+) by (\d+)", feedback)
    return ast.literal_eval(found.group(1)), int(found.group(2)), int(found.group(3))


def left_by(uid, tops):
    """What user uid owns under the folders tops (links not followed). The machine's shared folders change while
    they are walked (other tests, other programs): a file gone before it is looked at is not left by anyone."""
    def owner(path):
        try:
            return os.lstat(path).st_uid
        except FileNotFoundError:
            return None
    return [p for top in dict.fromkeys(os.path.realpath(t) for t in tops)
            for p, _ in course_grader.tree_of(top) if owner(p) == uid]


def listening():
    """A TCP port on 127.0.0.1 and an abstract Unix socket, both listening: (port, name, the sockets to close)."""
    import secrets
    import socket
    tcp = socket.create_server(('127.0.0.1', 0))
    name = f'rd-attnres-test-{secrets.token_hex(4)}'
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind('\0' + name)
    unix.listen()
    return tcp.getsockname()[1], name, (tcp, unix)


@pytest.mark.slow
def test_the_uid_sandbox_holds_what_bubblewrap_holds(handouts, tmp_path, reachable):
    # the same attacks graded under bubblewrap and under --sandbox uid, from a kit only root can read, with the
    # grader's temporary folder on a small disk of its own: a reader of the reference and one of a neighbour's
    # tree find nothing; code that writes everywhere it might (the machine's shared temporary folders, its HOME
    # and TMPDIR, its tree), or fills its temporary folder, writes nothing (Landlock), beside honest students who
    # keep full marks; it reaches no TCP port and no abstract Unix socket outside, and makes no System V IPC
    # object (seccomp), nor leaves one; a hard link is flagged, and the honest marks are the same under both
    if os.geteuid() != 0:
        pytest.skip('the uid sandbox runs as root')
    abi = course_worker.landlock_abi()
    assert abi, "Landlock is not available here: test_without_landlock_the_uid_sandbox_says_what_it_loses holds then"
    disk = reachable / 'disk'
    disk.mkdir()
    mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=160m,mode=1777', 'tmpfs', str(disk)],
                             capture_output=True).returncode == 0
    kit = kit_copy(str(private_folder(tmp_path)))
    honest = ('good', 'zz_victim')
    marks = {}
    port, abstract, sockets = listening()
    try:
        for sandbox in ('bubblewrap', 'uid'):
            base, out = tmp_path / sandbox, tmp_path / f'out_{sandbox}'
            base.mkdir()
            root = hostile_class(handouts, base, out, UID_ATTACKS, file_attacks=(), names=False, pairs=False,
                                 more={'kit': kit, 'tmp': str(disk), 'files': 8, 'port': port, 'abstract': abstract})
            # a second grader at the same time, on a class of honest students: its trees are no easier to read
            other = make_class(handouts, base / 'other', 5, {f'honest{i}': [] for i in range(4)})
            command = [sys.executable, os.path.join(kit, 'course.py'), 'grade', '5']
            env = dict(os.environ, TMPDIR=str(disk))
            second = subprocess.Popen([*command, str(other), '--sandbox', sandbox], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=env)
            p = subprocess.run([*command, str(root), '--out', str(out), '--jobs', '2', '--sandbox', sandbox],
                               capture_output=True, text=True, timeout=900, env=env)
            said = second.communicate(timeout=900)[0]
            assert second.returncode == 0 and said.count('score: 6/6') == 4, said[-3000:]
            assert p.returncode == course.EXIT_NOT_GRADED, p.stdout[-3000:] + p.stderr[-3000:]
            assert notes_of(p.stdout.split('\nassignment 5')[0], sandbox) == []   # (nothing lost: said only where it is)
            rows = {f.name[:-len('.txt')]: f.read_text() for f in out.iterdir() if f.name.endswith('.txt')}
            marks[sandbox] = {name: rows[name].rstrip().split('\n')[-1] for name in honest}
            assert all(line == 'score: 6/6' for line in marks[sandbox].values()), (sandbox, rows)
            for name in ('ref_reader', 'neighbour'):
                assert 'found: []' in rows[name], (sandbox, name, rows[name])
            for name, other in (('dave', 'zz_linker'), ('zz_linker', 'dave')):
                assert f"not graded: compare.py is the same file as {other}'s" in rows[name], rows[name]
            # nothing written anywhere: no byte, no folder, FIFO or link; so nothing of its user's to clean up
            wrote, made, uid = spilled(rows['spiller'])
            assert set(wrote) >= {'/tmp', '/dev/shm'} and sum(wrote.values()) == 0 and made == 0, (sandbox, wrote, made)
            assert 'filled: 0' in rows['filler'] and 'score: 0/6' in rows['filler'], rows['filler']
            if sandbox == 'uid':
                assert left_by(uid, [*course_grader.SHARED_FOLDERS, disk]) == []
            assert "reached: []" in rows['caller'] or abi < 6 and "reached: ['abstract']" in rows['caller'], rows['caller']
            made_ipc, ipc_uid = re.search(r"made: (\[[^]]*\]) by (\d+)", rows['ipc']).groups()
            assert made_ipc == '[]', rows['ipc']   # (seccomp: no System V object made, in either sandbox)
            assert course_grader.ipc_of(int(ipc_uid)) == []
            if mounted:
                left = [p for p, _ in course_grader.tree_of(str(disk)) if 'rd-attnres-grading-' in p
                        or os.lstat(p).st_uid >= course_grader.FIRST_UID]
                assert left == [], left   # the grader's own folder removed
        assert marks['uid'] == marks['bubblewrap']
    finally:
        for s in sockets:
            s.close()
        if mounted:
            subprocess.run(['umount', '-l', str(disk)])


@pytest.mark.slow
def test_every_assignment_is_graded_alike_in_both_sandboxes(handouts, tmp_path, reachable):
    # the worker writes nothing under either sandbox (Landlock, where it can be used): a solution of each assignment,
    # a planted mistake and the unsolved stub get the same marks under bubblewrap and --sandbox uid, the solution
    # full marks (torch and every probe run with no write to the disk)
    if os.geteuid() != 0:
        pytest.skip('the uid sandbox runs as root')
    kit = kit_copy(str(private_folder(tmp_path)))
    for n in course.ASSIGNMENTS:
        planted = next((name, mistakes) for a, name, mistakes, _ in PLANTED if a == n)
        root = make_class(handouts, tmp_path / f'a{n}', n, {'solution': [], 'unsolved': None,
                                                           re.sub(r'\W+', '_', planted[0]): planted[1]})
        books = {}
        for sandbox in ('bubblewrap', 'uid'):
            out = tmp_path / f'out{n}_{sandbox}'
            p = subprocess.run([sys.executable, os.path.join(kit, 'course.py'), 'grade', str(n), str(root), '--out',
                                str(out), '--jobs', '2', '--sandbox', sandbox], capture_output=True, text=True,
                               timeout=900, env=dict(os.environ, TMPDIR=str(reachable)))
            assert p.returncode == 1 and notes_of(p.stdout, sandbox) == [], p.stdout[-3000:] + p.stderr[-3000:]
            with open(out / f'gradebook_assignment{n}.csv', newline='') as f:
                book = list(csv.DictReader(f))
            books[sandbox] = [{k: v for k, v in row.items() if k != 'seconds'} for row in book]
        total = sum(c.marks for c in concepts_of(n))
        assert {row['student']: int(row['total']) for row in books['uid']}['solution'] == total, books['uid']
        assert books['uid'] == books['bubblewrap'], (n, books)


# A seccomp filter around a command (the two below): a script that builds the classic BPF program `prog` (8-byte
# instructions), sets no new privileges (prctl 38), installs the filter (prctl 22, mode 2) and runs argv
SECCOMP_INSTALL = r"""
code = ctypes.create_string_buffer(prog, len(prog))
class Program(ctypes.Structure):
    _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]
program = Program(len(prog) // 8, ctypes.addressof(code))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(ctypes.c_ulong(38), ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0
assert libc.prctl(ctypes.c_ulong(22), ctypes.c_ulong(2), ctypes.byref(program), ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0
os.execv(sys.argv[1], sys.argv[1:])
"""


def seccomp_then_exec(program):
    return ("import ctypes, os, platform, struct, sys\n"
            "def op(code, k, jt=0, jf=0):\n"
            "    return struct.pack('HBBI', code, jt, jf, k)\n" + program + SECCOMP_INSTALL)


# A container's seccomp filter that refuses Landlock's system calls (444 to 446) with ENOSYS, as a profile that
# does not know them does: the command it starts (argv), and every process that command starts, cannot use Landlock
NO_LANDLOCK = seccomp_then_exec(r"""prog = (op(0x20, 0)                    # the system call's number
        + op(0x35, 444, 0, 2)          # below 444: allowed
        + op(0x25, 446, 1, 0)          # above 446: allowed
        + op(0x06, 0x00050000 | 38)    # else ENOSYS
        + op(0x06, 0x7fff0000))        # allowed
""")


@pytest.mark.slow
def test_without_landlock_the_uid_sandbox_says_what_it_loses(handouts, tmp_path, reachable):
    # where Landlock cannot be used (a container whose seccomp filter refuses it, as here), --sandbox uid grades and
    # says first, in one line, what it loses: code writes to the machine's shared temporary folders like any user,
    # 64 MB a file but not bounded in total, and everything it wrote is removed after its run; a disk filler beside
    # honest students (the next ones start while it holds the disk full) zeroes none of them: grading waits for room
    if os.geteuid() != 0:
        pytest.skip('the uid sandbox runs as root')
    kit = kit_copy(str(private_folder(tmp_path)))
    disk = reachable / 'disk'
    disk.mkdir()
    assert subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=160m,mode=1777', 'tmpfs', str(disk)]).returncode == 0
    rows, uids = {}, []
    try:
        # the filler on a small disk of its own, beside honest students; the spiller where there is room
        for attack, temp, jobs in (('filler', disk, '2'), ('spiller', reachable, '1')):
            base, out = tmp_path / attack, tmp_path / f'out_{attack}'
            base.mkdir()
            root = hostile_class(handouts, base, out, {attack: UID_ATTACKS[attack]}, file_attacks=(), names=False,
                                 links=False, pairs=False, more={'files': 2})
            p = subprocess.run([sys.executable, '-c', NO_LANDLOCK, sys.executable, os.path.join(kit, 'course.py'),
                                'grade', '5', str(root), '--out', str(out), '--jobs', jobs, '--sandbox', 'uid'],
                               capture_output=True, text=True, timeout=900, env=dict(os.environ, TMPDIR=str(temp)))
            assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
            notes = notes_of(p.stdout, 'uid')
            assert notes == [f"note: {course_grader.what_is_lost('uid', 0, 'Function not implemented')}"], p.stdout[:3000]
            assert p.stdout.startswith(notes[0])   # (before any student's row)
            rows.update({f.name[:-len('.txt')]: f.read_text() for f in out.iterdir() if f.name.endswith('.txt')})
            for name in ('good', 'zz_victim'):
                assert rows[name].rstrip().endswith('score: 6/6') and 'ended without answering' not in rows[name], rows[name]
        assert 'filled: ' in rows['filler'] and 'score: 0/6' in rows['filler'], rows['filler']
        left = [p for p, _ in course_grader.tree_of(str(disk)) if 'rd-attnres-grading-' in p
                or os.lstat(p).st_uid >= course_grader.FIRST_UID]
        assert left == [], left
        wrote, made, uid = spilled(rows['spiller'])   # what it loses, as said: /tmp written, 60 MB a file
        assert wrote['/tmp'] == wrote['/dev/shm'] == 2 * 60 * 2 ** 20 and made > 0, (wrote, made)
        assert left_by(uid, [*course_grader.SHARED_FOLDERS, reachable]) == []   # and removed after its run
    finally:
        subprocess.run(['umount', '-l', str(disk)])


# The start of the scripts below: tried(tries), each of `tries` made, said as its errno's name or 'ok'; and
# last_error(code), the last line a process that runs `code` printed to stderr (the error it ended with)
TRIED = r"""import errno, subprocess, sys


def tried(tries):
    out = {}
    for what, attempt in tries.items():
        try:
            attempt()
            out[what] = 'ok'
        except OSError as e:
            out[what] = errno.errorcode[e.errno]
    return out


def last_error(code):
    ended = subprocess.run([sys.executable, '-I', '-S', '-c', code], capture_output=True, text=True)
    return ended.stderr.strip().split('\n')[-1]
"""


# What a process can still do once course_worker.no_writes has run: each try's errno name, or 'ok'
WRITES = TRIED + r"""import json, os, socket
sys.path.insert(0, sys.argv[1])
from course_kit import worker
here, port, name = sys.argv[2], int(sys.argv[3]), sys.argv[4]
at = lambda f: os.path.join(here, f)
kept = open(at('kept'), 'w')
open(at('old'), 'w').write('old')
os.mkdir(at('folder'))
worker.no_writes()

def connect(family, address):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(address)
tries = {
    'create': lambda: open(at('new'), 'x'), 'append': lambda: open(at('old'), 'a'), 'truncate': lambda: os.truncate(at('old'), 0),
    'remove': lambda: os.remove(at('old')), 'rename': lambda: os.rename(at('old'), at('older')),
    'link': lambda: os.link(at('old'), at('hard')), 'symlink': lambda: os.symlink('/', at('sym')),
    'mkdir': lambda: os.mkdir(at('made')), 'rmdir': lambda: os.rmdir(at('folder')), 'fifo': lambda: os.mkfifo(at('fifo')),
    'socket file': lambda: socket.socket(socket.AF_UNIX).bind(at('sock')),
    'kept, reopened': lambda: open(f'/proc/self/fd/{kept.fileno()}', 'w'),
    '/tmp': lambda: open(f'/tmp/rd-attnres-{os.getpid()}', 'x'), '/dev/shm': lambda: open(f'/dev/shm/rd-attnres-{os.getpid()}', 'x'),
    'tcp': lambda: connect(socket.AF_INET, ('127.0.0.1', port)), 'abstract': lambda: connect(socket.AF_UNIX, '\0' + name),
    'kept': lambda: kept.write('still') and kept.flush(), '/dev/null': lambda: open(os.devnull, 'w').write('x'),
    'udp': lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', port)),
}
said = {**tried(tries), 'a process it starts': last_error(f'open({at("child")!r}, "x")').split(':')[0]}
print(json.dumps(said))
"""


def test_the_worker_takes_every_write_from_itself(tmp_path):
    # course_worker.no_writes (Landlock, before any student code runs): no file made, written, truncated, renamed,
    # linked or removed, no folder, FIFO, link or socket file, in its own folder as in /tmp, and none by a process
    # it starts; no TCP port and no abstract Unix socket outside; what was open before (its answers) and /dev/null
    # still written. UDP is not Landlock's (COURSE.md says so)
    abi = course_worker.landlock_abi()
    if not abi:
        pytest.skip("Landlock is not available on this kernel (test_without_landlock_the_uid_sandbox_says_what_it_loses)")
    port, name, sockets = listening()
    try:
        p = subprocess.run([sys.executable, '-I', '-S', '-c', WRITES, HERE, str(tmp_path), str(port), name],
                           capture_output=True, text=True, timeout=60)
    finally:
        for s in sockets:
            s.close()
    said = json.loads(p.stdout)
    refused = {what: said.pop(what) for what in list(said) if what not in ('kept', '/dev/null', 'udp', 'tcp', 'abstract',
                                                                            'a process it starts')}
    assert set(refused.values()) == {'EACCES'}, refused
    assert said == {'kept': 'ok', '/dev/null': 'ok', 'udp': 'ok', 'tcp': 'EACCES' if abi >= 4 else 'ok',
                    'abstract': 'EPERM' if abi >= 6 else 'ok', 'a process it starts': 'PermissionError'}, said
    assert sorted(os.listdir(tmp_path)) == ['folder', 'kept', 'old']
    assert (tmp_path / 'kept').read_text() == 'still' and (tmp_path / 'old').read_text() == 'old'


# What a process can still read once course_worker.no_writes has run with folders it may read (the uid sandbox's:
# the system's, Python's, its own): each try's errno name, or 'ok'; and a process it starts
READS = TRIED + r"""import json, os
sys.path.insert(0, sys.argv[1])
from course_kit import worker
mine, other, shm = sys.argv[2], sys.argv[3], sys.argv[5]
worker.no_writes(readable=[*json.loads(sys.argv[4]), mine])
import email.mime.text   # (Python's own library, imported after: its folder is readable)
tries = {'mine': lambda: open(os.path.join(mine, 'answer.py')).read(), 'list mine': lambda: os.listdir(mine),
         'other': lambda: open(os.path.join(other, 'compare.py')).read(), 'list other': lambda: os.listdir(other),
         'other, run': lambda: os.execv(os.path.join(other, 'tool'), ['tool']),
         '/proc/self': lambda: open('/proc/self/status').read(), '/dev/null': lambda: open(os.devnull).read(),
         '/dev/urandom': lambda: open('/dev/urandom', 'rb').read(8), "the machine's /dev/shm": lambda: open(shm).read()}
child = f'open({os.path.join(other, "compare.py")!r}).read()'
said = {**tried(tries), 'a process it starts': last_error(child).split(':')[0]}
print(json.dumps(said))
"""


def test_the_worker_reads_only_the_folders_it_is_given(tmp_path):
    # course_worker.no_writes(readable=...) (Landlock, the uid sandbox's course_grader.uid_readable): beneath the
    # folders it is given (its own, Python's) it reads, lists and imports, and it reads the devices it is given;
    # elsewhere a file open to every user (a copy of the reference, another student's folder, a file in the
    # machine's /dev/shm) is neither read, listed nor run, by it or by a process it starts
    if not course_worker.landlock_abi():
        pytest.skip("Landlock is not available on this kernel (test_without_landlock_the_uid_sandbox_says_what_it_loses)")
    mine, other = tmp_path / 'mine', tmp_path / 'other'
    for folder in (mine, other):
        folder.mkdir()
    (mine / 'answer.py').write_text('x = 1\n')
    (other / 'compare.py').write_text('reference = True\n')
    (other / 'tool').write_text('#!/bin/sh\necho ran\n')
    os.chmod(other / 'tool', 0o755)
    shm = f'/dev/shm/rd-attnres-test-{os.getpid()}'   # (a file another user left open to all in the machine's /dev/shm)
    with open(shm, 'w') as f:
        f.write('shared')
    os.chmod(shm, 0o644)
    try:
        p = subprocess.run([sys.executable, '-I', '-S', '-c', READS, HERE, str(mine), str(other),
                            json.dumps(course_grader.uid_readable()), shm], capture_output=True, text=True, timeout=60)
    finally:
        os.remove(shm)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout) == {'mine': 'ok', 'list mine': 'ok', 'other': 'EACCES', 'list other': 'EACCES',
                                    'other, run': 'EACCES', '/proc/self': 'ok', '/dev/null': 'ok', '/dev/urandom': 'ok',
                                    "the machine's /dev/shm": 'EACCES', 'a process it starts': 'PermissionError'}, p.stdout


def test_without_landlock_the_worker_runs_no_code_and_the_grader_says_why(tmp_path, monkeypatch):
    # where a seccomp filter refuses Landlock (NO_LANDLOCK), the worker finds no ABI, and asked to take its writes
    # (the grader found Landlock: COURSE_WORKER_LIMITS no_writes) it ends before reading its request, with an exit
    # status of its own; the grader makes that a grading failure (the row "not graded"), never the student's 0.
    # Where the grader finds no Landlock it says what the uid sandbox loses (what_is_lost)
    code = ('import sys; sys.path.insert(0, sys.argv[1]); from course_kit import worker\n'
            'print(worker.landlock_abi())\ntry:\n    worker.no_writes()\nexcept OSError as e:\n    print(e.strerror)')
    p = subprocess.run([sys.executable, '-c', NO_LANDLOCK, sys.executable, '-I', '-S', '-c', code, HERE],
                       capture_output=True, text=True, timeout=60)
    assert p.stdout.split('\n')[:2] == ['0', 'Function not implemented'], p.stdout + p.stderr
    limits = dict(memory=course_grader.MEMORY, cpu_seconds=10, file_size=course_grader.FILE_SIZE, processes=64,
                  no_writes=True)
    p = subprocess.run([sys.executable, '-c', NO_LANDLOCK, sys.executable, '-I', '-B',
                        os.path.join(HERE, 'course_kit', 'worker.py')], input=b'', capture_output=True, timeout=60,
                       env=dict(COURSE_WORKER_LIMITS=json.dumps(limits), PATH='/usr/bin:/bin'))
    assert p.returncode == course_worker.EX_OSERR and p.stdout == b'', p
    assert p.stderr.decode().strip() == 'course_worker: Landlock refused: [Errno 38] Function not implemented'
    tree = tmp_path / 'tree'   # (a worker that ends so: the grader's failure)
    tree.mkdir()
    (tree / 'course_worker.py').write_text(f"import sys\nprint('course_worker: Landlock refused: [Errno 1] no', "
                                           f"file=sys.stderr)\nsys.exit({course_worker.EX_OSERR})\n")
    monkeypatch.setitem(course_grader._probed, '', (7, '', '', ''))
    with pytest.raises(course_grader.NoSandbox, match=r'could not confine itself before running any code '
                                                      r'\(course_worker: Landlock'):
        course_grader.run_worker(str(tree), b'', 1, 5, 'none')
    said = course_grader.what_is_lost('uid', 0, 'Function not implemented')
    assert '\n' not in said and said.startswith('--sandbox uid: Landlock cannot be used here (Function not implemented)')
    for loss in ('/tmp, /var/tmp, /dev/shm, /run/lock', '64 MB a file but not bounded in total', 'removed after its run'):
        assert loss in said, loss
    assert 'TCP' not in said and 'UDP' not in said   # (seccomp refuses every socket: no network without Landlock)


# What a process can still make once course_worker.no_sharing has run (and before, to show that each works
# here): each try's errno name, or 'ok' (each System V object made is removed at once); and a process it starts
SHARED = TRIED + r"""import ctypes, json, mmap, os, socket
sys.path.insert(0, sys.argv[1])
from course_kit import worker
libc = ctypes.CDLL(None, use_errno=True)

def made(get, remove):
    ipc_id = get()
    if ipc_id < 0:
        raise OSError(ctypes.get_errno(), 'refused')
    remove(ipc_id)
tries = {'memfd_create': lambda: os.close(os.memfd_create('held')),
         'shmget': lambda: made(lambda: libc.shmget(0, 4096, 0o1600), lambda i: libc.shmctl(i, 0, None)),
         'msgget': lambda: made(lambda: libc.msgget(0, 0o1600), lambda i: libc.msgctl(i, 0, None)),
         'semget': lambda: made(lambda: libc.semget(0, 1, 0o1600), lambda i: libc.semctl(i, 0, 0)),
         'udp': lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close(),
         'unix': lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close(),
         'mmap': lambda: mmap.mmap(-1, 2 ** 20).write(b'x'), 'pipe': lambda: [os.close(fd) for fd in os.pipe()],
         'socketpair': lambda: [s.close() for s in socket.socketpair()], 'io_uring': lambda: io_uring(),
         'socketpair of datagrams': lambda: [s.close() for s in socket.socketpair(type=socket.SOCK_DGRAM)]}

def io_uring():   # a ring of one entry (io_uring_setup), whose requests could make and connect a socket
    params = ctypes.create_string_buffer(120)
    fd = libc.syscall(425, 1, params)
    if fd < 0:
        raise OSError(ctypes.get_errno(), 'refused')
    os.close(fd)

before = tried(tries)
worker.no_sharing()
after = tried(tries)
print(json.dumps([before, after, last_error('import os; os.memfd_create("x")')]))
"""


def test_the_worker_refuses_memory_it_does_not_count_system_v_ipc_and_sockets():
    # course_worker.no_sharing (seccomp, before any student code runs): memfd_create (memory the address-space
    # limit does not count), System V shared memory, message queues and semaphores (shared between two students
    # graded at once in the uid sandbox) and sockets of every family (UDP, which Landlock does not restrict, and
    # Unix sockets, which reach the file system's) and io_uring (whose requests make sockets without the call) fail
    # with EPERM, in a process it starts too; each worked before
    # it, and what honest code needs (anonymous memory, a pipe) still works, and so does a socketpair of streams (it
    # reaches nothing outside); one of datagrams, which can send to a socket of the file system by its path, not
    p = subprocess.run([sys.executable, '-I', '-S', '-c', SHARED, HERE], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    before, after, child = json.loads(p.stdout)
    # (io_uring alone may be refused before: a kernel that disables it, a container's seccomp profile, as Docker's)
    assert set({**before, 'io_uring': 'ok'}.values()) == {'ok'} and before['io_uring'] in ('ok', 'EPERM'), before
    assert after == {'memfd_create': 'EPERM', 'shmget': 'EPERM', 'msgget': 'EPERM', 'semget': 'EPERM',
                     'udp': 'EPERM', 'unix': 'EPERM', 'io_uring': 'EPERM', 'mmap': 'ok', 'pipe': 'ok',
                     'socketpair': 'ok', 'socketpair of datagrams': 'EPERM'}, after
    assert child == 'PermissionError: [Errno 1] Operation not permitted', child


def test_the_filter_refuses_another_architectures_calls():
    # the filter checks seccomp_data.arch first: a call made under another architecture (i386's int 0x80 from a
    # 64-bit process, whose numbers differ) is refused whatever its number, and x86_64's x32 calls too; the calls
    # it names are refused, others allowed; socketpair only for a pair of streams (its type's flags aside). Run in
    # a classic BPF interpreter of this test's own, on the program as packed (each instruction: code, jt, jf, k)
    import struct
    arch, _, refused = course_worker.AUDIT_ARCHES['x86_64']
    prog = course_worker.refusing_filter(arch, refused.values(), course_worker.SOCKETPAIR['x86_64'])
    ops = [struct.unpack('=HBBI', prog[i:i + 8]) for i in range(0, len(prog), 8)]

    def run(nr, call_arch, *args):
        data, pc, a = struct.pack('=iIQ6Q', nr, call_arch, 0, *args, *[0] * (6 - len(args))), 0, 0
        while True:
            code, jt, jf, k = ops[pc]
            pc += 1
            if code == 0x20:
                a = struct.unpack('=I', data[k:k + 4])[0]
            elif code == 0x54:
                a &= k
            elif code in (0x15, 0x35):
                pc += jt if (a == k if code == 0x15 else a >= k) else jf
            elif code == 0x06:
                return 'allow' if k == 0x7fff0000 else 'EPERM' if k == 0x00050001 else hex(k)
            else:
                raise AssertionError(f'unknown instruction {code:#x}')
    for name, nr in refused.items():
        assert run(nr, arch) == 'EPERM', name
    for nr in (0, 1, 9, 56, 57, 59, 231, 444):   # read, write, mmap, clone, fork, execve, exit_group, landlock
        assert run(nr, arch) == 'allow', nr
    AF_UNIX, SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET, SOCK_CLOEXEC = 1, 1, 2, 5, 0x80000
    assert run(53, arch, AF_UNIX, SOCK_STREAM) == run(53, arch, AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC) == 'allow'
    assert run(53, arch, AF_UNIX, SOCK_DGRAM) == run(53, arch, AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC) == 'EPERM'
    assert run(356, 0x40000003) == run(3, 0x40000003) == 'EPERM'   # i386: memfd_create, and read itself
    assert run(course_worker.X32 | 319, arch) == run(course_worker.X32 | 0, arch) == 'EPERM'


def notes_of(stdout, sandbox):
    """The note lines a grading printed, less the memory cgroup's clause (course_grader.memory_lost: said where no
    cgroup can be made, as on a machine where the tests do not run as root), which the tests of a cgroup check."""
    clause = course_grader.memory_lost(sandbox)
    lines = [line for line in stdout.split('\n') if line.startswith('note: ')]
    if clause:
        lines = [line.replace(f'; and {clause}', '').replace(f'note: {clause}', 'note: ') for line in lines]
    return [line for line in lines if line != 'note: ']


def skip_unless_it_runs(sandbox):
    """Skip where this machine cannot run the sandbox: the uid sandbox needs root, bubblewrap its program."""
    import shutil
    if sandbox.startswith('uid') and os.geteuid() != 0:
        pytest.skip('the uid sandbox runs as root')
    if sandbox == 'bubblewrap' and not shutil.which('bwrap'):
        pytest.skip('bubblewrap is not installed here')


@pytest.mark.slow
@pytest.mark.parametrize('sandbox', ['bubblewrap', 'uid'])
def test_a_student_who_holds_memory_or_ipc_is_told_and_the_class_is_unchanged(handouts, tmp_path, reachable, sandbox):
    # graded (--jobs 2, from a kit only root can read) beside honest students: a student who makes memfd files of
    # memory the limits do not count, and one who makes System V shared memory for a neighbour to read, are
    # refused at the call (the feedback names the error and the line), and nothing is said at the start (seccomp
    # works here); the honest keep every mark
    skip_unless_it_runs(sandbox)
    attacks = {
        'memfd': """    import os
    fds = [os.memfd_create('held%%d' %% i) for i in range(4)]
    for fd in fds:
        os.write(fd, b'x' * 2 ** 20)
    raise RuntimeError('held: %%d MB' %% len(fds))
""",
        'shm': """    import ctypes
    got = ctypes.CDLL(None, use_errno=True).shmget(0x5eed, 4096, 0o1000 | 0o666)
    raise RuntimeError('shmget: %%d errno %%d' %% (got, ctypes.get_errno()))
"""}
    out, base = tmp_path / 'out', tmp_path / 'class'   # (the class where only root can read it; TMPDIR reachable)
    base.mkdir()
    root = hostile_class(handouts, base, out, attacks, file_attacks=(), names=False, links=False, pairs=False)
    kit = kit_copy(str(private_folder(tmp_path)))
    p = subprocess.run([sys.executable, os.path.join(kit, 'course.py'), 'grade', '5', str(root), '--out', str(out),
                        '--jobs', '2', '--sandbox', sandbox], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, TMPDIR=str(reachable)))
    assert notes_of(p.stdout.split('\nassignment 5')[0], sandbox) == [], p.stdout[:3000]
    rows = {f.name[:-len('.txt')]: f.read_text() for f in out.iterdir() if f.name.endswith('.txt')}
    for name in ('good', 'zz_victim'):
        assert rows.get(name, '').rstrip().endswith('score: 6/6'), (p.stdout[-3000:], p.stderr[-3000:])
    memfd = rows['memfd']
    assert 'PermissionError: [Errno 1] Operation not permitted' in memfd and 'memfd_create' in memfd, memfd
    assert 'held: ' not in memfd and not memfd.rstrip().endswith('score: 6/6'), memfd
    assert 'shmget: -1 errno 1' in rows['shm'] and not rows['shm'].rstrip().endswith('score: 6/6'), rows['shm']
    assert 0x5eed not in [int(line.split()[0]) for line in open('/proc/sysvipc/shm').readlines()[1:] if line.strip()]


# What reaches the machine from a sandbox: a UDP datagram to a port the test listens on, a Unix socket in the file
# system that every user may connect to, and /proc (the grader's command line holds its class and --out folders)
REACH_ATTACKS = {
    'udp': """    import socket
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b'from the sandbox', ('127.0.0.1', %(udp)d))
        said = 'sent'
    except OSError as e:
        said = type(e).__name__
    raise RuntimeError('udp: ' + said)
""",
    'unix_file': """    import socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(%(unix)r)
            s.sendall(b'from the sandbox')
        said = 'connected'
    except OSError as e:
        said = type(e).__name__
    raise RuntimeError('unix: ' + said)
""",
    'procs': """    import glob
    seen = []
    for f in glob.glob('/proc/[0-9]*/cmdline'):
        try:
            seen.append(open(f, 'rb').read().replace(b'\\0', b' ').decode(errors='replace'))
        except OSError:
            pass
    others = [c for c in seen if 'course_worker.py' not in c]
    raise RuntimeError('procs: %%d others: %%d out: %%s' %% (len(seen), len(others), any(%(out)r in c for c in seen)))
""",
}


# A container's seccomp filter that refuses unshare with EPERM, as Docker's default profile does without
# CAP_SYS_ADMIN: the command it starts (argv), and every process that command starts, cannot make namespaces
NO_NAMESPACES = seccomp_then_exec(r"""nr = {'x86_64': 272, 'aarch64': 97}[platform.machine()]   # unshare
prog = op(0x20, 0) + op(0x15, nr, 0, 1) + op(0x06, 0x00050000 | 1) + op(0x06, 0x7fff0000)
""")


@pytest.mark.slow
@pytest.mark.parametrize('sandbox', ['bubblewrap', 'uid', 'uid without namespaces'])
def test_no_student_reaches_the_machine_by_udp_unix_sockets_or_proc(handouts, tmp_path, reachable, sandbox):
    # graded (--jobs 2, from a kit only root can read) beside honest students: a datagram sent to a UDP port the test
    # listens on never arrives, a Unix socket the test listens on in /tmp (mode 0777: every user may connect) is never
    # connected to (seccomp refuses every socket), and /proc shows no process but the sandbox's own (bubblewrap's, or
    # the uid sandbox's namespaces: no --out folder in any command line). Where namespaces cannot be made (a
    # container's seccomp filter refuses unshare, as here), grading says so first, in one line that names what
    # stays open: /proc, which the prober then reads; the datagram and the socket stay refused. The honest keep
    # every mark
    import secrets
    import socket
    skip_unless_it_runs(sandbox)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(('127.0.0.1', 0))
    path = f'/tmp/rd-attnres-test-{secrets.token_hex(4)}.sock'
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(path)
    os.chmod(path, 0o777)
    unix.listen()
    out, base = tmp_path / 'out', tmp_path / 'class'
    base.mkdir()
    try:
        root = hostile_class(handouts, base, out, REACH_ATTACKS, file_attacks=(), names=False, links=False, pairs=False,
                             more={'udp': udp.getsockname()[1], 'unix': path})
        kit = kit_copy(str(private_folder(tmp_path)))
        wrap = [sys.executable, '-c', NO_NAMESPACES] if sandbox == 'uid without namespaces' else []
        p = subprocess.run([*wrap, sys.executable, os.path.join(kit, 'course.py'), 'grade', '5', str(root), '--out',
                            str(out), '--jobs', '2', '--sandbox', sandbox.split()[0]], capture_output=True, text=True,
                           timeout=600, env=dict(os.environ, TMPDIR=str(reachable)))
        udp.setblocking(False)
        unix.setblocking(False)
        with pytest.raises(BlockingIOError):
            udp.recv(100)
        with pytest.raises(BlockingIOError):
            unix.accept()
    finally:
        udp.close()
        unix.close()
        os.remove(path)
    notes = notes_of(p.stdout, sandbox.split()[0])
    if sandbox == 'uid without namespaces':
        said = course_grader.what_is_lost('uid', course_worker.landlock_abi(), '', '', 'Operation not permitted')
        assert notes == [f'note: {said}'] and p.stdout.startswith(notes[0]), p.stdout[:3000]
    else:
        assert notes == [], p.stdout[:3000]
    rows = {f.name[:-len('.txt')]: f.read_text() for f in out.iterdir() if f.name.endswith('.txt')}
    for name in ('good', 'zz_victim'):
        assert rows.get(name, '').rstrip().endswith('score: 6/6'), (p.stdout[-3000:], p.stderr[-3000:])
    assert 'udp: PermissionError' in rows['udp'] and 'unix: PermissionError' in rows['unix_file'], rows
    procs = re.search(r'procs: (\d+) others: (\d+) out: (\w+)', rows['procs'])
    assert procs, rows['procs']
    if sandbox == 'uid without namespaces':   # (what the note says stays open)
        assert int(procs.group(2)) > 0 and procs.group(3) == 'True', rows['procs']
    else:
        assert int(procs.group(1)) > 0 and procs.group(2) == '0' and procs.group(3) == 'False', rows['procs']
    for name in REACH_ATTACKS:
        assert rows[name].rstrip().endswith('score: 0/6') and 'Traceback' not in rows[name], rows[name]


def test_where_a_mechanism_is_missing_the_grader_says_what_each_sandbox_loses(monkeypatch):
    # where Landlock, the worker's seccomp filter or (the uid sandbox) namespaces cannot be used (the probe says why),
    # grading says so first, in one line: a clause per missing mechanism, in that order, each naming what no other
    # mechanism still stops, each loss once. Seccomp alone: memfd memory in both sandboxes, and in the uid sandbox the
    # Unix sockets of the file system (namespaces do not stop them); System V IPC and UDP only where namespaces are
    # missing too; /proc only where namespaces are; bubblewrap has namespaces and tmpfs of its own; a trusted grading
    # says nothing
    lost = course_grader.what_is_lost
    for sandbox in ('bubblewrap', 'uid'):
        said = lost(sandbox, 7, '', 'Invalid argument', '')
        assert '\n' not in said and said.startswith(f'--sandbox {sandbox}: seccomp cannot be used here (Invalid argument)')
        assert 'memfd_create' in said and ('Unix sockets in the file system' in said) == (sandbox == 'uid'), said
        assert 'System V' not in said and 'UDP' not in said and '/proc' not in said, said
    assert lost('bubblewrap', 0, 'Function not implemented', '', 'Operation not permitted') is None
    said = lost('uid', 7, '', '', 'Operation not permitted')
    assert said == ("--sandbox uid: namespaces cannot be used here (Operation not permitted): a submission can see every "
                    "process on the machine in /proc, with its command line (the grader's, with its class and --out "
                    "folders, among them) (COURSE.md, \"Where bubblewrap cannot start\")"), said
    said = lost('uid', 7, '', 'Invalid argument', 'Operation not permitted')
    seccomp, namespaces = said.split('; and ')
    for loss in ('memfd_create', 'System V', 'UDP datagrams', 'Unix sockets in the file system'):
        assert loss in seccomp and loss not in namespaces, loss
    assert '/proc' in namespaces and 'TCP' not in said   # (Landlock ABI 7 stops TCP and abstract sockets)
    assert 'TCP' in lost('uid', 3, '', 'Invalid argument', 'Operation not permitted')   # (before ABI 4 it does not)
    everything = lost('uid', 0, 'Function not implemented', 'Invalid argument', 'Operation not permitted')
    clauses = everything.split('; and ')
    assert [c.split(' cannot be used here')[0] for c in clauses] == ['--sandbox uid: Landlock', '--sandbox uid: seccomp',
                                                                     '--sandbox uid: namespaces']
    assert 'TCP' in clauses[0] and 'abstract Unix sockets' in clauses[0] and 'UDP' in clauses[1]
    for what, _ in course_grader.losses('uid', 0):
        assert everything.count(what) == 1, what
    monkeypatch.setattr(course_grader, 'worker_probe',
                        lambda sandbox: (0, 'Function not implemented', 'Invalid argument', 'Operation not permitted'))
    monkeypatch.setattr(course_grader, 'closed_to_others', lambda path: None)
    monkeypatch.setattr(course_grader, 'memory_cgroups', lambda: (('/sys/fs/cgroup/x', 'memory.max', 'memory.events'), ''))
    assert course_grader.check_sandbox('uid') == everything
    assert course_grader.check_sandbox('none') is None
    monkeypatch.setattr(course_grader, 'worker_probe', lambda sandbox: (7, '', '', ''))
    assert course_grader.check_sandbox('uid') is None and course_grader.check_sandbox('none') is None
    # no memory cgroup (not root, or no controller to make one in): said, after the rest, never for trusted code
    monkeypatch.setattr(course_grader, 'memory_cgroups', lambda: (None, 'only root can make them'))
    assert course_grader.check_sandbox('uid') == ("--sandbox uid: a memory cgroup cannot be made here (only root can "
                                                  "make them): a submission can hold 4 GB in each of 64 processes "
                                                  "(COURSE.md, \"The sandbox\")")
    assert course_grader.check_sandbox('none') is None


def stealer(read):
    """Assignment 5's two regions that run the instructor's compare.py, its source got by `read` (an expression):
    full marks where the source can be read, else the error of the read."""
    load = [f'    source = {read}', "    stolen = {'__name__': 'stolen'}", '    exec(compile(source, "stolen", "exec"), stolen)']
    return {'compare.py': [load + ['    p = stolen["sign_test_p"](wins, n)'], load + ['    return stolen["paired_stats"](deltas)']]}


@pytest.mark.slow
def test_the_uid_sandbox_reads_no_file_outside_the_system_python_and_its_own(handouts, tmp_path, reachable):
    # graded from a kit only root can read, as root under --sandbox uid (Landlock: no read outside the system's
    # folders, Python's and its own): a student who runs the reference from a copy of the project that every user
    # can read, one who reads it from a git repository every user can read (git show), and one graded alone who
    # runs the compare.py of a neighbour every user can read: each earns 0, its feedback naming the refused read,
    # while the honest keep full marks; the neighbour is not touched
    import shutil
    if os.geteuid() != 0:
        pytest.skip('the uid sandbox runs as root')
    assert course_worker.landlock_abi(), "Landlock is not available here: test_without_landlock_the_uid_sandbox_says_what_it_loses holds then"
    copy, repo = reachable / 'copy', reachable / 'repo'
    for folder in (copy, repo):
        folder.mkdir()
        shutil.copyfile(os.path.join(HERE, 'compare.py'), folder / 'compare.py')
    git = dict(os.environ, GIT_AUTHOR_NAME='i', GIT_AUTHOR_EMAIL='i@x', GIT_COMMITTER_NAME='i', GIT_COMMITTER_EMAIL='i@x')
    for cmd in (['init', '-q'], ['add', 'compare.py'], ['commit', '-qm', 'reference']):
        subprocess.run(['git', *cmd], cwd=repo, check=True, env=git)
    os.remove(repo / 'compare.py')   # (only its history holds it)
    subprocess.run(['chmod', '-R', 'a+rX', str(copy), str(repo)], check=True)
    students = {'good': [], 'from_a_copy': stealer(f"open({str(copy / 'compare.py')!r}).read()"),
                'from_git': stealer("__import__('subprocess').run(['git', '-c', 'safe.directory=*', '-C', "
                                    f"{str(repo)!r}, 'show', 'HEAD:compare.py'], capture_output=True, "
                                    "check=True).stdout.decode()")}
    root = make_class(handouts, reachable / 'class', 5, students)
    beside = make_class(handouts, reachable / 'beside', 5, {'neighbour': [], 'alone': stealer(
        f"open({str(reachable / 'beside' / 'class5' / 'neighbour' / 'compare.py')!r}).read()")})
    subprocess.run(['chmod', '-R', 'a+rX', str(beside)], check=True)
    os.chmod(root, 0o700)   # (the class closed to other users, as grading a class asks; the neighbour's folder open)
    neighbours = (beside / 'neighbour' / 'compare.py').read_text()
    kit = kit_copy(str(private_folder(tmp_path)))
    total = sum(c.marks for c in concepts_of(5))
    rows = {}
    for folder, out in ((root, tmp_path / 'out'), (beside / 'alone', tmp_path / 'out_alone')):
        p = subprocess.run([sys.executable, os.path.join(kit, 'course.py'), 'grade', '5', str(folder), '--out', str(out),
                            '--jobs', '2', '--sandbox', 'uid'], capture_output=True, text=True, timeout=900,
                           env=dict(os.environ, TMPDIR=str(reachable)))
        assert p.returncode == 1 and 'Traceback' not in p.stdout + p.stderr, p.stdout[-3000:] + p.stderr[-3000:]
        rows.update({f.name[:-len('.txt')]: f.read_text() for f in out.iterdir() if f.name.endswith('.txt')})
    assert rows['good'].rstrip().endswith(f'score: {total}/{total}'), rows['good']
    for name in ('from_a_copy', 'from_git', 'alone'):
        assert rows[name].rstrip().endswith(f'score: 0/{total}'), (name, rows[name])
    assert 'PermissionError' in rows['from_a_copy'] and 'PermissionError' in rows['alone'], rows
    assert 'CalledProcessError' in rows['from_git'], rows['from_git']   # (git itself refused the repository)
    assert (beside / 'neighbour' / 'compare.py').read_text() == neighbours


# A submission's processes together, each under the address-space limit: `children` forked children each touch
# `mb` MB, then the parent waits and says how each ended (0: it held its memory; 9: the kernel killed it)
HOG = """    import os, time
    kids = []
    for i in range({children}):
        pid = os.fork()
        if pid == 0:
            held = bytearray({mb} * 2 ** 20)
            for j in range(0, len(held), 4096):
                held[j] = 1
            time.sleep(1)
            os._exit(0)
        kids.append(pid)
    ended = [os.waitpid(pid, 0)[1] for pid in kids]
    raise RuntimeError(f"the children's ends: {{ended}}")"""   # (0 held, 9 killed)


def test_a_runs_memory_cgroup_bounds_all_its_processes_together():
    # where a memory cgroup can be made (root, cgroup v1 or v2 with a memory controller to make one in), a run's
    # processes together hold at most its limit: three children of 400 MB under a limit of 512 MB, each far under
    # the address-space limit, are not all let through; the kernel's kill is seen, and the cgroup goes with the run
    where, why_not = course_grader.memory_cgroups()
    if not where:
        pytest.skip(f"no memory cgroup can be made here ({why_not}): grading says so "
                    "(test_where_a_mechanism_is_missing_the_grader_says_what_each_sandbox_loses)")
    cgroup = course_grader.MemoryCgroup(where, 512 * 2 ** 20)
    try:
        code = 'def hog():\n' + HOG.format(children=3, mb=400) + '\nhog()\n'
        p = subprocess.run(cgroup.wrap([sys.executable, '-I', '-S', '-c', code]), capture_output=True, text=True,
                           timeout=120)
        assert re.search(r"the children's ends: \[[0-9, ]*\b9\b", p.stderr) and cgroup.out_of_memory(), p.stderr[-2000:]
    finally:
        cgroup.remove()
    assert not os.path.exists(cgroup.path)


@pytest.mark.slow
@pytest.mark.parametrize('sandbox', ['bubblewrap', 'uid'])
def test_a_student_whose_processes_hold_more_than_the_memory_limit_together_is_stopped(handouts, tmp_path, reachable,
                                                                                          sandbox):
    # graded (--jobs 2, from a kit only root can read) beside honest students: a submission that forks three
    # children of 1.6 GB each (each under the 4 GB address-space limit, 4.8 GB together) is stopped by its memory
    # cgroup: a child is killed, or the worker with it (the feedback says its processes held more than 4 GB); the
    # honest keep every mark
    skip_unless_it_runs(sandbox)
    if not course_grader.memory_cgroups()[0]:
        pytest.skip(f"no memory cgroup can be made here ({course_grader.memory_cgroups()[1]}): grading says so")
    students = {'good': [], 'hog': {'compare.py': [['    p = 1.0'], [HOG.format(children=3, mb=1600)]]}, 'also_good': []}
    p, rows = graded_class(handouts, tmp_path, reachable, 5, students, sandbox)
    assert notes_of(p.stdout, sandbox) == [] and 'memory cgroup' not in p.stdout, p.stdout[:2000]   # (one is made here)
    total = sum(c.marks for c in concepts_of(5))
    for name in ('good', 'also_good'):
        assert rows[name].rstrip().endswith(f'score: {total}/{total}'), (name, rows[name])
    hog = rows['hog']
    assert hog.rstrip().endswith(f'score: 0/{total}') and "the children's ends: [0, 0, 0]" not in hog, hog
    assert re.search(r"the children's ends: \[[0-9, ]*\b9\b", hog) or \
        'its processes together held more than 4 GB of memory' in hog, hog


def graded_class(handouts, tmp_path, reachable, n, students, sandbox):
    """A class of handout n (make_class's students) graded with --jobs 2 in `sandbox`, as root from a kit only root
    can read: (the finished process, {student: feedback}), once it ended with a 0 to someone and no traceback."""
    root, out = make_class(handouts, tmp_path / 'class', n, students), tmp_path / 'out'
    kit = kit_copy(str(private_folder(tmp_path)))
    p = subprocess.run([sys.executable, os.path.join(kit, 'course.py'), 'grade', str(n), str(root), '--out', str(out),
                        '--jobs', '2', '--sandbox', sandbox], capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, TMPDIR=str(reachable)))
    assert p.returncode == 1 and 'Traceback' not in p.stdout + p.stderr, p.stdout[-3000:] + p.stderr[-3000:]
    return p, {f.name[:-len('.txt')]: f.read_text() for f in out.iterdir() if f.name.endswith('.txt')}


def private_folder(tmp_path):
    """A folder only its owner can enter, as `mktemp -d` makes (or root's home)."""
    folder = tmp_path / 'private'
    folder.mkdir()
    os.chmod(folder, 0o700)
    return folder


@pytest.mark.slow
def test_uid_grading_names_the_folder_its_user_cannot_enter(handouts, reachable, tmp_path):
    # the uid sandbox's user must reach Python and the temporary folder the grading tree is made in: where it
    # cannot, grading refuses at start, naming the folder, and Gradescope's results.json says so with its
    # max_score; following the advice (chmod o+x) lets the same command grade
    root = make_class(handouts, reachable, 5, {'good': []})
    temp = private_folder(reachable)
    results = reachable / 'results.json'
    kit = kit_copy(str(private_folder(tmp_path)))   # (the instructor's kit where only root can read it)
    command = [sys.executable, os.path.join(kit, 'course.py'), 'grade', '5', str(root / 'good'), '--sandbox', 'uid',
               '--gradescope', str(results)]
    p = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, TMPDIR=str(temp)), timeout=600)
    said = json.load(open(results))
    assert p.returncode == 1 and said['score'] == 0 and said['max_score'] == 6 and said['tests'] == []
    assert 'Traceback' not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    if os.geteuid() != 0:   # (the uid sandbox needs root)
        assert 'only root can do' in p.stderr and 'only root can do' in said['output']
        return
    assert f"cannot enter {temp}," in p.stderr and f"chmod o+x {temp}" in said['output'], p.stderr
    os.chmod(temp, 0o701)   # the advice
    p = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, TMPDIR=str(temp)), timeout=600)
    said = json.load(open(results))
    assert p.returncode == 0 and said['score'] == said['max_score'] == 6, p.stdout[-2000:] + p.stderr[-2000:]
    # a kit that every user can read (a checkout cloned with umask 022): the sandbox's user could read the
    # reference and the hidden checks, so grading refuses, naming them and what to do; doing it (chmod 700 on
    # the kit's folder, as run_autograder does) grades
    shared_kit = reachable / 'kit'
    kit_copy(str(shared_kit))
    for d, dirs, files in os.walk(shared_kit):
        for x in dirs + files:
            os.chmod(os.path.join(d, x), 0o755 if x in dirs else 0o644)
    os.chmod(shared_kit, 0o755)
    command[1] = str(shared_kit / 'course.py')
    p = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, TMPDIR=str(temp)), timeout=600)
    said = json.load(open(results))
    assert p.returncode == 1 and said['score'] == 0 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "could read the instructor's files (course_kit/grader.py" in said['output'] and 'compare.py' in said['output']
    assert f'chmod -R o-rwx {shared_kit}' in p.stderr, p.stderr
    os.chmod(shared_kit, 0o700)
    p = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, TMPDIR=str(temp)), timeout=600)
    assert p.returncode == 0 and json.load(open(results))['score'] == 6, p.stdout[-2000:] + p.stderr[-2000:]


@pytest.mark.slow
def test_the_tests_that_run_as_another_user_pass_from_a_private_checkout(tmp_path):
    # a clone in a folder only its owner can enter (mktemp -d, root's home): the tests that run the project as
    # another account (a normal account's grading, the uid sandbox's Gradescope run) pass from there, and leave
    # every folder they opened closed again
    import shutil
    private = private_folder(tmp_path)
    checkout = private / 'rd-attnres'
    shutil.copytree(HERE, checkout, ignore=shutil.ignore_patterns(
        '.git', '.venv', 'venv', 'data', 'out*', '__pycache__', '.pytest_cache', 'runs', 'results', 'docs'))
    import tempfile
    before = {p: os.stat(p).st_mode for p in (str(private), os.path.dirname(sys.executable), tempfile.gettempdir())}
    p = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                        'tests/test_course.py', '-k', 'test_grading_from_a_normal_account or '
                        '(test_the_gradescope_autograder_grades_one_submission_per_run and uid) or '
                        'test_uid_grading_names_the_folder_its_user_cannot_enter'],
                       cwd=checkout, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0 and re.search(r'^3 passed', p.stdout, re.M), p.stdout[-3000:] + p.stderr[-3000:]
    assert {p: os.stat(p).st_mode for p in before} == before


@pytest.mark.slow
def test_without_a_sandbox_grading_refuses_unless_trusted(handouts, tmp_path, monkeypatch):
    root = make_class(handouts, tmp_path, 5, {'good': []})
    monkeypatch.setattr(course_grader.shutil, 'which', lambda name: None)
    with pytest.raises(SystemExit, match='apt-get install bubblewrap'):
        course.grade(5, str(root))
    rows = dict(course.grade(5, str(root), trusted=True))
    assert rows['good']['score'] == rows['good']['total']


@pytest.mark.slow
def test_grading_holds_on_a_busy_machine(handouts, tmp_path, monkeypatch):
    # the limits are CPU time, not wall time: an honest class graded while every core is busy. The wall-clock
    # backstops (start-up, twice the CPU time) are set far past what any load makes of an honest run's few
    # seconds, so the assertion is decided by the CPU-time limits alone, never by how busy the machine is
    monkeypatch.setattr(course_grader, 'STARTUP', 900.0)
    root = make_class(handouts, tmp_path, 5, {'good': []})
    burners = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(2 * (os.cpu_count() or 2))]
    try:
        rows = dict(course.grade(5, str(root), limit=300))
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert rows['good']['score'] == rows['good']['total'], rows['good']['feedback']


STUBBED = {1: [('model', None, 'read_sources')], 2: [('model', 'DepthRead', 'pseudo_queries'), ('model', 'Block', 'attn_inputs')],
           3: [('model', 'GPT', 'forward_depth_routed')], 4: [('train', None, 'step_windows')],
           5: [('compare', None, 'sign_test_p'), ('compare', None, 'paired_stats')]}


@pytest.mark.slow
def test_no_function_in_a_handout_passes_the_assignment_it_stubs(handouts, monkeypatch, tmp_path):
    # every function of a handout's Python files, put in place of one function it stubs (same number of
    # parameters; the assignment's other functions stubbed as in the handout), must fail every concept:
    # the release ships no other way to an answer
    monkeypatch.chdir(tmp_path)   # (a candidate may write files where it runs: the test's folder, not the project)
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
    assert [meta for _, meta in course_worker.read_answers(stream, 9)] == [{'results': [{'ok': True}]},
                                                                           {'results': [{'ok': False, 'error': 'E'}]}]
    assert len(course_worker.read_answers(stream * 1000, 3)) == 3   # no more read than the concepts asked
    cut = course_worker.read_answers(stream[:-5], 9)       # the process ended while writing the second
    assert len(cut) == 1 and torch.equal(cut[0][0]['0/h'], torch.ones(3))
    for bad in (b'', b'\x00' * 3, (2 ** 60).to_bytes(8, 'little') + b'x', b'\xff' * 64):
        assert course_worker.read_answers(bad, 9) == []
    garbled = frames[0] + frames[1][:8] + b'{' * (len(frames[1]) - 8)
    assert len(course_worker.read_answers(garbled, 9)) == 1
    # a well-formed answer whose header is huge (parsed, gigabytes of the grader's memory) is not read
    huge = course_worker.frame({}, {'results': [[]] * (course_worker.MAX_ANSWER_HEADER // 3)})
    assert len(course_worker.read_answers(frames[0] + huge + frames[1], 9)) == 1
    concept = course_grader.concepts(5)[0]                 # answers that are not one result per probe
    assert course_grader.judge(concept, ({}, {'results': 'all passed'}), 0) == \
        (False, ["the code's answers could not be read"])
    # a tensor keyed without a probe's index ('<index>/<name>') is a wrong answer, not a grader failure
    concept = course_grader.concepts(1)[0]
    passed, lines = course_grader.judge(concept, ({'0': torch.zeros(1)}, {'results': [{'ok': True, 'values': {}}] * len(concept.probes)}), 0)
    assert not passed and lines


def test_help_exits_zero():
    p = subprocess.run([sys.executable, os.path.join(HERE, 'course.py'), '--help'], capture_output=True, text=True)
    assert p.returncode == 0 and 'grade' in p.stdout


@pytest.mark.slow
def test_course_md_agrees_with_the_kit():
    # COURSE.md's marks per concept are the grader's, and its table's count of public tests is pytest's
    text = open(os.path.join(HERE, 'COURSE.md')).read()
    students = text.split(course.INSTRUCTORS_PART)[0]
    for n in course.ASSIGNMENTS:
        section = students.split(f'\n### {n}. ')[1].split('\n### ')[0].split('\n## ')[0]
        said = [int(m) for m in re.findall(r'\*[^*]+\*\s+\((\d+)', section.split('Concepts:')[1])]
        assert said == [c.marks for c in concepts_of(n)], (n, said)
        row = re.search(rf'^\| {n} \|.*$', students, re.M).group(0).split('|')
        p = subprocess.run([sys.executable, '-m', 'pytest', '--collect-only', '-q', '-p', 'no:cacheprovider', '-m',
                            f'assignment{n} and not hidden', *course.test_files(n, HERE)], cwd=HERE,
                           capture_output=True, text=True)
        collected = int(re.search(r'(\d+)/\d+ tests collected', p.stdout).group(1))
        assert int(row[5]) == collected, (n, row[5], collected)


GRADESCOPE_ATTACK = """    import glob, os, subprocess, sys
    found = [f for f in glob.glob(%(root)r + '/source/*') if os.access(f, os.R_OK)]
    try:
        open(%(root)r + '/results/results.json', 'w').write('{"score": 6}')
        found.append('results written')
    except OSError:
        pass
    for f in glob.glob('/proc/*/environ'):
        try:
            if 'SECRET' in open(f, errors='replace').read():
                found.append(f)
        except OSError:
            pass
    try:
        subprocess.Popen(['sleep', '30', 'rdattnres-gradescope-lingerer'], start_new_session=True)
    except OSError:
        pass
    raise RuntimeError('found: ' + repr(found))
"""


@pytest.mark.slow
@pytest.mark.parametrize('sandbox', ['bubblewrap', 'uid'])
def test_the_gradescope_autograder_grades_one_submission_per_run(handouts, tmp_path, sandbox, reachable):
    # the zip, unpacked into a fake /autograder (AUTOGRADER_ROOT), its run_autograder run once per submission as
    # Gradescope would: an honest, a wrong and an attacking submission each get the right results.json
    import zipfile
    zip_path = tmp_path / 'autograder.zip'
    if sandbox == 'uid' and os.geteuid() != 0:   # (the uid sandbox needs root, as Gradescope's container has)
        with pytest.raises(SystemExit, match='only root can do'):
            course.grade(5, str(handouts / 'h5'), sandbox='uid')
        return
    assert course.main(['autograder', '5', str(zip_path), '--sandbox', sandbox]) == 0
    names = set(zipfile.ZipFile(zip_path).namelist())
    assert names == {'setup.sh', 'run_autograder', *course.AUTOGRADER_FILES}
    assert 'torch==' in zipfile.ZipFile(zip_path).read('setup.sh').decode()
    wrong = [m for a, name, m, _ in PLANTED if name == 'sd over n'][0]
    for who, mistakes in (('honest', []), ('wrong', wrong), ('attacker', None)):
        root = tmp_path / who
        zipfile.ZipFile(zip_path).extractall(root / 'source')
        os.chmod(root / 'source' / 'run_autograder', 0o755)
        student = make_class(handouts, tmp_path / f'{who}_class', 5, {'me': mistakes if mistakes is not None else []})
        (root / 'submission').mkdir()
        text = (student / 'me' / 'compare.py').read_text()
        if who == 'attacker':
            lines = text.split('\n')
            begins = [i for i, line in enumerate(lines) if line.strip() == '### BEGIN YOUR CODE (assignment 5)']
            ends = [i for i, line in enumerate(lines) if line.strip() == '### END YOUR CODE (assignment 5)']
            lines[begins[1] + 1:ends[1]] = (GRADESCOPE_ATTACK % {'root': str(root)}).rstrip('\n').split('\n')
            text = '\n'.join(lines)
        (root / 'submission' / 'compare.py').write_text(text)
        p = subprocess.run(['bash', str(root / 'source' / 'run_autograder')], capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, AUTOGRADER_ROOT=str(root), AUTOGRADER_PYTHON=sys.executable,
                                    COURSE_SECRET='hunter2'))
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        results = json.load(open(root / 'results' / 'results.json'))
        assert results['max_score'] == 6 and len(results['tests']) == 3
        if who == 'honest':
            assert results['score'] == 6, results
        elif who == 'wrong':
            assert 0 < results['score'] < 6 and 'sd is not what it should be' in json.dumps(results)
        else:
            assert results['score'] == 0 and 'found: []' in json.dumps(results), results
    # (its sandbox ends it before run_autograder returns; a generous bound for a busy machine to reap it)
    assert gone(lambda: lingering('rdattnres-gradescope-lingerer'), 60), lingering('rdattnres-gradescope-lingerer')


@pytest.mark.slow
def test_a_bad_submission_file_is_not_graded_or_graded_as_what_it_is(tmp_path):
    handout = tmp_path / 'handout'
    course.handout(1, str(handout))
    good = (handout / 'model.py').read_text()
    cases = {'missing': None, 'empty': b'', 'markers removed': good.replace('### BEGIN YOUR CODE', '# ').encode(),
             'not UTF-8': good.replace('raise NotImplementedError', 'x = "caf\udce9"; raise NotImplementedError')
                              .encode('utf-8', 'surrogateescape')}
    for name, content in cases.items():
        sub = tmp_path / name.replace(' ', '_')
        sub.mkdir()
        if content is not None:
            (sub / 'model.py').write_bytes(content)
        tree = tmp_path / f'tree_{sub.name}'
        problem, _ = course.grading_tree(1, str(sub), str(tree))
        if name == 'not UTF-8':   # read with a replacement character: graded as the code it is
            assert problem is None and 'x = "caf\ufffd"' in (tree / 'model.py').read_text()
        elif name == 'missing':
            assert problem == 'model.py is missing from the submission'
        else:
            assert "regions were found: put the markers back" in problem, (name, problem)
    # a hard link hands in another student's file as a symbolic one would: neither name of it is graded, and
    # neither is blamed (which of the two made it cannot be told): flagged for the instructor
    (tmp_path / 'victim').mkdir()
    (tmp_path / 'victim' / 'model.py').write_text(good)
    (tmp_path / 'copier').mkdir()
    os.link(tmp_path / 'victim' / 'model.py', tmp_path / 'copier' / 'model.py')
    for who in ('copier', 'victim'):
        problem, _ = course.grading_tree(1, str(tmp_path / who), str(tmp_path / f'tree_{who}'))
        assert isinstance(problem, course.Flagged) and problem.startswith('model.py is a hard link (one file with 2 names')


INSTRUCTOR_NAMES = {os.path.basename(f.rstrip('/')) for f in course.INSTRUCTOR_ONLY} | {'grader.py', 'worker.py'}


def is_the_projects(top):
    """Whether a top-level import names the project's code (a module or package of this repository), or
    nothing that can be imported at all (a name left behind by a move): not the standard library's, not
    an installed package's."""
    import importlib.util
    if top in sys.stdlib_module_names:
        return False
    spec = importlib.util.find_spec(top)
    where = spec and (spec.origin or next(iter(spec.submodule_search_locations or []), None))
    where = os.path.abspath(where or '')
    return spec is None or where.startswith(HERE + os.sep) and 'site-packages' not in where.split(os.sep)


@pytest.mark.slow
def test_a_handout_is_a_working_project(handouts):
    # the release (every handout holds the same files): its whole test suite collects, every project module its
    # code imports is in it, and every code file its pages name is in it (the instructor's kit, named as such,
    # apart). That each of its tests passes or fails with a stub's message: run its suite (COURSE.md).
    import ast
    import fnmatch
    folder = handouts / 'h1'
    files = {os.path.relpath(os.path.join(d, f), folder) for d, _, names in os.walk(folder) for f in names}
    modules = {f[:-3].replace('/', '.') for f in files if f.endswith('.py')} | {os.path.basename(f)[:-3] for f in files
                                                                                if f.endswith('.py')}
    for f in files:
        if f.endswith('.py'):
            for node in ast.walk(ast.parse(open(folder / f).read())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
                for name in names:
                    top = name.split('.')[0]
                    if is_the_projects(top) and not (f == 'course.py' and top == 'course_kit'):   # (the instructor's)
                        assert name in modules or f'{name}.__init__' in modules, \
                            f"{f} imports {name}, which the handout does not hold"
        if f.endswith('.md'):
            for named in re.findall(r'[\w./*-]+\.(?:py|sh)\b', open(folder / f).read()):   # (a name or a glob)
                assert named.startswith(course.INSTRUCTOR_ONLY) or os.path.basename(named) in INSTRUCTOR_NAMES or any(
                    fnmatch.fnmatch(g, named) or fnmatch.fnmatch(g, '*/' + named) or fnmatch.fnmatch(os.path.basename(g), named)
                    for g in files), f"{f} names {named}"
    p = subprocess.run([sys.executable, '-m', 'pytest', '--collect-only', '-q', '-p', 'no:cacheprovider'], cwd=folder,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and 'error' not in p.stdout.split('\n')[-2].lower(), p.stdout[-3000:]


# -----------------------------------------------------------------------------
# The grader's pure functions: fast (no subprocess, no sandbox), so that a regression fails the fast tier

def test_student_text_is_shown_inert_on_a_terminal_and_in_a_spreadsheet():
    assert course_grader.shown('a\nb\x1b[2J\u202e\\') == 'a\\nb\\x1b[2J\\u202e\\\\'
    assert course_grader.shown('x' * 10, 4) == 'xxxx...'
    assert course_grader.student_said('score: 6/6\n') == '[from the submission: score: 6/6\\n]'
    for cell in ('=SUM(A1)', '@SUM(1)', '+1', '-2+3', '\tx', '\rx'):
        assert course_grader.spreadsheet_cell(cell) == "'" + cell
    assert course_grader.spreadsheet_cell('alice') == 'alice' and course_grader.spreadsheet_cell(-3) == -3
    # a name that prints like another: escaped, and said why
    assert course_grader.shown_name('\u212aim') == '\\u212aim' and 'compatibility' in course_grader.name_note('\u212aim')
    assert course_grader.skeleton('v\u0456\u0441tim') == course_grader.skeleton('Victim') == 'victim'
    assert course_grader.shown_name('Victim', lookalikes=True) == 'Victim'


def test_names_that_print_alike_are_flagged_beyond_the_table(tmp_path):
    # a look-alike letter the table does not list (the dotless i, Armenian oh) in a name otherwise another's: both
    # flagged, each shown with its non-ASCII letter escaped and files of its own; two names of another script of
    # one length (two Chinese names) and an honest accented name beside a plain other are not taken as alike
    alike = [('victim', 'v\u0131ctim'), ('bob', 'b\u0585b'), ('alice', 'ali\u034fce'), ('maria', 'mar\u115fia'),
             ('mila', 'mi\u0307la')]   # (a joiner, a Hangul filler: nothing printed; a combining dot in an NFC name)
    apart = [('\u674e\u660e', '\u738b\u660e'), ('Ren\u00e9', 'Mark'), ('ann', '\u738b\u5c0f\u660e'),
             ('li', '\u674e\u5a1c')]
    for name in [n for pair in alike + apart for n in pair]:
        (tmp_path / name).mkdir()
        (tmp_path / name / 'compare.py').write_text('')
    subs, _ = course.submissions_in(5, str(tmp_path), 'class')
    notes = {os.path.basename(path): note for _, path, _, note, _ in subs}
    for a, b in alike:
        assert f"prints like another student's name: {course_grader.shown_name(b, lookalikes=True)}" in notes[a], notes
        assert "prints like another student's name" in notes[b], notes
    for a, b in apart:
        assert 'prints like' not in notes[a] + notes[b], notes
    shown = {os.path.basename(path): name for name, path, _, _, _ in subs}
    for name in (b for _, b in alike):   # (each printed with what tells it apart escaped)
        assert shown[name] == course_grader.shown(name).encode('ascii', 'backslashreplace').decode(), shown
    assert 'print as nothing' in notes['ali\u034fce'] and 'combining marks' in notes['mi\u0307la'], notes
    assert shown['\u738b\u5c0f\u660e'] == '\u738b\u5c0f\u660e', shown   # (another script, not escaped)
    files = course.file_names([sub[0] for sub in subs], [sub[4] for sub in subs])
    assert len({f.casefold() for f in files}) == len(files) and 'victim' not in files and 'bob' not in files, files


def test_the_secret_files_include_their_bytecode_and_the_repositorys_history(tmp_path):
    # what --sandbox uid checks closed before grading (course.secret_files): a file that holds the reference, its
    # bytecode in __pycache__ (the same code), and every file of the repository's .git (git show HEAD:compare.py),
    # also where .git is a worktree's or a submodule's pointer to a folder elsewhere, with its common folder
    import shutil
    kit, other = tmp_path / 'kit', tmp_path / 'other'
    for root in (kit, other):
        (root / '__pycache__').mkdir(parents=True)
        shutil.copyfile(os.path.join(HERE, 'compare.py'), root / 'compare.py')
    (kit / '__pycache__' / 'compare.cpython-311.pyc').write_bytes(b'')
    (kit / '__pycache__' / 'prepare.cpython-311.pyc').write_bytes(b'')   # (not a secret file's)
    (kit / '.git' / 'objects' / 'pack').mkdir(parents=True)
    (kit / '.git' / 'objects' / 'pack' / 'pack-1.pack').write_bytes(b'')
    (kit / '.git' / 'worktrees' / 'w').mkdir(parents=True)
    (kit / '.git' / 'worktrees' / 'w' / 'commondir').write_text('../..\n')
    (other / '.git').write_text(f"gitdir: {kit / '.git' / 'worktrees' / 'w'}\n")
    secrets = course.secret_files(str(kit))
    assert str(kit / 'compare.py') in secrets and str(kit / '__pycache__' / 'compare.cpython-311.pyc') in secrets
    assert str(kit / '__pycache__' / 'prepare.cpython-311.pyc') not in secrets
    assert str(kit / '.git' / 'objects' / 'pack' / 'pack-1.pack') in secrets, secrets
    assert str(kit / '.git' / 'objects' / 'pack' / 'pack-1.pack') in course.secret_files(str(other))


def test_a_message_is_whole_or_cut_at_a_word():
    stub = course.not_written(5)
    assert max(len(course.not_written(k)) for k in course.ASSIGNMENTS) > 300   # (once cut at 160 characters mid-sentence)
    assert course_grader.cut_at_word(stub, course_grader.MESSAGE) == stub
    cut = course_grader.cut_at_word('alpha beta gamma delta', 13)
    assert cut == 'alpha beta ...'
    assert course_grader.cut_at_word('x' * 50, 10) == 'x' * 10 + ' ...'   # (no space to cut at)
    # the stub's whole message reaches the feedback: judge on a worker's answer that raised it
    concept = course_grader.concepts(5)[0]
    error = f"NotImplementedError: {stub}"
    passed, lines = course_grader.judge(concept, ({}, {'results': [{'ok': False, 'error': error, 'where': ''}] * 2}), 0)
    assert not passed and course_grader.shown(stub) in lines[0], lines


def test_answers_of_the_wrong_kind_are_said_in_words():
    import torch
    ref = ({'h': torch.zeros(2, 3, dtype=torch.float64)}, {})
    check = course_grader.same_tensors('h')
    assert check(({'h': torch.zeros(2, 3, dtype=torch.float64)}, {}), ref) is None
    assert check(({}, {}), ref) == 'h is missing'
    assert 'should be a tensor of float64' in check(({'h': [0.0]}, {}), ref)
    assert 'should be a tensor of float64' in check(({'h': torch.zeros(2, 3, dtype=torch.complex64)}, {}), ref)
    assert 'has shape (3, 2), not the shape asked for ((2, 3))' in check(({'h': torch.zeros(3, 2)}, {}), ref)
    assert 'differs from the expected values at 1 of 6' in check(({'h': torch.eye(2, 3, dtype=torch.float64)[:1].expand(2, 3) * 0
                                                                      + torch.tensor([[1.0, 0, 0], [0, 0, 0]])}, {}), ref)
    stats = course_grader.close_stats
    want = ({}, {'stats': {'sd': 1.0, 'ci95': [0.0, 1.0]}})
    assert 'should give a dict' in stats(({}, {'stats': [1, 2]}), want)
    assert 'sd should be a number' in stats(({}, {'stats': {'sd': 10 ** 400, 'ci95': [0, 1]}}), want)
    assert 'sd should be a number' in stats(({}, {'stats': {'sd': True, 'ci95': [0, 1]}}), want)
    assert 'ci95 should be a pair of numbers' in stats(({}, {'stats': {'sd': 1.0, 'ci95': 0.0}}), want)
    assert stats(({}, {'stats': {'sd': 1.0, 'ci95': [0, 1]}}), want) is None
    # the hook's record of the reads, forged by the code (it runs in the worker's process): a list where a sublayer
    # or a count should be, a string count, a bool: said as unreadable, never an error of the grader's
    ref = ({'logits': torch.ones(2)}, {'S': 1, 'L': 2, 'calls': [[0, 1, True], [1, 2, True], [2, 3, True]],
                                       'reads': [[0, 'qk', 1], [1, 'mlp', 2], [2, 'final', 3]], 'sublayer_of': {'q': 1}})
    for forged in ([[[0], 1, True]], [[0, '1', True]], [[0, 1.5, True]], [[True, 1, True]], [[0, 1, 1]], 'calls'):
        got = ({'logits': torch.zeros(2)}, {'calls': forged, 'grads': {'q': 'nonzero'}})
        assert course_grader.increments(got, ref).endswith('the record of the reads that ran could not be read')
        assert course_grader.pseudo_queries_learn(got, ref) == 'the gradients could not be read'
    for forged in ([[0, 'qk', [1]]], [[0, 'qk', '1']], [[[0], 'qk', 1]], [[0, 7, 1]]):
        assert course_grader.reads_recorded(({}, {'reads': forged}), ref) == 'the recorded reads could not be read'


def test_the_order_on_any_number_of_processes_is_an_order_of_the_datas_windows():
    # a step's windows that every rank agrees on and that change from step to step, but are no windows of the
    # data (the step's positions themselves, past n_windows): not the concept; the same positions modulo
    # n_windows (a sequential order, rank-independent) are, and their order is the exact order's concept
    anywhere = course_grader.same_anywhere(100)
    ref = ({}, {'alone': list(range(8))})
    past = list(range(96, 104))
    assert anywhere(({}, {'windows': past, 'alone': past, 'next': list(range(104, 112))}), ref) == \
        "a step's windows should be indices of the data's 100 windows (0 to 99)"
    inside = [i % 100 for i in past]
    assert anywhere(({}, {'windows': inside, 'alone': inside, 'next': list(range(4, 12))}), ref) is None


def test_a_nan_answer_is_told_its_value_is_nan():
    import torch
    ref = ({'h': torch.ones(2, 3, dtype=torch.float64)}, {})
    got = torch.ones(2, 3, dtype=torch.float64)
    got[0, 1] = float('nan')
    said = course_grader.same_tensors('h')(({'h': got}, {}), ref)
    assert 'h is NaN at 1 of 6 entries' in said and 'bf16' not in said, said
    # the read under autocast (as_specified): a NaN read is NaN, not "computed in bf16"
    n, r = 4, 2
    inputs = {**course_grader.sources(1, n, dtype=torch.float32), 'w': torch.randn(r, 8)}
    alpha = torch.full((r, 2, 3, n), 1 / n)
    alpha[1] = torch.softmax(torch.arange(n, dtype=torch.float32), -1)
    mixed = torch.einsum('btdn,rbtn->rbtd', torch.stack([inputs[f'x{i}'] for i in range(n)], -1).double(), alpha.double())
    h = mixed.clone()
    h[0, 0, 0, 0] = float('nan')
    answer = {'h': h.float(), 'alpha': alpha, 'h64': h, 'alpha64': alpha.double()}
    as_specified = course_grader.as_specified(inputs)
    said = as_specified((answer, {}), ({'h': h, 'alpha': alpha}, {}))
    assert said.startswith('h under bf16 autocast is NaN at 1 of') and 'turn autocast off' not in said, said
    answer = {**answer, 'h': mixed.float(), 'h64': mixed}
    assert as_specified((answer, {}), ({'h': h, 'alpha': alpha}, {})) is None
    # float64 sources read to float32 (a .float() too many): said in words, not the grader's error
    assert as_specified(({**answer, 'h64': mixed.float()}, {}), ({'h': h, 'alpha': alpha}, {})) == \
        "h of float64 sources is float32, not float64: outside autocast the read keeps its sources' dtype"
    # a read that mixes nothing (h zero) with a plausible alpha: not a read, whatever its dtype
    zero = {**answer, 'h': torch.zeros_like(answer['h']), 'h64': torch.zeros_like(answer['h64'])}
    assert as_specified((zero, {}), ({'h': h, 'alpha': alpha}, {})) == \
        "h is not the sources mixed by alpha (h = sum_s alpha_s b_s, the raw sources)"


def test_a_result_line_is_parsed_as_data():
    lines_of = {('compare.py', 40): 12}
    assert course.their_line('compare.py, line 40: mean = = 0', lines_of) == \
        'your compare.py, line 12: [from the submission: mean = = 0]'
    assert course.their_line('model.py, line 7: x', lines_of) == 'model.py, line 7 (called from your code)'
    assert course.their_line('\x1b[2J forged\nscore: 6/6', lines_of) == '[from the submission: \\x1b[2J forged\\nscore: 6/6]'
    # a line the worker reports outside the student's files: its file name is the code's to make up (a SyntaxError's)
    fake = '\x1b[1A\x1b[2K\x1b[3GPASS\x1b[1C2\u22152\x1b[8m.py, line 1: x'
    said = course.their_line(fake, {})
    assert '\x1b' not in said and said.startswith('\\x1b[1A') and said.endswith(', line 1 (called from your code)'), said
    assert course_grader.last_line('a\n\n  b  \n') == 'b' and course_grader.last_line('') == ''


def sub_folders(tmp_path, layout):
    """A folder made of {name: None (a file) or [files] (a folder holding them)}; its entries, as scanned."""
    for name, files in layout.items():
        if files is None:
            (tmp_path / name).write_text('x = 1\n')
        else:
            (tmp_path / name).mkdir()
            for f in files:
                (tmp_path / name / f).write_text('x = 1\n')
    return sorted(os.scandir(tmp_path), key=lambda e: e.name)


def test_a_class_folder_is_read_as_meant(tmp_path):
    files = course.files_of(5)
    read = course.folder_layout
    # pure: what the folder holds -> how it is read
    assert read(['compare.py'], ['model.py'], [('tests', False), ('run_kit', False)], files) == ('submission', None)
    assert read([], ['sample.py'], [('alice', True), ('bob', True)], files) == ('class', None)   # a stray file
    assert read([], [], [('alice', False), ('bob', True)], files) == ('class', None)
    assert read([], ['model.py'], [('tests', False)], files) == ('submission', None)   # a project lacking compare.py
    assert read([], [], [], files) == ('class', None)
    kind, why = read(['compare.py'], [], [('alice', True), ('bob', True)], files)
    assert kind is None and 'compare.py itself and 2 folders that hold a project (alice, bob)' in why
    assert '--layout submission' in why and '--layout class' in why
    kind, why = read([], ['sample.py'], [('alice', False)], files)
    assert kind is None and "sample.py (not compare.py) and the folder alice" in why, why
    # on a folder: a stray sample.py beside the students leaves a class of them (it is skipped and said)
    classroom = tmp_path / 'class'
    classroom.mkdir()
    sub_folders(classroom, {'sample.py': None, 'alice': ['compare.py'], 'bob': ['compare.py', 'model.py']})
    subs, skipped = course.submissions_in(5, str(classroom))
    assert [s[0] for s in subs] == ['alice', 'bob'] and skipped == ["sample.py: a file, not a student's folder"]
    (classroom / 'compare.py').write_text('x = 1\n')
    with pytest.raises(SystemExit, match='say which was meant'):
        course.submissions_in(5, str(classroom))
    assert [s[0] for s in course.submissions_in(5, str(classroom), 'class')[0]] == ['alice', 'bob']
    assert [s[1] for s in course.submissions_in(5, str(classroom), 'submission')[0]] == [str(classroom)]


def test_a_hard_link_across_two_students_flags_both(tmp_path):
    for name in ('dave', 'zz', 'erin'):
        (tmp_path / name).mkdir()
    (tmp_path / 'dave' / 'compare.py').write_text('x = 1\n')
    (tmp_path / 'erin' / 'compare.py').write_text('x = 1\n')   # (the same text, not the same file: graded)
    os.link(tmp_path / 'dave' / 'compare.py', tmp_path / 'zz' / 'compare.py')
    same = course.same_files([(name, str(tmp_path / name)) for name in ('dave', 'erin', 'zz')], ['compare.py'])
    assert sorted(same) == [0, 2]
    assert same[0].startswith("compare.py is the same file as zz's") and same[2].startswith("compare.py is the same file as dave's")
    assert all(isinstance(why, course.Flagged) for why in same.values())
    # a hard link to a file outside the class: not graded, flagged, not blamed
    with pytest.raises(course.NotHandedIn) as e:
        course.read_handed_in(str(tmp_path / 'dave'), 'compare.py')
    assert e.value.flagged and 'not graded, as it may be another' in str(e.value)


def test_a_nested_upload_is_found_where_it_is(tmp_path):
    up = tmp_path / 'upload'
    (up / 'a' / 'b' / 'c' / 'tests').mkdir(parents=True)
    (up / 'a' / 'b' / 'c' / 'compare.py').write_text('x = 1\n')
    (up / 'a' / 'b' / 'c' / 'tests' / 'test_compare.py').write_text('x = 1\n')
    (up / 'notes').mkdir()
    assert course.files_found(str(up), ['compare.py']) == ['a/b/c/compare.py']
    assert course.locate(5, str(up)) == (str(up / 'a' / 'b' / 'c'), 'a/b/c', None)
    assert course.project_roots(['x/fast_read/two_phase_read.py', 'x/model.py'], ['model.py', 'fast_read/two_phase_read.py']) == ['x']
    subs, said = course.one_upload(5, str(up))
    assert subs[0][1] == str(up / 'a' / 'b' / 'c') and said.startswith('graded the folder a/b/c of your upload (not notes')
    (up / 'old').mkdir()
    (up / 'old' / 'compare.py').write_text('x = 1\n')
    where, found, problem = course.locate(5, str(up))
    assert where == str(up) and found is None
    assert problem.startswith('compare.py is missing from the submission folder itself; found at a/b/c/compare.py, '
                              'old/compare.py: upload the project folder'), problem
    with pytest.raises(SystemExit, match=r'2 project folders \(a/b/c, old\): upload one copy'):
        course.one_upload(5, str(up))
    (up / 'compare.py').write_text('x = 1\n')   # at the top: the upload itself, whatever else it holds
    assert course.locate(5, str(up)) == (str(up), None, None) and course.one_upload(5, str(up))[1] is None
    # links are never followed in the search, and it stops at DEEPEST
    deep = tmp_path / 'deep'
    path = deep.joinpath(*['d'] * (course.DEEPEST + 2))
    path.mkdir(parents=True)
    (path / 'compare.py').write_text('x = 1\n')
    os.symlink(str(up), deep / 'link')
    assert course.files_found(str(deep), ['compare.py']) == []
    import shutil
    os.remove(up / 'compare.py')
    shutil.rmtree(up / 'old')
    os.symlink(str(up), tmp_path / 'linked')   # a student folder that is a link is not searched through
    assert course.locate(5, str(tmp_path / 'linked')) == (str(tmp_path / 'linked'), None, None)


def test_a_full_disk_is_said_and_blames_no_one(tmp_path, monkeypatch):
    # where grading itself cannot write (its copy of the submission), the row says so, flagged: not a 0
    (tmp_path / 'alice').mkdir()

    def no_room(*args, **kwargs):
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(course, 'grading_tree', no_room)
    monkeypatch.setattr(course_grader, 'wait_for_room', lambda cpu_seconds: None)
    r = course.grade_safely(5, str(tmp_path / 'alice'), 'alice', 1, 'none', True)
    assert r['status'] == 'not graded' and r['feedback'].split('\n')[1].startswith('  not graded: the disk was full')
    assert course_grader.disk_full(str(tmp_path)) is False and course_grader.disk_full('/no/such/folder') is True
    # a run that met a full disk runs once more when there is room; full both times, it is DiskFull (not a 0)
    runs = []

    def full_once(*args):
        runs.append(args)
        return (b'', '', 'disk', 0.0) if len(runs) == 1 else (b'answers', '', None, 1.0)
    monkeypatch.setattr(course_grader, 'run_worker', full_once)
    assert course_grader.run_with_room('tree', b'', 3, 1, 'none') == (b'answers', '', None, 1.0) and len(runs) == 2
    monkeypatch.setattr(course_grader, 'run_worker', lambda *args: (b'', '', 'disk', 0.0))
    with pytest.raises(course_grader.DiskFull, match='the disk was full'):
        course_grader.run_with_room('tree', b'', 3, 1, 'none')

    def no_room_for_the_request(*args):
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(course_grader, 'run_worker', no_room_for_the_request)
    with pytest.raises(course_grader.DiskFull):
        course_grader.run_with_room('tree', b'', 3, 1, 'none')

    # a run whose own files filled the disk is its own doing: its concepts fail, said so, and it is not run again
    ready = course_worker.frame({}, {'ready': True})
    calls = []

    def filled(*args):
        calls.append(args)
        return ready, '', 'filled', 1.0
    monkeypatch.setattr(course_grader, 'run_worker', filled)
    results = course_grader.evaluate_concepts(course_grader.concepts(5), 'tree', 1, 'uid')
    assert len(calls) == 1 and [passed for passed, *_ in results] == [False] * 3
    assert all('the code filled the disk' in lines[0] for _, lines, _, _ in results)


def raw_zip(path, entries):
    """A zip written byte by byte, as a hostile tool may write one: entries [(name, data as stored, CRC-32, the size
    its header declares, method (0 stored, 8 deflated), its mode (S_IFLNK | 0o777: a link))], each name as UTF-8."""
    import struct
    body, directory = b'', b''
    for name, data, crc, size, method, mode in entries:
        raw = name.encode('utf-8')
        head = struct.pack('<IHHHHHIIIHH', 0x04034b50, 20, 0x800, method, 0, 0x21, crc, len(data), size, len(raw), 0)
        directory += struct.pack('<IHHHHHHIIIHHHHHII', 0x02014b50, 0x314, 20, 0x800, method, 0, 0x21, crc, len(data),
                                 size, len(raw), 0, 0, 0, 0, mode << 16, len(body)) + raw
        body += head + raw + data
    end = struct.pack('<IHHHHIIH', 0x06054b50, 0, 0, len(entries), len(entries), len(directory), len(body), 0)
    path.write_bytes(body + directory + end)
    return path


def deflated(text):
    import zlib
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(text) + c.flush()


def zeros_bomb(gib):
    """(a raw deflate stream of `gib` GiB of zeros, about 1 MB per GiB, its CRC-32): 16 MB of zeros deflate to the
    same 16 kB block each time after a full flush."""
    import zlib
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = bytes(2 ** 24)
    block = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(64 * gib):
        crc = zlib.crc32(chunk, crc)
    return block * (64 * gib) + c.flush(), crc


def test_a_zip_is_read_as_data_and_only_its_files_of_the_assignment_written(tmp_path):
    # a Gradescope-style upload as a zip: the files of the assignment in it are written out (where the zip puts
    # them), nothing else: not a link (an entry that is one), not a path outside (absolute, '..'), not two names
    # that would be one file (the same name, NFC and NFD of one name), not a bomb (3 GiB of zeros in 3 MB, never
    # expanded: neither memory nor disk); a file of the assignment that is a link, too large (declared or not) or
    # cut is refused with what to do, one whose header says less than it holds is read as its header says; each
    # message shows the student's names inert
    import resource
    import stat
    import zlib
    good = open(os.path.join(HERE, 'compare.py'), 'rb').read()
    honest = (good, zlib.crc32(good), len(good), 0, 0o100644)
    bomb, bomb_crc = zeros_bomb(3)
    link = (b'/etc/shadow', zlib.crc32(b'/etc/shadow'), 11, 0, stat.S_IFLNK | 0o777)
    lie = deflated(b'#' * 2 ** 24)   # 16 MB of comment, its header saying 100 bytes (and the CRC of those)
    cases = {
        'honest': ([('proj/compare.py', *honest), ('proj/data/zeros.bin', bomb, bomb_crc, 3 * 2 ** 30, 8, 0o100644),
                    ('proj/link', *link), ('proj/notes.txt', b'x', zlib.crc32(b'x'), 1, 0, 0o100644)], None),
        'nfd': ([('caf\u00e9/compare.py', *honest), ('cafe\u0301/compare.py', *honest)],
                'two entries whose names differ only in Unicode normalisation'),
        'twice': ([('compare.py', *honest), ('./compare.py', *honest)], 'two entries for one file'),
        'dotdot': ([('proj/../../compare.py', *honest)], "an entry outside its folder"),
        'absolute': ([('/tmp/compare.py', *honest)], "an entry outside its folder"),
        'a link': ([('compare.py', *link)], 'is a link in the zip: zip the file itself'),
        'a bomb': ([('compare.py', bomb, bomb_crc, 3 * 2 ** 30, 8, 0o100644)],
                   "is 3,221,225,472 bytes, more than the 1,000,000 a source file"),
        'a lie': ([('compare.py', lie, zlib.crc32(b'#' * 2 ** 24), 100, 8, 0o100644)], 'the zip cannot be read (BadZipFile'),
        'a lie that holds': ([('compare.py', lie, zlib.crc32(b'#' * 100), 100, 8, 0o100644)], 'capped'),
        'an escape': ([('\x1b[2J\n/../compare.py', *honest)], "an entry outside its folder"),
    }
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.time()
    for name, (entries, said) in cases.items():
        path = raw_zip(tmp_path / f'{name}.zip', entries)
        dest = tmp_path / f'{name}_unpacked'
        dest.mkdir()
        why = course.unpacked(5, str(path), str(dest))
        made = [os.path.relpath(p, dest) for p, _ in course_grader.tree_of(str(dest))]
        if said is None:
            assert why is None and sorted(made) == ['proj', 'proj/compare.py'], (why, made)
            assert (dest / 'proj' / 'compare.py').read_bytes() == good
            assert course.locate(5, str(dest))[1] == 'proj'
        elif said == 'capped':   # (read as its header says, no further: a file without the markers, graded as one)
            assert why is None and (dest / 'compare.py').read_bytes() == b'#' * 100, why
        else:
            assert said in why and made == [] and '\n' not in why and '\x1b' not in why, (name, why, made)
    nfd = course.unpacked(5, str(tmp_path / 'nfd.zip'), str(tmp_path))   # (both named, told apart: NFD escaped)
    assert ('[from the submission: caf\u00e9/compare.py] and [from the submission: cafe\\u0301/compare.py]' in nfd), nfd
    assert '[from the submission: \\x1b[2J\\n/../compare.py]' in course.unpacked(5, str(tmp_path / 'an escape.zip'),
                                                                                str(tmp_path))
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    assert grew < 200 * 2 ** 20 and time.time() - t0 < 20, (grew, time.time() - t0)   # (expanding it: 3 GiB, minutes)
    # not a zip, a cut one, one that says it holds more entries than a folder may
    (tmp_path / 'text.zip').write_text('not a zip')
    assert 'not a zip that can be read' in course.unpacked(5, str(tmp_path / 'text.zip'), str(tmp_path))
    cut = tmp_path / 'cut.zip'
    cut.write_bytes((tmp_path / 'honest.zip').read_bytes()[:-30])
    assert 'not a zip that can be read' in course.unpacked(5, str(cut), str(tmp_path))
    many = bytearray((tmp_path / 'honest.zip').read_bytes())
    many[-12:-10] = (course.ZIP_ENTRIES + 1).to_bytes(2, 'little')
    (tmp_path / 'many.zip').write_bytes(bytes(many))
    assert f'more than {course.ZIP_ENTRIES:,} entries' in course.unpacked(5, str(tmp_path / 'many.zip'), str(tmp_path))
    # an end record that says 1 entry over a directory of 100,000 (4.7 MB): refused from the record, before zipfile
    # reads the directory into memory (1.8 million entries took it 17 s and 0.9 GB)
    import struct
    import zipfile
    directory = b''.join(struct.pack('<IHHHHHHIIIHHHHHII', 0x02014b50, 20, 20, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0)
                         + b'a' for _ in range(100_000))
    end = struct.pack('<IHHHHIIH', 0x06054b50, 0, 0, 1, 1, len(directory), 0, 0)
    (tmp_path / 'lying.zip').write_bytes(directory + end)

    def never(*args, **kwargs):
        raise AssertionError('the directory was read')
    original, zipfile.ZipFile = zipfile.ZipFile, never
    try:
        said = course.unpacked(5, str(tmp_path / 'lying.zip'), str(tmp_path))
    finally:
        zipfile.ZipFile = original
    assert f'or a directory of more than {course.ZIP_DIRECTORY:,} bytes' in said, said
    # the same directory behind a zip64 record (which zipfile reads instead) and an end record that says 1 entry of
    # 22 bytes: refused from the zip64 record, unread
    record = struct.pack('<IQHHIIQQQQ', 0x06064b50, 44, 45, 45, 0, 0, 100_000, 100_000, len(directory), 0)
    locator = struct.pack('<IIQI', 0x07064b50, 0, len(directory), 1)
    (tmp_path / 'lying64.zip').write_bytes(directory + record + locator
                                           + struct.pack('<IHHHHIIH', 0x06054b50, 0, 0, 1, 1, 22, 0, 0))
    assert len(original(tmp_path / 'lying64.zip').infolist()) == 100_000 and course.zip_directory(tmp_path / 'lying64.zip') == \
        (100_000, len(directory))   # (zipfile itself reads the 100,000 entries)
    zipfile.ZipFile = never
    try:
        said = course.unpacked(5, str(tmp_path / 'lying64.zip'), str(tmp_path))
    finally:
        zipfile.ZipFile = original
    assert f'or a directory of more than {course.ZIP_DIRECTORY:,} bytes' in said, said


def opened_watch(paths):
    """An inotify descriptor that records every open of each path (IN_OPEN): an open of a FIFO or a device is an
    event, whatever is then read."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    assert fd >= 0
    for path in paths:
        assert libc.inotify_add_watch(fd, os.fsencode(str(path)), 0x20) >= 0, path   # IN_OPEN
    return fd


def opens_seen(fd):
    try:
        return len(os.read(fd, 65536))
    except BlockingIOError:
        return 0


@pytest.mark.slow
@pytest.mark.parametrize('sandbox', ['bubblewrap', 'uid'])
def test_odd_files_and_names_in_a_folder_are_graded_as_what_they_are(handouts, tmp_path, reachable, sandbox):
    # a class beside honest students, graded (--jobs 2) as root from a kit only root can read: compare.py as a FIFO
    # and as a character device (never opened: an open can have effects), empty, 200 MB (sparse: never read), with
    # NUL bytes in the student's lines (the code cannot be compiled: said) and outside them (not graded: full
    # marks), a 200 MB file beside an honest compare.py (never read: full marks), an honest student whose folder
    # name holds a newline and escape sequences (full marks, the name escaped on the console, in the files and the
    # gradebook); and the same honest project as a zip (full marks) and as a zip with a '..' entry (refused, said)
    import shutil
    skip_unless_it_runs(sandbox)
    evil = 'evil\n  PASS 2 of 2  the paired table\x1b[2J\x1b]0;x\x07'
    out, base = tmp_path / 'out', tmp_path / 'class'
    base.mkdir()
    root = hostile_class(handouts, base, out, {}, file_attacks=(), names=False, links=False, pairs=False)
    students = ['fifo', 'device', 'empty', 'huge', 'nul_in_region', 'nul_outside', 'big_beside', evil]
    for name in students:
        shutil.copytree(root / 'good', root / name)
    path = {name: root / name / 'compare.py' for name in students}
    text = (root / 'good' / 'compare.py').read_bytes()
    for name in ('fifo', 'device', 'empty'):
        path[name].unlink()
    os.mkfifo(path['fifo'])
    os.mknod(path['device'], 0o666 | stat_char(), os.makedev(1, 5))   # (as /dev/zero)
    path['empty'].write_bytes(b'')
    with open(path['huge'], 'r+b') as f:
        f.truncate(200 * 2 ** 20)
    with open(root / 'big_beside' / 'data.bin', 'wb') as f:
        f.truncate(200 * 2 ** 20)
    marker = b'    ### BEGIN YOUR CODE (assignment 5)\n'
    at = text.rindex(marker) + len(marker)   # (paired_stats' region)
    path['nul_in_region'].write_bytes(text[:at] + b'    mean = 0  # \x00\n' + text[at:])
    path['nul_outside'].write_bytes(b'# \x00 a NUL outside the lines graded\n' + text)
    watch = opened_watch([path['fifo'], path['device']])
    kit = kit_copy(str(private_folder(tmp_path)))
    command = [sys.executable, os.path.join(kit, 'course.py'), 'grade', '5']
    env = dict(os.environ, TMPDIR=str(reachable))
    p = subprocess.run([*command, str(root), '--out', str(out), '--jobs', '2', '--sandbox', sandbox],
                       capture_output=True, text=True, timeout=900, env=env)
    assert opens_seen(watch) == 0   # neither the FIFO nor the device was opened
    os.close(watch)
    assert p.returncode == 1 and 'Traceback' not in p.stdout + p.stderr, p.stdout[-3000:] + p.stderr[-3000:]
    shown = course_grader.shown_name(evil)
    assert '\n' not in shown and '\x1b' not in shown
    rows = {f.name[:-len('.txt')]: f.read_text() for f in out.iterdir() if f.name.endswith('.txt')}
    assert set(rows) == {'good', 'zz_victim', *students[:-1], shown}, sorted(rows)
    for name in ('good', 'zz_victim', 'nul_outside', 'big_beside', shown):
        assert rows[name].rstrip().endswith('score: 6/6'), (name, rows[name])
    for name, said in (('fifo', 'compare.py is not a regular file (a FIFO): hand in the file itself'),
                       ('device', 'compare.py is not a regular file (a character device): hand in the file itself'),
                       ('empty', "0 of its 2 '### BEGIN/END YOUR CODE (assignment 5)' regions were found"),
                       ('huge', 'compare.py is 209,715,200 bytes, more than the 1,000,000 a source file')):
        assert said in rows[name] and rows[name].rstrip().endswith('score: 0/6'), (name, rows[name])
    nul = rows['nul_in_region']
    assert 'null bytes' in nul and nul.rstrip().endswith('score: 0/6'), nul
    # the name as shown, one line, everywhere: the console (no line of its own, no escape sequence), the files
    assert '\x1b' not in p.stdout and '\x07' not in p.stdout
    assert [line for line in p.stdout.split('\n') if 'PASS 2 of 2' in line] == \
        [f"assignment 5: The paired statistics -- {shown}"]
    with open(out / 'gradebook_assignment5.csv', newline='') as f:
        book = {line[0]: line for line in csv.reader(f)}
    assert shown in book and book[shown][-2] == 'graded' and int(book[shown][-5]) == 6, book.get(shown)
    assert not any('\x1b' in f.name or '\n' in f.name for f in out.iterdir())
    # a zip of the honest project, nested in a folder, and one with an entry outside it
    import zipfile
    results = tmp_path / 'results.json'
    with zipfile.ZipFile(tmp_path / 'upload.zip', 'w') as z:
        z.writestr('project/compare.py', text)
        z.writestr('project/notes.txt', 'notes')
    with zipfile.ZipFile(tmp_path / 'escape.zip', 'w') as z:
        z.writestr('project/compare.py', text)
        z.writestr('../../compare.py', text)
    for upload, score, said in (('upload.zip', 6, 'graded the folder project of your upload'),
                                ('escape.zip', 0, 'the zip holds an entry outside its folder')):
        p = subprocess.run([*command, str(tmp_path / upload), '--gradescope', str(results), '--sandbox', sandbox],
                           capture_output=True, text=True, timeout=900, env=env)
        got = json.load(open(results))
        assert p.returncode == (0 if score else 1) and got['score'] == score and said in got['output'], (p.stdout, got)
        assert 'Traceback' not in p.stdout + p.stderr
    assert not os.path.exists(os.path.join(os.path.dirname(str(tmp_path)), 'compare.py'))


def stat_char():
    import stat
    return stat.S_IFCHR


# Assignment 1's read, by students who lie through torch: torch's comparisons replaced (allclose, isclose, equal,
# Tensor.__eq__) before returning zeros, a tensor subclass that says it equals anything (__eq__, tolist, item) around
# zeros, and the same subclass around the right values
LIAR = ['    class Liar(torch.Tensor):',
        '        def __eq__(self, other):',
        '            return True',
        '        def tolist(self):',
        '            return [1.0]',
        '        def item(self):',
        '            return 1.0']
ZEROS = ['    h = torch.zeros(len(w), *b0.shape, dtype=b0.dtype)',
         '    alpha = torch.zeros(len(w), *b0.shape[:2], len(sources), dtype=b0.dtype)']
TORCH_LIARS = {
    'patches_torch': ['    torch.allclose = lambda *a, **k: True',
                      '    torch.isclose = lambda a, *x, **k: torch.ones_like(a, dtype=torch.bool)',
                      '    torch.equal = lambda *a: True',
                      '    torch.Tensor.__eq__ = lambda self, other: True', *ZEROS],
    'lying_zeros': [*LIAR, *ZEROS, '    h, alpha = h.as_subclass(Liar), alpha.as_subclass(Liar)'],
}


@pytest.mark.slow
@pytest.mark.parametrize('sandbox', ['bubblewrap', 'uid'])
def test_a_student_who_lies_through_torch_earns_what_the_values_earn(handouts, tmp_path, reachable, sandbox):
    # the values are compared by the grader's own torch on what the sandbox returned (tensors as safetensors: their
    # bytes, no object of the student's): a patched torch or a lying subclass around zeros earns 0, each concept
    # saying what differs (no traceback); the right values in the lying subclass earn full marks; the honest too
    skip_unless_it_runs(sandbox)
    mine = open(os.path.join(HERE, 'model.py')).read().split('\n')
    right = [mine[first + 1:last] for a, first, last in course.regions('\n'.join(mine)) if a == 1][0]
    students = {'good': [], 'unsolved': None, **{name: {'model.py': [body]} for name, body in TORCH_LIARS.items()},
                'lying_right': {'model.py': [LIAR + right + ['    h, alpha = h.as_subclass(Liar), alpha.as_subclass(Liar)']]}}
    _, rows = graded_class(handouts, tmp_path, reachable, 1, students, sandbox)
    total = sum(c.marks for c in concepts_of(1))
    for name in ('good', 'lying_right'):
        assert rows[name].rstrip().endswith(f'score: {total}/{total}'), (name, rows[name])
    for name in TORCH_LIARS:
        assert rows[name].rstrip().endswith(f'score: 0/{total}'), (name, rows[name])
        assert 'h differs from the expected values' in rows[name], rows[name]
