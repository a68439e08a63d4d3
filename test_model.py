"""
Tests of model.py, one group per concept. The course kit's assignments select theirs with a marker
(pytest -m assignment1; COURSE.md); the hidden tests are in test_hidden.py.

  1. tie recovery          rd_attnres with w_v tied to w_qk is attnres
  2. equal at init         every control and rd_attnres start as attnres
  3. parameter delta       one model-width vector per attention sublayer
  4. paired init           shared parameters are bit-identical across all modes for one seed; the documented init
  5. standard residual     the running sum (the literal reference of AttnRes is in test_hidden.py)
  6. causality             no logit depends on a later token
  7. learning              loss at init ~ ln(vocab); every mode overfits one batch
  8. routing diagnostics   distributions, source counts, the frozen value route of ctrl_fixed_v
  9. gradients             every pseudo-query learns, except the first read's (a single source)
 10. configuration errors  bad configs say what is allowed
 11. numerics and surface  float32 reads under bf16 autocast, optimizer groups, FLOPs, generate, compile

Run: python -m pytest -q test_model.py
"""

import math

import pytest
import torch
import torch.nn.functional as F

from fast_read.two_phase_read import TwoPhaseGPT
from model import ATTENTION_ROUTES, GPT, GPTConfig, RESIDUAL_MODES, read_sources, n_sources, source
from run_kit.routing import entropy, js_divergence, mean_depth, routing_summary, source_labels

VOCAB = 97
QUERY_NAMES = ('w_qk', 'w_v', 'w_mlp', 'w_final', 'w_heads1', 'w_heads2')


def make(residual, S=2, seed=0, n_layer=3, dtype=torch.float64, n_head=2):
    torch.manual_seed(seed)
    cfg = GPTConfig(block_size=32, vocab_size=VOCAB, n_layer=n_layer, n_head=n_head, n_embd=16,
                    residual=residual, attnres_block_size=S)
    return GPT(cfg).to(dtype)


