"""
Sample from a trained model, and optionally show where each layer reads from.

    python sample.py --out_dir=out/quickstart --start="The tuple" --show_routing=True
    python sample.py --out_dir=out/rd_120m_s1 --start=FILE:prompt.txt --num_samples=3 --top_k=50
"""

import os
import sys

import torch

from common import MODEL_KEYS, load_checkpoint, resolve_device
from configurator import configure
from model import GPT, GPTConfig, source_labels
from prepare import InputError, gpt2_encoding

DEFAULTS = dict(
    out_dir='out/quickstart',
    start="\n",               # the prompt, or FILE:path to read it from a file
    num_samples=3,
    max_new_tokens=200,
    temperature=0.8,          # < 1 sharpens, > 1 flattens the distribution
    top_k=200,                # keep only the top_k most likely tokens (0 = all)
    seed=1337,
    device='auto',
    show_routing=False,       # print each read point's depth distribution over the prompt
)


ROUTES = {'qk': "the input of queries and keys (the one route of attnres)", 'v': "the input of values (RD-AttnRes)",
          'heads1': "the Q, K and V input of the first half of the heads (ctrl_heads)",
          'heads2': "the Q, K and V input of the second half of the heads (ctrl_heads)", 'mlp': "the MLP's input",
          'final': "the read after the last sublayer, into the LM head"}


def print_routing(model):
    S, L = model.config.attnres_block_size, 2 * model.config.n_layer
    print(f"---- depth routing over the prompt: share of each source (emb = embedding, bN = block N, "
          f"p = partial of the current block); {L} sublayers in blocks of {S} ----")
    routes = list(dict.fromkeys(r['route'] for r in model.routing))
    print("routes: " + '; '.join(f"{r} = {ROUTES[r]}" for r in routes))
    for r in model.routing:
        alpha = r['alpha'].tolist()
        kind = 'final' if r['sublayer'] == L else 'attn' if r['sublayer'] % 2 == 0 else 'mlp'
        cells = ' '.join(f"{n}:{a * 100:3.0f}%" for n, a in zip(source_labels(r['sublayer'], S, L), alpha))
        print(f"sublayer {r['sublayer']:2d} {kind:5s} {r['route']:6s} | {cells}")


def main(argv):
    cfg = configure(DEFAULTS, argv)
    ckpt_path = os.path.join(cfg['out_dir'], 'ckpt.pt')
    if not os.path.exists(ckpt_path):
        raise SystemExit(f"no checkpoint at {ckpt_path}: train one first (python train.py config/quickstart.py) "
                         "or pass --out_dir=<a run directory>")
    device = resolve_device(cfg['device'])
    ckpt = load_checkpoint(ckpt_path)   # onto the CPU first: the model is moved once, below
    saved = ckpt['config']
    model = GPT(GPTConfig(vocab_size=50304, **{k: saved[k] for k in MODEL_KEYS}))
    model.load_state_dict(ckpt['model'])
    model.eval().to(device)

    try:
        enc = gpt2_encoding()
    except InputError as e:
        raise SystemExit(str(e)) from None
    start = cfg['start']
    if start.startswith('FILE:'):
        with open(start[5:], encoding='utf-8') as f:
            start = f.read()
    ids = enc.encode(start, allowed_special={'<|endoftext|>'}) or [enc.eot_token]
    if len(ids) > model.config.block_size:
        print(f"note: the prompt is {len(ids)} tokens, longer than the context of {model.config.block_size}: "
              f"only its last {model.config.block_size} tokens are used")
    x = torch.tensor(ids, dtype=torch.long, device=device)[None, -model.config.block_size:]
    print(f"{saved['residual']} model from {ckpt_path} (step {ckpt['step']}, best val loss {ckpt['best_val_loss']:.4f})")

    if cfg['show_routing'] and saved['residual'] != 'standard':
        model.record_routing = True
        with torch.no_grad():
            model(x)  # every position is routed (only the head looks at the last one alone)
        model.record_routing = False
        print_routing(model)

    torch.manual_seed(cfg['seed'])
    for _ in range(cfg['num_samples']):
        y = model.generate(x, cfg['max_new_tokens'], temperature=cfg['temperature'], top_k=cfg['top_k'] or None)
        print(enc.decode([t for t in y[0].tolist() if t < enc.n_vocab]))
        print('---------------')


if __name__ == '__main__':
    main(sys.argv[1:])
