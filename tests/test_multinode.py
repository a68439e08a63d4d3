"""Several nodes, each with an out_dir on a disk of its own (docs/gpus.md, "Beyond one node"): rank 0 decides
how the run starts and every rank starts from rank 0's state, whatever the other nodes' disks hold. Two
"nodes" on this machine: two torchrun agents (gloo, one process each) that meet at one rendezvous, each
given its own --out_dir. Their run must be the run one node with two processes makes."""

import os
import shutil
import socket
import subprocess
import sys

import pytest

from helpers import HERE, assert_same_run, command, run

pytestmark = pytest.mark.slow   # two torchrun agents a test: the full suite only (README, "Tests")
ONE_NODE = (sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2')
ARGS = ['--init_from=auto', '--lr_decay_iters=4']


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def two_nodes(data_dir, out_dirs, args):
    """One run on two nodes of one process each, node k writing (if rank 0) into out_dirs[k]; both must end
    well. Returns what node 0 printed."""
    port = free_port()
    procs = [subprocess.Popen(command(args, data_dir, out_dir, launcher=(
                 sys.executable, '-m', 'torch.distributed.run', '--nnodes=2', '--nproc_per_node=1', f'--node_rank={k}',
                 '--master_addr=127.0.0.1', f'--master_port={port}')),
                              cwd=HERE, env=dict(os.environ, OMP_NUM_THREADS='1'), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for k, out_dir in enumerate(out_dirs)]
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]   # (ranks that disagree would hang: a failure)
    finally:
        for p in procs:
            p.kill()
    for k, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"node {k}: exit {p.returncode}\n{out[-3000:]}"
    return outs[0]


def test_every_node_starts_from_rank_0s_state(data_dir, tmp_path):
    ref = str(tmp_path / 'one_node')
    run(ARGS, data_dir, ref, launcher=ONE_NODE)                    # 4 steps, one node, two processes

    # from scratch, each node its own empty out_dir: the one-node run, and nothing written on node 1
    nodes = [str(tmp_path / 'scratch' / f'node{k}') for k in (0, 1)]
    two_nodes(data_dir, nodes, ARGS)
    assert_same_run(ref, nodes[0])
    assert not os.path.exists(os.path.join(nodes[1], 'log.jsonl'))

    # only node 0 holds a checkpoint (step 2 of this run): node 1's rank gets it from rank 0
    half = str(tmp_path / 'half')
    run([*ARGS, '--max_iters=2'], data_dir, half, launcher=ONE_NODE)
    nodes = [str(tmp_path / 'only_node0' / f'node{k}') for k in (0, 1)]
    shutil.copytree(half, nodes[0])
    said = two_nodes(data_dir, nodes, ARGS)
    assert 'resumed at step 2' in said and 'rank 1 on' in said and '(none)' in said, said[-2000:]
    assert_same_run(ref, nodes[0])

    # the nodes hold different checkpoints (node 1: another seed's, at step 1): rank 0's is the one resumed
    other = str(tmp_path / 'other')
    run([*ARGS, '--max_iters=1', '--eval_interval=1', '--seed=2'], data_dir, other, launcher=ONE_NODE)
    nodes = [str(tmp_path / 'different' / f'node{k}') for k in (0, 1)]
    shutil.copytree(half, nodes[0])
    shutil.copytree(other, nodes[1])
    said = two_nodes(data_dir, nodes, ARGS)
    assert 'resumed at step 2' in said and '(another checkpoint)' in said, said[-2000:]
    assert_same_run(ref, nodes[0])


def test_a_rank_whose_parameters_differ_stops_the_run_at_a_checkpoint(monkeypatch):
    # what every checkpoint checks under DDP: the ranks' parameters, gathered as fingerprints, are rank 0's.
    # Two ranks simulated: rank 1 holds the same model, then one weight changed by one ulp.
    import pytest
    import torch
    from model import GPT, GPTConfig
    from run_kit import run_control
    model = GPT(GPTConfig(vocab_size=64, n_layer=2, n_head=2, n_embd=16, block_size=8, residual='rd_attnres',
                          attnres_block_size=2))
    proc = run_control.ThisProcess(True, 0, 2, 'cpu', 'cpu')
    rank1 = {}
    monkeypatch.setattr(torch.distributed, 'get_world_size', lambda: 2)
    monkeypatch.setattr(torch.distributed, 'all_gather', lambda out, mine: [out[0].copy_(mine), out[1].copy_(rank1['fp'])])
    rank1['fp'] = run_control.parameter_fingerprint(model)
    run_control.ranks_agree(model, 10, proc)                     # equal: nothing said
    with torch.no_grad():
        w = model.transformer.h[1].attn.c_proj.weight
        w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(1.0))
    rank1['fp'] = run_control.parameter_fingerprint(model)
    with torch.no_grad():
        w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(-1.0))   # rank 0 holds the original
    with pytest.raises(SystemExit, match=r"at step 10 the parameters of rank 1 differ from rank 0's.*--init_from=auto"):
        run_control.ranks_agree(model, 10, proc)