def perturb(model, seed=1, scale=1.0):
    """Random non-zero pseudo-queries and source gains, so that the reads are far from uniform."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.split('.')[-1] in QUERY_NAMES:
                p.copy_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif 'source_gain' in name or 'input_gain' in name:
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def batch(B=2, T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (B, T + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def copy_shared(src, dst):
    """Copy every parameter/buffer that both models have from src into dst; an attnres model's w_qk is also
    ctrl_heads's first pseudo-query, w_heads1 (its first route: attnres's read)."""
    dst_state = dst.state_dict()
    src_state = {k.replace('.w_qk', '.w_heads1') if dst.config.residual == 'ctrl_heads' else k: v
                 for k, v in src.state_dict().items()}
    dst_state.update({k: v for k, v in src_state.items() if k in dst_state})
    dst.load_state_dict(dst_state)


def assert_same_function(a, b, idx, targets, tol=1e-12):
    la, lossa = a(idx, targets)
    lb, lossb = b(idx, targets)
    torch.testing.assert_close(la, lb, rtol=tol, atol=tol)
    torch.testing.assert_close(lossa, lossb, rtol=tol, atol=tol)
    return lossa, lossb


def assert_same_function_and_gradients(plain, other, tol=1e-12, what=''):
    """`other` (another way to compute the reads) against the plain read on one batch: logits, loss and the
    gradient of every parameter within tol."""
    idx, targets = batch()
    (lp, loss_p), (lo, loss_o) = plain(idx, targets), other(idx, targets)
    assert (lp - lo).abs().max() <= tol and abs(loss_p - loss_o) <= tol, what
    loss_p.backward()
    loss_o.backward()
    for (name, a), b in zip(plain.named_parameters(), other.parameters()):
        assert (a.grad - b.grad).abs().max() <= tol, (what, name)


# ---------------------------------------------------------------------------------------------
# 1. Tie recovery (README: "The method in a few lines of math", rd_attnres)

# the pseudo-queries of each two-route mode with learned ones: rd_attnres's qk and v routes, ctrl_heads's
# routes of the two halves of the heads; the first is the parent's w_qk (copy_shared)
ROUTE_QUERIES = {'rd_attnres': ('w_qk', 'w_v'), 'ctrl_heads': ('w_heads1', 'w_heads2')}


@pytest.mark.parametrize('mode', sorted(ROUTE_QUERIES))
@pytest.mark.parametrize('S', [1, 2, 3])
def test_tied_second_route_recovers_attnres(mode, S):
    # rd_attnres: the value route *is* the Q/K route; ctrl_heads: both halves of the heads read one input
    idx, targets = batch()
    parent = perturb(make('attnres', S))
    model = make(mode, S)
    copy_shared(parent, model)
    first, second = ROUTE_QUERIES[mode]
    for block in model.transformer.h:    # tie: one tensor for both routes
        setattr(block.attn_read, second, getattr(block.attn_read, first))
    loss_p, loss_m = assert_same_function(parent, model, idx, targets)
    loss_p.backward()
    loss_m.backward()
    grads = {name.replace(first, 'w_qk'): p for name, p in model.named_parameters()}   # by the parent's names
    for name, p in parent.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-10, atol=1e-12, msg=name)


def test_value_route_equal_to_qk_route_splits_the_gradient():
    # the same tie by value, not by identity: the parent's gradient of w_l is the sum of the two routes'
    idx, targets = batch()
    parent = perturb(make('attnres'))
    rd = make('rd_attnres')
    copy_shared(parent, rd)
    with torch.no_grad():
        for block in rd.transformer.h:
            block.attn_read.w_v.copy_(block.attn_read.w_qk)
    loss_p, loss_rd = assert_same_function(parent, rd, idx, targets)
    loss_p.backward()
    loss_rd.backward()
    for layer, (bp, br) in enumerate(zip(parent.transformer.h, rd.transformer.h)):
        bp, br = bp.attn_read, br.attn_read
        torch.testing.assert_close(bp.w_qk.grad, br.w_qk.grad + br.w_v.grad,
                                   rtol=1e-10, atol=1e-12)
        assert layer == 0 or br.w_v.grad.abs().max() > 0  # layer 0 reads one source only


@pytest.mark.parametrize('mode', sorted(ROUTE_QUERIES))
def test_untied_second_route_changes_the_function(mode):
    # the converse: a different second route is a different model (otherwise the tests above prove nothing).
    idx, targets = batch()
    parent = perturb(make('attnres'))
    model = make(mode)
    copy_shared(parent, model)
    perturb(model, seed=7)
    with torch.no_grad():
        for bp, bm in zip(parent.transformer.h, model.transformer.h):
            getattr(bm.attn_read, ROUTE_QUERIES[mode][0]).copy_(bp.attn_read.w_qk)
    assert (parent(idx, targets)[1] - model(idx, targets)[1]).abs() > 1e-6


# ---------------------------------------------------------------------------------------------
# 1b. The routes of one read point, without the rest of the model (course assignment 2)

def perturbed_block(mode, seed=3):
    """Block 1 of a perturbed model, with pre-norm gains that differ from each other and from 1."""
    model = perturb(make(mode, n_layer=2), seed=seed)
    block = model.transformer.h[1]
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for norm in (block.norm_attn, block.norm_mlp):
            norm.weight.copy_(1 + 0.5 * torch.randn(16, generator=g, dtype=torch.float64))
    return block


def some_sources(seed=4, n=3):
    g = torch.Generator().manual_seed(seed)
    return [source(torch.randn(2, 5, 16, generator=g, dtype=torch.float64) * (1 + s)) for s in range(n)]


@pytest.mark.assignment2
@pytest.mark.parametrize('mode', [m for m in RESIDUAL_MODES if m != 'standard'])
def test_a_read_point_has_one_pseudo_query_per_route(mode):
    read = perturbed_block(mode).attn_read
    sources, log = some_sources(), []
    try:
        h = read(sources, log)
    except (IndexError, RuntimeError) as e:
        pytest.fail(f"concept 'one pseudo-query per route, the source gain folded in': the read of {mode} raised {e!r}: one "
                    "pseudo-query row per route of self.routes, also when two routes share one")
    # one row per route, in the order of ATTENTION_ROUTES, each pseudo-query with the source gain folded in;
    # ctrl_dup's two routes share one pseudo-query and are still two reads
    names = list(ATTENTION_ROUTES[mode].values())
    expected, _ = read_sources(sources, torch.stack([getattr(read, n) * read.source_gain for n in names]))
    torch.testing.assert_close(h, expected, rtol=1e-12, atol=1e-12, msg=f"concept 'one pseudo-query per route, the source gain folded in': the reads of {mode} differ from one "
                               "read per route (in the order of self.routes, a shared pseudo-query still two rows), each "
                               "pseudo-query times the source gain")
    assert [r['route'] for r in log] == list(ATTENTION_ROUTES[mode]), "concept 'one pseudo-query per route, the source gain folded in': one logged read per route, in order"


@pytest.mark.assignment2
@pytest.mark.parametrize('mode', [m for m in RESIDUAL_MODES if m != 'standard'])
def test_attention_inputs_come_from_their_routes_through_norm_attn(mode):
    block = perturbed_block(mode)
    sources, log = some_sources(), []
    h = block.attn_read(sources, log)
    x_qk, x_v = block.attn_inputs(h)
    # Q/K from the first route, V from the last, both through the attention's pre-norm (not norm_mlp)
    torch.testing.assert_close(x_qk, block.norm_attn(h[0]), rtol=1e-12, atol=1e-12,
                               msg=f"concept 'the attention inputs: q/k from the first route, v from the last, through norm_attn': x_qk of {mode} is not the first route's read through norm_attn")
    torch.testing.assert_close(x_v, block.norm_attn(h[-1]), rtol=1e-12, atol=1e-12,
                               msg=f"concept 'the attention inputs: q/k from the first route, v from the last, through norm_attn': x_v of {mode} is not the last route's read through norm_attn (the "
                                   "attention's own pre-norm, not norm_mlp)")
    if len(ATTENTION_ROUTES[mode]) == 2 and mode != 'ctrl_dup':   # two different pseudo-queries: two inputs
        assert (x_qk - x_v).abs().max() > 1e-3, "concept 'the attention inputs: q/k from the first route, v from the last, through norm_attn': two routes with different queries give two inputs"
    assert len(log) == len(ATTENTION_ROUTES[mode])


@pytest.mark.assignment2
def test_tied_w_v_gives_one_input_and_splits_the_gradient():
    block = perturbed_block('rd_attnres')
    read = block.attn_read
    with torch.no_grad():
        read.w_v.copy_(read.w_qk)
    sources = some_sources()
    x_qk, x_v = block.attn_inputs(read(sources))
    torch.testing.assert_close(x_qk, x_v, rtol=0, atol=0)
    (x_qk.square().sum() + 2 * x_v.sum()).backward()
    parent = perturbed_block('attnres')          # the same weights: one route feeding both
    with torch.no_grad():
        parent.attn_read.w_qk.copy_(read.w_qk)
        parent.attn_read.source_gain.copy_(read.source_gain)
        parent.norm_attn.weight.copy_(block.norm_attn.weight)
    p_qk, p_v = parent.attn_inputs(parent.attn_read(sources))
    (p_qk.square().sum() + 2 * p_v.sum()).backward()
    torch.testing.assert_close(parent.attn_read.w_qk.grad, read.w_qk.grad + read.w_v.grad,
                               rtol=1e-10, atol=1e-12, msg="concept 'the attention inputs: q/k from the first route, v from the last, through norm_attn': with w_v = w_qk, rd_attnres must be "
                                                           "attnres, its gradient split between the two pseudo-queries")


# ---------------------------------------------------------------------------------------------
# 2. Equal at init (property 2), and ctrl_dup equal always

@pytest.mark.parametrize('mode', ['rd_attnres', 'ctrl_dup', 'ctrl_fixed_v', 'ctrl_params', 'ctrl_heads'])
def test_modes_equal_attnres_at_init(mode):
    idx, targets = batch()
    assert_same_function(make('attnres'), make(mode), idx, targets)


def test_ctrl_dup_equals_attnres_after_perturbation():
    idx, targets = batch()
    parent = perturb(make('attnres'))
    dup = make('ctrl_dup')
    copy_shared(parent, dup)
    assert_same_function(parent, dup, idx, targets)


def test_ctrl_params_gain_changes_the_function():
    idx, targets = batch()
    parent = perturb(make('attnres'))
    ctrl = make('ctrl_params')
    copy_shared(parent, ctrl)
    perturb(ctrl, seed=1)  # same pseudo-queries as the parent, but the attention input gains move away from 1
    with torch.no_grad():
        for block in ctrl.transformer.h:
            block.attn_input_gain.mul_(2.0).add_(0.3)
    assert (parent(idx, targets)[1] - ctrl(idx, targets)[1]).abs() > 1e-6


# ---------------------------------------------------------------------------------------------
# 3. Parameter delta (property 3)

@pytest.mark.parametrize('n_layer', [1, 3, 4])
def test_parameter_delta_is_one_vector_per_attention_sublayer(n_layer):
    counts = {m: make(m, n_layer=n_layer).get_num_params() for m in RESIDUAL_MODES}
    d = 16
    assert counts['rd_attnres'] - counts['attnres'] == n_layer * d
    assert counts['ctrl_params'] - counts['attnres'] == n_layer * d
    assert counts['ctrl_heads'] - counts['attnres'] == n_layer * d
    assert counts['ctrl_dup'] == counts['attnres'] == counts['ctrl_fixed_v']
    # the parent adds, per read point (2 per layer + the final read), a pseudo-query and a key gain
    assert counts['attnres'] - counts['standard'] == 2 * (2 * n_layer + 1) * d


def test_fixed_w_v_is_a_buffer_not_a_parameter():
    model = make('ctrl_fixed_v')
    names = dict(model.named_parameters())
    assert not any(n.endswith('w_v') for n in names)
    assert all(torch.equal(b.attn_read.w_v, torch.zeros(16, dtype=b.attn_read.w_v.dtype))
               for b in model.transformer.h)


def test_pseudo_queries_are_named_and_zero():
    model = make('rd_attnres')
    names = [n for n, _ in model.named_parameters() if n.split('.')[-1] in QUERY_NAMES]
    assert sorted({n.split('.')[-1] for n in names}) == sorted(set(QUERY_NAMES) - {'w_heads1', 'w_heads2'})
    assert len(names) == 3 * 3 + 1
    assert all((p == 0).all() for n, p in model.named_parameters() if n in names)


# ---------------------------------------------------------------------------------------------
# 4. Paired init (property 4)

def test_shared_parameters_are_bit_identical_across_modes():
    models = {m: make(m, seed=1234, dtype=torch.float32) for m in RESIDUAL_MODES}
    states = {m: model.state_dict() for m, model in models.items()}
    for m in RESIDUAL_MODES:
        for other in RESIDUAL_MODES:
            shared = set(states[m]) & set(states[other])
            assert len(shared) >= len(states['standard'])
            for name in shared:
                assert torch.equal(states[m][name], states[other][name]), (m, other, name)
    # and the seed matters (a test that could not fail otherwise)
    other_seed = make('attnres', seed=1235, dtype=torch.float32).state_dict()
    assert not torch.equal(other_seed['lm_head.weight'], states['attnres']['lm_head.weight'])


def test_the_initialisation_is_the_documented_one():
    # docs/method.md, "Backbone": matrices N(0, 0.02), the residual output projections (c_proj) at 0.02/sqrt(2L),
    # norm gains and source gains one, pseudo-queries zero; rotary angles t * 10000^(-2j/head_dim)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=4096, n_layer=4, n_head=4, n_embd=256, residual='rd_attnres'))
    for name, p in model.named_parameters():
        if p.dim() == 2:
            std = 0.02 / math.sqrt(2 * 4) if name.endswith('c_proj.weight') else 0.02
            assert abs(p.mean().item()) < 0.1 * std and abs(p.std().item() / std - 1) < 0.03, (name, p.std().item())
        elif name.split('.')[-1].startswith('w_'):
            assert torch.equal(p, torch.zeros_like(p)), name
        else:
            assert torch.equal(p, torch.ones_like(p)), name
    head_dim, t, j = 64, 5, 3
    assert model.rope_cos[t, j].item() == pytest.approx(math.cos(t * 10000 ** (-2 * j / head_dim)), abs=1e-6)


# ---------------------------------------------------------------------------------------------
# 5. The standard residual (the literal reference of the depth-routed modes is in test_hidden.py:
#    it is the answer to assignments 2 and 3 of the course kit, so it is not handed out)

def test_standard_residual_is_the_running_sum():
    model = make('standard')
    idx, targets = batch()
    x = model.transformer.wte(idx)
    for b in model.transformer.h:
        a = b.norm_attn(x)
        x = x + b.attn(a, a, model.rope_cos, model.rope_sin)
        x = x + b.mlp(b.norm_mlp(x))
    expected = model.lm_head(model.transformer.ln_f(x))
    torch.testing.assert_close(model(idx, targets)[0], expected, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# 6. Causality

@pytest.mark.parametrize('mode', RESIDUAL_MODES)
def test_no_logit_depends_on_a_later_token(mode):
    model = perturb(make(mode, S=3))
    idx, targets = batch(B=1, T=10)
    t = 6
    changed = idx.clone()
    changed[0, t] = (changed[0, t] + 1) % VOCAB
    a, _ = model(idx, targets)
    b, _ = model(changed, targets)
    assert torch.equal(a[:, :t], b[:, :t])
    assert not torch.allclose(a[:, t:], b[:, t:])


# ---------------------------------------------------------------------------------------------
# 7. Learning

@pytest.mark.parametrize('mode', RESIDUAL_MODES)
def test_loss_at_init_is_about_ln_vocab(mode):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=512, n_layer=2, n_head=2, n_embd=32, residual=mode))
    idx = torch.randint(0, 512, (4, 32))
    _, loss = model(idx, torch.roll(idx, -1, 1))
    assert abs(loss.item() - math.log(512)) < 0.1


@pytest.mark.parametrize('mode', RESIDUAL_MODES)
def test_every_mode_overfits_one_batch(mode):
    model = make(mode, S=2, dtype=torch.float32)
    idx, targets = batch(B=4, T=16)
    opt = model.configure_optimizers(0.0, 1e-2, (0.9, 0.95), 'cpu')
    first = None
    for _ in range(60):
        _, loss = model(idx, targets)
        first = first if first is not None else loss.item()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert first > 4.0 and loss.item() < 0.3, (first, loss.item())


# ---------------------------------------------------------------------------------------------
# 8. Routing diagnostics

def expected_sources(l, S):
    # embedding + finished blocks before sublayer l, + the partial unless l opens a block
    return n_sources(l, S)


def test_source_counts_and_labels_by_hand():
    # S = 3, L = 8: blocks {0,1,2} {3,4,5} {6,7}
    assert [n_sources(l, 3) for l in range(9)] == [1, 2, 2, 2, 3, 3, 3, 4, 4]
    assert source_labels(4, 3, 8) == ['emb', 'b1', 'part'] and source_labels(3, 3, 8) == ['emb', 'b1']
    assert source_labels(8, 3, 8) == ['emb', 'b1', 'b2', 'b3'] and source_labels(6, 2, 6) == ['emb', 'b1', 'b2', 'b3']


@pytest.mark.assignment3
@pytest.mark.parametrize('mode', [m for m in RESIDUAL_MODES if m != 'standard'])
@pytest.mark.parametrize('S', [1, 3, 4])
def test_routing_records_every_read_point(mode, S):
    model = perturb(make(mode, S, n_layer=4))
    idx, targets = batch()
    model(idx, targets)
    assert model.routing == []            # nothing is collected unless asked for
    model.record_routing = True
    model(idx, targets)
    L = 8
    routes = {(r['sublayer'], r['route']): r['alpha'] for r in model.routing}
    two = mode in ('rd_attnres', 'ctrl_dup', 'ctrl_fixed_v', 'ctrl_heads')
    first, second = ('heads1', 'heads2') if mode == 'ctrl_heads' else ('qk', 'v')
    expected = {(l, first if l % 2 == 0 else 'mlp') for l in range(L)} | {(L, 'final')}
    expected |= {(l, second) for l in range(0, L, 2)} if two else set()
    assert set(routes) == expected, "concept 'every read point reads its sources and is recorded': the logged (sublayer, route) pairs are not one per read; pass `log` to every read"
    for (l, route), alpha in routes.items():
        n = expected_sources(l, S) if l < L else 1 + math.ceil(L / S)
        assert alpha.shape == (n,), (f"concept 'every read point reads its sources and is recorded': with S = {S}, "
                                     f"{'the final read' if l == L else f'sublayer {l} ({route})'} read {alpha.shape[0]} "
                                     f"source{'s' if alpha.shape[0] != 1 else ''}, not {n} "
                                     f"({', '.join(source_labels(l, S, L))}): {abs(alpha.shape[0] - n)} "
                                     f"{'missing' if alpha.shape[0] < n else 'extra'}")
        torch.testing.assert_close(alpha.sum(), torch.tensor(1.0, dtype=alpha.dtype))
        assert (alpha >= 0).all()
    assert [(l, R, n) for l, R, n in model.read_point_sizes()] == [
        (l, 2 if two and l % 2 == 0 and l < L else 1, expected_sources(l, S) if l < L else 1 + math.ceil(L / S))
        for l in range(L + 1)]


class Constant(torch.nn.Module):
    """A sublayer that outputs the same vector whatever its input."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self, *args):
        return self.value.expand(1, 1, -1)


