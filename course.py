"""
The course kit: hand out the depth-routing assignments and grade a class (COURSE.md is the students' page).

    python course.py list                          # the assignments, their files, concepts and marks
    python course.py handout 2 handout2/           # a copy of the project with assignments 2..5 to write
    python course.py release release/              # the solution-free release: all five to write
    python course.py check 2                       # student: assignment 2's public tests, here
    python course.py grade 2 submissions/          # instructor: one folder, or a class (a folder per student)
    python course.py grade 2 upload.zip            # one upload as a zip (read as data, never unpacked by a tool)
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
course_kit/grader.py runs each concept's probes in a sandbox (bubblewrap, one per submission) with the
student's code and on the instructor's own code, and compares. Each assignment has a few concepts, each
worth some marks, earned when all of its probes match. The grader, its inputs and its checks are never handed out.
"""

import argparse
import csv
import errno
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile


HERE = os.path.dirname(os.path.abspath(__file__))
EXIT_NOT_GRADED = 3   # grade's exit status when a submission could not be graded (0: all full marks, 1: some not;
                      # 4, EXIT_NOT_WRITTEN: what it had to write could not all be written)


ASSIGNMENTS = {   # the statements: COURSE.md; the concepts, their marks and the grader: course_kit/grader.py
    1: dict(title="The depth read",
            task="implement the depth read: scores = (b_s * w_r).sum(-1) * (1/rms(b_s)) per source and route "
                 "(an elementwise product and a sum, no matmul, no 1/sqrt(d)), a softmax over the sources and "
                 "the raw sources mixed by alpha, in float32 with autocast off (float64 stays float64)"),
    2: dict(title="RD-AttnRes: the routes of a read point",
            task="one pseudo-query per route (in the order of self.routes, also when two routes share one) "
                 "with the source gain folded in; then the attention inputs: x_qk from the first route, x_v from "
                 "the last, both through norm_attn"),
    3: dict(title="The block bookkeeping",
            task="keep the sources: the embedding as its own source, the partial of the current AttnRes block "
                 "(a sum of the block's outputs, the embedding never added in), a block closed after its S-th "
                 "sublayer, then the final read over all blocks; sublayer l's output is "
                 "self.sublayer_output(l, self.read_point(l)(sources, log))"),
    4: dict(title="The paired data order",
            task="the windows of optimizer step `step`, all ranks together, as a list of ints: the slice "
                 "[step*M, (step+1)*M) of the epochs' seed-keyed permutations (window_order), crossing into the "
                 "next epoch where needed"),
    5: dict(title="The paired statistics",
            task="mean and sample sd (n - 1) of the paired differences, the 95% t-interval half-width, the wins "
                 "(delta < 0), the ties (delta = 0), and the exact two-sided sign test of the wins among the pairs "
                 "that are not ties; with one pair the sd and interval are NaN"),
}
# What a handout holds: the project (its code, tests, configs and docs, so that its own suite runs and every
# file it names is there), but the instructor's kit (the grader, the sandbox's worker, the hidden checks and the
# kit's own tests) and the study's runs and measurements (data, not code: large, and of no use to an answer).
# The instructor's part of COURSE.md is cut from a handout's copy (INSTRUCTORS_PART on).
INSTRUCTOR_ONLY = ('course_kit/', 'tests/test_hidden.py', 'tests/test_course.py', 'tests/test_course_check.py')
NOT_HANDED_OUT = ('results/', 'study/')
INSTRUCTORS_PART = '\n## For instructors\n'
# What the sandbox of a grading run holds: the modules the probes import, and the worker
GRADING_FILES = ('model.py', 'compare.py', 'train.py', 'configurator.py', 'prepare.py', 'fast_read/__init__.py',
                 'fast_read/two_phase_read.py', 'run_kit/__init__.py', 'run_kit/common.py', 'run_kit/routing.py',
                 'run_kit/console.py', 'run_kit/run_control.py', 'run_kit/run_dir.py', 'run_kit/run_files.py')
WORKER = ('course_kit/worker.py', 'course_worker.py')   # the worker, and its name in the sandbox's tree
BEGIN = re.compile(r'^(\s*)### BEGIN SOLUTION (\d+)\s*$')
END = re.compile(r'^\s*### END SOLUTION\s*$')
# code that computes what assignment n asks a second way (fast_read/two_phase_read.py): given with n's solution
WITH_BEGIN = re.compile(r'^(\s*)### BEGIN WITH SOLUTION (\d+)\s*$')
WITH_END = re.compile(r'^\s*### END WITH SOLUTION\s*$')
# inside such a region, the lines a handout that lacks the solution holds instead, commented out here: a whole
# file that computes nothing a student writes (it calls the student's functions), never a stub
HANDOUT_LINE = re.compile(r'^(\s*)### HANDOUT: ?(.*)$')
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


def not_written(n):
    """The message of a stub of assignment n: what every test that needs it fails with."""
    return f"assignment {n}: not written yet ({ASSIGNMENTS[n]['task']})"


def stub(text, first):
    """The file's text with the regions of assignments >= first replaced by a stub between YOUR CODE
    markers, and their WITH SOLUTION regions by the region's HANDOUT lines (uncommented); the solutions of the
    earlier ones stay, without their markers, and so do the earlier WITH SOLUTION regions, without their
    HANDOUT lines."""
    lines, out, skipping, handout_lines = text.split('\n'), [], False, False
    for line in lines:
        m, w, h = BEGIN.match(line), WITH_BEGIN.match(line), HANDOUT_LINE.match(line)
        if m and int(m.group(2)) >= first:
            indent, n = m.group(1), int(m.group(2))
            out += [f"{indent}### BEGIN YOUR CODE (assignment {n})",
                    f"{indent}# (assignment {n}, COURSE.md; check it with: python course.py check {n})",
                    f'{indent}raise NotImplementedError({not_written(n)!r})',
                    f"{indent}### END YOUR CODE (assignment {n})"]
            skipping = True
        elif w:
            skipping = handout_lines = int(w.group(2)) >= first
        elif END.match(line) or WITH_END.match(line):
            skipping = handout_lines = False
        elif h:
            if handout_lines:
                out.append(h.group(1) + h.group(2))
        elif not m and not skipping:
            out.append(line)
    return '\n'.join(out)


def files_of(n, root=HERE):
    return sorted({f for f in project_files(root) if f.endswith('.py') and f != 'course.py'
                   and any(a == n for a, _, _ in regions(open(os.path.join(root, f)).read()))})


def handout_files(root=HERE):
    """The project's files that go into a handout: all but INSTRUCTOR_ONLY and NOT_HANDED_OUT."""
    return [f for f in project_files(root) if not f.startswith(INSTRUCTOR_ONLY + NOT_HANDED_OUT)]


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
        elif f == 'COURSE.md':   # the students' page: the instructor's part is the instructor's
            with open(src) as fin, open(dst, 'w') as fout:
                fout.write(fin.read().split(INSTRUCTORS_PART)[0].rstrip('\n') + '\n\n(The instructor\'s part of '
                           'this page, how grading works, is in the instructor\'s copy of the project.)\n')
        else:
            shutil.copy2(src, dst)
    todo = ', '.join(str(a) for a in ASSIGNMENTS if a >= n)
    print(f"{out_dir}: the project with assignment{'s' if n < max(ASSIGNMENTS) else ''} {todo} to write "
          f"({ASSIGNMENTS[n]['title']} first, in {', '.join(files_of(n))}); students check their work with: "
          f"python course.py check {n}")


