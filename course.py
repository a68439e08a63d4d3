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

Grading takes *only the lines between a student's markers* into a clean copy of the instructor's project
(nothing else of the student's folder is used: no file of theirs can shadow a package, a test,
conftest.py or pytest.ini), runs the public and hidden tests of the assignment there with a time limit,
and scores *concepts*: each assignment has a few, each worth some marks, earned when all of its tests
pass. The hidden tests (test_hidden.py) are never handed out.
"""

import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Concept:
    name: str
    marks: int
    hint: str        # what to look at when it fails
    tests: tuple     # test function names (all parametrizations count)


ASSIGNMENTS = {
    1: dict(title="The depth read",
            task="implement the depth read: logits = (x_s * q_r).sum(-1) * (1/rms(x_s)) per source and route "
                 "(an elementwise product and a sum, no matmul, no 1/sqrt(d)), a softmax over the sources and "
                 "the raw sources mixed by alpha, in float32 with autocast off (float64 stays float64)",
            concepts=(
                Concept("the read's equations: normalised keys, raw values, a softmax over the sources", 2,
                        "keys are x_s / rms(x_s) (already folded: x_s * q times 1/rms), no 1/sqrt(d) or temperature; "
                        "the values are the sources as they are",
                        ('test_depth_read_is_a_per_token_softmax_mixture',
                         'test_depth_read_normalises_the_keys_but_mixes_the_raw_values',
                         'test_depth_read_matches_the_equations')),
                Concept("the read as specified: elementwise logits (no matmul), float32 under autocast", 3,
                        "compute each logit as (x * w).sum(-1): a matmul (@, einsum, mm) is rounded to TF32 on GPUs; "
                        "turn autocast off and keep float32 (float64 inputs stay float64)",
                        ('test_reads_stay_float32_under_bf16_autocast', 'test_depth_read_uses_no_matmul')))),
    2: dict(title="RD-AttnRes: the routes of a read point",
            task="one pseudo-query per route (in the order of self.routes, also when two routes share a query) "
                 "with the key gain folded in; then the attention inputs: x_qk from the first route, x_v from "
                 "the last, both through norm_attn",
            concepts=(
                Concept("one query per route, the key gain folded in", 3,
                        "stack getattr(self, name) for every route in self.routes (ctrl_dup's two routes share one "
                        "name and are still two reads), times self.key_gain",
                        ('test_a_read_point_has_one_query_per_route',)),
                Concept("the attention inputs: Q/K from the first route, V from the last, through norm_attn", 4,
                        "x = self.norm_attn(h) for all routes at once (the same pre-norm for both, not norm_mlp), "
                        "then x[0] for queries and keys and x[-1] for values",
                        ('test_attention_inputs_come_from_their_routes_through_norm_attn',
                         'test_tied_value_query_gives_one_input_and_splits_the_gradient',
                         'test_attention_inputs_match_the_literal_routes')))),
    3: dict(title="The block bookkeeping",
            task="keep the sources: the embedding as its own source, the partial of the current AttnRes block "
                 "(a sum of the block's outputs, the embedding never added in), a block closed after its S-th "
                 "sublayer, then the final read over all blocks",
            concepts=(
                Concept("sources are increments: the embedding, finished blocks, the partial", 5,
                        "b_0 is the embedding alone; a block's source is the sum of its sublayers' outputs (not a "
                        "running sum of everything so far); it closes after its S-th sublayer; the last, shorter "
                        "block is closed before the final read",
                        ('test_attnres_matches_literal_reference', 'test_two_route_modes_match_literal_reference')),
                Concept("every read point reads its sources and is recorded", 2,
                        "sublayer l reads 1 + l // S + (l % S != 0) sources; pass `log` to every read",
                        ('test_routing_records_every_read_point',)),
                Concept("every pseudo-query learns", 1,
                        "every read must take part in the forward pass (the final read too)",
                        ('test_every_pseudo_query_gets_a_gradient',)))),
    4: dict(title="The paired data order",
            task="the windows of optimizer step `step`, all ranks together, as a list of ints: the slice "
                 "[step*W, (step+1)*W) of the epochs' seed-keyed permutations (window_order), crossing into the "
                 "next epoch where needed",
            concepts=(
                Concept("the exact order: each epoch a seed-keyed permutation, steps crossing epochs", 2,
                        "epoch e is window_order(n_windows, seed, e); step s takes positions [s*W, (s+1)*W) of the "
                        "endless sequence of epochs",
                        ('test_data_order_is_a_seeded_permutation_of_whole_windows',
                         'test_data_order_is_exactly_the_reference_order',
                         'test_committed_study_logs_still_match_their_data_order')),
                Concept("the same order on any number of processes", 3,
                        "return the whole step's W windows, whoever asks: train.py splits them between the ranks; "
                        "nothing may depend on RANK or WORLD_SIZE",
                        ('test_data_order_is_the_whole_step_whatever_the_processes',
                         'test_ddp_on_two_processes_equals_one_process_with_accumulation')))),
    5: dict(title="The paired statistics",
            task="mean and sample sd (n - 1) of the paired differences, the 95% t-interval half-width, the wins "
                 "(delta < 0), and the exact two-sided sign test; with one pair the sd and interval are NaN",
            concepts=(
                Concept("the paired table", 2, "sample sd over n - 1; half-width t(0.975, n-1) * sd / sqrt(n)",
                        ('test_paired_table_matches_hand_computed_values', 'test_statistics_against_known_values')),
                Concept("the statistics on other values", 2,
                        "a tie (delta = 0) is not a win; p = min(1, 2 * sum_{i <= k} C(n, i) / 2^n)",
                        ('test_paired_statistics_on_other_values',)),
                Concept("one pair (n = 1)", 2,
                        "with one pair there is no spread: sd and the interval are NaN (no division by n - 1 = 0), "
                        "the sign test gives p = 1",
                        ('test_one_pair_has_no_spread_and_no_interval', 'test_paired_statistics_on_other_values')))),
}
HIDDEN_TESTS = 'test_hidden.py'
INSTRUCTOR_ONLY = (HIDDEN_TESTS, 'test_course.py')   # never in a handout: hidden tests, planted mistakes
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


def handout(n, out_dir, last=None):
    """This project with assignment n and every later one to write (n = 1: the solution-free release)."""
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
# Grading: the student's marked lines in a clean copy, tests with a time limit, marks per concept

def answers(path, n):
    """The bodies of assignment n's YOUR CODE regions of a student's file, in order."""
    with open(path, errors='replace') as f:
        lines = f.read().split('\n')
    return [lines[first + 1:last] for a, first, last in regions('\n'.join(lines), ANSWER_BEGIN, ANSWER_END) if a == n]


def grading_tree(n, submission, tree):
    """A clean copy of the instructor's project in `tree` with, in each file of assignment n, the
    student's lines between the markers in place of the solution (submission None: the reference).
    Returns None, or why it cannot be built (a missing file, markers removed or changed)."""
    for f in project_files():
        if f.endswith('.png'):
            continue
        os.makedirs(os.path.join(tree, os.path.dirname(f)), exist_ok=True)
        shutil.copy2(os.path.join(HERE, f), os.path.join(tree, f))
    for f in files_of(n) if submission else ():
        theirs = os.path.join(submission, f)
        if not os.path.isfile(theirs):
            return f"{f} is missing from the submission"
        mine = open(os.path.join(HERE, f)).read().split('\n')
        spots = [(first, last) for a, first, last in regions('\n'.join(mine)) if a == n]
        found = answers(theirs, n)
        if len(found) != len(spots):
            return (f"{f}: {len(found)} of its {len(spots)} '### BEGIN/END YOUR CODE (assignment {n})' regions "
                    "were found: put the markers back as they were in the handout (only the lines between "
                    "them are graded)")
        for (first, last), body in sorted(zip(spots, found), reverse=True):   # from the end: lines stay put
            mine[first + 1:last] = body
        with open(os.path.join(tree, f), 'w') as out:
            out.write('\n'.join(mine))
    return None


def run_tests(n, tree, limit):
    """Run the public and hidden tests of assignment n in `tree`, at most `limit` seconds (a test alone at
    most half of it). Returns ({test id: (passed, message)}, collection errors, timed out, seconds)."""
    with tempfile.TemporaryDirectory() as work:   # outside the tree: nothing under test writes here
        results = os.path.join(work, 'results.jsonl')
        env = {k: v for k, v in os.environ.items() if not k.startswith(('PYTHON', 'PYTEST'))}
        env.update(PYTHONDONTWRITEBYTECODE='1', COURSE_RESULTS=results, COURSE_TEST_LIMIT=str(max(1, int(limit / 2))))
        # one thread per grading run: the tests are tiny, and runs side by side (--jobs) or a busy machine
        # would otherwise leave torch's threads waiting for each other (5-10x slower here)
        env.setdefault('OMP_NUM_THREADS', '1')
        cmd = [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-p', 'course', '-m',
               f'assignment{n}', *test_files(n, tree)]
        t0, timed_out = time.time(), False
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            timed_out = True
        seconds = time.time() - t0
        tests, errors = {}, []
        if os.path.exists(results):
            with open(results) as f:
                for line in f:
                    try:
                        r = json.loads(line)
                    except ValueError:
                        continue   # a line cut by the kill
                    if r['kind'] == 'collect':
                        errors.append(r['message'])
                    elif not r['passed'] or r['id'] not in tests:   # a failed setup or teardown counts too
                        tests[r['id']] = (r['passed'], r['message'])
    return tests, errors, timed_out, seconds


REFERENCE = {}   # assignment -> (test ids, seconds) of the instructor's own solution, measured once


def reference(n):
    if n not in REFERENCE:
        with tempfile.TemporaryDirectory() as tree:
            grading_tree(n, None, tree)
            tests, errors, timed_out, seconds = run_tests(n, tree, limit=1800)
        bad = [t for t, (ok, _) in tests.items() if not ok]
        if errors or timed_out or bad or not tests:
            raise SystemExit(f"assignment {n}: the reference solution does not pass its own tests ({errors or bad}); "
                             "grading needs the instructor's complete copy of the project")
        untested = [c.name for c in ASSIGNMENTS[n]['concepts'] if not any(function_name(t) in c.tests for t in tests)]
        unmarked = sorted({function_name(t) for t in tests} - {name for c in ASSIGNMENTS[n]['concepts'] for name in c.tests})
        if untested or unmarked:
            raise SystemExit(f"assignment {n}: concepts without tests {untested}, tests in no concept {unmarked}")
        REFERENCE[n] = (sorted(tests), seconds)
    return REFERENCE[n]


def function_name(test_id):
    return test_id.split('::')[-1].split('[')[0]


def grade_one(n, submission, limit=None):
    """Grade one submission folder: a dict with the marks of each concept, the total, status and feedback."""
    expected, ref_seconds = reference(n)
    limit = limit or max(60.0, 5 * ref_seconds)
    concepts = ASSIGNMENTS[n]['concepts']
    total = sum(c.marks for c in concepts)
    with tempfile.TemporaryDirectory() as tree:
        problem = grading_tree(n, submission, tree)
        tests, errors, timed_out, seconds = ({}, [], False, 0.0) if problem else run_tests(n, tree, limit)
    status = 'graded' if not (problem or errors or timed_out) else \
        'no answer' if problem else 'timed out' if timed_out else 'error'
    by_concept, marks = {}, {}   # each concept's feedback lines, and its marks
    for c in concepts:
        ids = [t for t in expected if function_name(t) in c.tests]
        failed = [(t, tests.get(t, (False, 'timed out' if timed_out else 'did not run'))[1]) for t in ids
                  if not tests.get(t, (False, ''))[0]]
        marks[c.name] = 0 if failed else c.marks
        lines = [f"  {'PASS' if not failed else 'FAIL'} {marks[c.name]}/{c.marks}  {c.name}"]
        lines += [f"         {function_name(t)}: {message}" for t, message in failed[:3]]
        if failed:
            lines.append(f"         ({len(failed)} of {len(ids)} tests failed) hint: {c.hint}")
        by_concept[c.name] = lines
    score = sum(marks.values())
    head = [f"assignment {n}: {ASSIGNMENTS[n]['title']} -- {submission}"]
    if problem:
        head.append(f"  not graded: {problem}")
    for e in errors[:3]:
        head.append(f"  the code does not run: {e}")
    if timed_out:
        head.append(f"  timed out after {limit:.0f} s (the reference takes {ref_seconds:.0f} s): what did not finish "
                    "scores 0")
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
    """Gradescope's autograder format (results.json): one test per concept, with its marks and feedback."""
    return dict(score=result['score'], execution_time=result['seconds'], output='\n'.join(result['head']),
                tests=[dict(name=c.name, score=result['marks'][c.name], max_score=c.marks, visibility='visible',
                            output='\n'.join(line.strip() for line in result['by_concept'][c.name]))
                       for c in ASSIGNMENTS[n]['concepts']])


