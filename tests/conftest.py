"""Shared test fixtures: the built-in tiny corpus, prepared once per test session (offline); and the guard of
the fast tier (README, "Tests")."""

import os
import subprocess
import sys

os.environ.setdefault('HF_HUB_OFFLINE', '1')      # before datasets is imported anywhere
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')

import pytest


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
    import prepare
    root = tmp_path_factory.mktemp('data')
    prepare.main(['--dataset', 'tiny', '--data_dir', str(root), '--num_proc', '1'])
    return str(root)


# The two tiers: the fast one (`pytest -m "not slow"`, what a contributor runs after an edit) and the full suite.
# A test that trains through a process of its own, runs torchrun, grades or builds a class, runs a study or the
# GPU check, or compiles, is marked slow. A test without the mark that starts such a process or compiles fails
# here, saying so: a slow test cannot slip into the fast tier unnoticed.
SLOW_SCRIPTS = ('train.py', 'course.py', 'study.py', 'gpu_check.py', 'bench.py', 'intervene.py')


def slow_command(args):
    """What makes a command slow ('' if nothing): torchrun, or Python running one of SLOW_SCRIPTS (not --help)."""
    words = [str(w) for w in (args if isinstance(args, (list, tuple)) else str(args).split())]
    if not words:
        return ''
    program = os.path.basename(words[0])
    if program == 'torchrun' or 'torch.distributed.run' in words[1:3]:
        return 'torchrun'
    if '-m' in words[1:3] and words.index('-m') + 1 < len(words):   # python -m train, ...
        words = [words[0], words[words.index('-m') + 1] + '.py', *words[words.index('-m') + 2:]]
    script = next((os.path.basename(w) for w in words[1:] if not w.startswith('-')), '')
    if program.startswith('python') or words[0] == sys.executable:
        if script in SLOW_SCRIPTS and not {'-h', '--help'} & set(words):
            return script
    return ''


@pytest.fixture(autouse=True)
def fast_tier_guard(request, monkeypatch):
    if request.node.get_closest_marker('slow'):
        yield
        return
    real_init = subprocess.Popen.__init__

    def guarded_init(self, args, *more, **kw):
        what = slow_command(args)
        if what:
            pytest.fail(f"{request.node.nodeid} starts {what} but is not marked slow: add @pytest.mark.slow "
                        "(the fast tier starts no such process; README, \"Tests\")", pytrace=False)
        real_init(self, args, *more, **kw)
    monkeypatch.setattr(subprocess.Popen, '__init__', guarded_init)
    import torch

    def no_compile(*a, **kw):
        pytest.fail(f"{request.node.nodeid} compiles but is not marked slow: add @pytest.mark.slow", pytrace=False)
    monkeypatch.setattr(torch, 'compile', no_compile)
    yield
