"""
A GPT language model with three kinds of residual connection, selected by one flag (symbols: the glossary below).

    residual='standard'    x_{l+1} = x_l + f_l(x_l)                        the pre-norm baseline
    residual='attnres'     h_l = sum_s softmax_s(w_l . RMSNorm(b_s)) b_s   Block Attention Residuals
    residual='rd_attnres'  two reads before attention, one route for its q/k, one for its v (Role-Decoupled)

plus the RD-AttnRes paper's three early-budget controls (ctrl_params, ctrl_dup, ctrl_fixed_v) and
ctrl_heads, our control for "two different reads, whatever the split" (docs/controls.md). Everything
else (the "backbone") is the same modern nanoGPT for every mode: RMSNorm pre-norms, rotary position
embeddings, causal scaled-dot-product attention, GELU MLP, tied LM head, no biases.

Glossary (README: "The method in a few lines of math"); q, k, v are token attention's alone, never the read's
    sublayer  one attention or one MLP; a transformer Block holds two. L = 2 * n_layer sublayers, l = 0 .. L-1
    S         attnres_block_size: an AttnRes block is S consecutive sublayers (1 = Full AttnRes; not a
              transformer Block, nor block_size, the context length). N, R, d: a read's sources, routes, width (C)
    source    what a read chooses from: b_0 = the embedding, b_n = the sum of AttnRes block n's outputs, the partial
    partial   the sum of the outputs of the current AttnRes block so far (shown as `part`)
    read      h = sum_s alpha_s b_s, alpha = softmax_s(w . RMSNorm(b_s)): a pseudo-query w scores the normalised
              sources, alpha mixes the raw ones (the gain of that RMSNorm: source_gain). h: a read's output
              (transformer.h keeps nanoGPT's name for the list of Blocks: the checkpoints' tensor names)
    read point  where reads happen (a DepthRead): before each sublayer, and the final read after the last one
    route     one read of a read point, with the pseudo-query ATTENTION_ROUTES names: qk (w_qk: attention's q, k,
              and v in attnres), v (w_v: attention's v; ctrl_dup's reuses w_qk), heads1/heads2 (ctrl_heads), mlp, final
    x         a sublayer's input: the residual stream (standard), a read through the pre-norm (x_qk, x_v)
    layer     a transformer Block's number, 0 .. n_layer-1 (its sublayers: 2*layer, 2*layer+1; the final read: n_layer)
`### BEGIN SOLUTION <k>` ... `### END SOLUTION` (a handout's: BEGIN/END YOUR CODE): the course kit's assignment k.
"""

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

RESIDUAL_MODES = ('standard', 'attnres', 'rd_attnres', 'ctrl_params', 'ctrl_dup', 'ctrl_fixed_v', 'ctrl_heads')
# The read point before each attention sublayer, per mode: its routes and each one's pseudo-query (the controls' too:
# their attention is control_attention, at the end of this file). Tying the second pseudo-query to the first gives
# attnres back (ctrl_dup: attnres's function at rd_attnres's compute). rd_attnres splits attention's input by role,
# ctrl_heads by heads. A mode with one route calls it qk, though it feeds the values too: rd_attnres keeps it for q, k.
ATTENTION_ROUTES = {
    'attnres':      {'qk': 'w_qk'},
    'ctrl_params':  {'qk': 'w_qk'},
    'rd_attnres':   {'qk': 'w_qk', 'v': 'w_v'},
    'ctrl_fixed_v': {'qk': 'w_qk', 'v': 'w_v'},   # w_v fixed at zero (a buffer)
    'ctrl_dup':     {'qk': 'w_qk', 'v': 'w_qk'},
    'ctrl_heads':   {'heads1': 'w_heads1', 'heads2': 'w_heads2'},
}
RMS_EPS = 1e-6