def test_files(n, directory):
    """The test files of `directory` (test_model.py) and of its tests/ that hold tests of assignment n, as
    paths relative to it (only these are collected, so a check needs nothing the other tests need)."""
    found = []
    for folder in ('.', 'tests'):
        where = os.path.join(directory, folder)
        if os.path.isdir(where):
            found += [os.path.normpath(os.path.join(folder, f)) for f in sorted(os.listdir(where))
                      if f.startswith('test_') and f.endswith('.py')
                      and f'pytest.mark.assignment{n}\n' in open(os.path.join(where, f)).read()]
    return found


def check(n, directory='.', first=False, **run):
    """A student's check: the public tests of assignment n, in the student's copy (with first: stop at the first
    failure). Returns pytest's exit status (0: every test passed), or with `run` (subprocess.run's arguments)
    the completed process."""
    p = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', *(['-x'] if first else []),
                        '-m', f'assignment{n} and not hidden', *test_files(n, directory)], cwd=directory, **run)
    return p if run else p.returncode


# -----------------------------------------------------------------------------
# Grading: the student's marked lines in a copy of the graded files; their code runs only in a sandbox

MAX_SOURCE = 1_000_000   # bytes: a file of an assignment is a few kB (model.py, the largest, about 25 kB)


KINDS = {stat.S_IFDIR: 'a folder', stat.S_IFIFO: 'a FIFO', stat.S_IFCHR: 'a character device',
         stat.S_IFBLK: 'a block device', stat.S_IFSOCK: 'a socket'}   # what a file that is not a regular one is


class NotHandedIn(Exception):
    """A file of a submission that is not graded (missing, a link, not a regular file, too large): why, in words.
    flagged: not the student's fault, or not surely (a hard link another student may have made): the row is
    "not graded", for the instructor to look at, never a 0."""

    def __init__(self, message, flagged=False):
        super().__init__(message)
        self.flagged = flagged


class Flagged(str):
    """Why a submission is not graded, where that is no fault of its code (a hard link that another student may
    have made, a full disk): its row is "not graded", flagged for the instructor (exit status 3), never a 0."""


def read_handed_in(submission, f, follow=True):
    """The text of file f of a submission folder: a regular file of the folder itself (never a link, hard or
    symbolic, a device, a FIFO or a folder: none of them is opened), at most MAX_SOURCE bytes, decoded as UTF-8 (a byte that is not
    UTF-8 becomes U+FFFD and is graded as the code it is). With follow=False the folder itself must not be a
    link either."""
    try:
        folder = os.open(submission, os.O_RDONLY | os.O_DIRECTORY | (0 if follow else os.O_NOFOLLOW))
    except OSError as e:
        raise NotHandedIn("the submission folder is a link: hand in a folder" if e.errno in (errno.ELOOP, errno.ENOTDIR)
                          and os.path.islink(submission) else f"the submission folder cannot be read ({e.strerror})")
    try:
        try:   # (O_PATH: the entry itself, opened for nothing: a device or a FIFO is never opened, which can have
            #  effects (a watchdog, a tape, a writer woken); O_NOFOLLOW: a link is the link, never what it names)
            where = os.open(f, os.O_PATH | os.O_NOFOLLOW, dir_fd=folder)
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise NotHandedIn(f"{f} is missing from the submission")
            raise NotHandedIn(f"{f} cannot be read ({e.strerror}): hand in a plain file")
        try:
            st = os.fstat(where)
            if stat.S_ISLNK(st.st_mode):
                raise NotHandedIn(f"{f} is a link: hand in the file itself")
            if not stat.S_ISREG(st.st_mode):
                raise NotHandedIn(f"{f} is not a regular file ({KINDS.get(stat.S_IFMT(st.st_mode), 'not a file')}): "
                                  "hand in the file itself")
            if st.st_nlink > 1:   # (a hard link: the same file under another name, another student's perhaps, who
                                  # may be the victim: flagged, never graded as either's)
                raise NotHandedIn(f"{f} is a hard link (one file with {st.st_nlink} names, the others outside this "
                                  "folder): not graded, as it may be another's file; the instructor will look at it",
                                  flagged=True)
            fd = os.open(f'/proc/self/fd/{where}', os.O_RDONLY)   # (the file found above, whatever its name is now)
        except OSError as e:
            raise NotHandedIn(f"{f} cannot be read ({e.strerror}): hand in a plain file")
        finally:
            os.close(where)
        with os.fdopen(fd, 'rb') as fin:
            if st.st_size > MAX_SOURCE:
                raise NotHandedIn(f"{f} is {st.st_size:,} bytes, more than the {MAX_SOURCE:,} a source file of an "
                                  "assignment may have: hand in the handout's file with your lines")
            data = fin.read(MAX_SOURCE + 1)
        if len(data) > MAX_SOURCE:   # (it grew after the check)
            raise NotHandedIn(f"{f} is more than {MAX_SOURCE:,} bytes: hand in the handout's file with your lines")
        return data.decode('utf-8', 'replace')
    finally:
        os.close(folder)


def answers(text, n):
    """The bodies of assignment n's YOUR CODE regions of a student's file's text, in order."""
    lines = text.split('\n')
    return [(first, lines[first + 1:last]) for a, first, last in regions(text, ANSWER_BEGIN, ANSWER_END) if a == n]


def grading_tree(n, submission, tree, follow=True):
    """The files a grading run needs (GRADING_FILES), readable by everyone, in `tree`: the student's handout of
    assignment n (the earlier assignments' solutions, stubs for n and the later ones: nothing the student's copy
    does not hold) with the student's lines between the markers of n. Returns (None or why it cannot be built
    (a file missing, a link, not a regular file, too large, markers removed or changed), {(file, line in the
    tree): line in theirs})."""
    lines_of, graded = {}, files_of(n)
    os.makedirs(tree, exist_ok=True)
    os.chmod(tree, 0o755)
    for f, to in [(f, f) for f in GRADING_FILES] + [WORKER]:
        with open(os.path.join(HERE, f)) as fin:
            text = fin.read()
        ours = (stub(text, n) if f.endswith('.py') else text).split('\n')   # the handout's copy of the file
        if f in graded:
            try:
                theirs = read_handed_in(submission, f, follow)
            except NotHandedIn as e:
                return (Flagged(e) if e.flagged else str(e)), {}
            spots = [(first, last) for a, first, last in regions('\n'.join(ours), ANSWER_BEGIN, ANSWER_END) if a == n]
            found = answers(theirs, n)
            if len(found) != len(spots):
                return (f"{f}: {len(found)} of its {len(spots)} '### BEGIN/END YOUR CODE (assignment {n})' regions "
                        "were found: put the markers back as they were in the handout (only the lines between "
                        "them are graded)"), {}
            out, prev = [], 0
            for (first, last), (their_first, body) in zip(spots, found):
                out += ours[prev:first + 1]                     # up to and with the BEGIN marker
                for i, line in enumerate(body):                 # (1-based line numbers on both sides)
                    lines_of[(f, len(out) + 1)] = their_first + 2 + i
                    out.append(line)
                prev = last                                     # from the END marker on
            ours = out + ours[prev:]
        path = os.path.join(tree, to)
        if os.path.dirname(to) and not os.path.isdir(os.path.dirname(path)):   # run_kit/, fast_read/
            os.makedirs(os.path.dirname(path))
            os.chmod(os.path.dirname(path), 0o755)
        with open(path, 'w') as out:
            out.write('\n'.join(ours))
        os.chmod(path, 0o644)
    return None, lines_of


