"""
A GPT language model with three kinds of residual connection, selected by one flag.

    residual='standard'    h_{l+1} = h_l + f_l(h_l)                        the pre-norm baseline
    residual='attnres'     h_l = sum_s softmax_s(w_l . RMSNorm(b_s)) b_s   Block Attention Residuals
    residual='rd_attnres'  the same read twice before attention: one route for Q/K,
                           one for V (Role-Decoupled Attention Residuals)

plus the RD-AttnRes paper's three early-budget controls (ctrl_params, ctrl_dup, ctrl_fixed_v) and
ctrl_heads, our control for "two different reads, whatever the split" (docs/controls.md). Everything
else (the "backbone") is the same modern nanoGPT for every mode: RMSNorm pre-norms, rotary position
embeddings, causal scaled-dot-product attention, GELU MLP, tied LM head, no biases.

Glossary (README: "The method in a few lines of math")
    sublayer  one attention or one MLP; a transformer Block holds two. L = 2 * n_layer sublayers,
              numbered l = 0 .. L-1 (even: attention, odd: MLP)
    S         attnres_block_size: sublayers per AttnRes block (1 = Full AttnRes); N: a read's sources
    block     an AttnRes block: S consecutive sublayers. (Not a transformer Block, and not block_size,
              which is the context length.)
    source    what a depth read chooses from: b_0 = the token embedding, b_n = the sum of the outputs
              of the sublayers of AttnRes block n, and the partial
    partial   the sum of the outputs of the current AttnRes block so far
    read      h = sum_s alpha_s * source_s with alpha = softmax_s(w . RMSNorm(source_s)): a learned
              pseudo-query w against RMS-normalised keys, raw values mixed
    route     one softmax of a read, with its own pseudo-query: qk (feeds queries and keys; the only
              route of attnres), v (feeds values: RD-AttnRes), heads1 / heads2 (ctrl_heads: Q, K
              and V of the first / second half of the heads), mlp, final
The lines between `### BEGIN SOLUTION n` and `### END SOLUTION` are what assignment n of the course
kit asks students to write (COURSE.md); Python ignores the markers.
"""

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from routing import summarise_read

RESIDUAL_MODES = ('standard', 'attnres', 'rd_attnres', 'ctrl_params', 'ctrl_dup', 'ctrl_fixed_v', 'ctrl_heads')
# The read before each attention sublayer, per mode: its routes and the pseudo-query each one uses. The
# first route is always attn_query's, so tying a mode's second query to it gives attnres back; ctrl_dup's
# two routes share one query (attnres's function at rd_attnres's compute). rd_attnres splits attention's
# input by role (Q/K from one route, V from the other); ctrl_heads splits it by heads (Q, K and V of heads
# 1..H/2 from one route, of the others from the other): two learned reads, roles still coupled.
ATTENTION_ROUTES = {
    'attnres':      {'qk': 'attn_query'},
    'ctrl_params':  {'qk': 'attn_query'},
    'rd_attnres':   {'qk': 'attn_query', 'v': 'value_query'},
    'ctrl_fixed_v': {'qk': 'attn_query', 'v': 'value_query'},   # value_query frozen at zero (a buffer)
    'ctrl_dup':     {'qk': 'attn_query', 'v': 'attn_query'},
    'ctrl_heads':   {'heads1': 'attn_query', 'heads2': 'heads2_query'},
}
RMS_EPS = 1e-6