def grade(n, folder, out_dir=None, limit=None, gradescope=None, jobs=1):
    """Grade a submission or a class (jobs submissions at a time: each is its own process); print each
    student's feedback, and with out_dir write it, their results.json and the gradebook."""
    from concurrent.futures import ThreadPoolExecutor
    subs = submissions_in(n, folder)
    concepts = ASSIGNMENTS[n]['concepts']
    reference(n)   # measured once, before the students
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        graded = list(pool.map(lambda sub: grade_one(n, sub[1], limit), subs))
    rows = []
    for (name, path), r in zip(subs, graded):
        print(r['feedback'], flush=True)
        rows.append((name, r))
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, f'{name}.txt'), 'w') as f:
                f.write(r['feedback'] + '\n')
            with open(os.path.join(out_dir, f'{name}.results.json'), 'w') as f:
                json.dump(gradescope_json(r, n), f, indent=2)
    if out_dir:
        with open(os.path.join(out_dir, f'gradebook_assignment{n}.csv'), 'w', newline='') as f:
            w = csv.writer(f)
            w.writerow(['student', *[c.name for c in concepts], 'total', 'max', 'seconds', 'status'])
            for name, r in rows:
                w.writerow([name, *[r['marks'][c.name] for c in concepts], r['score'], r['total'], r['seconds'],
                            r['status']])
        print(f"wrote {out_dir}/gradebook_assignment{n}.csv and each student's feedback ({len(rows)} students)")
    if gradescope:
        with open(gradescope, 'w') as f:
            json.dump(gradescope_json(rows[0][1], n), f, indent=2)
    return rows


