"""
Routing diagnostics: where the depth reads of one forward pass read from, in numbers.

With model.record_routing = True, a forward pass of model.GPT keeps one record per route of every
read point (model.DepthRead.forward): its depth distribution averaged over the tokens, alpha (one share per
source: 0 = the embedding, n = AttnRes block n, then the partial) and its tokens' mean entropy. train.py logs
routing_summary() of the first validation batch at every evaluation; sample.py prints the records
with source_labels(); compare.py tabulates and plots them.
"""

import torch


def entropy(p):
    """Entropy in nats of a distribution over depth sources (as model.DepthRead computes each token's)."""
    p = p.double()
    return float(-(p * p.clamp_min(1e-30).log()).sum(-1)) + 0.0  # + 0.0 turns -0.0 into 0.0


def mean_depth(p):
    """Expected source number: 0 = the embedding, n = AttnRes block n (the partial counts as the next one)."""
    return float((p.double() * torch.arange(p.numel(), dtype=torch.float64, device=p.device)).sum())


def js_divergence(p, q):
    """Jensen-Shannon divergence in nats: symmetric, 0 for equal routes, at most ln 2."""
    m = 0.5 * (p.double() + q.double())
    return entropy(m) - 0.5 * (entropy(p) + entropy(q))


def source_labels(l, S, L):
    """Names of the sources of the read before sublayer l (S: attnres_block_size, L: sublayers), for
    people: emb, b1, b2, ..., and part for the partial."""
    finished = l // S + (l == L and L % S != 0)
    return ['emb'] + [f'b{n}' for n in range(1, finished + 1)] + (['part'] if l < L and l % S else [])


def routing_summary(routing):
    """Per attention sublayer: how far apart its two routes read (JS divergence), each route's entropy
    and mean depth, keyed by the route names: js_qk_v, entropy_qk, depth_v, ... for the modes that split
    roles (a one-route mode reads v from its qk route: divergence 0), js_heads1_heads2, entropy_heads1,
    ... for ctrl_heads."""
    attn_routes = {}   # layer -> its attention read's routes, in order
    for r in routing:
        if r['sublayer'] % 2 == 0 and r['route'] != 'final':
            attn_routes.setdefault(r['layer'], []).append(r)
    rows = []
    for layer, routes in sorted(attn_routes.items()):
        first, second = routes[0], routes[-1] if len(routes) > 1 else dict(routes[0], route='v')
        a, b = first['route'], second['route']
        row = {'layer': layer, f'js_{a}_{b}': js_divergence(first['alpha'], second['alpha'])}
        for name, r in ((a, first), (b, second)):
            row.update({f'entropy_{name}': entropy(r['alpha']),
                        f'token_entropy_{name}': float(r['token_entropy']) + 0.0,   # + 0.0: no -0.0 in logs
                        f'depth_{name}': mean_depth(r['alpha'])})
        rows.append(row)
    return rows


def routing_log(routing):
    """What log.jsonl keeps of one forward pass's records: routing_summary, and each read's alpha (5 decimals)."""
    return dict(summary=routing_summary(routing),
                alpha=[dict(sublayer=r['sublayer'], layer=r['layer'], route=r['route'],
                            alpha=[round(a, 5) for a in r['alpha'].tolist()]) for r in routing])


def routing_of_batch(raw_model, x, y, ctx):
    """routing_log of one batch's reads, recorded on the plain module (raw_model): recording is Python work,
    kept out of the compiled graph."""
    raw_model.record_routing = True
    with ctx:
        raw_model(x, y)
    raw_model.record_routing = False
    return routing_log(raw_model.routing)
