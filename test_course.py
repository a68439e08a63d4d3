"""Tests of the course kit itself (course.py, COURSE.md): for every assignment, the handout has the stub
and not the solution (nor the hidden tests), its public tests fail on the stub with the stub's message,
putting the solution back gives full marks, and a planted wrong solution loses marks."""

import os
import re
import shutil
import subprocess
import sys

import pytest

import course

# a wrong solution per assignment: (file, the right text, the planted mistake)
PLANTED = {
    1: [('model.py', '(x * w).sum(-1) for w in q', '(x * w).sum(-1) / math.sqrt(x.size(-1)) for w in q')],  # 1/sqrt(d)
    2: [('model.py', 'blocks = [source(embedding)]', 'blocks = []'),              # the embedding folded into
        ('model.py', 'partial = None                  #', 'partial = source(embedding)     #')],  # the first block
    3: [('model.py', 'return x[0], x[-1]', 'return x[0], x[0]')],                 # V read from the QK route
    4: [('common.py', 'window_order(n_windows, seed, epoch)[offset', 'window_order(n_windows, seed, 0)[offset')],
    5: [('compare.py', '/ (n - 1)) if n > 1', '/ n) if n > 1')],                   # sd over n, not n - 1
}


def solution_lines(n, path):
    text = open(path).read()
    lines = text.split('\n')
    return [lines[i].strip() for a, first, last in course.regions(text) if a == n
            for i in range(first + 1, last) if lines[i].strip() and not lines[i].strip().startswith('#')]


@pytest.mark.parametrize('n', sorted(course.ASSIGNMENTS))
def test_handout_check_and_grade(n, tmp_path):
    out = str(tmp_path / f'handout{n}')
    course.handout(n, out)
    files = course.files_of(n)
    assert files
    # the stub, not the solution, and none of the hidden tests or their literal reference
    for f in files:
        text = open(os.path.join(out, f)).read()
        assert f'raise NotImplementedError("assignment {n}:' in text
        assert not any(line in text for line in solution_lines(n, os.path.join(course.HERE, f)) if len(line) > 25)
    everything = ''.join(open(os.path.join(d, f), errors='replace').read()
                         for d, _, names in os.walk(out) for f in names if f.endswith(('.py', '.md')))
    assert not any(course.BEGIN.match(line) for line in everything.split('\n'))
    assert 'def reference_forward' not in everything
    assert not any(os.path.exists(os.path.join(out, f)) for f in course.INSTRUCTOR_ONLY)

    # the student's check: every public test of the assignment fails, with the stub's message
    p = subprocess.run([sys.executable, 'course.py', 'check', str(n)], cwd=out, capture_output=True, text=True,
                       timeout=600)
    summary = p.stdout.strip().splitlines()[-1]
    assert p.returncode != 0 and re.search(r'\d+ failed', summary) and 'passed' not in summary, p.stdout[-3000:]
    assert f'NotImplementedError: assignment {n}:' in p.stdout

    # the solution put back: full marks (public and hidden)
    for f in files:
        shutil.copy2(os.path.join(course.HERE, f), os.path.join(out, f))
    score, total = course.grade(n, out)
    assert score == total > 0

    # a planted mistake: marks lost
    for f, right, wrong in PLANTED[n]:
        path = os.path.join(out, f)
        text = open(path).read()
        assert text.count(right) == 1, (f, right)
        open(path, 'w').write(text.replace(right, wrong))
    score, total = course.grade(n, out)
    assert score < total
