"""
The course kit: hand out the depth-routing assignments and grade them (COURSE.md is the students' page).

    python course.py list                     # the assignments, their files and tests
    python course.py handout 1 handout1/      # instructor: a copy of the project with assignment 1 stubbed
    python course.py check 1                  # student: run assignment 1's public tests here
    python course.py grade 1 path/to/student  # instructor: public + hidden tests of assignment 1, a score

The solution of assignment N is marked in the real code, nbgrader-style:

        ### BEGIN SOLUTION N
        ... the lines the student writes ...
        ### END SOLUTION

so the shipped files stay complete and runnable. A handout replaces the marked lines of assignment N
by a stub that raises NotImplementedError with the task in one line; everything else, the other
assignments included, stays the reference. Its tests are selected with a marker (pytest -m
assignmentN); the hidden ones (test_hidden.py: a literal implementation of the equations, exact
reference values) are never handed out and are run by `grade` from the instructor's copy.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ASSIGNMENTS = {
    1: dict(title="The depth read",
            task="implement the depth read: logits = queries . (x_s / rms(x_s)) per source (no 1/sqrt(d)), "
                 "a softmax over the sources in float32 with autocast off, then the raw sources mixed by alpha"),
    2: dict(title="The block bookkeeping",
            task="keep the sources: the embedding as its own source, the partial of the current AttnRes block, "
                 "a block closed after its S-th sublayer, then the final read over all blocks"),
    3: dict(title="RD-AttnRes: the QK and V routes",
            task="one pseudo-query per route with the key gain folded in, and the attention inputs: "
                 "x_qk from the first route, x_v from the last, through the one pre-norm"),
    4: dict(title="The paired data order",
            task="the windows of optimizer step `step`: the slice [step*W, (step+1)*W) of the epochs' "
                 "seed-keyed permutations (window_order), crossing into the next epoch where needed"),
    5: dict(title="The paired statistics",
            task="mean and sample sd of the paired differences, the 95% t-interval half-width, the wins "
                 "(delta < 0), and the exact two-sided sign test"),
}
HIDDEN_TESTS = 'test_hidden.py'
INSTRUCTOR_ONLY = (HIDDEN_TESTS, 'test_course.py')   # never in a handout: hidden tests, planted mistakes
BEGIN = re.compile(r'^(\s*)### BEGIN SOLUTION (\d+)\s*$')
END = re.compile(r'^\s*### END SOLUTION\s*$')


def project_files(root=HERE):
    """The project's files: what git tracks (a clone's content), else every file but data and runs."""
    try:
        out = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard'], cwd=root,
                             capture_output=True, text=True, check=True).stdout
        files = [f for f in out.splitlines() if os.path.isfile(os.path.join(root, f))]
        if files:
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    skip = {'.git', 'data', 'out', '.venv', 'venv', '__pycache__', '.pytest_cache'}
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x not in skip]
        files += [os.path.relpath(os.path.join(d, f), root) for f in names]
    return files


def regions(text):
    """(assignment, first line, last line) of every marked region of a file's text (0-based lines)."""
    found, lines, start = [], text.split('\n'), None
    for i, line in enumerate(lines):
        m = BEGIN.match(line)
        if m:
            start = (int(m.group(2)), i)
        elif END.match(line) and start:
            found.append((start[0], start[1], i))
            start = None
    return found


def stub(text, n):
    """The file's text with assignment n's regions replaced by a stub, the other markers removed."""
    lines, out, skipping = text.split('\n'), [], False
    for line in lines:
        m = BEGIN.match(line)
        if m and int(m.group(2)) == n:
            indent = m.group(1)
            out.append(f"{indent}# YOUR CODE HERE (assignment {n}, COURSE.md; check it with: python course.py check {n})")
            out.append(f'{indent}raise NotImplementedError("assignment {n}: {ASSIGNMENTS[n]["task"]}")')
            skipping = True
        elif END.match(line):
            skipping = False
        elif not m and not skipping:
            out.append(line)
    return '\n'.join(out)


def files_of(n, root=HERE):
    return sorted({f for f in project_files(root) if f.endswith('.py') and f != 'course.py'
                   and any(a == n for a, _, _ in regions(open(os.path.join(root, f)).read()))})


