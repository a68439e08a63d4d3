"""
The course kit: hand out the depth-routing assignments and grade a class (COURSE.md is the students' page).

    python course.py list                          # the assignments, their files, concepts and marks
    python course.py handout 2 handout2/           # a copy of the project with assignments 2..5 to write
    python course.py release release/              # the solution-free release: all five to write
    python course.py check 2                       # student: assignment 2's public tests, here
    python course.py grade 2 submissions/          # instructor: one folder, or a class (a folder per student)
    python course.py grade 2 submissions/ --out grades/ --timeout 120 --gradescope results.json

The solution of assignment N is marked in the real code, nbgrader-style:

        ### BEGIN SOLUTION N
        ... the lines the student writes ...
        ### END SOLUTION

so the shipped files stay complete and runnable. A handout of assignment N replaces the marked lines of
N and of every later assignment by a stub between `### BEGIN YOUR CODE (assignment N)` and
`### END YOUR CODE (assignment N)`; the earlier assignments stay the reference, so that a course can go
in order. The tests of an assignment carry a marker (pytest -m assignmentN) and never need a later one.

Grading takes *only the lines between a student's markers* into a copy of the few files the grader needs
(nothing else of the student's folder is used) and never runs them in the process that decides the marks:
course_grader.py runs each concept's probes in a sandbox (bubblewrap, one per submission) with the
student's code and on the instructor's own code, and compares. Each assignment has a few concepts, each
worth some marks, earned when all of its probes match. The grader, its inputs and its checks are never handed out.
"""

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


ASSIGNMENTS = {   # the statements: COURSE.md; the concepts, their marks and the grader: course_grader.py
    1: dict(title="The depth read",
            task="implement the depth read: logits = (x_s * q_r).sum(-1) * (1/rms(x_s)) per source and route "
                 "(an elementwise product and a sum, no matmul, no 1/sqrt(d)), a softmax over the sources and "
                 "the raw sources mixed by alpha, in float32 with autocast off (float64 stays float64)"),
    2: dict(title="RD-AttnRes: the routes of a read point",
            task="one pseudo-query per route (in the order of self.routes, also when two routes share a query) "
                 "with the key gain folded in; then the attention inputs: x_qk from the first route, x_v from "
                 "the last, both through norm_attn"),
    3: dict(title="The block bookkeeping",
            task="keep the sources: the embedding as its own source, the partial of the current AttnRes block "
                 "(a sum of the block's outputs, the embedding never added in), a block closed after its S-th "
                 "sublayer, then the final read over all blocks"),
    4: dict(title="The paired data order",
            task="the windows of optimizer step `step`, all ranks together, as a list of ints: the slice "
                 "[step*W, (step+1)*W) of the epochs' seed-keyed permutations (window_order), crossing into the "
                 "next epoch where needed"),
    5: dict(title="The paired statistics",
            task="mean and sample sd (n - 1) of the paired differences, the 95% t-interval half-width, the wins "
                 "(delta < 0), and the exact two-sided sign test; with one pair the sd and interval are NaN"),
}
# What a handout holds: the files a student reads, runs and is tested with; nothing else (no grader, no
# hidden checks, no measurements or probes that might hold another way to write an answer).
HANDOUT_FILES = ('README.md', 'COURSE.md', 'requirements.txt', 'pytest.ini', 'conftest.py', '.gitignore',
                 'model.py', 'routing.py', 'common.py', 'compare.py', 'configurator.py', 'prepare.py', 'train.py',
                 'run_dir.py', 'run_control.py', 'sample.py', 'course.py', 'test_model.py', 'test_compare.py',
                 'test_train.py', 'config/', 'docs/')
# What the sandbox of a grading run holds: the modules the probes import, and the worker
GRADING_FILES = ('model.py', 'routing.py', 'common.py', 'compare.py', 'course_worker.py')
BEGIN = re.compile(r'^(\s*)### BEGIN SOLUTION (\d+)\s*$')
END = re.compile(r'^\s*### END SOLUTION\s*$')
ANSWER_BEGIN = re.compile(r'^(\s*)### BEGIN YOUR CODE \(assignment (\d+)\)\s*$')
ANSWER_END = re.compile(r'^\s*### END YOUR CODE \(assignment (\d+)\)\s*$')


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


def regions(text, begin=BEGIN, end=END):
    """(assignment, first line, last line) of every marked region of a file's text (0-based lines)."""
    found, lines, start = [], text.split('\n'), None
    for i, line in enumerate(lines):
        m = begin.match(line)
        if m:
            start = (int(m.group(2)), i)
        elif end.match(line) and start:
            found.append((start[0], start[1], i))
            start = None
    return found