# -----------------------------------------------------------------------------
# The pytest plugin of a grading run (loaded with -p course): each test's outcome, as it finishes, into
# the file COURSE_RESULTS, and a time limit per test (COURSE_TEST_LIMIT seconds)

class TestTimedOut(Exception):
    pass


def _record(**row):
    path = os.environ.get('COURSE_RESULTS')
    if path:
        with open(path, 'a') as f:
            f.write(json.dumps(row) + '\n')


def _first_line(report):
    text = str(report.longrepr) if report.longrepr else ''
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    error = next((line for line in reversed(lines) if line.startswith('E ')), lines[-1] if lines else '')
    where = next((line for line in reversed(lines) if re.match(r'^\S+\.py:\d+', line)), '')
    return (error[2:].strip() if error.startswith('E ') else error)[:200] + (f" ({where[:80]})" if where else '')


def pytest_runtest_logreport(report):
    if report.when == 'call' or report.failed:
        _record(kind='test', id=report.nodeid, passed=report.passed, message='' if report.passed else _first_line(report))


def pytest_collectreport(report):
    if report.failed:
        _record(kind='collect', id=report.nodeid, passed=False, message=_first_line(report))


def pytest_runtest_call(item):
    limit = int(os.environ.get('COURSE_TEST_LIMIT', 0))
    if limit and hasattr(signal, 'SIGALRM'):
        def stop(signum, frame):
            raise TestTimedOut(f"timed out: the test ran past {limit} s")
        signal.signal(signal.SIGALRM, stop)
        signal.alarm(limit)