@pytest.mark.assignment3
@pytest.mark.parametrize('S, expected', [
    # n_layer = 2: four sublayers, numbered l = 0..3 (attention, MLP, attention, MLP); sublayer l outputs
    # (l + 1) * u, the embedding is e. The sources of each read, then of the final read:
    (2, [['e'], ['e', '1u'], ['e', '3u'], ['e', '3u', '3u'], ['e', '3u', '7u']]),     # blocks {0, 1} {2, 3}
    (3, [['e'], ['e', '1u'], ['e', '3u'], ['e', '6u'], ['e', '6u', '4u']]),           # blocks {0, 1, 2} {3}
])
def test_sources_are_increments_by_hand(S, expected, monkeypatch):
    from model import DepthRead
    e, u = torch.tensor([1.0, 0, 0, 0], dtype=torch.float64), torch.tensor([0, 1.0, 0, 0], dtype=torch.float64)
    model = GPT(GPTConfig(block_size=4, vocab_size=8, n_layer=2, n_head=2, n_embd=4, residual='attnres',
                          attnres_block_size=S)).double()
    with torch.no_grad():
        model.transformer.wte.weight[0] = e
    for layer, block in enumerate(model.transformer.h):
        block.attn, block.mlp = Constant((2 * layer + 1) * u), Constant((2 * layer + 2) * u)
    seen, forward = [], DepthRead.forward

    def recorded(self, sources, log=None):
        seen.append([x[0, 0] for x, _ in sources])
        return forward(self, sources, log)
    monkeypatch.setattr(DepthRead, 'forward', recorded)
    model(torch.zeros(1, 1, dtype=torch.long))
    named = {'e': e, **{f'{k}u': k * u for k in range(1, 8)}}
    said = [[next((k for k, v in named.items() if torch.allclose(x, v)), str([round(t, 3) for t in x.tolist()]))
             for x in xs] for xs in seen]
    assert said == expected, (f"concept 'sources are increments: the embedding, finished blocks, the partial': with S = {S} the reads saw the sources {said}, not {expected}. b_0 is the "
                              "embedding alone; a block's source is the sum of its own sublayers' outputs (not a running "
                              "sum, the embedding never added in); the partial is the current block's sum so far; the "
                              "last, shorter block is closed before the final read")