def handout(n, out_dir):
    if n not in ASSIGNMENTS:
        raise SystemExit(f"no assignment {n}; there are {', '.join(map(str, ASSIGNMENTS))}")
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise SystemExit(f"{out_dir} exists and is not empty: give a new folder")
    for f in project_files():
        if f in INSTRUCTOR_ONLY:
            continue
        src, dst = os.path.join(HERE, f), os.path.join(out_dir, f)
        os.makedirs(os.path.dirname(dst) or '.', exist_ok=True)
        if f.endswith('.py'):
            with open(src) as fin, open(dst, 'w') as fout:
                fout.write(stub(fin.read(), n))
        else:
            shutil.copy2(src, dst)
    print(f"{out_dir}: the project with assignment {n} ({ASSIGNMENTS[n]['title']}) to write in "
          f"{', '.join(files_of(n))}; students check their work with: python course.py check {n}")


def test_files(n, directory):
    """The test files of `directory` that hold tests of assignment n (only these are collected, so a
    check needs nothing the other tests need, such as the tokenizer's files)."""
    return sorted(f for f in os.listdir(directory) if f.startswith('test_') and f.endswith('.py')
                  and f'pytest.mark.assignment{n}\n' in open(os.path.join(directory, f)).read())


def check(n, directory='.'):
    """A student's check: the public tests of assignment n, in the student's copy."""
    return subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-m',
                           f'assignment{n} and not hidden', *test_files(n, directory)], cwd=directory).returncode


def grade(n, directory='.'):
    """Run the instructor's public and hidden tests of assignment n against the code in `directory`,
    print one line per test and the score. The tests come from this copy (a student's edits to tests
    count for nothing); the code under test is the student's (found first on the import path)."""
    if not os.path.exists(os.path.join(HERE, HIDDEN_TESTS)):
        raise SystemExit(f"{HIDDEN_TESTS} is not here: grading needs the instructor's copy of the project")
    directory = os.path.abspath(directory)
    with tempfile.TemporaryDirectory() as tests:
        for f in os.listdir(HERE):
            if f.startswith('test_') and f.endswith('.py') or f == 'pytest.ini':
                shutil.copy2(os.path.join(HERE, f), tests)
        report = os.path.join(tests, 'report.xml')
        # cwd = the tests (so they import each other from here), then the student's code on the path
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, directory]), PYTHONDONTWRITEBYTECODE='1')
        subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '--import-mode=append',
                        '-m', f'assignment{n}', f'--junitxml={report}', '-o', 'junit_family=xunit1',
                        *test_files(n, tests)], cwd=tests, env=env, capture_output=True, text=True)
        if not os.path.exists(report):
            raise SystemExit("the tests could not be run (pytest wrote no report)")
        cases = ET.parse(report).getroot().iter('testcase')
        results = []
        for case in cases:
            problem = case.find('failure')
            problem = problem if problem is not None else case.find('error')
            if case.find('skipped') is not None:
                continue
            message = '' if problem is None else (problem.get('message') or '').splitlines()[0][:100]
            results.append((case.get('file') or case.get('classname'), case.get('name'), problem is None, message))
    print(f"assignment {n}: {ASSIGNMENTS[n]['title']} -- graded in {directory}")
    for file, name, ok, message in results:
        kind = 'hidden' if 'hidden' in (file or '') else 'public'
        print(f"  {'PASS' if ok else 'FAIL'}  {kind:6s} {name:70s} {message}")
    score = sum(ok for *_, ok, _ in results)
    print(f"score: {score}/{len(results)}")
    return score, len(results)


def main(argv):
    if argv[:1] == ['list']:
        for n, a in ASSIGNMENTS.items():
            print(f"{n}. {a['title']} ({', '.join(files_of(n))}): {a['task']}")
        return 0
    if len(argv) in (2, 3) and argv[0] in ('handout', 'check', 'grade') and argv[1].isdigit():
        n = int(argv[1])
        if n not in ASSIGNMENTS:
            raise SystemExit(f"no assignment {n}; there are {', '.join(map(str, ASSIGNMENTS))}")
        if argv[0] == 'handout':
            if len(argv) != 3:
                raise SystemExit("usage: python course.py handout N OUT_DIR")
            handout(n, argv[2])
            return 0
        if argv[0] == 'check':
            return check(n, argv[2] if len(argv) == 3 else '.')
        score, total = grade(n, argv[2] if len(argv) == 3 else '.')
        return 0 if score == total else 1
    raise SystemExit(__doc__)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