def their_line(where, lines_of):
    """The worker's 'model.py, line N: text' with N as a line of the student's own file when it is theirs."""
    from course_kit.grader import shown, student_said
    m = re.match(r'^(\S+\.py), line (\d+): (.*)$', where or '')
    if not m:
        return student_said(where)
    f, line, text = m.group(1), int(m.group(2)), m.group(3)
    if (f, line) in lines_of:
        return f"your {f}, line {lines_of[(f, line)]}: {student_said(text.strip(), 200)}"
    return f"{shown(f, 80)}, line {line} (called from your code)"   # (a file name the code can make up: inert)


def with_room(fn, limit):
    """fn(), and once more when it met a full disk (another student's run filled it: its files go with its run)
    and there is room again; a full disk the second time is the OSError, which grade_safely says."""
    from course_kit import grader as course_grader
    try:
        return fn()
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
    course_grader.wait_for_room(limit)
    return fn()


def grade_one(n, submission, limit=None, sandbox='bubblewrap', follow=True, name=None):
    """Grade one submission folder: a dict with the marks of each concept, the total, status and feedback. A
    folder that lacks the assignment's files but holds one copy of the project deeper (an upload nested in
    folders) is graded from there, and the feedback says so; one that holds several says where."""
    from course_kit import grader as course_grader
    limit = limit or 60.0
    concepts = course_grader.concepts(n)
    marks, by_concept, timed_out, seconds = {}, {}, False, 0.0
    where, found, problem = locate(n, submission)
    lines_of = {}
    # the student's folder in the grader's own (0700, random name; under the uid sandbox its user's alone)
    work = with_room(lambda: tempfile.mkdtemp(dir=course_grader.grading_folder()), limit)
    try:
        tree = os.path.join(work, 'tree')
        if not problem:
            problem, lines_of = with_room(lambda: grading_tree(n, where, tree, follow), limit)
        results = ([(False, [], False, 0.0)] * len(concepts) if problem else
                   course_grader.evaluate_concepts(concepts, tree, limit, sandbox,
                                                   lambda where: their_line(where, lines_of)))
        for c, (passed, lines, late, took) in zip(concepts, results):
            timed_out, seconds = timed_out or late, seconds + took
            marks[c.name] = c.marks if passed else 0
            by_concept[c.name] = [f"  {'PASS' if passed else 'FAIL'} {marks[c.name]}/{c.marks}  {c.name}"]
            by_concept[c.name] += [f"         {x}" for x in lines]
            if not passed and not problem:
                by_concept[c.name].append(f"         hint: {c.hint}")
    finally:
        course_grader.remove_tree(work)
    status = ('not graded' if isinstance(problem, Flagged) else 'no answer' if problem else
              'timed out' if timed_out else 'graded')
    head = [f"assignment {n}: {ASSIGNMENTS[n]['title']} -- {name or course_grader.shown_name(submission)}"]
    if found:
        head.append(f"  graded the folder {course_grader.shown(found)} of the submission (the project was found there)")
    if problem:
        head.append(f"  not graded: {problem}")
    if timed_out:
        head.append(f"  timed out: code that runs past {limit:.0f} s of CPU time, or twice that in wall-clock time, "
                    "per concept scores 0 for it")
    return row(submission, concepts, marks, by_concept, head, status, seconds)


DEEPEST, MOST_ENTRIES = 8, 20_000   # how far a submission is searched for a project nested in folders


def files_found(folder, files):
    """The paths (relative to folder, sorted) of the regular files under it, at most DEEPEST folders down (links
    never followed, at most MOST_ENTRIES entries looked at), whose path ends with one of `files` (relative
    paths: compare.py, fast_read/two_phase_read.py)."""
    found, stack, seen = [], [(folder, 0)], 0
    while stack and seen < MOST_ENTRIES:
        top, depth = stack.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for e in entries:
            seen += 1
            try:
                if e.is_dir(follow_symlinks=False):
                    if depth < DEEPEST:
                        stack.append((e.path, depth + 1))
                elif e.is_file(follow_symlinks=False):
                    rel = os.path.relpath(e.path, folder).replace(os.sep, '/')
                    if any(rel == f or rel.endswith('/' + f) for f in files):
                        found.append(rel)
            except OSError:
                continue
    return sorted(found)


def project_roots(found, files):
    """The folders (relative, '' for the top) that a list of found files (files_found) places a project at: the
    path of each less the assignment file's own relative path."""
    roots = set()
    for rel in found:
        f = max((f for f in files if rel == f or rel.endswith('/' + f)), key=len)
        roots.add(rel[:-len(f)].rstrip('/'))
    return sorted(roots)


def locate(n, submission):
    """(folder to grade, the nested folder it is as said to the student or None, why it cannot be graded or
    None): the submission itself when it holds one of assignment n's files (or anything in their place: a
    link, a folder, which read_handed_in refuses); else the one folder deeper that holds a copy of the project
    (an upload nested in folders); with several, why, saying where they are."""
    files = files_of(n)
    if os.path.islink(submission) or any(os.path.lexists(os.path.join(submission, f)) for f in files):
        return submission, None, None   # (a linked folder is never searched through: read_handed_in refuses it)
    found = files_found(submission, files)
    roots = project_roots(found, files)
    if len(roots) == 1:
        return os.path.join(submission, roots[0]), roots[0], None
    if roots:
        from course_kit.grader import shown
        return submission, None, (f"{files[0]} is missing from the submission folder itself; found at "
                                  f"{', '.join(shown(x, 120) for x in found[:3])}{', ...' if len(found) > 3 else ''}: "
                                  "upload the project folder (one copy of it)")
    return submission, None, None


def same_files(subs, files):
    """{index of a submission: why it is not graded} for each submission whose file of the assignment is the same
    file (one inode: a hard link) as another submission's: neither is graded, both are flagged (the victim is
    never blamed). subs: [(name as shown, folder)]."""
    owners = {}
    for i, (name, folder) in enumerate(subs):
        for f in files:
            try:
                st = os.lstat(os.path.join(folder, f))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                owners.setdefault((st.st_dev, st.st_ino), []).append((i, name, f))
    out = {}
    for holders in owners.values():
        if len({i for i, _, _ in holders}) < 2:
            continue
        for i, _, f in holders:
            others = [name for j, name, _ in holders if j != i]
            out.setdefault(i, Flagged(f"{f} is the same file as {others[0]}'s"
                                      + (f" (and {len(others) - 1} more)" if len(others) > 1 else '')
                                      + " (a hard link): neither is graded; the instructor will look at it"))
    return out


