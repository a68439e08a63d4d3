"""Independent checks of the instructor's solutions, never handed out because they hold the answers: a
literal implementation of the AttnRes equations, a literal data order (and the committed study logs'
fingerprints), statistics on values the public tests do not use. The course kit's grader
(course_grader.py) compares a student's code with the instructor's: these tests are why the instructor's
code can be the reference.
"""

import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import compare
from model import apply_rotary as model_apply_rotary, read_sources, source
from model import ATTENTION_ROUTES, RESIDUAL_MODES
from run_kit import run_files
import train
from test_model import batch, make, perturb, perturbed_block, some_sources

# the project under test (a student's copy when course.py grades it): its committed study logs
REPO = os.path.dirname(os.path.abspath(train.__file__))


# ---------------------------------------------------------------------------------------------
# Assignment 1: the depth read, against the equations written out with einsum

@pytest.mark.assignment1
@pytest.mark.hidden
def test_depth_read_matches_the_equations():
    g = torch.Generator().manual_seed(3)
    bs = [torch.randn(2, 4, 8, generator=g, dtype=torch.float64) * (1 + 3 * s) for s in range(4)]
    w = torch.randn(3, 8, generator=g, dtype=torch.float64)
    h, alpha = read_sources([source(b) for b in bs], w)
    b = torch.stack(bs)                                               # (n, B, T, d)
    normed = F.rms_norm(b, (8,), eps=1e-6)                            # the sources, normalised
    scores = torch.einsum('rd,nbtd->rbtn', w, normed)                 # no 1/sqrt(d), no temperature
    expected_alpha = scores.softmax(-1)
    torch.testing.assert_close(alpha, expected_alpha)
    torch.testing.assert_close(h, torch.einsum('rbtn,nbtd->rbtd', expected_alpha, b))   # the raw sources mixed


# ---------------------------------------------------------------------------------------------
# Assignments 2 and 3: the whole model against a literal implementation that keeps every source

def reference_forward(model, idx):
    cfg = model.config
    S, mode = cfg.attnres_block_size, cfg.residual
    cos, sin = model.rope_cos, model.rope_sin

    def read(w, read_point, sources):
        b = torch.stack(sources)                                   # (n, B, T, d)
        normed = F.rms_norm(b, (b.size(-1),), read_point.source_gain, 1e-6)   # RMSNorm of every source, with its gain
        alpha = torch.einsum('d,nbtd->nbt', w, normed).softmax(0)  # scores, softmax over sources
        return torch.einsum('nbt,nbtd->btd', alpha, b)             # the raw sources mixed

    blocks = [model.transformer.wte(idx)]   # b_0 = embedding
    outputs = []                            # outputs of the sublayers of the current block
    sublayers = [(b, kind) for b in model.transformer.h for kind in ('attn', 'mlp')]
    for l, (block, kind) in enumerate(sublayers):
        if l % S == 0 and outputs:           # 0-indexed sublayer l opens a new block
            blocks.append(sum(outputs))
            outputs = []
        sources = blocks + ([sum(outputs)] if outputs else [])
        if kind == 'attn':
            at = block.attn_read
            h_qk = read(at.w_heads1 if mode == 'ctrl_heads' else at.w_qk, at, sources)
            h_v = read(at.w_v, at, sources) if mode == 'rd_attnres' else h_qk
            if mode == 'ctrl_heads':   # two reads, each the q, k and v input of half of the heads
                h_2 = read(at.w_heads2, at, sources)
                out = heads_split_attention(block, block.norm_attn(h_qk), block.norm_attn(h_2), cos, sin)
            else:
                out = block.attn(block.norm_attn(h_qk), block.norm_attn(h_v), cos, sin)
        else:
            out = block.mlp(block.norm_mlp(read(block.mlp_read.w_mlp, block.mlp_read, sources)))
        outputs.append(out)
    blocks.append(sum(outputs))
    h = read(model.final_read.w_final, model.final_read, blocks)
    return model.lm_head(model.transformer.ln_f(h))