@pytest.mark.assignment1
def test_depth_read_is_a_per_token_softmax_mixture():
    g = torch.Generator().manual_seed(0)
    bs = [torch.randn(2, 5, 8, generator=g, dtype=torch.float64) * (s + 1) for s in range(3)]
    w = torch.randn(2, 8, generator=g, dtype=torch.float64)
    h, alpha = read_sources([source(b) for b in bs], w)
    assert h.shape == (2, 2, 5, 8) and alpha.shape == (2, 2, 5, 3), "concept 'the read\'s equations: normalised sources scored, raw sources mixed, a softmax over the sources': h is (R, B, T, d) and alpha (R, B, T, N)"
    torch.testing.assert_close(alpha.sum(-1), torch.ones(2, 2, 5, dtype=torch.float64),
                               msg="concept 'the read\'s equations: normalised sources scored, raw sources mixed, a softmax over the sources': alpha is a softmax over the sources (the last axis): it sums to 1")
    # token (0, 3), route 1, by hand
    normed = [F.rms_norm(b[0, 3], (8,), eps=1e-6) for b in bs]
    a = torch.stack([w[1] @ n for n in normed]).softmax(0)
    torch.testing.assert_close(h[1, 0, 3], sum(a[s] * bs[s][0, 3] for s in range(3)),
                               msg="concept 'the read\'s equations: normalised sources scored, raw sources mixed, a softmax over the sources': one token's read differs from the equations")