@dataclass
class GPTConfig:
    block_size: int = 1024         # context length in tokens
    vocab_size: int = 50304        # GPT-2's 50257 padded up to a multiple of 64 (faster matmuls)
    n_layer: int = 12              # transformer blocks; each holds 2 sublayers (attention, MLP)
    n_head: int = 12
    n_embd: int = 768
    residual: str = 'standard'     # one of RESIDUAL_MODES
    attnres_block_size: int = 4    # S: sublayers per AttnRes block (1 = Full AttnRes)
    depth_read: str = 'plain'      # or 'two_phase': the same reads, computed per block (two_phase_read.py)

    def __post_init__(self):   # a bad shape is a message here, not an error deep inside a forward pass
        if self.residual not in RESIDUAL_MODES or self.depth_read not in ('plain', 'two_phase'):
            raise ValueError(f"unknown residual={self.residual!r} or depth_read={self.depth_read!r}; choose one of "
                             f"{', '.join(RESIDUAL_MODES)}, and plain or two_phase")
        for name in ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'attnres_block_size'):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.residual != 'standard' and self.attnres_block_size > 2 * self.n_layer:
            warnings.warn(f"attnres_block_size={self.attnres_block_size} exceeds the {2 * self.n_layer} sublayers: one "
                          f"block, every read sees the embedding and the partial only (1 = Full AttnRes)")
        if self.residual == 'ctrl_heads' and self.n_head % 2 != 0:
            raise ValueError(f"residual='ctrl_heads' splits the heads into two halves, one per route: n_head must be "
                             f"even, got {self.n_head}")
        if (self.n_embd // self.n_head) % 2 != 0:
            raise ValueError(f"head dim n_embd/n_head={self.n_embd // self.n_head} must be even for rotary "
                             "embeddings (they rotate pairs of channels); change n_embd or n_head")


# -----------------------------------------------------------------------------
# The backbone: the same for every residual mode

class RMSNorm(nn.Module):
    """x / rms(x) * gain, with rms(x) = sqrt(mean(x^2) + eps). No mean subtraction, no bias."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.size(-1),), self.weight, RMS_EPS)


def rotary_tables(block_size, head_dim, base=10000.0):
    # channel pair i of position t is rotated by the angle t * base^(-2i/head_dim)
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(block_size, dtype=torch.float32), inv_freq)  # (T, head_dim/2)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    # x: (B, n_head, T, head_dim); rotate the pairs (x1[i], x2[i]) made of the two halves of the head
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention. Q and K are computed from one input, V from another, so that
    RD-AttnRes can feed them from two different depth routes; every other mode passes the same
    tensor twice and gets ordinary attention."""

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.c_qk = nn.Linear(config.n_embd, 2 * config.n_embd, bias=False)  # matching: queries and keys
        self.c_v = nn.Linear(config.n_embd, config.n_embd, bias=False)       # retrieval: values
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x_qk, x_v, cos, sin):
        C = x_qk.size(-1)
        q, k = self.c_qk(x_qk).split(C, dim=2)
        return self.attend(q, k, self.c_v(x_v), cos, sin)

    def forward_by_heads(self, x_heads1, x_heads2, cos, sin):
        """ctrl_heads: x_heads1 is the input of Q, K and V of the first half of the heads, x_heads2 of the
        other half. Row block h*hd:(h+1)*hd of each projection belongs to head h, so each half is projected
        by its own rows only: no head is computed twice, and the cost is that of forward()."""
        C = x_heads1.size(-1)
        half = C // 2                                              # the rows of heads 1 .. n_head/2
        w_q, w_k = self.c_qk.weight.split(C)
        q, k, v = (torch.cat([F.linear(x_heads1, w[:half]), F.linear(x_heads2, w[half:])], dim=-1)
                   for w in (w_q, w_k, self.c_v.weight))
        return self.attend(q, k, v, cos, sin)

    def attend(self, q, k, v, cos, sin):
        """Causal attention of projected q, k, v (B, T, C), then the output projection."""
        B, T, C = q.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        q, k = apply_rotary(q, cos[:T], sin[:T]), apply_rotary(k, cos[:T], sin[:T])
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hd)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


# -----------------------------------------------------------------------------
# The depth read: the heart of AttnRes and RD-AttnRes

