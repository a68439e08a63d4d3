"""Shared test fixtures: the built-in tiny corpus, prepared once per test session (offline)."""

import os

os.environ.setdefault('HF_HUB_OFFLINE', '1')      # before datasets is imported anywhere
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')

import pytest


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
    import prepare
    root = tmp_path_factory.mktemp('data')
    prepare.main(['--dataset', 'tiny', '--data_dir', str(root), '--num_proc', '1'])
    return str(root)