@dataclass
class GPTConfig:
    block_size: int = 1024         # context length in tokens
    vocab_size: int = 50304        # GPT-2's vocabulary (prepare.VOCAB_SIZE) padded up to a multiple of 64 (faster matmuls)
    n_layer: int = 12              # transformer blocks; each holds 2 sublayers (attention, MLP)
    n_head: int = 12
    n_embd: int = 768
    residual: str = 'standard'     # one of RESIDUAL_MODES
    attnres_block_size: int = 4    # S: sublayers per AttnRes block (1 = Full AttnRes)

    def __post_init__(self):   # a bad shape is a message here, not an error deep inside a forward pass
        if self.residual not in RESIDUAL_MODES:
            raise ValueError(f"unknown residual={self.residual!r}; choose one of {', '.join(RESIDUAL_MODES)}")
        for name in [n for n in ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'attnres_block_size')
                     if getattr(self, n) < 1][:1]:
            raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.residual != 'standard' and self.attnres_block_size > 2 * self.n_layer:
            warnings.warn(f"attnres_block_size={self.attnres_block_size} exceeds the {2 * self.n_layer} sublayers: one "
                          f"AttnRes block, every read sees the embedding and the partial only (1 = Full AttnRes)")
        if self.residual == 'ctrl_heads' and self.n_head % 2 != 0:
            raise ValueError(f"ctrl_heads gives each route half the heads: n_head must be even, got {self.n_head}")
        if (self.n_embd // self.n_head) % 2 != 0:
            raise ValueError(f"head dim n_embd/n_head={self.n_embd // self.n_head} must be even for rotary "
                             "embeddings (they rotate pairs of channels); change n_embd or n_head")


# -----------------------------------------------------------------------------
# The backbone: the same for every residual mode

def RMSNorm(dim):
    """x / rms(x) * gain, with rms(x) = sqrt(mean(x^2) + eps). No mean subtraction, no bias."""
    return nn.RMSNorm(dim, eps=RMS_EPS)


def rotary_tables(block_size, head_dim, base=10000.0):
    # channel pair j of position t is rotated by the angle t * base^(-2j/head_dim)
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(block_size, dtype=torch.float32), inv_freq)  # (T, head_dim/2)
    return angles.cos(), angles.sin()