@pytest.mark.assignment1
def test_depth_read_of_two_sources_by_hand():
    # two sources, d = 2, one pseudo-query: numbers to check on paper
    #   b_a = [3, 4]: rms = sqrt((9 + 16) / 2) = 3.5355    b_b = [1, -1]: rms = 1        w = [1, 1]
    #   score_a = (3 + 4) / 3.5355 = 1.9799                 score_b = (1 - 1) / 1 = 0    (no 1/sqrt(d))
    #   alpha = softmax([1.9799, 0]) = [0.8787, 0.1213]
    #   h = 0.8787 * [3, 4] + 0.1213 * [1, -1] = [2.7573, 3.3934]     (the raw sources mixed)
    xa, xb = torch.tensor([[[3.0, 4.0]]], dtype=torch.float64), torch.tensor([[[1.0, -1.0]]], dtype=torch.float64)
    h, alpha = read_sources([source(xa), source(xb)], torch.tensor([[1.0, 1.0]], dtype=torch.float64))
    torch.testing.assert_close(alpha[0, 0, 0], torch.tensor([0.8787, 0.1213], dtype=torch.float64), atol=1e-4, rtol=0,
                               msg=lambda m: f"concept 'the read\'s equations: normalised sources scored, raw sources mixed, a softmax over the sources': alpha of the worked example is {alpha[0, 0, 0].tolist()}, not "
                                             "[0.8787, 0.1213]: score = w . b / rms(b), no 1/sqrt(d), softmax over the sources")
    torch.testing.assert_close(h[0, 0, 0], torch.tensor([2.7573, 3.3934], dtype=torch.float64), atol=1e-4, rtol=0,
                               msg=lambda m: f"concept 'the read\'s equations: normalised sources scored, raw sources mixed, a softmax over the sources': h of the worked example is {h[0, 0, 0].tolist()}, not "
                                             "[2.7573, 3.3934]: the raw sources, mixed by alpha")