def stub(text, first):
    """The file's text with the regions of assignments >= first replaced by a stub between YOUR CODE
    markers; the solutions of the earlier ones stay, without their markers."""
    lines, out, skipping = text.split('\n'), [], False
    for line in lines:
        m = BEGIN.match(line)
        if m and int(m.group(2)) >= first:
            indent, n = m.group(1), int(m.group(2))
            out += [f"{indent}### BEGIN YOUR CODE (assignment {n})",
                    f"{indent}# (assignment {n}, COURSE.md; check it with: python course.py check {n})",
                    f'{indent}raise NotImplementedError("assignment {n}: {ASSIGNMENTS[n]["task"]}")',
                    f"{indent}### END YOUR CODE (assignment {n})"]
            skipping = True
        elif END.match(line):
            skipping = False
        elif not m and not skipping:
            out.append(line)
    return '\n'.join(out)


def files_of(n, root=HERE):
    return sorted({f for f in project_files(root) if f.endswith('.py') and f != 'course.py'
                   and any(a == n for a, _, _ in regions(open(os.path.join(root, f)).read()))})


def handout_files(root=HERE):
    """The project's files that go into a handout (HANDOUT_FILES)."""
    return [f for f in project_files(root) if f in HANDOUT_FILES or
            any(d.endswith('/') and f.startswith(d) for d in HANDOUT_FILES)]


def handout(n, out_dir):
    """This project with assignment n and every later one to write (n = 1: the solution-free release)."""
    if n not in ASSIGNMENTS:
        raise SystemExit(f"no assignment {n}; there are {', '.join(map(str, ASSIGNMENTS))}")
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise SystemExit(f"{out_dir} exists and is not empty: give a new folder")
    for f in handout_files():
        src, dst = os.path.join(HERE, f), os.path.join(out_dir, f)
        os.makedirs(os.path.dirname(dst) or '.', exist_ok=True)
        if f.endswith('.py'):
            with open(src) as fin, open(dst, 'w') as fout:
                fout.write(stub(fin.read(), n))
        else:
            shutil.copy2(src, dst)
    todo = ', '.join(str(a) for a in ASSIGNMENTS if a >= n)
    print(f"{out_dir}: the project with assignment{'s' if n < max(ASSIGNMENTS) else ''} {todo} to write "
          f"({ASSIGNMENTS[n]['title']} first, in {', '.join(files_of(n))}); students check their work with: "
          f"python course.py check {n}")


def test_files(n, directory):
    """The test files of `directory` that hold tests of assignment n (only these are collected, so a
    check needs nothing the other tests need)."""
    return sorted(f for f in os.listdir(directory) if f.startswith('test_') and f.endswith('.py')
                  and f'pytest.mark.assignment{n}\n' in open(os.path.join(directory, f)).read())


def check(n, directory='.'):
    """A student's check: the public tests of assignment n, in the student's copy."""
    return subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-m',
                           f'assignment{n} and not hidden', *test_files(n, directory)], cwd=directory).returncode


# -----------------------------------------------------------------------------
# Grading: the student's marked lines in a copy of the graded files; their code runs only in a sandbox

def answers(path, n):
    """The bodies of assignment n's YOUR CODE regions of a student's file, in order."""
    with open(path, errors='replace') as f:
        lines = f.read().split('\n')
    return [(first, lines[first + 1:last]) for a, first, last in regions('\n'.join(lines), ANSWER_BEGIN, ANSWER_END)
            if a == n]


