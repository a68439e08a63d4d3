"""
Sample from a trained model, and optionally show where each layer reads from.

    python sample.py --out_dir=out/quickstart --start="The tuple" --show_routing=True
    python sample.py --out_dir=out/rd_120m_s1 --start=FILE:prompt.txt --num_samples=3 --top_k=50
    python sample.py --out_dir=out/rd_120m_s1 --export=rd_120m_s1.safetensors    # share the weights
    python sample.py --weights=rd_120m_s1.safetensors --start="The"              # sample from such a file

A checkpoint is loaded with torch.load(weights_only=True) and its checksum verified; a .safetensors
file holds only tensors and a text header (the model's configuration), so neither can run code.
"""

import json

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
    export='',                # write the run's weights and model configuration to this .safetensors file, exit
    weights='',               # sample from this .safetensors file (written by --export) instead of out_dir
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


def load_model(cfg):
    """(model, its configuration, a line saying where it came from): from out_dir/ckpt.pt, or from a
    .safetensors file whose header holds the model configuration."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_model as load_safetensors
    if cfg['weights']:
        try:
            with safe_open(cfg['weights'], framework='pt') as f:
                saved = json.loads((f.metadata() or {}).get('config', 'null'))
        except (OSError, SafetensorError, ValueError) as e:
            raise SystemExit(f"{cfg['weights']} cannot be read as a .safetensors file: {e}") from None
        if not isinstance(saved, dict) or any(k not in saved for k in MODEL_KEYS):
            raise SystemExit(f"{cfg['weights']} has no model configuration in its header: write it with "
                             "python sample.py --out_dir=<run> --export=<file>.safetensors")
        model = GPT(GPTConfig(vocab_size=50304, **{k: saved[k] for k in MODEL_KEYS}))
        load_safetensors(model, cfg['weights'])
        return model, saved, f"{cfg['weights']} (step {saved.get('step')})"
    ckpt_path = os.path.join(cfg['out_dir'], 'ckpt.pt')
    if not os.path.exists(ckpt_path):
        raise SystemExit(f"no checkpoint at {ckpt_path}: train one first (python train.py config/quickstart.py) "
                         "or pass --out_dir=<a run directory>")
    ckpt = load_checkpoint(ckpt_path)   # onto the CPU first: the model is moved once, below
    saved = ckpt['config']
    model = GPT(GPTConfig(vocab_size=50304, **{k: saved[k] for k in MODEL_KEYS}))
    model.load_state_dict(ckpt['model'])
    saved = dict(saved, step=ckpt['step'], best_val_loss=ckpt['best_val_loss'])
    return model, saved, f"{ckpt_path} (step {ckpt['step']}, best val loss {ckpt['best_val_loss']:.4f})"


def export(model, saved, path):
    """The weights (the tied embedding / LM head once) and, in the header, the model configuration."""
    from safetensors.torch import save_model
    config = {k: saved[k] for k in (*MODEL_KEYS, 'step', 'best_val_loss', 'seed', 'data_id') if k in saved}
    save_model(model, path + '.tmp', metadata={'config': json.dumps(config), 'format': 'pt'})
    os.replace(path + '.tmp', path)
    print(f"wrote {path}: {model.get_num_params():,} parameters of a {saved['residual']} model, step {saved.get('step')}")


def main(argv):
    cfg = configure(DEFAULTS, argv)
    device = resolve_device(cfg['device'])
    model, saved, origin = load_model(cfg)
    if cfg['export']:
        return export(model, saved, cfg['export'])
    model.eval().to(device)

    try:
        enc = gpt2_encoding()
    except InputError as e:
        raise SystemExit(str(e)) from None
    start = cfg['start']
    if start.startswith('FILE:'):
        try:
            with open(start[5:], encoding='utf-8') as f:
                start = f.read()
        except OSError as e:
            raise SystemExit(f"--start={start}: cannot read the prompt file ({e.strerror})") from None
    ids = enc.encode(start, allowed_special={'<|endoftext|>'}) or [enc.eot_token]
    if len(ids) > model.config.block_size:
        print(f"note: the prompt is {len(ids)} tokens, longer than the context of {model.config.block_size}: "
              f"only its last {model.config.block_size} tokens are used")
    x = torch.tensor(ids, dtype=torch.long, device=device)[None, -model.config.block_size:]
    print(f"{saved['residual']} model from {origin}")

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