def fp32(x):
    """Upcast bf16/fp16 to float32; float32 and float64 (used by the exactness tests) pass through."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def source(x):
    """A depth source as the reads use it: (x in float32, 1/rms(x) of shape (B, T, 1)). The key of a
    source is RMSNorm(x) = x * (1/rms(x)) * gain; with the gain folded into the query (DepthRead), a
    source's keys cost one (B, T, 1) tensor, computed once per forward, never a normalised copy of x.
    Sources are float32, like the residual stream of the standard mode under autocast."""
    x = fp32(x)
    return x, torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS)


def n_sources(l, S):
    """Sources of the read before 0-indexed sublayer l: the embedding, the l // S finished blocks, and
    the partial unless l opens a block. For l = L (the final read, after the last block is closed)
    the same count is 1 + ceil(L / S): the embedding and every block."""
    return 1 + l // S + (l % S != 0)


def depth_read(sources, queries):
    """R depth reads over the same sources at once, one per row of `queries`.

        logit[r, s] = queries[r] . RMSNorm(x_s)        (keys are the normalised sources; no 1/sqrt(d))
        alpha[r]    = softmax over s of logit[r]
        h[r]        = sum_s alpha[r, s] * x_s           (values are the raw sources)

    sources: list of N pairs (x_s (B, T, d) float32, 1/rms(x_s) (B, T, 1)), see source()
    queries: (R, d) pseudo-queries with the key-norm gain folded in: w . (g * x / rms(x)) = ((w * g) . x) / rms(x)
    returns h (R, B, T, d) and alpha (R, B, T, N), both float32 (float64 when the sources are float64).
    """
    x0 = sources[0][0]
    # Softmax over depth and the weighted sum are done in float32 even under bf16 autocast: the
    # sources have very different scales and bf16's 8 bits of mantissa would blur the mixture.
    # Each logit is an elementwise product and a sum, not a matmul: on GPUs with allow_tf32 a matmul
    # would round its float32 inputs to TF32's 10-bit mantissa. The read is memory-bound, so this
    # costs about the same (under torch.compile the product and the sum fuse into one kernel).
    ### BEGIN SOLUTION 1
    with torch.autocast(device_type=x0.device.type, enabled=False):
        q = queries.to(x0.dtype)                                                          # (R, d)
        logits = torch.stack([torch.stack([(x * w).sum(-1) for w in q], -1) * inv_rms     # (B, T, R)
                              for x, inv_rms in sources], -1)                             # (B, T, R, N)
        alpha = logits.softmax(dim=-1).permute(2, 0, 1, 3)                                # (R, B, T, N)
        # a running sum instead of stacking the sources: no (S, B, T, d) copy is made or kept for backward
        h = sum(alpha[..., s:s + 1] * x for s, (x, _) in enumerate(sources))              # (R, B, T, d)
    ### END SOLUTION
    return h, alpha


class DepthRead(nn.Module):
    """One read point: the read before a sublayer (or the final one). It owns one pseudo-query per
    distinct query name of its routes, all zero at init (the paper: no volatility early on; every read
    starts as the uniform average of its sources), and the gain of its key RMSNorm (ones), which it
    folds into the queries. Both routes of a two-route read share the sources and the key norm."""

    def __init__(self, d, sublayer, layer, routes, frozen=()):
        super().__init__()
        self.sublayer, self.layer, self.routes = sublayer, layer, routes   # routes: {route: query name}
        for name in dict.fromkeys(routes.values()):
            if name in frozen:
                self.register_buffer(name, torch.zeros(d))   # not learned: this route stays uniform
            else:
                setattr(self, name, nn.Parameter(torch.zeros(d)))
        self.key_gain = nn.Parameter(torch.ones(d))

    def queries(self):
        """The (R, d) pseudo-queries of the routes, one row per route in the order of self.routes (two routes
        that share a query name are still two rows), with the key-norm gain folded in."""
        ### BEGIN SOLUTION 2
        return torch.stack([getattr(self, name) for name in self.routes.values()]) * self.key_gain
        ### END SOLUTION

    def forward(self, sources, log=None):
        """h (routes, B, T, d); with a list as `log`, each route's depth distribution is appended to it."""
        h, alpha = depth_read(sources, self.queries())
        if log is not None:
            for r, route in enumerate(self.routes):
                log.append(summarise_read(self.sublayer, self.layer, route, alpha[r]))
        return h