# A submission may come as a zip (Gradescope's upload, before Gradescope unpacks it; an export of a class): it is read
# as data, never unpacked by a tool. Only the entries that can be a file of the assignment are written out (regular
# files whose path ends with one, read up to MAX_SOURCE + 1 bytes each), into a folder of the grader's own; a bomb
# of other entries is never expanded.
MAX_ZIP = 100 * 2 ** 20   # bytes of a zip (Gradescope's uploads are at most 100 MB)
ZIP_ENTRIES = 20_000      # entries of a zip, as MOST_ENTRIES of a folder (its directory is read into memory)
ZIP_DIRECTORY = 4 * 2 ** 20   # bytes of a zip's directory: ZIP_ENTRIES entries of 200 bytes (46 and the name)
ZIP_COPIES = 16           # entries that can be a file of the assignment (several copies of the project)


def zip_directory(path):
    """(entries, bytes) of the directory a zip's end record says it has, read before the directory is (a
    directory of millions of entries would take gigabytes to read: zipfile reads as many bytes as the record
    says, whatever number of entries it says), or None where there is no such record. Where a zip64 locator
    comes before the end record, zipfile takes both from the zip64 record it points at: the larger of the two
    records' values, each."""
    with open(path, 'rb') as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 22 - 65535))
        tail = f.read()
        at = tail.rfind(b'PK\x05\x06')
        if at < 0 or len(tail) < at + 22:
            return None
        entries = int.from_bytes(tail[at + 10:at + 12], 'little')
        directory = int.from_bytes(tail[at + 12:at + 16], 'little')
        locator = tail[max(0, at - 20):at]
        if locator[:4] == b'PK\x06\x07' and len(locator) == 20:
            f.seek(int.from_bytes(locator[8:16], 'little'))
            record = f.read(56)
            if record[:4] != b'PK\x06\x06' or len(record) < 56:
                return None
            entries = max(entries, int.from_bytes(record[32:40], 'little'))
            directory = max(directory, int.from_bytes(record[40:48], 'little'))
    return entries, directory


def unpacked(n, zip_path, dest):
    """None once the files of assignment n in the zip at zip_path are written under dest (a folder that exists), as
    the zip names them; else why the zip is not graded, in words with what to do: not a zip that can be read, too
    large, an entry outside the zip's folder (an absolute path, a '..'), two entries that would be one file (the
    same name, or names that differ only in Unicode normalisation), a file of the assignment that is a link or not a
    regular file, or larger than MAX_SOURCE. A link is never made, nothing outside dest is written, nothing is
    expanded past MAX_SOURCE + 1 bytes."""
    import unicodedata
    import zipfile
    from course_kit.grader import shown
    again = "zip the project folder (or only the assignment's files) again, and submit again"
    files = files_of(n)
    try:
        size = os.path.getsize(zip_path)
        if size > MAX_ZIP:
            return f"the zip is {size:,} bytes, more than the {MAX_ZIP:,} an upload may have: zip only the project's files"
        directory = zip_directory(zip_path)
        if directory is None:
            return f"the file is not a zip that can be read (no end record): {again}"
        if directory[0] > ZIP_ENTRIES or directory[1] > ZIP_DIRECTORY:
            return (f"the zip holds more than {ZIP_ENTRIES:,} entries (or a directory of more than {ZIP_DIRECTORY:,} "
                    f"bytes): {again}")
        with zipfile.ZipFile(zip_path) as z:
            infos = z.infolist()
            if len(infos) > ZIP_ENTRIES:
                return f"the zip holds more than {ZIP_ENTRIES:,} entries: {again}"
            seen = {}
            for info in infos:
                name = info.filename
                parts = name.replace('\\', '/').split('/')
                if name.startswith(('/', '\\')) or re.match(r'^[A-Za-z]:', name) or '..' in parts:
                    return (f"the zip holds an entry outside its folder ({student_text(name)}: an absolute path or "
                            f"a '..'): {again}")
                clean = '/'.join(p for p in parts if p not in ('', '.'))
                key = unicodedata.normalize('NFC', clean)
                if key in seen:
                    other, other_clean = seen[key]
                    return ((f"the zip holds two entries for one file ({student_text(other)} and {student_text(name)})"
                             if other_clean == clean else
                             f"the zip holds two entries whose names differ only in Unicode normalisation "
                             f"({student_text(other)} and {student_text(name)}): one file on some systems")
                            + f": {again}")
                seen[key] = name, clean
            wanted = [info for info in infos if any(info.filename == f or info.filename.endswith('/' + f) for f in files)]
            if len(wanted) > ZIP_COPIES:
                return f"the zip holds {len(wanted)} copies of {', '.join(files)}: upload one copy of the project"
            for info in wanted:
                name = info.filename
                kind = stat.S_IFMT(info.external_attr >> 16)
                if kind == stat.S_IFLNK:
                    return f"{student_text(name)} is a link in the zip: zip the file itself, and submit again"
                if info.is_dir() or kind not in (0, stat.S_IFREG):
                    return f"{student_text(name)} is not a regular file in the zip: zip the file itself, and submit again"
                if info.file_size > MAX_SOURCE:
                    return (f"{student_text(name)} is {info.file_size:,} bytes, more than the {MAX_SOURCE:,} a source "
                            "file of an assignment may have: hand in the handout's file with your lines")
                with z.open(info) as fin:
                    data = fin.read(MAX_SOURCE + 1)   # (a size that lies is read no further)
                if len(data) > MAX_SOURCE:
                    return (f"{student_text(name)} is more than {MAX_SOURCE:,} bytes: hand in the handout's file with "
                            "your lines")
                at = dest
                for part in [p for p in name.split('/') if p not in ('', '.')][:-1]:
                    at = os.path.join(at, part)
                    if not os.path.isdir(at):
                        os.mkdir(at, 0o700)
                fd = os.open(os.path.join(at, os.path.basename(name)), os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                             os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, 'wb') as out:
                    out.write(data)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, EOFError, ValueError) as e:
        # (a cut or garbled zip, a bad CRC, an encrypted entry or a method zipfile does not know)
        return f"the zip cannot be read ({type(e).__name__}: {shown(e, 200)}): {again}"
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        return f"the zip cannot be unpacked ({shown(e.strerror or e, 200)}): {again}"
    return None


def student_text(name):
    """A name from a submission (a zip's entry) as a message shows it: inert, labelled, and with what could make it
    print like another name escaped (course_grader.shown_name)."""
    from course_kit.grader import shown_name
    return f"[from the submission: {shown_name(name)}]"


