"""Tests of the course kit itself (course.py, COURSE.md), as an instructor with a class would use it: for
every assignment the handout stubs it and every later one (and holds none of their solutions), its public
tests fail on the stub and pass with the solution put back while the later ones are still stubs, the
solution scores full marks, and each planted mistake, a hijacked grader, an endless loop and code that
does not import are graded as they deserve."""

import csv
import json
import os
import re
import subprocess
import sys

import pytest

import course

HERE = course.HERE

# Planted mistakes, each a case a student would make: (assignment, name, [(file, right text, wrong text)]).
# Each loses marks; those named MOST (conceptually wrong models that a grader by test count once scored
# high) lose most of their assignment's marks.
MOST = {'logits by matmul', 'V read from the QK route', 'V through norm_mlp', 'routes de-duplicated by query name',
        'running sums instead of increments', "one rank's share", 'crashes with one pair'}
PLANTED = [
    (1, 'scaled by 1/sqrt(d)', [('model.py', '(x * w).sum(-1) for w in q', '(x * w).sum(-1) / math.sqrt(x.size(-1)) for w in q')]),
    (1, 'logits by matmul', [('model.py', 'torch.stack([(x * w).sum(-1) for w in q], -1)', '(x @ q.T)')]),
    (2, 'V read from the QK route', [('model.py', 'return x[0], x[-1]', 'return x[0], x[0]')]),
    (2, 'V through norm_mlp', [('model.py', 'return x[0], x[-1]', 'return x[0], self.norm_mlp(h[-1])')]),
    (2, 'routes de-duplicated by query name',
     [('model.py', 'for name in self.routes.values()]', 'for name in dict.fromkeys(self.routes.values())]')]),
    (3, 'running sums instead of increments', [('model.py', '                    blocks.append(partial)\n',
                                                '                    blocks.append(source(blocks[-1][0] + partial[0]))\n')]),
    (3, 'the embedding folded into the first block', [('model.py', 'blocks = [source(embedding)]', 'blocks = []'),
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


def put_back(folder, n, mistakes=()):
    """Write the reference solution of assignment n between the student's markers, then plant mistakes."""
    for f in course.files_of(n):
        mine = open(os.path.join(HERE, f)).read().split('\n')
        bodies = [mine[first + 1:last] for a, first, last in course.regions('\n'.join(mine)) if a == n]
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
    everything = ''.join(open(os.path.join(d, f), errors='replace').read()
                         for d, _, names in os.walk(out) for f in names if f.endswith(('.py', '.md')))
    assert not any(course.BEGIN.match(line) for line in everything.split('\n'))
    assert 'def reference_forward' not in everything
    assert not any(os.path.exists(os.path.join(out, f)) for f in course.INSTRUCTOR_ONLY)
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
    """A class folder: students = {name: mistakes (None: the stub, unsolved)}, each a copy of handout n."""
    import shutil
    root = tmp_path / f'class{n}'
    for name, mistakes in students.items():
        shutil.copytree(handouts / f'h{n}', root / name)
        if mistakes is not None:
            put_back(str(root / name), n, mistakes)
    return root


@pytest.mark.parametrize('n', sorted(course.ASSIGNMENTS))
def test_a_class_is_graded_by_concepts(handouts, tmp_path, n):
    students = {'solution': []}
    students.update({re.sub(r'\W+', '_', name): mistakes for a, name, mistakes in PLANTED if a == n})
    most = {re.sub(r'\W+', '_', name) for name in MOST}
    root = make_class(handouts, tmp_path, n, students)
    rows = dict(course.grade(n, str(root), out_dir=str(tmp_path / 'grades'), jobs=2))
    total = sum(c.marks for c in course.ASSIGNMENTS[n]['concepts'])
    assert rows['solution']['score'] == rows['solution']['total'] == total
    for name, r in rows.items():
        if name != 'solution':   # each planted mistake loses marks; the MOST ones more than half
            assert r['total'] == total and r['score'] < (total / 2 if name in most else total), (name, r['feedback'])
            assert 'hint:' in r['feedback'] and r['status'] == 'graded'
    with open(tmp_path / 'grades' / f'gradebook_assignment{n}.csv') as f:
        book = list(csv.DictReader(f))
    assert [b['student'] for b in book] == sorted(students)
    assert all(int(b['total']) == rows[b['student']]['score'] and int(b['max']) == total for b in book)
    results = json.load(open(tmp_path / 'grades' / 'solution.results.json'))
    assert results['score'] == total and sum(t['max_score'] for t in results['tests']) == total


def test_hijacks_loops_and_broken_code_are_graded_as_they_deserve(handouts, tmp_path):
    n = 5
    root = make_class(handouts, tmp_path, n, {'hijack_pytest': None, 'hijack_site': None, 'hijack_conftest': None,
                                              'loop': [], 'broken': [], 'good': []})
    # an unsolved stub with a fake pytest package whose __main__ reports success
    fake = root / 'hijack_pytest' / 'pytest'
    fake.mkdir()
    (fake / '__init__.py').write_text('')
    (fake / '__main__.py').write_text("import sys\nprint('100 passed')\nsys.exit(0)\n")
    # an unsolved stub with a sitecustomize.py that turns every failed test into a pass
    (root / 'hijack_site' / 'sitecustomize.py').write_text(
        "import _pytest.reports\n_pytest.reports.TestReport.passed = property(lambda self: True)\n")
    (root / 'hijack_conftest' / 'conftest.py').write_text(
        "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    out = yield\n    out.get_result().outcome = 'passed'\n")
    # an endless loop in the answer, and an answer that does not even import
    for name, line in (('loop', '    while True:\n        pass\n'), ('broken', '    mean = = 0\n')):
        path = root / name / 'compare.py'
        text = open(path).read()
        marker = '    ### BEGIN YOUR CODE (assignment 5)\n'
        path.write_text(text.replace(marker, marker + line, 1))
    rows = dict(course.grade(n, str(root), out_dir=str(tmp_path / 'grades'), limit=12, jobs=2))
    total = sum(c.marks for c in course.ASSIGNMENTS[n]['concepts'])
    for name in ('hijack_pytest', 'hijack_site', 'hijack_conftest'):
        assert rows[name]['score'] == 0 and rows[name]['total'] == total, rows[name]['feedback']
    assert rows['loop']['score'] == 0 and 'timed out' in rows['loop']['feedback'], rows['loop']['feedback']
    assert rows['broken']['score'] == 0 and rows['broken']['total'] == total and rows['broken']['status'] == 'error'
    assert re.search(r'the code does not run: .*(SyntaxError|invalid syntax).*compare.py', rows['broken']['feedback'])
    assert rows['good']['score'] == total            # the batch went on after the loop
    # markers removed: not graded, said so
    path = root / 'good' / 'compare.py'
    path.write_text(open(path).read().replace('### END YOUR CODE (assignment 5)', '### END'))
    r = course.grade_one(n, str(root / 'good'))
    assert r['score'] == 0 and r['status'] == 'no answer' and 'put the markers back' in r['feedback']


def test_concepts_cover_every_test_and_help_exits_zero():
    for n in course.ASSIGNMENTS:
        tests, _ = course.reference(n)   # raises if a concept has no test or a test no concept
        assert tests
    p = subprocess.run([sys.executable, os.path.join(HERE, 'course.py'), '--help'], capture_output=True, text=True)
    assert p.returncode == 0 and 'grade' in p.stdout