# -----------------------------------------------------------------------------

class Block(nn.Module):
    """One transformer block = two sublayers (attention, then MLP), each with its own pre-norm. In the
    depth-routed modes each sublayer also has the read point that builds its input."""

    def __init__(self, config, layer):
        super().__init__()
        d, mode = config.n_embd, config.residual
        self.residual = mode
        self.norm_attn = RMSNorm(d)
        self.attn = CausalSelfAttention(config)
        self.norm_mlp = RMSNorm(d)
        self.mlp = MLP(config)
        if mode == 'standard':
            return
        self.attn_read = DepthRead(d, 2 * layer, layer, ATTENTION_ROUTES[mode],
                                   frozen=('value_query',) if mode == 'ctrl_fixed_v' else ())
        self.mlp_read = DepthRead(d, 2 * layer + 1, layer, {'mlp': 'mlp_query'})
        if mode == 'ctrl_params':
            self.attn_input_gain = nn.Parameter(torch.ones(d))   # the extra vector, spent as a gain

    def attn_inputs(self, sources, log=None, h=None):
        """The attention sublayer's two inputs, its first route's and its last route's (the same x when there is
        one route): x_qk feeds queries and keys and x_v values; in ctrl_heads, the two halves of the heads.
        (h: the read's rows when they were computed elsewhere, by two_phase_read.py)"""
        h = self.attn_read(sources, log) if h is None else h   # one row per route
        if self.residual == 'ctrl_params':
            h = h * self.attn_input_gain
        ### BEGIN SOLUTION 2
        x = self.norm_attn(h)                              # the same pre-norm for both routes [chosen]
        return x[0], x[-1]                                 # one route: both inputs are the same x
        ### END SOLUTION

    def attention(self, sources, cos, sin, log=None, h=None):
        """The attention sublayer's output from the sources: its read, then attention fed by the routes."""
        x_qk, x_v = self.attn_inputs(sources, log, h)
        if self.residual == 'ctrl_heads':     # its two routes feed two halves of the heads, not two roles
            return self.attn.forward_by_heads(x_qk, x_v, cos, sin)
        return self.attn(x_qk, x_v, cos, sin)  # route 1 -> Q and K; the last route -> V

    def mlp_input(self, sources, log=None, h=None):
        """The MLP sublayer's input: one read of its own (unchanged by RD-AttnRes)."""
        return self.norm_mlp((self.mlp_read(sources, log) if h is None else h)[0])


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            h=nn.ModuleList([Block(config, layer) for layer in range(config.n_layer)]),
            ln_f=RMSNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        if config.residual != 'standard':  # the read after the last sublayer, into the final norm and head
            self.final_read = DepthRead(config.n_embd, 2 * config.n_layer, config.n_layer, {'final': 'final_query'})
        cos, sin = rotary_tables(config.block_size, config.n_embd // config.n_head)
        self.register_buffer('rope_cos', cos, persistent=False)
        self.register_buffer('rope_sin', sin, persistent=False)
        # Paired init: only Linear and Embedding weights draw random numbers, in module order, and every
        # mode has the same ones in the same order; the extra vectors of a mode are zeros or ones, so
        # they never shift the random stream and shared weights are bit-identical across modes.
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith('c_proj.weight'):  # outputs written into the residual: scaled by depth (GPT-2)
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        self.record_routing = False  # set True to keep each read's depth distribution in self.routing
        self.routing = []

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self):
        # the tied embedding / LM head is counted once; rotary tables are buffers, not parameters
        return sum(p.numel() for p in self.parameters())

    # ---- forward -------------------------------------------------------------------------------

    def forward(self, idx, targets=None):
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} exceeds block_size={self.config.block_size}")
        x = self.transformer.wte(idx)
        if self.config.residual == 'standard':
            for block in self.transformer.h:
                a = block.norm_attn(x)
                x = x + block.attn(a, a, self.rope_cos, self.rope_sin)
                x = x + block.mlp(block.norm_mlp(x))
        elif self.config.depth_read == 'two_phase' and not self.record_routing:
            from two_phase_read import forward_two_phase   # the same function, block by block (its docstring)
            x = forward_two_phase(self, x)
        else:
            x = self.forward_depth_routed(x)
        x = self.transformer.ln_f(x)
        if targets is None:  # inference: only the last position's logits are needed
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def forward_depth_routed(self, embedding):
        """Every sublayer reads its input from the sources instead of a running sum.
        Sources are *increments*: the embedding, then one per finished AttnRes block (the sum of its
        sublayers' outputs, the embedding never added in), plus the partial of the current block."""
        S = self.config.attnres_block_size
        log = [] if self.record_routing else None
        ### BEGIN SOLUTION 3
        finished = [source(embedding)]  # finished sources: b_0 = the embedding, then b_1, b_2, ...
        partial = None                  # the current block's outputs so far, as a source; None when empty
        for layer, block in enumerate(self.transformer.h):
            for l, kind in ((2 * layer, 'attn'), (2 * layer + 1, 'mlp')):   # l: the sublayer's number
                sources = finished if partial is None else finished + [partial]
                if kind == 'attn':
                    out = block.attention(sources, self.rope_cos, self.rope_sin, log)
                else:
                    out = block.mlp(block.mlp_input(sources, log))
                partial = source(out if partial is None else partial[0] + fp32(out))
                if (l + 1) % S == 0:    # the AttnRes block's S-th sublayer: its partial is now finished
                    finished.append(partial)
                    partial = None
        if partial is not None:         # the last block may be shorter than S
            finished.append(partial)
        h = self.final_read(finished, log)[0]
        ### END SOLUTION
        self.routing = log or []
        return h

    # ---- training and inference helpers (the nanoGPT surface) ----------------------------------

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        params = [p for p in self.parameters() if p.requires_grad]
        # Decay the matrices (linear weights, the tied embedding). Never the vectors: decaying a norm
        # gain drags it to 0, and decaying a pseudo-query drags its read back to the uniform average.
        groups = [{'params': [p for p in params if p.dim() >= 2], 'weight_decay': weight_decay},
                  {'params': [p for p in params if p.dim() < 2], 'weight_decay': 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=(device_type == 'cuda'))

    def read_points(self):
        """(sublayer, routes, sources) of every depth read of one forward pass, in order; sublayer 2*n_layer is
        the final read. Empty for the standard residual."""
        return [(m.sublayer, len(m.routes), n_sources(m.sublayer, self.config.attnres_block_size))
                for m in self.modules() if isinstance(m, DepthRead)]

    def flops_per_token(self, seq_len=None):
        """Training FLOPs (forward + backward = 3x forward) per token, depth reads included."""
        cfg, T = self.config, seq_len or self.config.block_size
        N, d = self.get_num_params(), cfg.n_embd
        dense = 6 * N + 12 * cfg.n_layer * cfg.n_embd * T  # weights (PaLM appendix B) + attention scores
        # a read over N sources and R routes: R*N dot products of length d (logits) and an R-route
        # weighted sum of N vectors of length d, 2 FLOPs per multiply-add each
        reads = sum(4 * d * R * N for _, R, N in self.read_points())
        return dense + 3 * reads

    def estimate_mfu(self, tokens_per_iter, dt, peak_flops=312e12, seq_len=None):
        """Model FLOPs utilisation: achieved FLOP/s over peak_flops (default: A100 bf16 dense)."""
        return self.flops_per_token(seq_len) * tokens_per_iter / dt / peak_flops

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Sample max_new_tokens tokens after idx (B, T), feeding predictions back in."""
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / max(temperature, 1e-8)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float('inf')
            idx_next = torch.multinomial(F.softmax(logits.float(), dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