def grading_tree(n, submission, tree):
    """The files a grading run needs (GRADING_FILES), readable by everyone, in `tree`, with, in each file of
    assignment n, the student's lines between the markers in place of the solution. Returns (None or why it
    cannot be built (a missing file, markers removed or changed), {(file, line in the tree): line in theirs})."""
    lines_of, graded = {}, files_of(n)
    os.makedirs(tree, exist_ok=True)
    os.chmod(tree, 0o755)
    for f in GRADING_FILES:
        with open(os.path.join(HERE, f)) as fin:
            mine = fin.read().split('\n')
        if f in graded:
            theirs = os.path.join(submission, f)
            if not os.path.isfile(theirs):
                return f"{f} is missing from the submission", {}
            spots = [(first, last) for a, first, last in regions('\n'.join(mine)) if a == n]
            found = answers(theirs, n)
            if len(found) != len(spots):
                return (f"{f}: {len(found)} of its {len(spots)} '### BEGIN/END YOUR CODE (assignment {n})' regions "
                        "were found: put the markers back as they were in the handout (only the lines between "
                        "them are graded)"), {}
            out, prev = [], 0
            for (first, last), (their_first, body) in zip(spots, found):
                out += mine[prev:first + 1]                     # up to and with the BEGIN marker
                for i, line in enumerate(body):                 # (1-based line numbers on both sides)
                    lines_of[(f, len(out) + 1)] = their_first + 2 + i
                    out.append(line)
                prev = last                                     # from the END marker on
            mine = out + mine[prev:]
        path = os.path.join(tree, f)
        with open(path, 'w') as out:
            out.write('\n'.join(mine))
        os.chmod(path, 0o644)
    return None, lines_of


def their_line(where, lines_of):
    """The worker's 'model.py, line N: text' with N as a line of the student's own file when it is theirs."""
    m = re.match(r'^(\S+\.py), line (\d+): (.*)$', where or '')
    if not m:
        return where
    f, line, text = m.group(1), int(m.group(2)), m.group(3)
    if (f, line) in lines_of:
        return f"your {f}, line {lines_of[(f, line)]}: {text.strip()}"
    return f"{f}, line {line} (called from your code)"


def grade_one(n, submission, limit=None, trusted=False):
    """Grade one submission folder: a dict with the marks of each concept, the total, status and feedback."""
    import course_grader
    limit = limit or 60.0
    concepts = course_grader.concepts(n)
    total = sum(c.marks for c in concepts)
    marks, by_concept, timed_out, seconds = {}, {}, False, 0.0
    with tempfile.TemporaryDirectory() as work:
        tree = os.path.join(work, 'tree')
        problem, lines_of = grading_tree(n, submission, tree)
        results = ([(False, [], False, 0.0)] * len(concepts) if problem else
                   course_grader.evaluate_concepts(concepts, tree, limit, trusted))
        for c, (passed, lines, late, took) in zip(concepts, results):
            lines = [re.sub(r'\(([^()]*\.py, line \d+: .*)\)$', lambda m: f"({their_line(m.group(1), lines_of)})", x)
                     for x in lines]
            timed_out, seconds = timed_out or late, seconds + took
            marks[c.name] = c.marks if passed else 0
            by_concept[c.name] = [f"  {'PASS' if passed else 'FAIL'} {marks[c.name]}/{c.marks}  {c.name}"]
            by_concept[c.name] += [f"         {x}" for x in lines]
            if not passed and not problem:
                by_concept[c.name].append(f"         hint: {c.hint}")
    score = sum(marks.values())
    status = 'no answer' if problem else 'timed out' if timed_out else 'graded'
    head = [f"assignment {n}: {ASSIGNMENTS[n]['title']} -- {submission}"]
    if problem:
        head.append(f"  not graded: {problem}")
    if timed_out:
        head.append(f"  timed out: code that runs past {limit:.0f} s of CPU time per concept scores 0 for it")
    feedback = '\n'.join(head + [line for c in concepts for line in by_concept[c.name]] + [f"score: {score}/{total}"])
    return dict(submission=submission, marks=marks, score=score, total=total, status=status,
                seconds=round(seconds, 1), feedback=feedback, head=head, by_concept=by_concept)


def submissions_in(n, folder):
    """[(name, path)]: the folder itself if it is one submission (it holds the assignment's files), else
    each of its subfolders (a class: one folder per student)."""
    if any(os.path.isfile(os.path.join(folder, f)) for f in files_of(n)):
        return [(os.path.basename(os.path.abspath(folder)), folder)]
    subs = sorted((d, os.path.join(folder, d)) for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    if not subs:
        raise SystemExit(f"{folder} holds neither a submission ({', '.join(files_of(n))}) nor a folder per student")
    return subs


def gradescope_json(result, n):
    """Gradescope's autograder format (results.json): the score, and one test per concept with its marks
    and feedback."""
    import course_grader
    return dict(score=result['score'], max_score=result['total'], execution_time=result['seconds'],
                output='\n'.join(result['head']),
                tests=[dict(name=c.name, score=result['marks'][c.name], max_score=c.marks, visibility='visible',
                            output='\n'.join(line.strip() for line in result['by_concept'][c.name]))
                       for c in course_grader.concepts(n)])


def write_json(path, obj):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + '.tmp', 'w') as f:
        json.dump(obj, f, indent=2)
    os.replace(path + '.tmp', path)


