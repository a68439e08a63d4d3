"""Shared test fixtures: the built-in tiny corpus, prepared once per test session (offline); under pytest-xdist,
each worker's share of the cores for torch."""

import os

os.environ.setdefault('HF_HUB_OFFLINE', '1')      # before datasets is imported anywhere
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')

import pytest

# Under pytest-xdist each worker is a process of its own; torch would give each one a thread per core, so
# n workers on n cores would run n^2 threads and every parallel region would wait for a thread that has no
# core. A worker takes its share of the cores instead (the subprocesses the tests start already run one
# thread, OMP_NUM_THREADS=1). A test that compares two computations makes both with the same count.
if int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1')) > 1:
    import torch
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // int(os.environ['PYTEST_XDIST_WORKER_COUNT'])))


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
    import prepare
    root = tmp_path_factory.mktemp('data')
    prepare.main(['--dataset', 'tiny', '--data_dir', str(root), '--num_proc', '1'])
    return str(root)
