"""The student's own check teaches: every mistake the course kit knows (test_course.py's PLANTED, each marked
as caught by the public check, and its TRIVIAL non-solutions) fails `python course.py check N` in the student's
copy, with a message that names a concept of the assignment, so that "when they all pass, hand the folder
back" (COURSE.md) is true of each of them. The marks those mistakes lose at grading: test_course.py."""

import os
import re
import shutil

import pytest

import course
from course_kit import grader as course_grader
from test_course import PLANTED, TRIVIAL, put_back


@pytest.mark.parametrize('n', sorted(course.ASSIGNMENTS))
def test_the_public_check_catches_every_known_mistake(tmp_path, n):
    handout = str(tmp_path / 'handout')
    course.handout(n, handout)
    cases = [(name, mistakes, None, caught) for a, name, mistakes, caught in PLANTED if a == n]
    cases += [(f'trivial {name}', [], {course.files_of(n)[0]: bodies}, True) for name, bodies in TRIVIAL[n].items()]
    concepts = [f"concept '{c.name}'" for c in course_grader.concepts(n)]
    missed = []
    for name, mistakes, bodies, caught in cases:
        folder = str(tmp_path / re.sub(r'\W+', '_', name))
        shutil.copytree(handout, folder)
        put_back(folder, n, mistakes, bodies)
        p = course.check(n, folder, first=True, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS='1'))
        if (p.returncode != 0) != caught:
            missed.append(f"{name}: the check {'passed' if p.returncode == 0 else 'failed'}")
        elif caught and not any(c in p.stdout for c in concepts):
            missed.append(f"{name}: the failure names no concept of assignment {n}:\n{p.stdout[-2000:]}")
    assert not missed, '\n'.join(missed)