def test_fixed_value_route_stays_uniform_while_qk_learns():
    model = perturb(make('ctrl_fixed_v', S=2, dtype=torch.float32))
    idx, targets = batch(B=4, T=16)
    opt = model.configure_optimizers(0.1, 1e-2, (0.9, 0.95), 'cpu')
    for _ in range(5):
        _, loss = model(idx, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.record_routing = True
    model(idx, targets)
    v_reads = [r['alpha'] for r in model.routing if r['route'] == 'v']
    assert len(v_reads) == 3            # one per attention sublayer
    for alpha in v_reads:
        torch.testing.assert_close(alpha, torch.full_like(alpha, 1 / alpha.numel()))
    qk = [r['alpha'] for r in model.routing if r['route'] == 'qk' and r['alpha'].numel() > 1]
    assert any(not torch.allclose(a, torch.full_like(a, 1 / a.numel()), atol=1e-3) for a in qk)


def test_summary_helpers():
    p = torch.tensor([0.5, 0.5, 0.0])
    q = torch.tensor([0.0, 0.0, 1.0])
    assert entropy(p) == pytest.approx(math.log(2))
    assert mean_depth(p) == pytest.approx(0.5) and mean_depth(q) == pytest.approx(2.0)
    assert js_divergence(p, p) == pytest.approx(0.0, abs=1e-12)
    assert js_divergence(p, q) == pytest.approx(math.log(2))      # disjoint supports: the maximum
    model = perturb(make('rd_attnres', n_layer=3))
    model.record_routing = True
    model(*batch())
    rows = routing_summary(model.routing)
    assert [r['layer'] for r in rows] == [0, 1, 2]
    assert rows[0]['js_qk_v'] == pytest.approx(0.0, abs=1e-12)        # one source: both routes agree
    assert all(r['js_qk_v'] > 1e-4 for r in rows[1:])                  # different pseudo-queries: they differ
    parent = perturb(make('attnres', n_layer=3))
    parent.record_routing = True
    parent(*batch())
    assert all(r['js_qk_v'] == 0.0 for r in routing_summary(parent.routing))
    heads = perturb(make('ctrl_heads', n_layer=3))   # its routes are named for the heads they feed
    heads.record_routing = True
    heads(*batch())
    rows = routing_summary(heads.routing)
    assert sorted(rows[0]) == sorted(['layer', 'js_heads1_heads2'] + [f'{k}_heads{i}' for i in (1, 2) for k in
                                                                       ('entropy', 'token_entropy', 'depth')])
    assert all(r['js_heads1_heads2'] > 1e-4 for r in rows[1:])


@pytest.mark.parametrize('mode', ['rd_attnres', 'ctrl_heads'])
def test_two_learned_routes_separate_in_training(mode):
    # What the routes of these modes are for: to learn *different* depth mixtures. Both pseudo-queries start at
    # zero, as in training; the routes must get different gradients and drift apart. (ctrl_mix, whose two
    # reads were exchangeable, kept its pseudo-queries exactly equal forever: this test fails for it.)
    model = make(mode, S=2, n_layer=3)
    idx, targets = batch(B=4, T=16)
    opt = model.configure_optimizers(0.0, 1e-2, (0.9, 0.95), 'cpu')
    for _ in range(4):
        opt.zero_grad(set_to_none=True)
        model(idx, targets)[1].backward()
        opt.step()
    first, second = ATTENTION_ROUTES[mode].values()
    for block in model.transformer.h[1:]:    # (layer 0 reads one source: its pseudo-queries get no gradient)
        assert (getattr(block.attn_read, first) - getattr(block.attn_read, second)).abs().max() > 1e-4
    model.record_routing = True
    model(idx, targets)
    js = [v for row in routing_summary(model.routing)[1:] for k, v in row.items() if k.startswith('js_')]
    assert len(js) == 2 and all(j > 1e-9 for j in js), js


# ---------------------------------------------------------------------------------------------
# 9. Gradients reach every pseudo-query (except the first read's)

@pytest.mark.assignment3
@pytest.mark.parametrize('mode', [m for m in RESIDUAL_MODES if m != 'standard'])
def test_every_pseudo_query_gets_a_gradient(mode):
    # S = 4 over 6 sublayers: a full AttnRes block, then a shorter last one. Each pseudo-query's gradient is judged
    # given what its own read was given (a hook on every read point): a read of one source has a constant
    # softmax (a zero gradient, as the first attention read's); a read of more must pass a gradient to its
    # pseudo-query. So this test fails for a read cut off from the loss, not for wrong sources (the other tests' concern).
    from model import DepthRead
    model = perturb(make(mode, S=4, n_layer=3), scale=0.3)
    given = {}                                  # read point -> (number of sources, all of them in the graph)

    def seen(module, inputs):
        given.setdefault(module, (len(inputs[0]), all(x.requires_grad for x, _ in inputs[0])))
    hooks = [m.register_forward_pre_hook(seen) for m in model.modules() if isinstance(m, DepthRead)]
    loss = model(*batch())[1]
    for h in hooks:
        h.remove()
    loss.backward()
    cut = not all(in_graph for _, in_graph in given.values())
    for module_name, read in model.named_modules():
        if not isinstance(read, DepthRead):
            continue
        for name, p in read.named_parameters(recurse=False):
            if name not in QUERY_NAMES:
                continue
            name = f'{module_name}.{name}'
            where = 'the final read' if read.sublayer == 6 else f'the read of sublayer {read.sublayer}'
            assert read in given, f"concept 'every pseudo-query learns': {name} cannot learn: {where} never ran: every read must take part in the forward pass"
            if given[read][0] == 1:             # one source: softmax is constant 1
                assert p.grad is None or torch.equal(p.grad, torch.zeros_like(p)), name
            elif p.grad is None or not p.grad.abs().max() > 0:
                assert not cut, (f"concept 'every pseudo-query learns': {name} gets no gradient, though {where} runs: no gradient "
                                 "reaches the sources, a source is cut from the graph (.detach(), .data or torch.no_grad()): "
                                 "keep every source in it")
                pytest.fail(f"concept 'every pseudo-query learns': {name} gets no gradient, though {where} runs: its output "
                            "never reaches the loss (every AttnRes block's source is read later; the last, shorter one by "
                            "the final read)")


def test_every_parameter_gets_a_gradient_at_init():
    # zero pseudo-queries are a fixed point of nothing: at init the queries must still get gradients
    model = make('rd_attnres')
    model(*batch())[1].backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == []
    assert model.transformer.h[1].attn_read.w_v.grad.abs().max() > 0


# ---------------------------------------------------------------------------------------------
# 10. Configuration errors

@pytest.mark.parametrize('kwargs, message', [
    (dict(residual='attn_res'), 'choose one of standard, attnres, rd_attnres'),
    (dict(n_embd=30, n_head=4), 'divisible by n_head'),
    (dict(attnres_block_size=0), 'attnres_block_size must be a positive integer'),
    (dict(n_embd=36, n_head=4), 'must be even for rotary'),
    (dict(n_layer=0), 'n_layer must be a positive integer'),
    (dict(residual='ctrl_heads', n_embd=48, n_head=3), 'n_head must be even'),
])
def test_bad_config_raises_a_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**kwargs)