def not_graded(n, submission, name, why, status='not graded'):
    """The row of a submission whose grading failed (whatever failed, the grader's own code included), or with
    status 'no answer', of one that cannot be graded by its own doing (a zip that cannot be read as one)."""
    from course_kit import grader as course_grader
    concepts = course_grader.concepts(n)
    return row(submission, concepts, {c.name: 0 for c in concepts},
               {c.name: [f"  FAIL 0/{c.marks}  {c.name}"] for c in concepts},
               [f"assignment {n}: {ASSIGNMENTS[n]['title']} -- {name}", f"  not graded: {why}"], status, 0.0)


def row(submission, concepts, marks, by_concept, head, status, seconds):
    """A student's row: the marks of each concept, the total, status and feedback (the head, each concept's
    lines, the score)."""
    score, total = sum(marks.values()), sum(c.marks for c in concepts)
    feedback = '\n'.join(head + [line for c in concepts for line in by_concept[c.name]] + [f"score: {score}/{total}"])
    return dict(submission=submission, marks=marks, score=score, total=total, status=status,
                seconds=round(seconds, 1), feedback=feedback, head=head, by_concept=by_concept)


def grade_safely(n, submission, name, limit, sandbox, follow):
    """grade_one inside an error boundary: whatever goes wrong while grading one student gives that student a
    row saying "not graded: <why>", and the class goes on; a disk too full for grading to write is said so."""
    from course_kit import grader as course_grader
    try:
        return grade_one(n, submission, limit, sandbox, follow, name)
    except course_grader.DiskFull as e:
        return not_graded(n, submission, name, str(e))
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            return not_graded(n, submission, name, f"the grader failed on this submission ({type(e).__name__}: "
                                                   f"{course_grader.shown(e, 200)}); grade it again, or alone, and "
                                                   "report the message")
        return not_graded(n, submission, name, f"the disk was full ({course_grader.shown(e.strerror, 100)}, where grading "
                                               "writes its copy of the submission): make room and grade it again")
    except Exception as e:   # noqa: BLE001 (the boundary: a bug of the grader's own included)
        return not_graded(n, submission, name, f"the grader failed on this submission ({type(e).__name__}: "
                                               f"{course_grader.shown(e, 200)}); grade it again, or alone, and report the message")


def submissions_in(n, folder, layout=None):
    """([(name as shown, path, follow links, note, skeleton)], [what was skipped, in words]): the folder itself if it is
    one submission, else each of its subfolders (a class: one folder per student), as folder_layout reads it
    (layout: 'submission' or 'class', said by the instructor; a folder it cannot read either way is refused). A student names their own folder,
    so a folder or a link named compare.py in a class is a student's, never the sign of a submission. In a
    class a student's entry that is a link is graded as not handed in (a link hands in someone else's
    folder), and a plain file is skipped and said. Rows are told apart by what a person sees: a name that
    could print like another (course_grader.shown_name, skeleton) is shown with escapes and its note says why;
    two rows never print the same."""
    from course_kit.grader import look_alike, name_note, shown_name, skeleton
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as e:
        raise SystemExit(f"{folder} cannot be read as a folder of submissions ({e.strerror})")
    if layout is None:
        layout, why = folder_layout(*folder_seen(n, entries), files_of(n))
        if layout is None:
            raise SystemExit(f"{folder}: {why}")
    if layout == 'submission':
        name = os.path.basename(os.path.abspath(folder))
        return [(shown_name(name), folder, True, name_note(name), skeleton(name))], []
    subs, skipped = [], []
    for e in entries:
        if e.is_dir(follow_symlinks=True):
            subs.append((e.name, e.path, False))
        else:
            skipped.append(f"{shown_name(e.name)}: {'a link to no folder' if e.is_symlink() else 'a file'}, not a "
                           "student's folder")
    if not subs:
        raise SystemExit(f"{folder} holds neither a submission ({', '.join(files_of(n))}) nor a folder per student")
    looks = [skeleton(raw) for raw, _, _ in subs]
    out = []
    for (raw, path, follow), look in zip(subs, looks):
        alike = [other for (other, _, _), o in zip(subs, looks) if look_alike(o, look) and other != raw]
        note = [name_note(raw)] if name_note(raw) else []
        if alike:
            note.append("prints like another student's name: "
                        + ', '.join(shown_name(other, lookalikes=True) for other in alike[:3]))
        out.append((shown_name(raw, lookalikes=bool(alike)), path, follow, '; '.join(note), look))
    names = [sub[0] for sub in out]
    if len(set(names)) != len(names):   # (two folders that show the same: each row made unique by its number)
        out = [(f"{sub[0]} (folder {i + 1})" if names.count(sub[0]) > 1 else sub[0], *sub[1:]) for i, sub in enumerate(out)]
    return out, skipped


def project_signs(n):
    """The names whose regular file marks a project folder: the project's top-level .py files and assignment n's."""
    return {f for f in handout_files() if '/' not in f and f.endswith('.py')} | set(files_of(n))


def folder_seen(n, entries):
    """What a folder's entries are, for folder_layout: (the assignment's files it holds as regular files, the
    project's other top-level .py files it holds so, [(each subfolder's name, whether it holds a project: one of
    those files as a regular file)])."""
    signs, files = project_signs(n), set(files_of(n))
    here = {e.name for e in entries if e.name in signs and e.is_file(follow_symlinks=False)}
    folders = []
    for e in entries:
        if e.is_dir(follow_symlinks=True):
            try:
                holds = not e.is_symlink() and any(x.name in signs and x.is_file(follow_symlinks=False)
                                                   for x in os.scandir(e.path))
            except OSError:
                holds = False
            folders.append((e.name, holds))
    return sorted(here & files), sorted(here - files), folders


PROJECT_FOLDERS = {'tests', 'run_kit', 'fast_read', 'config', 'docs', 'scripts', 'results', 'study', 'data', 'out',
                   '__pycache__', '.git', '.venv', 'venv', '.pytest_cache', '.ipynb_checkpoints'}


def folder_layout(assignment_files, project_files_here, folders, files):
    """How a folder given to grade is read: ('submission', None), ('class', None), or (None, what was seen and
    how to say which was meant). A folder that holds the assignment's file is one submission; one whose
    subfolders hold projects is a class, whatever stray files lie beside them (a sample.py); one that holds
    other project files and only a project's own folders (tests/, run_kit/) is a submission that lacks the
    assignment's file; one with folders alone is a class. Both at once is refused: a class folder with the
    assignment's file in it, or project files beside folders that are not a project's."""
    students = [name for name, holds in folders if holds]
    others = [name for name, holds in folders if not holds and name not in PROJECT_FOLDERS]

    def listed(names):
        return ', '.join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else '')
    say = ("say which was meant: --layout submission grades the folder as one submission, --layout class grades "
           "each of its folders as a student's (the files beside them skipped)")
    if assignment_files and students:
        return None, (f"it holds {listed(assignment_files)} itself and {len(students)} folder"
                      f"{'s' if len(students) > 1 else ''} that hold a project ({listed(students)}): {say}")
    if assignment_files:
        return 'submission', None
    if students:
        return 'class', None
    if project_files_here and others:
        return None, (f"it holds the project's {listed(project_files_here)} (not {listed(files)}) and the "
                      f"folder{'s' if len(others) > 1 else ''} {listed(others)}, none of which holds a project: {say}")
    if project_files_here:
        return 'submission', None
    return 'class', None


