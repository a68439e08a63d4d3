"""
The depth reads of a whole model computed in two phases, as the AttnRes paper computes them: the same
function as model.GPT.forward_depth_routed (the lesson, the plain read), chosen by
GPTConfig(depth_read='two_phase') (docs/performance.md, "The two-phase read").

The pseudo-queries do not depend on the input, so when an AttnRes block opens, the reads of all its
sublayers (every route) over the *finished* sources can be computed at once:

    phase 1, once per block, over the finished sources b_0 .. b_n:
        z[r, s] = (q_r . x_s) / rms(x_s)          (the logits, as depth_read computes them)
        m[r] = max_s z[r, s],  d[r] = sum_s exp(z[r, s] - m[r]),  u[r] = sum_s exp(z[r, s] - m[r]) x_s
    phase 2, at each sublayer, merges the one source that changes, the partial p (an online softmax):
        z_p = (q_r . p) / rms(p),  m' = max(m, z_p)
        h[r] = (u[r] exp(m - m') + exp(z_p - m') p) / (d[r] exp(m - m') + exp(z_p - m'))
        (at the sublayer that opens the block there is no partial: h[r] = u[r] / d[r])

Phase 1 always runs over the same number of sources: the finished ones padded with zeros up to the most a
read ever has (1 + the number of blocks), the padding masked out of the softmax. So every block's phase 1
has one shape and every merge another, whatever the depth: under torch.compile the kernels are the same
for every block, and their number no longer grows with depth. The arithmetic is the plain read's: float32
(float64 stays float64) with autocast off, logits as elementwise products and sums (no matmul). The
routing diagnostics use the plain read (GPT.forward records with it).
"""

import math

import torch

from model import fp32, source


def queries_of(read):
    """A read point's pseudo-queries, one row per route, with its key-norm gain folded in."""
    return torch.stack([getattr(read, name) for name in read.routes.values()]) * read.key_gain


def phase1(padded, bias, q):
    """The online-softmax state (m, d, u) of the routes q (R, d) over the padded finished sources, stacked
    into one tensor so that the pass is a few ops of one shape: padded: list of (x, 1/rms(x)) pairs;
    bias: (len(padded),) 0 for a source, -inf for padding. m, d: (R, B, T, 1); u: (R, B, T, d)."""
    x = torch.stack([x for x, _ in padded])                          # (N, B, T, d)
    inv_rms = torch.stack([r for _, r in padded])[..., 0]            # (N, B, T)
    z = (x[None] * q[:, None, None, None, :]).sum(-1) * inv_rms[None] + bias[None, :, None, None]   # (R, N, B, T)
    m = z.amax(1, keepdim=True)
    e = (z - m).exp()
    u = (e[..., None] * x[None]).sum(1)                              # (R, B, T, d)
    return m[:, 0, ..., None], e.sum(1)[..., None], u


def phase2(state, q, partial):
    """h (R, B, T, d): the state of phase 1 with the partial merged in (or as it is, without one)."""
    m, d, u = state
    if partial is None:
        return u / d
    x, inv_rms = partial
    z = (x[None] * q[:, None, None, :]).sum(-1, keepdim=True) * inv_rms[None]   # (R, B, T, 1)
    m2 = torch.maximum(m, z)
    c, e = (m - m2).exp(), (z - m2).exp()
    return (u * c + e * x[None]) / (d * c + e)


def forward_two_phase(model, embedding):
    """model.forward_depth_routed(embedding), computed block by block in two phases."""
    S, L = model.config.attnres_block_size, 2 * model.config.n_layer
    n_max = 1 + math.ceil(L / S)                                     # the final read's sources: the most of any
    finished = [source(embedding)]
    dtype, device = finished[0][0].dtype, embedding.device
    pad = source(torch.zeros_like(finished[0][0]))
    blocks, cos, sin = list(model.transformer.h), model.rope_cos, model.rope_sin
    no_autocast = torch.autocast(device_type=device.type, enabled=False)   # the reads are float32, as in depth_read
    for first in range(0, L, S):
        sublayers = range(first, min(first + S, L))
        reads = [blocks[l // 2].attn_read if l % 2 == 0 else blocks[l // 2].mlp_read for l in sublayers]
        with no_autocast:
            q = [queries_of(r).to(dtype) for r in reads]
            rows = [sum(len(x) for x in q[:i]) for i in range(len(q) + 1)]
            bias = torch.tensor([0.0] * len(finished) + [-math.inf] * (n_max - len(finished)), dtype=dtype,
                                device=device)
            m, d, u = phase1(finished + [pad] * (n_max - len(finished)), bias, torch.cat(q))
        partial = None
        for i, l in enumerate(sublayers):
            with no_autocast:
                h = phase2((m[rows[i]:rows[i + 1]], d[rows[i]:rows[i + 1]], u[rows[i]:rows[i + 1]]), q[i], partial)
            block = blocks[l // 2]
            out = block.attention(None, cos, sin, h=h) if l % 2 == 0 else block.mlp(block.mlp_input(None, h=h))
            partial = source(out if partial is None else partial[0] + fp32(out))
        finished.append(partial)
    with no_autocast:
        q = queries_of(model.final_read).to(dtype)
        h = phase2(phase1(finished, torch.zeros(n_max, dtype=dtype, device=device), q), q, None)
    return h[0]