@pytest.mark.parametrize('mode', ['attnres', 'ctrl_heads'])
def test_ctrl_heads_projects_each_head_once(mode):
    # the two halves of the heads are projected by their own rows of the weights: the matmul FLOPs of a
    # forward pass are those of rd_attnres (and of attnres: a read has no matmul), no head computed twice
    from torch.utils.flop_counter import FlopCounterMode
    flops = {}
    for m in (mode, 'rd_attnres'):
        with FlopCounterMode(display=False) as counter:
            perturb(make(m, n_head=4))(*batch())
        flops[m] = counter.get_total_flops()
    assert flops[mode] == flops['rd_attnres'] > 0


def test_too_long_sequence_is_refused():
    model = make('attnres')
    with pytest.raises(ValueError, match='exceeds block_size=32'):
        model(torch.zeros(1, 33, dtype=torch.long))


# ---------------------------------------------------------------------------------------------
# 11. Numerics and the nanoGPT surface

@pytest.mark.assignment1
def test_depth_read_scores_the_normalised_sources_but_mixes_the_raw_ones():
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(1, 3, 8, generator=g, dtype=torch.float64) for _ in range(3)]
    w = torch.randn(2, 8, generator=g, dtype=torch.float64)
    h, alpha = read_sources([source(x) for x in xs], w)
    h10, alpha10 = read_sources([source(xs[0]), source(10 * xs[1]), source(xs[2])], w)
    # a source's scale does not change its score (up to RMSNorm's eps) ...
    torch.testing.assert_close(alpha10, alpha, rtol=1e-5, atol=1e-6,
                               msg="concept 'the read\'s equations: normalised sources scored, raw sources mixed, a softmax over the sources': scaling a source changed alpha: a source is scored divided by its rms")
    torch.testing.assert_close(h10, h + 9 * alpha[..., 1:2] * xs[1], rtol=1e-5, atol=1e-5,   # ... it is mixed as it is
                               msg="concept 'the read\'s equations: normalised sources scored, raw sources mixed, a softmax over the sources': scaling a source must scale what it adds: the raw sources are mixed")
    h0, alpha0 = read_sources([source(x) for x in xs], torch.zeros(2, 8, dtype=torch.float64))
    torch.testing.assert_close(alpha0, torch.full_like(alpha0, 1 / 3),  # zero pseudo-query: the uniform average
                               msg="concept 'the read\'s equations: normalised sources scored, raw sources mixed, a softmax over the sources': a zero pseudo-query gives equal scores, so alpha is uniform")
    torch.testing.assert_close(h0[0], sum(xs) / 3, msg="concept 'the read\'s equations: normalised sources scored, raw sources mixed, a softmax over the sources': a zero pseudo-query reads the plain average of the sources")


@pytest.mark.assignment1
def test_reads_stay_float32_under_bf16_autocast():
    # float32 under autocast; float64 (the exactness tests' precision) stays float64
    g = torch.Generator().manual_seed(2)
    bs = [torch.randn(2, 4, 16, generator=g) * (1 + 5 * s) for s in range(3)]
    w = torch.randn(2, 16, generator=g)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        h, alpha = read_sources([source(b) for b in bs], w)
    exact_h, exact_alpha = read_sources([source(b.double()) for b in bs], w.double())
    assert h.dtype == alpha.dtype == torch.float32 and exact_h.dtype == torch.float64, \
        "concept 'the read as specified: elementwise scores (no matmul), float32 under autocast': under bf16 autocast the read returns float32 (autocast off inside), float64 stays float64"
    torch.testing.assert_close(alpha.double(), exact_alpha, rtol=1e-5, atol=1e-6,   # not rounded to bf16
                               msg="concept 'the read as specified: elementwise scores (no matmul), float32 under autocast': alpha under autocast was computed in bf16: turn autocast off for the read")
    torch.testing.assert_close(h.double(), exact_h, rtol=1e-5, atol=1e-5,
                               msg="concept 'the read as specified: elementwise scores (no matmul), float32 under autocast': h under autocast was computed in bf16: turn autocast off for the read")


