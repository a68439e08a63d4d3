"""The suite's two tiers (README, "Tests"; tests/conftest.py): every test file is collected, so every test is in
the fast tier or marked slow; the fast tier's guard refuses a slow test that is not marked."""

import configparser
import os
import re
import subprocess
import sys

from helpers import HERE


def test_every_file_with_tests_is_one_pytest_collects():
    # a test file outside pytest.ini's testpaths, or not named test_*.py, would run in neither tier
    ini = configparser.ConfigParser()
    ini.read(os.path.join(HERE, 'pytest.ini'))
    paths = ini['pytest']['testpaths'].split()
    listed = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard', '*.py'], cwd=HERE,
                            capture_output=True, text=True).stdout.split()
    if not listed:   # (not a git checkout: a course handout) every .py file but the virtual environment's
        listed = [os.path.relpath(os.path.join(d, f), HERE) for d, dirs, files in os.walk(HERE)
                  for f in files if f.endswith('.py') and '.venv' not in d]
    under = lambda f: any(f == p or f.startswith(p.rstrip('/') + '/') for p in paths)
    named = lambda f: re.match(r'test_\w+\.py$|\w+_test\.py$', os.path.basename(f))
    has_tests = lambda f: re.search(r'^(    )?def test_\w*\(', open(os.path.join(HERE, f), encoding='utf-8').read(), re.M)
    assert len([f for f in listed if named(f) and under(f)]) >= 15                     # (the search finds the suite)
    outside = [f for f in listed if named(f) and not under(f)]                       # a test file in another folder
    misnamed = [f for f in listed if under(f) and not named(f) and has_tests(f)]     # tests in a file pytest skips
    assert outside + misnamed == [], f"tests no tier collects (pytest.ini's testpaths: {paths}): {outside + misnamed}"


def test_a_slow_test_without_its_mark_fails_the_fast_tier(tmp_path):
    test = tmp_path / 'tests' / 'test_unmarked.py'
    test.parent.mkdir()
    (tmp_path / 'tests' / 'conftest.py').write_text(open(os.path.join(HERE, 'tests', 'conftest.py')).read())
    test.write_text('import subprocess, sys\nimport pytest\n\n'
                    'def test_trains():\n    subprocess.run([sys.executable, "train.py", "--max_iters=1"])\n\n'
                    '@pytest.mark.slow\ndef test_marked():\n    subprocess.run([sys.executable, "train.py", "--max_iters=1"])\n\n'
                    'def test_asks_for_help():\n    subprocess.run([sys.executable, "train.py", "--help"])\n')
    (tmp_path / 'train.py').write_text('')   # (the command starts, and does nothing)
    (tmp_path / 'pytest.ini').write_text('[pytest]\nmarkers =\n    slow: the full suite only\n')
    p = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-p', 'no:xdist', 'tests'],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert '1 failed, 2 passed' in p.stdout, p.stdout[-2000:]
    assert 'test_trains starts train.py but is not marked slow: add @pytest.mark.slow' in p.stdout