def apply_rotary(t, cos, sin):
    # t: q or k (B, n_head, T, head_dim); rotate the pairs (t1[j], t2[j]) made of the two halves of the head
    t1, t2 = t.float().chunk(2, dim=-1)
    return torch.cat([t1 * cos - t2 * sin, t1 * sin + t2 * cos], dim=-1).type_as(t)


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention. q and k are computed from one input, v from another, so that RD-AttnRes
    can feed them from two depth routes; attnres passes one tensor twice and gets ordinary attention."""

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.c_qk = nn.Linear(config.n_embd, 2 * config.n_embd, bias=False)  # matching: queries and keys
        self.c_v = nn.Linear(config.n_embd, config.n_embd, bias=False)       # retrieval: values
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x_qk, x_v, cos, sin):
        q, k = self.c_qk(x_qk).chunk(2, dim=-1)
        return self.attend(q, k, self.c_v(x_v), cos, sin)

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


def source(b):
    """A depth source as the reads use it: (b in float32, like the standard residual stream under autocast,
    1/rms(b) (B, T, 1)). A read scores RMSNorm(b) = b * (1/rms(b)) * gain; with the gain folded into the
    pseudo-query (DepthRead), that costs one (B, T, 1) tensor per source per forward, never a normalised copy."""
    b = fp32(b)
    return b, torch.rsqrt(b.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS)


def n_sources(l, S):
    """The number N of sources of the read point before sublayer l: the embedding, the l // S finished AttnRes
    blocks, the partial unless l opens one. For l = L (the final read, the last one closed): 1 + ceil(L / S)."""
    return 1 + l // S + (l % S != 0)


def read_sources(sources, w):
    """R depth reads over the same sources at once, one per row of `w`.

        score[r, s] = w[r] . RMSNorm(b_s)              (the normalised sources are scored; no 1/sqrt(d))
        alpha[r]    = softmax over s of score[r]
        h[r]        = sum_s alpha[r, s] * b_s           (the raw sources are mixed)

    sources: list of N pairs (b_s (B, T, d) float32, 1/rms(b_s) (B, T, 1)), see source()
    w: (R, d) pseudo-queries with the source norm's gain g folded in: w . (g * b / rms(b)) = ((w * g) . b) / rms(b)
    returns h (R, B, T, d) and alpha (R, B, T, N), both float32 (float64 when the sources are float64).
    """
    b0 = sources[0][0]
    # Float32 even under bf16 autocast: the sources have very different scales, and bf16's 8 bits of mantissa
    # would blur the mixture. Each score an elementwise product and a sum, not a matmul: on GPUs with TF32 on a
    # matmul rounds its inputs to 10 bits. The read is memory-bound, so this costs the same (compiled, it fuses).
    ### BEGIN SOLUTION 1
    with torch.autocast(device_type=b0.device.type, enabled=False):
        w = w.to(b0.dtype)                                                      # (R, d)
        scores = []
        for b, inv_rms in sources:                                              # source s: its score per route
            scores.append(torch.stack([(b * w_r).sum(-1) for w_r in w]) * inv_rms[..., 0])   # (R, B, T)
        alpha = torch.stack(scores, -1).softmax(dim=-1)                         # (R, B, T, N)
        # a running sum instead of stacking the sources: no (N, B, T, d) copy is made or kept for backward
        h = sum(alpha[..., s:s + 1] * b for s, (b, _) in enumerate(sources))    # (R, B, T, d)
    ### END SOLUTION
    return h, alpha


class DepthRead(nn.Module):
    """One read point: where the reads before a sublayer happen (or the final read). It owns one pseudo-query per
    distinct name in its routes, zero at init (the paper: every read starts as the uniform average of its sources),
    and the gain of its RMSNorm of the sources (ones), folded into the pseudo-queries; its routes share it."""

    def __init__(self, d, sublayer, layer, routes, fixed=()):
        super().__init__()
        self.sublayer, self.layer, self.routes = sublayer, layer, routes   # routes: {route: pseudo-query name}
        for name in dict.fromkeys(routes.values()):   # a fixed one is a buffer: not learned, its route stays uniform
            zeros = torch.zeros(d)
            self.register_buffer(name, zeros) if name in fixed else setattr(self, name, nn.Parameter(zeros))
        self.source_gain = nn.Parameter(torch.ones(d))

    def pseudo_queries(self):
        """The (R, d) pseudo-queries of the routes, one row per route in the order of self.routes (two routes
        that share a pseudo-query are still two rows), with the source norm's gain folded in."""
        ### BEGIN SOLUTION 2
        return torch.stack([getattr(self, name) for name in self.routes.values()]) * self.source_gain
        ### END SOLUTION

    def forward(self, sources, log=None):
        """h (R, B, T, d), one read per route; with a list as `log`, each route's depth distribution is appended:
        alpha averaged over the tokens, and the tokens' mean entropy (nats) (run_kit/routing.py uses them)."""
        h, alpha = read_sources(sources, self.pseudo_queries())
        if log is not None:
            for r, route in enumerate(self.routes):
                alpha_r = alpha[r].detach().float()             # (B, T, N)
                log.append(dict(sublayer=self.sublayer, layer=self.layer, route=route, alpha=alpha_r.mean(dim=(0, 1)),
                                token_entropy=-(alpha_r * alpha_r.clamp_min(1e-30).log()).sum(-1).mean()))
        return h


