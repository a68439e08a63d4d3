"""
The depth reads of a whole model computed in two phases, as the AttnRes paper computes them: the same
function as model.GPT.forward_depth_routed (the lesson, the plain read), in TwoPhaseGPT, which train.py
and bench.py build with depth_read='two_phase' (docs/performance.md, "The two-phase read"). It is made of
model.py's pieces (each read point's pseudo-queries, each sublayer); only the order of the arithmetic differs.

The pseudo-queries do not depend on the input, so when an AttnRes block opens, the reads of all its
sublayers (every route) over the *finished* sources can be computed at once:

    phase 1, once per AttnRes block, over the finished sources b_0 .. b_{n-1}:
        z[r, s] = (w_r . b_s) / rms(b_s)          (the scores, as read_sources computes them; w_r: route r's pseudo-query)
        m[r] = max_s z[r, s],  den[r] = sum_s exp(z[r, s] - m[r]),  num[r] = sum_s exp(z[r, s] - m[r]) b_s
    phase 2, at each sublayer, merges the one source that changes, the partial p (an online softmax):
        z_p = (w_r . p) / rms(p),  m' = max(m, z_p)
        h[r] = (num[r] exp(m - m') + exp(z_p - m') p) / (den[r] exp(m - m') + exp(z_p - m'))
        (at the sublayer that opens the AttnRes block there is no partial: h[r] = num[r] / den[r])

Phase 1 always runs over the same number of sources: the finished ones kept in one tensor, padded up to
the most a block's reads have (the embedding and every block but the last), the padding masked out of the
softmax; a closed block is shifted in at the back and the oldest padding slot dropped. The final read is
one more phase 1 over that tensor, with the last block merged in as its partial. So every block's phase 1
has one shape and is made of the same operations, and so is every merge, whatever the depth. That is
what lets compile=True compile one AttnRes block (attnres_block: its phase 1, then its sublayers with
their merges) once and call it for every block (compile_model, compile_blocks): dynamo sees the same
shapes, and the block's read points and Blocks are its inputs, not constants. The arithmetic is the
plain read's: float32 (float64 stays float64) with autocast off, scores as elementwise products and sums
(no matmul). The routing diagnostics use the plain read (GPT.forward records with it).

This file computes what assignments 1 and 3 of the course kit ask for, a second way: its lines between
`### BEGIN WITH SOLUTION n` and `### END WITH SOLUTION` come with assignment n's solution. A course handout
that still has assignment n to write holds, in their place, the lines marked `### HANDOUT:` (commented out
here): a whole file that computes nothing a student writes. Phase 1 keeps the sources and phase 2 reads them
with model.read_sources (assignment 1); TwoPhaseGPT's forward pass is the plain one, GPT.forward_depth_routed
(assignment 3), and TWO_PHASE is False, so that the tests of the two-phase computation itself skip.
"""

import math

import torch

from model import GPT, fp32, source

TWO_PHASE = True   # the reads are computed in two phases (False in a course handout: see above)
### BEGIN WITH SOLUTION 3
### HANDOUT: TWO_PHASE = False
### END WITH SOLUTION

class TwoPhaseGPT(GPT):
    """A GPT whose depth reads are computed in two phases, AttnRes block by AttnRes block: the same function
    and the same parameters (a checkpoint of either loads into the other). The routing diagnostics use the
    plain read."""
    block_region = None   # compile_blocks(): attnres_block compiled, one graph reused by every AttnRes block
    blocks_outside_the_graph = None   # compile_blocks(): forward_two_phase, which the compiled model does not trace

    def forward_depth_routed(self, embedding):
        if self.record_routing:
            return super().forward_depth_routed(embedding)
        if self.block_region is not None:
            return self.blocks_outside_the_graph(self, embedding)
        return forward_two_phase(self, embedding)

    def compile_blocks(self, **options):
        """This model as compile=True runs it: one AttnRes block (attnres_block) compiled and called for every
        block, and the rest of the model compiled around the loop over the blocks: the embedding is one
        graph, the head and the loss (the cross-entropy over the vocabulary, fused) another; the loop, the
        pushes and the final read run eagerly between them. Every block calls the region with inputs of the
        same shapes (the padded finished sources, its own read points and Blocks), so torch.compile traces
        and builds it once, whatever the depth: a new graph only for another pattern of sublayers (S odd: a
        block opening on an MLP; a short last block), eval mode or no grad. Returns the compiled module, for
        the step; this one keeps the parameters (checkpoints) and records the routing with the plain read."""
        self.block_region = torch.compile(attnres_block, dynamic=False, **options)
        # a graph break where the loop over the blocks is (made here, not where the function is defined:
        # torch.compiler.disable imports dynamo, a second's start-up that an eager run does not need)
        self.blocks_outside_the_graph = torch.compiler.disable(forward_two_phase)
        return torch.compile(self, dynamic=False, **options)


def phase1(x, inv_rms, bias, w):
    """The online-softmax state (m, den, num) of the routes' pseudo-queries w (R, d) over the finished sources, kept as
    one tensor x (N, B, T, d) with their 1/rms (N, B, T) and bias (N,): 0 for a source, -inf for padding.
    m, den: (R, B, T, 1); num: (R, B, T, d)."""
    ### BEGIN WITH SOLUTION 1
    z = (x[None] * w[:, None, None, None, :]).sum(-1) * inv_rms[None] + bias[None, :, None, None]   # (R, N, B, T)
    m = z.amax(1, keepdim=True)
    e = (z - m).exp()
    num = (e[..., None] * x[None]).sum(1)                            # (R, B, T, d)
    return m[:, 0, ..., None], e.sum(1)[..., None], num
    ### HANDOUT: return x, inv_rms, bias   # (this handout's state: the sources themselves, read by phase2)
    ### END WITH SOLUTION