def pytest_runtest_teardown(item):
    if hasattr(signal, 'SIGALRM'):
        signal.alarm(0)


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
    p.add_argument('--timeout', type=float, help="seconds per grading run (default: 5x the reference's, at least 60)")
    p.add_argument('--gradescope', help="write Gradescope's results.json for the (first) submission here")
    p.add_argument('--jobs', type=int, default=1, help="submissions graded at the same time (one process each)")
    args = ap.parse_args(argv)
    if getattr(args, 'n', 1) not in ASSIGNMENTS:
        raise SystemExit(f"no assignment {args.n}; there are {', '.join(map(str, ASSIGNMENTS))}")
    if args.command == 'list':
        for n, a in ASSIGNMENTS.items():
            print(f"{n}. {a['title']} ({', '.join(files_of(n))}): {a['task']}")
            for c in a['concepts']:
                print(f"     {c.marks} marks: {c.name}")
        return 0
    if args.command == 'handout':
        handout(args.n, args.out_dir)
    elif args.command == 'release':
        handout(1, args.out_dir)
    elif args.command == 'check':
        return check(args.n, args.directory)
    else:
        if not os.path.exists(os.path.join(HERE, HIDDEN_TESTS)):
            raise SystemExit(f"{HIDDEN_TESTS} is not here: grading needs the instructor's copy of the project")
        rows = grade(args.n, args.folder, args.out, args.timeout, args.gradescope, args.jobs)
        return 0 if all(r['score'] == r['total'] for _, r in rows) else 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