def file_names(names, looks=None):
    """Each student's name (as shown) as the name of their files in out_dir: the name, or if it is longer than
    150 bytes (a file name may have 255, and '.results.json' and a temporary suffix are added) its first 130
    bytes and a digest of the whole. Names that look alike (course_grader.look_alike: the same but for case,
    compatibility characters or look-alike letters, which a file system or a person may not tell apart) each get a digest of
    their own name, so no student takes another's plain name whatever the order (looks: the skeletons of the
    names as the students wrote them; by default of the names as given); and where two files still
    have one name, even in another case, a number: no student's files ever replace another's."""
    import hashlib
    from course_kit.grader import look_alike, skeleton
    looks = looks or [skeleton(name) for name in names]
    taken, out = set(), []
    for i, name in enumerate(names):
        digest = hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()
        base = name if len(name.encode()) <= 150 else name.encode()[:130].decode('utf-8', 'ignore') + '~' + digest[:16]
        if sum(look_alike(looks[i], other) for other in looks) > 1:
            base += '~' + digest[:8]
        file, k = base, i + 1
        while file.casefold() in taken:
            file, k = f"{base} ({k})", k + len(names)
        taken.add(file.casefold())
        out.append(file)
    return out


def gradescope_json(result, n):
    """Gradescope's autograder format (results.json): the score, and one test per concept with its marks
    and feedback."""
    from course_kit import grader as course_grader
    return dict(score=result['score'], max_score=result['total'], execution_time=result['seconds'],
                output='\n'.join(result['head']),
                tests=[dict(name=c.name, score=result['marks'][c.name], max_score=c.marks, visibility='visible',
                            output='\n'.join(line.strip() for line in result['by_concept'][c.name]))
                       for c in course_grader.concepts(n)])


def write_json(path, obj):
    from run_kit.run_files import atomic_write
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, json.dumps(obj, indent=2))


EXIT_NOT_WRITTEN = 4   # grade's exit status when what it had to write (--out, --gradescope) could not all be written


class NotWritten(Exception):
    """What grade could not write (a full disk, a folder it may not write to), in one line; .rows: the rows."""

    def __init__(self, message, rows):
        super().__init__(message)
        self.rows = rows


