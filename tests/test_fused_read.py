"""Tests of the fused depth read (fast_read/fused_read.py, depth_read='fused'): it computes the plain read's
function and gradients, its PyTorch implementation exactly (float64) and its Triton kernels under Triton's
interpreter (TRITON_INTERPRET=1, on the CPU), it is one opaque node to torch.compile, and train.py runs with it."""

import os
import subprocess
import sys
import warnings

import pytest
import torch

from fast_read import fused_read
from fast_read.fused_read import FUSED, FusedGPT   # (the op itself through the module: a handout has none)
from model import RESIDUAL_MODES, read_sources, source
from test_model import assert_same_function_and_gradients, batch, make, perturb

# (a course handout that still has assignment 1 or 3 to write holds no fused computation: COURSE.md)
pytestmark = pytest.mark.skipif(not FUSED, reason="the fused read comes with assignments 1 and 3's solutions: "
                                                  "this handout's FusedGPT computes the plain read")

DEPTH_ROUTED = [m for m in RESIDUAL_MODES if m != 'standard']
# Triton reads TRITON_INTERPRET when it is imported: the kernels' tests run in a process of their own that sets it
# (test_the_kernels_tests_pass_under_the_interpreter), and are skipped in this one
needs_triton = pytest.mark.skipif(not fused_read.interpreted(), reason="the kernels' tests: run under TRITON_INTERPRET=1 "
                                  "by test_the_kernels_tests_pass_under_the_interpreter")


def pair(mode, S, n_layer=3, dtype=torch.float64):
    plain = perturb(make(mode, S, n_layer=n_layer, dtype=dtype))
    fused = FusedGPT(plain.config).to(dtype)
    fused.load_state_dict(plain.state_dict())   # the same parameters: a plain checkpoint loads as it is
    return plain, fused


@pytest.mark.parametrize('mode', DEPTH_ROUTED)
@pytest.mark.parametrize('S', [1, 2, 3, 7])
def test_the_fused_read_is_the_plain_read(mode, S):
    # float64, the op's PyTorch implementation: logits, loss and every gradient of the plain read to 1e-12; S = 3
    # has blocks that open on an MLP and a short last one, S = 7 one block longer than the model
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')   # (S = 7 > 6 sublayers: GPTConfig's warning)
        assert_same_function_and_gradients(*pair(mode, S), tol=1e-12, what=(mode, S))


