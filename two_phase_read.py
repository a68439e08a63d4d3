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

Phase 1 always runs over the same number of sources: the finished ones kept in one tensor, padded up to
the most a block's reads have (the embedding and every block but the last), the padding masked out of the
softmax; a closed block is pushed in at the back and the oldest padding slot dropped. The final read is
one more phase 1 over that tensor, with the last block merged in as its partial. So every block's phase 1
has one shape and is made of the same operations, and so is every merge, whatever the depth: under
torch.compile the kernels are the same for every block. The arithmetic is the plain read's: float32
(float64 stays float64) with autocast off, logits as elementwise products and sums (no matmul). The
routing diagnostics use the plain read (GPT.forward records with it).

This file computes what assignments 1 and 3 of the course kit ask for, a second way: its lines between
`### BEGIN WITH SOLUTION n` and `### END WITH SOLUTION` come with assignment n's solution (a handout that
still has assignment n to write has a stub there).
"""

import math

import torch

from model import fp32, source


def phase1(x, inv_rms, bias, q):
    """The online-softmax state (m, d, u) of the routes q (R, d) over the finished sources, kept as one
    tensor x (N, B, T, d) with their 1/rms (N, B, T) and bias (N,): 0 for a source, -inf for padding.
    m, d: (R, B, T, 1); u: (R, B, T, d)."""
    ### BEGIN WITH SOLUTION 1
    z = (x[None] * q[:, None, None, None, :]).sum(-1) * inv_rms[None] + bias[None, :, None, None]   # (R, N, B, T)
    m = z.amax(1, keepdim=True)
    e = (z - m).exp()
    u = (e[..., None] * x[None]).sum(1)                              # (R, B, T, d)
    return m[:, 0, ..., None], e.sum(1)[..., None], u
    ### END WITH SOLUTION


def phase2(state, q, partial):
    """h (R, B, T, d): the state of phase 1 with the partial merged in (or as it is, without one)."""
    ### BEGIN WITH SOLUTION 1
    m, d, u = state
    if partial is None:
        return u / d
    x, inv_rms = partial
    z = (x[None] * q[:, None, None, :]).sum(-1, keepdim=True) * inv_rms[None]   # (R, B, T, 1)
    m2 = torch.maximum(m, z)
    c, e = (m - m2).exp(), (z - m2).exp()
    return (u * c + e * x[None]) / (d * c + e)
    ### END WITH SOLUTION


def push(stack, new):
    """The stack of finished sources with `new` appended and the oldest slot (padding) dropped: the same
    shape and the same operations at every block, so that every block's phase 1 is the same kernel."""
    return torch.cat([stack[1:], new[None]])


def forward_two_phase(model, embedding):
    """model.forward_depth_routed(embedding), computed block by block in two phases."""
    ### BEGIN WITH SOLUTION 3
    S, L = model.config.attnres_block_size, 2 * model.config.n_layer
    slots = math.ceil(L / S)                    # the last block's finished sources: the embedding, the other blocks
    x0, r0 = source(embedding)
    dtype, device = x0.dtype, embedding.device
    # the finished sources, padded at the front: slots fill from the back, one per closed block
    x = push(torch.zeros(slots, *x0.shape, dtype=dtype, device=device), x0)
    inv_rms = push(torch.ones(slots, *x0.shape[:-1], dtype=dtype, device=device), r0[..., 0])
    bias = push(torch.full((slots,), -math.inf, dtype=dtype, device=device), torch.zeros((), dtype=dtype, device=device))
    blocks, cos, sin = list(model.transformer.h), model.rope_cos, model.rope_sin
    no_autocast = torch.autocast(device_type=device.type, enabled=False)   # the reads are float32, as in depth_read
    for first in range(0, L, S):
        sublayers = range(first, min(first + S, L))
        reads = [blocks[l // 2].attn_read if l % 2 == 0 else blocks[l // 2].mlp_read for l in sublayers]
        with no_autocast:
            q = [r.queries().to(dtype) for r in reads]
            rows = [sum(len(w) for w in q[:i]) for i in range(len(q) + 1)]
            m, d, u = phase1(x, inv_rms, bias, torch.cat(q))
        partial = None
        for i, l in enumerate(sublayers):
            with no_autocast:
                h = phase2((m[rows[i]:rows[i + 1]], d[rows[i]:rows[i + 1]], u[rows[i]:rows[i + 1]]), q[i], partial)
            block = blocks[l // 2]
            out = block.attention(None, cos, sin, h=h) if l % 2 == 0 else block.mlp(block.mlp_input(None, h=h))
            partial = source(out if partial is None else partial[0] + fp32(out))
        if first + S < L:                       # a later block reads this one as a finished source
            x, inv_rms = push(x, partial[0]), push(inv_rms, partial[1][..., 0])
            bias = push(bias, torch.zeros((), dtype=dtype, device=device))
    with no_autocast:                           # the final read: the last block is its partial
        q = model.final_read.queries().to(dtype)
        h = phase2(phase1(x, inv_rms, bias, q), q, partial)
    ### END WITH SOLUTION
    return h[0]