def writable_folder(folder, what):
    """None if `folder` can be made and written to, else why, in one line with what to do."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix='.course-write-test-', suffix='.tmp'):
            pass
        return None
    except OSError as e:
        return (f"{what} {folder} cannot be written to ({e.strerror or e}): give a folder you may write to, with "
                "free space, and grade again")


def secret_files(root=HERE):
    """The instructor's files a submission must never read: the grader and the kit's tests, and every graded file
    that holds a solution (the reference), as paths under root."""
    kit = ['course_kit/grader.py', 'tests/test_hidden.py', 'tests/test_course.py', 'tests/test_course_check.py']
    marked = [f for f in GRADING_FILES if os.path.isfile(os.path.join(root, f)) and (
        regions(open(os.path.join(root, f)).read()) or regions(open(os.path.join(root, f)).read(), WITH_BEGIN, WITH_END))]
    named = [os.path.join(root, f) for f in kit + marked if os.path.isfile(os.path.join(root, f))]
    compiled = []   # (their bytecode holds the same code: __pycache__/model.cpython-311.pyc, ...)
    for path in named:
        cache = os.path.join(os.path.dirname(path), '__pycache__')
        stem = os.path.basename(path)[:-len('.py')] + '.'
        compiled += [os.path.join(cache, c) for c in (sorted(os.listdir(cache)) if os.path.isdir(cache) else [])
                     if c.startswith(stem) and c.endswith('.pyc')]
    history = []    # (the repository's history holds every version of them: git show HEAD:model.py)
    gits = [os.path.join(root, '.git')]
    if os.path.isfile(gits[0]):   # (a worktree or a submodule: "gitdir: <its folder>", whose commondir holds the rest)
        pointed = open(gits[0], errors='replace').read().partition('gitdir:')[2].strip()
        gits = [os.path.join(root, pointed)] if pointed else []
        common = os.path.join(gits[0], 'commondir') if gits else ''
        if os.path.isfile(common):
            gits.append(os.path.normpath(os.path.join(gits[0], open(common, errors='replace').read().strip())))
    for git in gits:
        for folder, _, files in os.walk(git):
            history += [folder] + [os.path.join(folder, f) for f in files]
    return named + compiled + history


def closed_to_sandbox(n, folders):
    """SystemExit naming what the uid sandbox's user could read, and what to do, where it could read the
    instructor's files (secret_files) or, in a class, the students' submissions (another's answer); else None.
    (With Landlock the worker reads nothing outside the system's folders, Python's and its own either, whatever
    the permissions: course_worker.no_writes; without it, grading says so: course_grader.OTHER_FILES.)"""
    from course_kit import grader as course_grader
    students = [os.path.join(f, x) for f in folders for x in files_of(n)] + folders if len(folders) > 1 else []
    try:
        readable = course_grader.readable_by_others(secret_files() + students)
    except course_grader.NoSandbox as e:
        raise SystemExit(str(e)) from None
    theirs = [p for p in readable if p not in students]
    if theirs:
        raise SystemExit(f"--sandbox uid: a submission's user of its own could read the instructor's files "
                         f"({', '.join(os.path.relpath(p, HERE) for p in theirs[:4])}"
                         f"{f' and {len(theirs) - 4} more' if len(theirs) > 4 else ''}, in {HERE}): close them to other "
                         f"users (chmod -R o-rwx {HERE}, or grade from a copy in a folder only root can enter, as "
                         "Gradescope's run_autograder does: chmod 700 on the folder), and grade again")
    if readable:
        raise SystemExit(f"--sandbox uid: a submission's user of its own could read the students' submissions "
                         f"({', '.join(readable[:3])}{', ...' if len(readable) > 3 else ''}): close the class folder "
                         "to other users (chmod o-rwx on it), and grade again")


def one_upload(n, folder):
    """Gradescope grades one submission per upload: the upload itself when it holds a file of assignment n, else
    the one folder in it, however deep, that holds a copy of the project ([sub], what to say), or SystemExit
    saying what to upload (results.json then says it). An upload with no project in it is graded as it is (its
    feedback says what is missing)."""
    from course_kit.grader import name_note, shown, shown_name, skeleton
    files = files_of(n)
    name = os.path.basename(os.path.abspath(folder))
    upload = (shown_name(name), folder, True, name_note(name), skeleton(name))
    if any(os.path.lexists(os.path.join(folder, f)) for f in files):
        return [upload], None
    where, found, _ = locate(n, folder)
    if where == folder and not found:
        roots = project_roots(files_found(folder, files), files)
        if len(roots) < 2:
            return [upload], None
        raise SystemExit(f"the upload holds {len(roots)} project folders ({', '.join(shown(r, 80) for r in roots[:5])}): "
                         f"upload one copy of the project, or only its file{'s' if len(files) > 1 else ''} "
                         f"{', '.join(files)}, and submit again")
    top = found.split('/')[0]
    try:
        others = sorted(e.name for e in os.scandir(folder) if e.name != top and e.is_dir(follow_symlinks=False))
    except OSError:
        others = []
    return [(upload[0], where, False, upload[3], upload[4])], (
        f"graded the folder {shown(found, 200)} of your upload"
        + (f" (not {', '.join(shown(o, 80) for o in others[:5])}: no file of assignment {n} in "
           f"{'them' if len(others) > 1 else 'it'})" if others else ''))


def zipped_upload(n, path):
    """A zip given to grade: one upload (as Gradescope grades one), unpacked as data (unpacked) into a folder of the
    grader's own: ([sub], what to say or None, why it is not graded or None, the folder to remove). Its student's
    name is the zip's, less '.zip'."""
    from course_kit import grader as course_grader
    from course_kit.grader import name_note, shown_name, skeleton
    name = os.path.basename(os.path.abspath(path))
    name = name[:-len('.zip')] if name.lower().endswith('.zip') and len(name) > 4 else name
    dest = tempfile.mkdtemp(dir=course_grader.grading_folder())   # (0700, root's: no sandbox's user reads it)
    why = unpacked(n, path, dest)
    if why:
        return [(shown_name(name), dest, True, name_note(name), skeleton(name))], None, why, dest
    subs, said = one_upload(n, dest)
    return [(shown_name(name), subs[0][1], subs[0][2], name_note(name), skeleton(name))], said, None, dest


def grade(n, folder, out_dir=None, limit=None, gradescope=None, jobs=1, trusted=False, sandbox='bubblewrap',
          layout=None):
    """Grade a submission or a class (jobs submissions at a time, each in sandboxes of its own); print each
    student's feedback, and with out_dir write it, their results.json and the gradebook. With gradescope,
    Gradescope's results.json: a path that ends in .json is one file, for one submission (an upload that holds
    several folders is graded as its one project folder, said, or not at all: SystemExit says what to upload);
    any other path a folder, <gradescope>/<student>/results.json. sandbox: 'bubblewrap', 'uid'
    (course_grader.SANDBOXES) or 'none' (trusted=True: trusted submissions). Returns [(name as shown, row)]; a
    row's status is graded, timed out, no answer or not graded. What cannot be written (a full disk) is said in
    one line, NotWritten, after everything that could be written is: the gradebook first. layout: 'submission' or
    'class', said where the folder reads as both (submissions_in refuses it otherwise). A file given as the folder is
    one upload, a zip (zipped_upload)."""
    from concurrent.futures import ThreadPoolExecutor
    import io
    from course_kit import grader as course_grader
    from run_kit.run_files import atomic_write
    sandbox = 'none' if trusted else sandbox
    try:
        loses = course_grader.check_sandbox(sandbox)
    except course_grader.NoSandbox as e:
        raise SystemExit(str(e)) from None
    if loses:   # (the uid sandbox without Landlock: said, never pretended)
        print(f"note: {loses}", flush=True)
    one_file = bool(gradescope) and gradescope.endswith('.json')
    for where, what in ((out_dir, '--out'), (gradescope and (os.path.dirname(os.path.abspath(gradescope)) if one_file
                                                             else gradescope), '--gradescope')):
        problem = where and writable_folder(where, what)
        if problem:   # (before the class is graded: minutes of work that could not be kept)
            raise NotWritten(problem, [])
    upload, skipped, refused, unzipped = None, [], None, None
    if os.path.isfile(folder):   # a zip (Gradescope's upload): one submission, read as data
        subs, upload, refused, unzipped = zipped_upload(n, folder)
    elif one_file:
        subs, upload = one_upload(n, folder)
    else:
        subs, skipped = submissions_in(n, folder, layout)
    if upload:
        print(upload, flush=True)
    if sandbox == 'uid':   # (no namespace hides the file system: what that user could read must be closed to it)
        closed_to_sandbox(n, [sub[1] for sub in subs])
    for why in skipped:
        print(f"skipped {why}", flush=True)
    for name, _, _, note, _ in subs:
        if note:
            print(f"note: the folder {name}: {note}", flush=True)
    concepts = course_grader.concepts(n)
    # one file under two students' names (a hard link): neither graded, both flagged
    same = same_files([(sub[0], locate(n, sub[1])[0]) for sub in subs], files_of(n))
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        graded = list(pool.map(lambda i: not_graded(n, subs[i][1], subs[i][0], refused, 'no answer') if refused else
                               not_graded(n, subs[i][1], subs[i][0], same[i]) if i in same else
                               grade_safely(n, subs[i][1], subs[i][0], limit, sandbox, subs[i][2]), range(len(subs))))
    if unzipped:
        course_grader.remove_tree(unzipped)
    if upload:
        for r in graded:
            r['head'].insert(1, f"  {upload}")
            r['feedback'] = '\n'.join([r['head'][0], r['head'][1], r['feedback'].split('\n', 1)[1]])
    rows = [(name, r) for (name, _, _, _, _), r in zip(subs, graded)]
    for _, r in rows:
        print(r['feedback'], flush=True)
    unwritten, book_written, error = [], None, None
    if out_dir:   # the gradebook first: it holds every row
        book = io.StringIO()
        w = csv.writer(book)
        w.writerow(['student', *[c.name for c in concepts], 'total', 'max', 'seconds', 'status', 'note'])
        for (name, r), sub in zip(rows, subs):
            w.writerow([course_grader.spreadsheet_cell(x) for x in (name, *[r['marks'][c.name] for c in concepts], r['score'],
                                                       r['total'], r['seconds'], r['status'], sub[3])])
        book_path = os.path.join(out_dir, f'gradebook_assignment{n}.csv')
        try:
            atomic_write(book_path, book.getvalue())
            book_written = True
        except OSError as e:
            book_written, error = False, e
    for (name, r), file in zip(rows, file_names([sub[0] for sub in subs], [sub[4] for sub in subs])):
        try:
            if out_dir:
                atomic_write(os.path.join(out_dir, f'{file}.txt'), r['feedback'] + '\n')
                write_json(os.path.join(out_dir, f'{file}.results.json'), gradescope_json(r, n))
            if gradescope:
                write_json(gradescope if one_file else os.path.join(gradescope, file, 'results.json'),
                           gradescope_json(r, n))
        except OSError as e:
            unwritten.append(name)
            error = error or e
    if book_written:
        print(f"wrote {out_dir}/gradebook_assignment{n}.csv and "
              f"{'each' if not unwritten else f'{len(rows) - len(unwritten)} of {len(rows)}'} student's feedback")
    failed = sum(r['status'] == 'not graded' for _, r in rows)
    print(f"{len(rows)} submissions: {sum(r['score'] == r['total'] for _, r in rows)} with full marks, "
          f"{failed} not graded" + (" (their rows say why)" if failed else '') +
          (f", {len(skipped)} entries skipped" if skipped else ''), flush=True)
    if book_written is False or unwritten:
        where, why = ' and '.join(x for x in (out_dir, gradescope) if x), error.strerror or str(error)
        names = ': ' + ', '.join(unwritten[:3]) + (', ...' if len(unwritten) > 3 else '') if unwritten else ''
        raise NotWritten(f"{where}: could not write {'the gradebook and ' if book_written is False else ''}"
                         f"{len(unwritten)} of {len(rows)} students' files ({why}{names}); "
                         + ("no gradebook was written" if book_written is False else "the gradebook holds every row")
                         + ": make room, or give another folder, and grade again", rows)
    return rows


# -----------------------------------------------------------------------------
# Gradescope: an autograder zip (setup.sh, run_autograder and what grading needs), run once per submission

AUTOGRADER_FILES = ('course.py', 'course_kit/__init__.py', 'course_kit/grader.py', WORKER[0], *GRADING_FILES)
SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu): Python, bubblewrap (the
# sandbox the grader runs student code in) and the packages grading needs, torch as its CPU build.
set -euo pipefail
apt-get update -qq
apt-get install -y -qq python3 python3-venv bubblewrap
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --quiet --upgrade pip
/autograder/venv/bin/pip install --quiet torch=={torch} --index-url https://download.pytorch.org/whl/cpu
/autograder/venv/bin/pip install --quiet numpy safetensors
"""
RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this once per submission, as root: assignment {n} of the course kit, graded from the files in
# /autograder/submission by course.py grade (the sandbox: {sandbox}), into /autograder/results/results.json.
set -u
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"            # (another root: the kit's test runs this on a fake tree)
PYTHON="${{AUTOGRADER_PYTHON:-$ROOT/venv/bin/python}}"
chmod 700 "$ROOT/source"                             # the grader, its probes and the reference: root's alone
mkdir -p "$ROOT/results"
cd "$ROOT/source"
"$PYTHON" course.py grade {n} "$ROOT/submission" --gradescope "$ROOT/results/results.json" --sandbox {sandbox}
code=$?
[ "$code" -le 1 ] || echo "run_autograder: course.py grade ended with exit status $code (its results.json, or the line above, says why)"
exit 0
"""


def autograder(n, zip_path, sandbox='bubblewrap'):
    """Gradescope's autograder zip for assignment n: setup.sh, run_autograder, and only what grading needs
    (AUTOGRADER_FILES: the grader, its probes, the instructor's reference), never a test or another file."""
    import zipfile
    with open(os.path.join(HERE, 'requirements.txt')) as f:
        torch_version = re.search(r'^torch==(\S+)', f.read(), re.M).group(1)
    os.makedirs(os.path.dirname(os.path.abspath(zip_path)), exist_ok=True)
    with zipfile.ZipFile(zip_path + '.tmp', 'w', zipfile.ZIP_DEFLATED) as z:
        for name, text in (('setup.sh', SETUP_SH.format(torch=torch_version)),
                           ('run_autograder', RUN_AUTOGRADER.format(n=n, sandbox=sandbox))):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16   # executable
            z.writestr(info, text)
        for f in AUTOGRADER_FILES:
            z.write(os.path.join(HERE, f), f)
    os.replace(zip_path + '.tmp', zip_path)
    print(f"{zip_path}: Gradescope's autograder for assignment {n} ({ASSIGNMENTS[n]['title']}), the sandbox: {sandbox}; "
          "upload it as the assignment's autograder (Docker image: Ubuntu)")


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
    p.add_argument('-x', '--first', action='store_true', help='stop at the first failing test')
    p = sub.add_parser('autograder', help="Gradescope's autograder zip for assignment N")
    p.add_argument('n', type=int)
    p.add_argument('zip')
    p.add_argument('--sandbox', choices=('bubblewrap', 'uid'), default='bubblewrap',
                   help="uid where Gradescope's container cannot start bubblewrap (COURSE.md says what it loses)")
    p = sub.add_parser('grade', help='grade a submission, or a class (a folder per student)')
    p.add_argument('n', type=int)
    p.add_argument('folder', help="a submission's folder, a class (a folder per student), or one upload as a zip")
    p.add_argument('--out', help="write each student's feedback, results.json and the gradebook CSV here")
    p.add_argument('--timeout', type=float, help="CPU seconds per concept of a submission (default 60)")
    p.add_argument('--gradescope', help="Gradescope's results.json: this file for one submission, this folder "
                                        "(<student>/results.json) for a class")
    p.add_argument('--jobs', type=int, default=1, help="submissions graded at the same time")
    p.add_argument('--sandbox', choices=('bubblewrap', 'uid'), default='bubblewrap',
                   help="where student code runs: bubblewrap (the default), or uid where bubblewrap cannot start (a "
                        "container without user namespaces, as root): a user of its own, the same limits, no namespaces "
                        "(COURSE.md says what it loses)")
    p.add_argument('--layout', choices=('class', 'submission'),
                   help="what FOLDER is, where it could be read as either: a class (a folder per student, the files "
                        "beside them skipped) or one submission")
    p.add_argument('--trusted', action='store_true',
                   help="the submissions are trusted: run them without a sandbox (where bubblewrap is missing)")
    args = ap.parse_args(argv)
    if getattr(args, 'n', 1) not in ASSIGNMENTS:
        raise SystemExit(f"no assignment {args.n}; there are {', '.join(map(str, ASSIGNMENTS))}")
    if args.command == 'list':
        grader = os.path.exists(os.path.join(HERE, 'course_kit', 'grader.py'))
        for n, a in ASSIGNMENTS.items():
            print(f"{n}. {a['title']} ({', '.join(files_of(n))}): {a['task']}")
            if grader:
                from course_kit import grader as course_grader
                for c in course_grader.concepts(n):
                    print(f"     {c.marks} marks: {c.name}")
        return 0
    if args.command == 'handout':
        handout(args.n, args.out_dir)
    elif args.command == 'release':
        handout(1, args.out_dir)
    elif args.command == 'check':
        return check(args.n, args.directory, args.first)
    elif args.command == 'autograder':
        autograder(args.n, args.zip, args.sandbox)
    else:
        if not os.path.exists(os.path.join(HERE, 'course_kit', 'grader.py')):
            raise SystemExit("course_kit/grader.py is not here: grading needs the instructor's copy of the project")
        try:
            rows = grade(args.n, args.folder, args.out, args.timeout, args.gradescope, args.jobs, args.trusted, args.sandbox,
                         args.layout)
        except NotWritten as e:   # (a full disk, a folder it may not write to: one line, an exit status of its own)
            print(f"course.py grade: {e}", file=sys.stderr, flush=True)
            return EXIT_NOT_WRITTEN
        except SystemExit as e:   # nothing graded: Gradescope's results.json still says why
            if args.gradescope and args.gradescope.endswith('.json') and isinstance(e.code, str):
                from course_kit import grader as course_grader
                total = sum(c.marks for c in course_grader.concepts(args.n))
                write_json(args.gradescope, dict(score=0, max_score=total, output=f"not graded: {e.code}", tests=[]))
            raise
        if any(r['status'] == 'not graded' for _, r in rows):
            return EXIT_NOT_GRADED
        return 0 if all(r['score'] == r['total'] for _, r in rows) else 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