def some_sources(n, M=10, d=24, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = [(torch.randn(M, d, generator=g) * (1 + 3 * i)).to(dtype).requires_grad_() for i in range(n)]
    return xs, torch.randn(3, d, generator=g).to(dtype).requires_grad_()


def test_the_op_is_model_read_sources_with_the_log_sum_exp():
    xs, w = some_sources(4, dtype=torch.float64)
    h, lse = fused_read.finished_read_op(xs, w)
    h_plain, alpha = read_sources([source(x) for x in xs], w)
    assert (h - h_plain).abs().max() < 1e-12
    z = torch.stack([(x[None] * w[:, None]).sum(-1) * source(x)[1][..., 0] for x in xs], -1)
    assert (lse - z.logsumexp(-1)).abs().max() < 1e-12
    assert torch.allclose(alpha, (z - lse[..., None]).exp(), atol=1e-12)


def test_the_ops_gradients_pass_gradcheck_and_opcheck():
    # the hand-written backward (torch_backward) against finite differences, lse's gradient included; opcheck:
    # the fake implementation's shapes, the registration, autograd through the op
    xs, w = some_sources(3, M=4, d=6, dtype=torch.float64)
    fn = lambda *args: tuple(fused_read.finished_read_op(list(args[:-1]), args[-1]))
    assert torch.autograd.gradcheck(fn, (*xs, w))
    torch.library.opcheck(fused_read.finished_read_op, (xs, w))


@needs_triton
@pytest.mark.parametrize('mode', ['rd_attnres', 'attnres', 'ctrl_heads'])
@pytest.mark.parametrize('S', [1, 3])
def test_the_kernels_compute_the_plain_read(monkeypatch, mode, S):
    # float32 through the Triton kernels (the interpreter runs them on the CPU): the plain read's function and
    # gradients to float32's rounding; the kernels ran (forward and backward both called)
    calls = []
    for name in ('kernel_forward', 'kernel_backward'):
        real = getattr(fused_read, name)
        monkeypatch.setattr(fused_read, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    plain, fused = pair(mode, S, n_layer=2, dtype=torch.float32)
    assert_same_function_and_gradients(plain, fused, tol=2e-5, what=(mode, S))
    assert {'kernel_forward', 'kernel_backward'} <= set(calls)


@needs_triton
@pytest.mark.parametrize('n', [1, 2, 5, 9])
def test_the_kernels_are_the_ops_pytorch_math_for_any_number_of_sources(monkeypatch, n):
    # odd sizes (M = 10 tokens over tiles of 64, d = 24 padded to 32): the masks keep the padding out
    xs, w = some_sources(n)
    h_ref, lse_ref = fused_read.torch_forward([x.detach() for x in xs], w.detach())
    gh, glse = torch.randn_like(h_ref), torch.randn_like(lse_ref)
    with monkeypatch.context() as m:   # the op's PyTorch implementation
        m.setattr(fused_read, 'uses_kernels', lambda *a: False)
        h_t, lse_t = fused_read.finished_read_op(xs, w)
        grads_t = torch.autograd.grad((h_t * gh).sum() + (lse_t * glse).sum(), xs + [w])
    calls = []                         # its kernels, both of them
    for name in ('kernel_forward', 'kernel_backward'):
        real = getattr(fused_read, name)
        monkeypatch.setattr(fused_read, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    h_k, lse_k = fused_read.finished_read_op(xs, w)
    grads_k = torch.autograd.grad((h_k * gh).sum() + (lse_k * glse).sum(), xs + [w])
    assert calls == ['kernel_forward', 'kernel_backward']
    for a, b in ((h_t, h_k), (lse_t, lse_k)):   # float32's rounding, relative to the sources' scale (up to 25)
        assert (a - b).abs().max() <= 2e-6 * (1 + a.abs().max())
    for a, b in zip(grads_t, grads_k):
        assert (a - b).abs().max() <= 1e-4 * (1 + a.abs().max())


@needs_triton
def test_the_kernels_split_a_wide_reads_routes_into_groups_and_still_compute_the_read(monkeypatch):
    # d = 1000 (tiles of 1024): 8 routes a program, so 9 routes run as 2 groups, the second 1 route and 7 masked
    assert fused_read.route_groups(9, 1000) == (2, 8) and fused_read.route_groups(3, 24) == (1, 4)
    g = torch.Generator().manual_seed(1)
    xs = [(torch.randn(5, 1000, generator=g) * (1 + i)).requires_grad_() for i in range(3)]
    w = torch.randn(9, 1000, generator=g).mul(0.05).requires_grad_()
    h, lse = fused_read.finished_read_op(xs, w)
    h_ref, lse_ref = fused_read.torch_forward(xs, w)
    assert (h - h_ref).abs().max() <= 2e-6 * (1 + h_ref.abs().max()) and (lse - lse_ref).abs().max() < 1e-4
    gh = torch.randn_like(h)
    grads = torch.autograd.grad((h * gh).sum() + lse.sum(), xs + [w])
    grads_ref = torch.autograd.grad((h_ref * gh).sum() + lse_ref.sum(), xs + [w])
    for a, b in zip(grads_ref, grads):
        assert (a - b).abs().max() <= 1e-4 * (1 + a.abs().max())


@needs_triton
def test_more_sources_than_the_kernels_take_fall_back_with_a_warning(monkeypatch):
    xs, w = some_sources(fused_read.MAX_SOURCES + 1, M=3, d=8)
    with pytest.warns(UserWarning, match='exceed the kernels'):
        h, _ = fused_read.finished_read_op(xs, w)
    assert (h - fused_read.torch_forward(xs, w)[0]).abs().max() < 1e-5


@pytest.mark.slow
def test_the_kernels_tests_pass_under_the_interpreter():
    # the kernels (Triton's interpreter, on the CPU) against the plain read and the op's PyTorch math; Triton is in
    # requirements.txt, so this runs on every machine with the project's packages
    from helpers import HERE
    if fused_read.interpreted():
        return   # (this process is that run: it does not start another)
    assert fused_read.triton is not None, "Triton is missing: pip install -r requirements.txt"
    run = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:xdist', '-p', 'no:cacheprovider', __file__,
                          '-k', 'kernels and not interpreter'], cwd=HERE, env=dict(os.environ, TRITON_INTERPRET='1'),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and ' skipped' not in run.stdout, run.stdout[-3000:]
    assert '12 passed' in run.stdout, run.stdout[-3000:]


def test_under_bf16_autocast_the_reads_stay_float32():
    plain, fused = pair('rd_attnres', 2, dtype=torch.float32)
    idx, targets = batch()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        lp, lf = plain(idx, targets)[1], fused(idx, targets)[1]
    assert abs(lp.item() - lf.item()) < 0.05   # the backbone's bf16 matmuls round differently, the reads agree
    seen = []
    real = fused_read.finished_read_op
    with torch.autocast('cpu', dtype=torch.bfloat16):
        h, lse = real([torch.randn(4, 8), torch.randn(4, 8)], torch.randn(2, 8))
    seen += [h.dtype, lse.dtype]
    assert seen == [torch.float32, torch.float32]


def test_the_routing_diagnostics_use_the_plain_read_and_checkpoints_interchange():
    plain, fused = pair('rd_attnres', 2)
    fused.record_routing = plain.record_routing = True
    idx, targets = batch()
    assert torch.equal(plain(idx, targets)[0], fused(idx, targets)[0])
    assert len(fused.routing) == len(plain.routing) > 0
    assert set(plain.state_dict()) == set(fused.state_dict())


@pytest.mark.slow
def test_compiled_the_op_is_one_node_with_no_graph_break():
    # fullgraph=True fails on a graph break; the graph count stays one whatever the depth (the number of sources
    # is the op's input list, not a shape the graph specialises on beyond the list's length)
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter
    for n_layer in (2, 4):
        torch._dynamo.reset()
        counter = CompileCounter()
        plain, fused = pair('rd_attnres', 2, n_layer=n_layer)
        compiled = torch.compile(fused, backend=counter, fullgraph=True)
        idx, targets = batch()
        assert (compiled(idx, targets)[1] - plain(idx, targets)[1]).abs() < 1e-12
        assert counter.frame_count == 1
    torch._dynamo.reset()


@pytest.mark.slow
def test_train_py_runs_the_fused_read_and_refuses_an_unknown_one(data_dir, tmp_path, capsys):
    # the note says where the kernels run, the run finishes; 'bogus' is refused before anything is written
    from helpers import python, read_log, train_here
    out = str(tmp_path / 'run')
    train_here(data_dir, out, '--depth_read=fused', '--residual=rd_attnres', '--max_iters=2')
    assert "depth_read='fused': no GPU (cpu)" in capsys.readouterr().err
    assert read_log(out)[0]   # (the training rows)
    bad = python('train.py', '--depth_read=bogus', f'--data_dir={data_dir}', f'--out_dir={tmp_path / "bad"}')
    assert bad.returncode != 0 and "depth_read='bogus' is not one of plain, two_phase, fused" in bad.stderr
    assert 'Traceback' not in bad.stderr and not os.path.exists(tmp_path / 'bad')