def grade(n, folder, out_dir=None, limit=None, gradescope=None, jobs=1, trusted=False):
    """Grade a submission or a class (jobs submissions at a time, each in sandboxes of its own); print each
    student's feedback, and with out_dir write it, their results.json and the gradebook. With gradescope,
    Gradescope's results.json: at that path for one submission, or <gradescope>/<student>/results.json."""
    from concurrent.futures import ThreadPoolExecutor
    import course_grader
    if not trusted:
        try:
            course_grader.sandbox_command(HERE)
        except course_grader.NoSandbox as e:
            raise SystemExit(str(e)) from None
    subs = submissions_in(n, folder)
    concepts = course_grader.concepts(n)
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        graded = list(pool.map(lambda sub: grade_one(n, sub[1], limit, trusted), subs))
    rows = []
    for (name, path), r in zip(subs, graded):
        print(r['feedback'], flush=True)
        rows.append((name, r))
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, f'{name}.txt'), 'w') as f:
                f.write(r['feedback'] + '\n')
            write_json(os.path.join(out_dir, f'{name}.results.json'), gradescope_json(r, n))
        if gradescope:
            write_json(gradescope if len(subs) == 1 else os.path.join(gradescope, name, 'results.json'),
                       gradescope_json(r, n))
    if out_dir:
        with open(os.path.join(out_dir, f'gradebook_assignment{n}.csv'), 'w', newline='') as f:
            w = csv.writer(f)
            w.writerow(['student', *[c.name for c in concepts], 'total', 'max', 'seconds', 'status'])
            for name, r in rows:
                w.writerow([name, *[r['marks'][c.name] for c in concepts], r['score'], r['total'], r['seconds'],
                            r['status']])
        print(f"wrote {out_dir}/gradebook_assignment{n}.csv and each student's feedback ({len(rows)} students)")
    return rows


# -----------------------------------------------------------------------------

def main(argv):
    ap = argparse.ArgumentParser(prog='course.py', description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest='command', required=True)
    sub.add_parser('list', help='the assignments, their files, concepts and marks')
    p = sub.add_parser('handout', help='a copy of the project with assignment N and the later ones to write')
    p.add_argument('n', type=int)
    p.add_argument('out_dir')
    p = sub.add_parser('release', help='the solution-free release: all five assignments to write')
    p.add_argument('out_dir')
    p = sub.add_parser('check', help="a student's check: the public tests of assignment N")
    p.add_argument('n', type=int)
    p.add_argument('directory', nargs='?', default='.')
    p = sub.add_parser('grade', help='grade a submission, or a class (a folder per student)')
    p.add_argument('n', type=int)
    p.add_argument('folder')
    p.add_argument('--out', help="write each student's feedback, results.json and the gradebook CSV here")
    p.add_argument('--timeout', type=float, help="CPU seconds per concept of a submission (default 60)")
    p.add_argument('--gradescope', help="Gradescope's results.json: this file for one submission, this folder "
                                        "(<student>/results.json) for a class")
    p.add_argument('--jobs', type=int, default=1, help="submissions graded at the same time")
    p.add_argument('--trusted', action='store_true',
                   help="the submissions are trusted: run them without a sandbox (where bubblewrap is missing)")
    args = ap.parse_args(argv)
    if getattr(args, 'n', 1) not in ASSIGNMENTS:
        raise SystemExit(f"no assignment {args.n}; there are {', '.join(map(str, ASSIGNMENTS))}")
    if args.command == 'list':
        grader = os.path.exists(os.path.join(HERE, 'course_grader.py'))
        for n, a in ASSIGNMENTS.items():
            print(f"{n}. {a['title']} ({', '.join(files_of(n))}): {a['task']}")
            if grader:
                import course_grader
                for c in course_grader.concepts(n):
                    print(f"     {c.marks} marks: {c.name}")
        return 0
    if args.command == 'handout':
        handout(args.n, args.out_dir)
    elif args.command == 'release':
        handout(1, args.out_dir)
    elif args.command == 'check':
        return check(args.n, args.directory)
    else:
        if not os.path.exists(os.path.join(HERE, 'course_grader.py')):
            raise SystemExit("course_grader.py is not here: grading needs the instructor's copy of the project")
        rows = grade(args.n, args.folder, args.out, args.timeout, args.gradescope, args.jobs, args.trusted)
        return 0 if all(r['score'] == r['total'] for _, r in rows) else 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