# -----------------------------------------------------------------------------
# The transformer: Blocks of two sublayers, and the GPT that runs their reads and sublayers in order

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
                                   fixed=('w_v',) if mode == 'ctrl_fixed_v' else ())
        self.mlp_read = DepthRead(d, 2 * layer + 1, layer, {'mlp': 'w_mlp'})
        if mode == 'ctrl_params':
            self.attn_input_gain = nn.Parameter(torch.ones(d))   # the extra vector (control_attention)

    def attn_inputs(self, h):
        """The attention sublayer's two inputs from its read point's h (R, B, T, d), one read per route: the first
        route's and the last route's, each through the attention's pre-norm (one route: the same x twice)."""
        ### BEGIN SOLUTION 2
        x = self.norm_attn(h)                              # the same pre-norm for both routes [chosen]
        return x[0], x[-1]                                 # one route: both inputs are the same x
        ### END SOLUTION

    def attention(self, h, cos, sin):
        """The attention sublayer's output from its read point's h (R, B, T, d), one read per route."""
        if self.residual in CONTROLS:
            return control_attention(self, h, cos, sin)    # the controls' attention: at the end of this file
        x_qk, x_v = self.attn_inputs(h)
        if self.residual == 'rd_attnres':
            # RD-AttnRes, the paper's one idea: matching (attention's q, k) reads the depth through the qk
            # route, retrieval (attention's v) through the v route, each with its own pseudo-query
            return self.attn(x_qk, x_v, cos, sin)
        return self.attn(x_qk, x_qk, cos, sin)            # attnres: one read feeds q, k and v

    def run_sublayer(self, is_attention, h, cos, sin):
        """This block's attention sublayer's output (else its MLP's) from its read point's h (R, B, T, d).
        The MLP's read point has one route (unchanged by RD-AttnRes), through the MLP's own pre-norm."""
        return self.attention(h, cos, sin) if is_attention else self.mlp(self.norm_mlp(h[0]))


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
            self.final_read = DepthRead(config.n_embd, 2 * config.n_layer, config.n_layer, {'final': 'w_final'})
        cos, sin = rotary_tables(config.block_size, config.n_embd // config.n_head)
        self.register_buffer('rope_cos', cos, persistent=False)
        self.register_buffer('rope_sin', sin, persistent=False)
        # Paired init: only Linear and Embedding weights draw random numbers, in module order, and every
        # mode has the same ones in the same order; the extra vectors of a mode are zeros or ones, so
        # they never shift the random stream and shared weights are bit-identical across modes.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        for name, param in self.named_parameters():
            if name.endswith('c_proj.weight'):  # outputs written into the residual: scaled by depth (GPT-2)
                torch.nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        self.record_routing = False  # set True to keep each read's depth distribution in self.routing
        self.routing = []

    def get_num_params(self):   # the tied embedding / LM head counted once; rotary tables are buffers, not parameters
        return sum(param.numel() for param in self.parameters())

    def forward(self, idx, targets=None):
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} exceeds block_size={self.config.block_size}")
        x = self.transformer.wte(idx)
        if self.config.residual == 'standard':
            for block in self.transformer.h:
                x_norm = block.norm_attn(x)
                x = x + block.attn(x_norm, x_norm, self.rope_cos, self.rope_sin)
                x = x + block.mlp(block.norm_mlp(x))
            h = x                              # standard: the final norm sees the stream itself
        else:
            h = self.forward_depth_routed(x)   # the final read's output
        out = self.transformer.ln_f(h)         # (ln_f: nanoGPT's name; an RMSNorm)
        if targets is None:  # inference: only the last position's logits are needed
            return self.lm_head(out[:, [-1], :]), None
        logits = self.lm_head(out)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def read_point(self, l):
        """The DepthRead before sublayer l (attention when l is even, MLP when odd); l = L: the final read."""
        if l == 2 * self.config.n_layer:
            return self.final_read
        block = self.transformer.h[l // 2]
        return block.attn_read if l % 2 == 0 else block.mlp_read

    def sublayer_output(self, l, h):
        """The output of sublayer l (attention when l is even, MLP when odd) from its read point's h (R, B, T, d)."""
        return self.transformer.h[l // 2].run_sublayer(l % 2 == 0, h, self.rope_cos, self.rope_sin)

    def forward_depth_routed(self, embedding):
        """Every sublayer reads its input from the sources instead of a running sum. Sources are *increments*:
        the embedding, one per finished AttnRes block (the sum of its sublayers' outputs), the partial. Returns
        the final read's output h (B, T, d), which ln_f and the LM head see."""
        S, L = self.config.attnres_block_size, 2 * self.config.n_layer
        log = [] if self.record_routing else None
        ### BEGIN SOLUTION 3
        finished = [source(embedding)]  # finished sources: b_0 = the embedding, then b_1, b_2, ...
        partial = None                  # the current AttnRes block's outputs so far, as a source; None when empty
        for l in range(L):              # l: the sublayer's number
            sources = finished if partial is None else finished + [partial]
            out = self.sublayer_output(l, self.read_point(l)(sources, log))
            partial = source(out if partial is None else partial[0] + fp32(out))
            if (l + 1) % S == 0:        # the AttnRes block's S-th sublayer: its partial is now finished
                finished.append(partial)
                partial = None
        if partial is not None:         # the last AttnRes block may be shorter than S
            finished.append(partial)
        h = self.final_read(finished, log)[0]
        ### END SOLUTION
        self.routing = log or []
        return h

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        params = [param for param in self.parameters() if param.requires_grad]
        # Decay the matrices (linear weights, the tied embedding). Never the vectors: decaying a norm
        # gain drags it to 0, and decaying a pseudo-query drags its read back to the uniform average.
        groups = [{'params': [param for param in params if param.dim() >= 2], 'weight_decay': weight_decay},
                  {'params': [param for param in params if param.dim() < 2], 'weight_decay': 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=(device_type == 'cuda'))

    def read_point_sizes(self):
        """(sublayer, R, N) of every read point of a forward pass, in order (sublayer 2*n_layer: the final read)."""
        return [(m.sublayer, len(m.routes), n_sources(m.sublayer, self.config.attnres_block_size))
                for m in self.modules() if isinstance(m, DepthRead)]

    def flops_per_token(self, seq_len=None):
        """Training FLOPs (forward + backward = 3x forward) per token, depth reads included."""
        cfg, T, d = self.config, seq_len or self.config.block_size, self.config.n_embd
        dense = 6 * self.get_num_params() + 12 * cfg.n_layer * d * T  # weights (PaLM appendix B) + attention scores
        # a read over N sources and R routes: R*N dot products of length d (scores) and an R-route
        # weighted sum of N vectors of length d, 2 FLOPs per multiply-add each
        reads = sum(4 * d * R * N for _, R, N in self.read_point_sizes())
        return dense + 3 * reads

    def estimate_mfu(self, tokens_per_iter, dt, peak_flops=312e12, seq_len=None):
        """Model FLOPs utilisation: achieved FLOP/s over peak_flops (default: A100 bf16 dense)."""
        return self.flops_per_token(seq_len) * tokens_per_iter / dt / peak_flops

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Sample max_new_tokens tokens after idx (B, T), feeding predictions back in."""
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.config.block_size:])   # the context cropped to the last block_size tokens
            logits = logits[:, -1, :] / max(temperature, 1e-8)
            if top_k is not None:
                top_logits, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < top_logits[:, [-1]]] = -float('inf')
            idx_next = torch.multinomial(F.softmax(logits.float(), dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


# -----------------------------------------------------------------------------
# The controls (docs/controls.md says what each rules out): the method's reads, another use of them

CONTROLS = ('ctrl_params', 'ctrl_dup', 'ctrl_fixed_v', 'ctrl_heads')


def control_attention(block, h, cos, sin):
    """The attention sublayer of a control, from its read point's h (R, B, T, d)."""
    if block.residual == 'ctrl_params':      # attnres's one read, and the extra vector spent as a gain on it
        h = h * block.attn_input_gain
    x_1, x_2 = block.attn_inputs(h)
    if block.residual == 'ctrl_heads':       # two routes feed two halves of the heads, not two roles
        return attention_by_heads(block.attn, x_1, x_2, cos, sin)
    return block.attn(x_1, x_2, cos, sin)    # ctrl_dup, ctrl_fixed_v: rd_attnres's wiring of q/k and v


def attention_by_heads(attn, x_heads1, x_heads2, cos, sin):
    """ctrl_heads: x_heads1 feeds q, k and v of the first half of the heads, x_heads2 of the other. Rows
    j*hd:(j+1)*hd of a projection belong to head j: each half is projected by its own rows, none twice."""
    C = x_heads1.size(-1)
    half = C // 2                                                  # the rows of heads 0 .. n_head/2 - 1
    rows_q, rows_k = attn.c_qk.weight.split(C)
    q, k, v = (torch.cat([F.linear(x_heads1, rows[:half]), F.linear(x_heads2, rows[half:])], dim=-1)
               for rows in (rows_q, rows_k, attn.c_v.weight))
    return attn.attend(q, k, v, cos, sin)