def phase2(state, w, partial):
    """h (R, B, T, d): the state of phase 1 with the partial merged in (or as it is, without one)."""
    ### BEGIN WITH SOLUTION 1
    m, den, num = state
    if partial is None:
        return num / den
    x, inv_rms = partial
    z = (x[None] * w[:, None, None, :]).sum(-1, keepdim=True) * inv_rms[None]   # (R, B, T, 1)
    m2 = torch.maximum(m, z)
    c, e = (m - m2).exp(), (z - m2).exp()
    return (num * c + e * x[None]) / (den * c + e)
    ### HANDOUT: from model import read_sources   # (this handout: the plain read of the sources and the partial)
    ### HANDOUT: x, inv_rms, bias = state
    ### HANDOUT: sources = [(x[i], inv_rms[i][..., None]) for i in range(len(x)) if bias[i] == 0]   # (not the padding)
    ### HANDOUT: return read_sources(sources + ([partial] if partial is not None else []), w)[0]
    ### END WITH SOLUTION


def shift_in(stack, new):
    """The stack of finished sources with `new` appended at the back and the oldest slot (padding) dropped:
    the same shape and the same operations at every AttnRes block, so that every phase 1 is the same kernel."""
    return torch.cat([stack[1:], new[None]])


### BEGIN WITH SOLUTION 3
def attnres_block(is_attention, reads, blocks, x, inv_rms, bias, cos, sin):
    """One AttnRes block in two phases: phase 1 of all its read points at once over the finished sources
    (x, inv_rms, bias, as phase1 takes them), then each sublayer in turn, its read merged with the partial.
    is_attention[i], reads[i], blocks[i]: sublayer i of the block is an attention sublayer (else an MLP), its
    DepthRead, its transformer Block. Returns the block's sum of outputs as a source (x, 1/rms)."""
    with torch.autocast(device_type=x.device.type, enabled=False):   # the reads are float32, as in read_sources
        w = [read.pseudo_queries().to(x.dtype) for read in reads]
        rows = [sum(len(w_i) for w_i in w[:i]) for i in range(len(w) + 1)]
        m, den, num = phase1(x, inv_rms, bias, torch.cat(w))
    partial = None
    for i, block in enumerate(blocks):
        with torch.autocast(device_type=x.device.type, enabled=False):
            state = (m[rows[i]:rows[i + 1]], den[rows[i]:rows[i + 1]], num[rows[i]:rows[i + 1]])
            h = phase2(state, w[i], partial)
        out = block.run_sublayer(is_attention[i], h, cos, sin)
        partial = source(out if partial is None else partial[0] + fp32(out))
    return partial
### END WITH SOLUTION


def forward_two_phase(model, embedding):
    """model.forward_depth_routed(embedding), computed AttnRes block by AttnRes block in two phases (in a course
    handout that still has assignment 1 or 3 to write: the plain read, GPT.forward_depth_routed)."""
    ### BEGIN WITH SOLUTION 3
    S, L = model.config.attnres_block_size, 2 * model.config.n_layer
    run_block = model.block_region or attnres_block
    slots = math.ceil(L / S)                    # the last AttnRes block's finished sources: the embedding, the others
    x0, r0 = source(embedding)
    dtype, device = x0.dtype, embedding.device
    # the finished sources, padded at the front: slots fill from the back, one per closed AttnRes block
    x = shift_in(torch.zeros(slots, *x0.shape, dtype=dtype, device=device), x0)
    inv_rms = shift_in(torch.ones(slots, *x0.shape[:-1], dtype=dtype, device=device), r0[..., 0])
    bias = shift_in(torch.full((slots,), -math.inf, dtype=dtype, device=device), torch.zeros((), dtype=dtype, device=device))
    for first in range(0, L, S):
        sublayers = range(first, min(first + S, L))
        partial = run_block(tuple(l % 2 == 0 for l in sublayers), [model.read_point(l) for l in sublayers],
                            [model.transformer.h[l // 2] for l in sublayers], x, inv_rms, bias, model.rope_cos,
                            model.rope_sin)
        if first + S < L:                       # a later AttnRes block reads this one as a finished source
            x, inv_rms = shift_in(x, partial[0]), shift_in(inv_rms, partial[1][..., 0])
            bias = shift_in(bias, torch.zeros((), dtype=dtype, device=device))
    with torch.autocast(device_type=device.type, enabled=False):   # the final read: the last block is its partial
        w = model.final_read.pseudo_queries().to(dtype)
        h = phase2(phase1(x, inv_rms, bias, w), w, partial)
    return h[0]
    ### HANDOUT: return GPT.forward_depth_routed(model, embedding)   # (the two-phase read: with assignment 3's solution)
    ### END WITH SOLUTION


def compile_model(model, **options):
    """What runs `model` under compile=True, in train.py and in bench.py: a TwoPhaseGPT with one region per
    AttnRes block compiled (compile_blocks), any other model compiled whole. Static shapes (dynamic=False): a
    new shape is a visible recompile, not a slower dynamic graph. options: torch.compile's (a backend, say)."""
    if isinstance(model, TwoPhaseGPT) and TWO_PHASE:
        return model.compile_blocks(**options)
    return torch.compile(model, dynamic=False, **options)