def heads_split_attention(block, x_1, x_2, cos, sin):
    """Attention whose heads 1..H/2 see x_1 and heads H/2+1..H see x_2, literally: run ordinary
    attention on each input and keep the head outputs of its half (computing every head twice)."""
    attn, (B, T, C) = block.attn, x_1.shape
    H, hd = attn.n_head, C // attn.n_head

    def head_outputs(x):   # (B, T, H, hd) before the output projection
        q, k = attn.c_qk(x).split(C, dim=2)
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, attn.c_v(x)))
        q, k = model_apply_rotary(q, cos[:T], sin[:T]), model_apply_rotary(k, cos[:T], sin[:T])
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)

    y = torch.cat([head_outputs(x_1)[:, :, :H // 2], head_outputs(x_2)[:, :, H // 2:]], dim=2)
    return attn.c_proj(y.reshape(B, T, C))


@pytest.mark.assignment2
@pytest.mark.hidden
@pytest.mark.parametrize('mode', [m for m in RESIDUAL_MODES if m != 'standard'])
def test_attention_inputs_match_the_literal_routes(mode):
    # the two inputs of the attention sublayer, written out: each route's read with einsum, then the
    # attention's own pre-norm, whose gain differs from the MLP's (so a v input through norm_mlp is caught)
    block = perturbed_block(mode, seed=11)
    sources = some_sources(seed=12, n=4)
    at, b = block.attn_read, torch.stack([x for x, _ in sources])
    normed = F.rms_norm(b, (b.size(-1),), at.source_gain, 1e-6)

    def read(w):
        return torch.einsum('nbt,nbtd->btd', torch.einsum('d,nbtd->nbt', w, normed).softmax(0), b)

    h = [read(getattr(at, name)) for name in ATTENTION_ROUTES[mode].values()]
    x_qk, x_v = block.attn_inputs(at(sources, []))
    torch.testing.assert_close(x_qk, block.norm_attn(h[0]), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(x_v, block.norm_attn(h[-1]), rtol=1e-10, atol=1e-10)


@pytest.mark.assignment3
@pytest.mark.hidden
@pytest.mark.parametrize('S', [1, 2, 3, 6, 50])   # Full AttnRes, even, odd (splits blocks), S = L, S > L
def test_attnres_matches_literal_reference(S):
    idx, targets = batch()
    model = perturb(make('attnres', S))
    torch.testing.assert_close(model(idx, targets)[0], reference_forward(model, idx), rtol=1e-10, atol=1e-10)


@pytest.mark.assignment3
@pytest.mark.hidden
@pytest.mark.parametrize('mode', ['rd_attnres', 'ctrl_heads'])
@pytest.mark.parametrize('S', [1, 3, 4])
def test_two_route_modes_match_literal_reference(mode, S):
    idx, targets = batch()
    model = perturb(make(mode, S))
    torch.testing.assert_close(model(idx, targets)[0], reference_forward(model, idx), rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# Assignment 4: the data order, exactly

def reference_step_windows(step, n_windows, windows_per_step, seed):
    """The order as first written: a fresh permutation per epoch, every time it is asked for."""
    first, out = step * windows_per_step, []
    while len(out) < windows_per_step:
        epoch, offset = divmod(first + len(out), n_windows)
        order = np.random.default_rng([seed, epoch]).permutation(n_windows)
        out.extend(order[offset:offset + windows_per_step - len(out)].tolist())
    return out


@pytest.mark.assignment4
@pytest.mark.hidden
def test_data_order_is_exactly_the_reference_order():
    n, per_step = 1000, 64                                   # 15.6 steps per epoch: steps straddle epochs
    for step in range(40):
        assert train.step_windows(step, n, per_step, 5) == reference_step_windows(step, n, per_step, 5)


@pytest.mark.assignment4
@pytest.mark.hidden
def test_committed_study_logs_still_match_their_data_order():
    # the study's runs logged a fingerprint of every 10th step's windows: the code must still produce them
    for path in ('study/runs/main/attnres_s1', 'study/runs/early/ctrl_dup_s4'):
        cfg = json.load(open(os.path.join(REPO, path, 'config.json')))
        n_windows = (cfg['train_tokens'] - 1) // cfg['block_size']
        per_step = cfg['total_batch_size'] // cfg['block_size']
        rows = [r for r in run_files.read_log(os.path.join(REPO, path, 'log.jsonl')) if 'data_hash' in r]
        assert len(rows) >= 10
        for r in rows:   # logged after step r['step'] - 1 was trained
            windows = train.step_windows(r['step'] - 1, n_windows, per_step, cfg['seed'])
            assert train.windows_hash(windows) == r['data_hash'], (path, r['step'])


# ---------------------------------------------------------------------------------------------
# Assignment 5: the paired statistics on other values

@pytest.mark.assignment5
@pytest.mark.hidden
def test_paired_statistics_on_other_values():
    r = compare.paired_stats([0.01, -0.03])                  # n = 2: t(0.975, 1) = 12.7062
    sd = math.sqrt(((0.02) ** 2 + (0.02) ** 2) / 1)
    assert r['mean_delta'] == pytest.approx(-0.01) and r['sd'] == pytest.approx(sd)
    assert r['ci95'] == pytest.approx([-0.01 - 12.7062 * sd / math.sqrt(2), -0.01 + 12.7062 * sd / math.sqrt(2)], abs=1e-4)
    assert (r['wins'], r['n']) == (1, 2) and r['sign_test_p'] == 1.0
    r = compare.paired_stats([-0.01] * 9 + [0.0])            # a tie is neither a win nor a loss: 9 wins of 9
    assert (r['wins'], r['ties']) == (9, 1) and r['sign_test_p'] == pytest.approx(2 / 512)
    assert r['ppl_reduction_pct'] == pytest.approx(100 * (1 - math.exp(-0.009)))
    r = compare.paired_stats([0.02])                          # n = 1: no spread, no interval, p = 1
    assert r['mean_delta'] == 0.02 and (r['wins'], r['n'], r['sign_test_p']) == (0, 1, 1.0)
    assert math.isnan(r['sd']) and all(math.isnan(x) for x in r['ci95'])
