"""
The depth read with a hand-written backward. Its forward pass *is* model.depth_read (the definition,
and what course assignment 1 asks for); only the backward is written out, with fewer passes over the
sources than autograd's backward of the plain read.

A read is memory-bound: every source x_s is a (B, T, d) tensor, and autograd goes over each of them
several times per route (the gradient of each logit's product, of each term of the weighted sum, one
small op at a time). By hand, for R routes over S sources, with logit[r,s] = (x_s . q_r) rinv_s,
alpha = softmax_s(logit) and h_r = sum_s alpha[r,s] x_s, given the gradient gh_r of each h_r:

    dalpha[r,s] = gh_r . x_s                      and the dots x_s . q_r again: one pass over x_s
    dlogit[r,s] = alpha[r,s] (dalpha[r,s] - sum_s' alpha[r,s'] dalpha[r,s'])       the softmax's backward
    dx_s        = sum_r (alpha[r,s] gh_r + dlogit[r,s] rinv_s q_r)                one pass writing dx_s
    drinv_s     = sum_r dlogit[r,s] (x_s . q_r)                                   (a number per token)
    dq_r        = sum_{b,t} dlogit[r,s] rinv_s x_s                                one pass over x_s

(rinv_s = 1/rms(x_s) is an input of its own; autograd takes its gradient on to x_s.) Nothing but what
the model keeps anyway is saved: the sources, their 1/rms, the queries and alpha. The results equal
autograd of the plain read to float64 precision (torch.autograd.gradcheck, test_model.py), and the
forward pass is bit-identical, since it is the plain read.

Measured on CPU (README "Performance", 2026-12-01), it is *not* faster: eager about as fast as autograd
(1.02x slower at 8 x 256), compiled slower to compile (41 s vs 34 s first step), with a 2% lower peak
memory. So it is off by default (GPTConfig.fast_backward); `bench.py --modes=rd_attnres,rd_attnres+fast`
measures it, e.g. on a GPU, where fewer kernels over the sources may pay.
"""

import torch


class DepthReadFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, read, queries, n, *tensors):
        xs, rinvs = tensors[:n], tensors[n:]
        h, alpha = read(list(zip(xs, rinvs)), queries)
        ctx.n = n
        ctx.save_for_backward(queries, alpha, *xs, *rinvs)
        return h, alpha

    @staticmethod
    def backward(ctx, grad_h, grad_alpha):
        queries, alpha, *tensors = ctx.saved_tensors
        xs, rinvs = tensors[:ctx.n], tensors[ctx.n:]
        R = queries.size(0)
        with torch.autocast(device_type=queries.device.type, enabled=False):   # the read's own precision
            q = queries.to(xs[0].dtype)
            if grad_h is None:
                grad_h = torch.zeros(alpha.shape[:3] + xs[0].shape[-1:], dtype=q.dtype, device=q.device)
            # one product per source gives both gh_r . x_s and q_r . x_s (its R queries broadcast over tokens)
            against = torch.cat([grad_h, q[:, None, None, :].expand_as(grad_h)])           # (2R, B, T, d)
            both = torch.stack([(against * x).sum(-1) for x in xs], -1)                   # (2R, B, T, S)
            dalpha, dots = both[:R], both[R:]
            if grad_alpha is not None:
                dalpha = dalpha + grad_alpha
            dlogit = alpha * (dalpha - (alpha * dalpha).sum(-1, keepdim=True))          # (R, B, T, S)
            grad_q, grad_xs, grad_rinvs = torch.zeros_like(q), [], []
            for s, (x, rinv) in enumerate(zip(xs, rinvs)):
                c = dlogit[..., s:s + 1] * rinv                                          # (R, B, T, 1)
                grad_xs.append((alpha[..., s:s + 1] * grad_h + c * q[:, None, None, :]).sum(0))
                grad_q += (c * x).sum((1, 2))
                grad_rinvs.append((dlogit[..., s:s + 1] * dots[..., s:s + 1]).sum(0))
        return (None, grad_q.to(queries.dtype), None, *grad_xs, *grad_rinvs)


def depth_read_fast(read, sources, queries):
    """read(sources, queries) (model.depth_read), with the backward above."""
    return DepthReadFunction.apply(read, queries, len(sources), *[x for x, _ in sources], *[r for _, r in sources])