class RecordOps(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, '__name__', str(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.assignment1
def test_depth_read_uses_no_matmul():
    # a matmul would be rounded to TF32 on GPUs (train.py turns TF32 on for the backbone)
    bs = [torch.randn(2, 3, 8) for _ in range(3)]
    with RecordOps() as ops:
        read_sources([source(b) for b in bs], torch.randn(2, 8))
    used = {'matmul', '__matmul__', 'mm', 'bmm', 'einsum', 'linear', 'addmm', 'tensordot', 'inner', 'dot',
            'baddbmm'} & set(ops.names)
    assert ops.names and not used, f"concept 'the read as specified: elementwise scores (no matmul), float32 under autocast': the read uses {sorted(used)}: compute each score as (b * w_r).sum(-1)"


def test_model_routing_stays_float32_under_bf16_autocast():
    model = perturb(make('rd_attnres', dtype=torch.float32))
    model.record_routing = True
    with torch.autocast('cpu', dtype=torch.bfloat16):
        logits, loss = model(*batch())
    assert len(model.routing) > 0 and all(r['alpha'].dtype == torch.float32 for r in model.routing)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)


def test_optimizer_never_decays_queries_or_gains():
    model = make('rd_attnres', dtype=torch.float32)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
    decayed = {id(p) for g in opt.param_groups if g['weight_decay'] > 0 for p in g['params']}
    for name, p in model.named_parameters():
        assert (id(p) in decayed) == (p.dim() == 2), name
    assert sum(len(g['params']) for g in opt.param_groups) == len(list(model.parameters()))


def test_flops_count_the_depth_reads():
    parent, rd, std = make('attnres', S=2), make('rd_attnres', S=2), make('standard')
    d, T = 16, 32
    extra_params = 6 * 3 * d                                        # 3 w_v (one per layer), 6 FLOPs each
    extra_reads = 3 * 4 * d * sum(1 + l // 2 + (l % 2 != 0) for l in range(0, 6, 2))  # one more route
    assert rd.flops_per_token(T) - parent.flops_per_token(T) == extra_params + extra_reads
    assert parent.flops_per_token(T) > std.flops_per_token(T)
    assert 0 < rd.estimate_mfu(tokens_per_iter=1000, dt=1.0, peak_flops=1e12) < 1


def test_generate_appends_tokens_and_respects_top_k():
    model = perturb(make('rd_attnres', dtype=torch.float32))
    idx = torch.zeros(2, 3, dtype=torch.long)
    torch.manual_seed(0)
    out = model.generate(idx, 40, temperature=0.8, top_k=1)   # past block_size: the context is cropped
    assert out.shape == (2, 43) and torch.equal(out[:, :3], idx)
    assert torch.equal(out[0], out[1])                        # top_k=1 is greedy: same rows


@pytest.mark.slow
def test_compiled_model_matches_eager():
    model = perturb(make('rd_attnres', S=3, dtype=torch.float32))
    idx, targets = batch()
    eager_logits, eager_loss = model(idx, targets)
    compiled = torch.compile(model, dynamic=False)
    logits, loss = compiled(idx, targets)
    loss.backward()
    torch.testing.assert_close(logits, eager_logits, rtol=1e-4, atol=1e-4)
    assert model.transformer.h[2].attn_read.w_v.grad.abs().max() > 0


# ---------------------------------------------------------------------------------------------
# 12. The two-phase read (fast_read/two_phase_read.py): the same function as the plain read

@pytest.mark.parametrize('mode', [m for m in RESIDUAL_MODES if m != 'standard'])
def test_two_phase_read_is_the_plain_read(mode):
    # every S from Full AttnRes to one block, with 3 layers (6 sublayers: the last block is short for S = 4, 5)
    for S in range(1, 8):
        plain = perturb(make(mode, S))
        two = TwoPhaseGPT(plain.config).double()
        two.load_state_dict(plain.state_dict())
        assert_same_function_and_gradients(plain, two, tol=1e-12, what=f'S={S}')


@pytest.mark.slow
def test_compiled_two_phase_read_is_the_eager_plain_read():
    # compiled, every block's phase 1 and every merge have one shape and reuse the same kernels: a later
    # block's (other parameters) and a short last block's must compute what the eager plain read does
    plain = perturb(make('rd_attnres', S=3, n_layer=4, dtype=torch.float32))
    two = TwoPhaseGPT(plain.config)
    two.load_state_dict(plain.state_dict())
    idx, targets = batch()
    logits, loss = plain(idx, targets)
    loss.backward()
    compiled_logits, compiled_loss = torch.compile(two, dynamic=False)(idx, targets)
    compiled_loss.backward()
    torch.testing.assert_close(compiled_logits, logits, rtol=1e-4, atol=1e-4)
    for (name, a), b in zip(plain.named_parameters(), two.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-3, atol=1e-5, msg=name)


def test_two_phase_read_stays_float32_under_autocast_and_records_with_the_plain_read():
    plain = perturb(make('rd_attnres', 3, dtype=torch.float32))
    two = TwoPhaseGPT(plain.config)
    two.load_state_dict(plain.state_dict())
    with torch.autocast('cpu', dtype=torch.bfloat16):
        (lp, _), (lt, _) = plain(*batch()), two(*batch())
    assert lt.dtype == torch.bfloat16 and (lp.float() - lt.float()).abs().max() < 0.05
    from fast_read import two_phase_read
    sources, w = some_sources(n=3), torch.randn(2, 16, dtype=torch.float64)
    with RecordOps() as ops:   # no matmul in either phase (TF32 would round it on GPUs)
        x, inv_rms = torch.stack([x for x, _ in sources]), torch.stack([r[..., 0] for _, r in sources])
        state = two_phase_read.phase1(x, inv_rms, torch.zeros(3, dtype=torch.float64), w)
        two_phase_read.phase2(state, w, sources[0])
    assert ops.names and not {'matmul', '__matmul__', 'mm', 'bmm', 'einsum', 'linear', 'addmm', 'tensordot',
                              'inner', 'dot', 'baddbmm'} & set(ops.names)
    two.record_routing = plain.record_routing = True
    plain(*batch())
    two(*batch())
    assert len(two.routing) == len(plain.routing) > 0
    assert all(torch.equal(a['alpha'], b['alpha']) for a, b in zip(plain.routing, two.routing))
