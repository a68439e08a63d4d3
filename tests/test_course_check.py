"""The student's own check teaches: every mistake the course kit knows (test_course.py's PLANTED and its TRIVIAL
non-solutions) fails `python course.py check N` in the student's copy, with messages that name concepts of the
assignment: for a planted mistake exactly the concepts the table says it loses, the ones whose marks grading
takes (test_course.py checks those marks), so that the check and the grade tell a student the same thing, and
"when they all pass, hand the folder back" (COURSE.md) is true of each of them."""

import os
import re
import shutil

import pytest

import course
from course_kit import grader as course_grader
from test_course import PLANTED, TRIVIAL, put_back, short

pytestmark = pytest.mark.slow   # (each test runs `course.py check`: nested pytest)


def reported(stdout, n):
    """The concepts of assignment n that a check's failures name (in pytest's error lines and summary)."""
    said = [line for line in stdout.split('\n') if line.startswith(('E ', 'FAILED '))]
    return {short(c.name) for c in course_grader.concepts(n) if any(f"concept '{c.name}'" in line for line in said)}


@pytest.mark.parametrize('n', sorted(course.ASSIGNMENTS))
def test_the_public_check_reports_the_concepts_each_mistake_loses(tmp_path, n):
    handout = str(tmp_path / 'handout')
    course.handout(n, handout)
    cases = [(name, mistakes, None, loses) for a, name, mistakes, loses in PLANTED if a == n]
    cases += [(f'trivial {name}', [], {course.files_of(n)[0]: bodies}, None) for name, bodies in TRIVIAL[n].items()]
    wrong = []
    for name, mistakes, bodies, loses in cases:
        folder = str(tmp_path / re.sub(r'\W+', '_', name))
        shutil.copytree(handout, folder)
        put_back(folder, n, mistakes, bodies)
        # (a trivial non-solution: the first failure is enough; a planted mistake: every test, every concept said)
        p = course.check(n, folder, first=loses is None, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS='1'))
        said = reported(p.stdout, n)
        if p.returncode == 0:
            wrong.append(f"{name}: the check passed")
        elif loses is None and not said:
            wrong.append(f"{name}: the failure names no concept of assignment {n}:\n{p.stdout[-2000:]}")
        elif loses is not None and said != loses:
            wrong.append(f"{name}: the check reports {sorted(said)}, the table (and the grade) {sorted(loses)}:\n"
                         f"{p.stdout[-3000:]}")
    assert not wrong, '\n'.join(wrong)
