"""
Sample from a trained model, and optionally show where each layer reads from.

    python sample.py --out_dir=out/quickstart --start="The tuple" --show_routing=True
    python sample.py --out_dir=out/rd_120m_s1 --start=FILE:prompt.txt --num_samples=3 --top_k=50
    python sample.py --out_dir=out/rd_120m_s1 --export=rd_120m_s1.safetensors    # share the weights
    python sample.py --weights=rd_120m_s1.safetensors --start="The"              # sample from such a file

A checkpoint is loaded with torch.load(weights_only=True) and its checksum verified; a .safetensors
file holds only tensors and a text header (the model's configuration and a digest of it and the tensors,
verified too), so neither can run code.
"""

from run_kit.common import ctrl_c_while_starting  # first: a Ctrl-C while torch loads is one line, exit 130
ctrl_c_while_starting(__name__, 'sample.py')

import json
import os
import sys
import textwrap
import warnings

from configurator import configure, exit_on_help
exit_on_help(__name__, __file__, "README's Quickstart and \"What the output means\"")   # before torch loads
import torch

from model import GPT
from prepare import InputError, gpt2_encoding
from run_kit.common import MODEL_KEYS, WriteFailed, run_command
from run_kit.run_control import check_device
from run_kit.routing import source_labels
from run_kit.run_files import (CHECKPOINT, atomic_write, check_tensors, content_digest, load_checkpoint, model_config,
                               renamed_keys, write_failed)

DEFAULTS = dict(
    out_dir='out/quickstart',
    start="\n",               # the prompt, or FILE:path to read it from a file
    num_samples=3,
    max_new_tokens=200,
    temperature=0.8,          # < 1 sharpens, > 1 flattens the distribution
    top_k=200,                # keep only the top_k most likely tokens (0 = all)
    seed=1337,                # the sampling's random numbers (not a run's seed)
    device='auto',
    cpu_threads=1,            # on CPU: torch's threads (0 = one per core); 1 is faster for small models
                              # (docs/performance.md, "Threads for small models on a CPU")
    show_routing=False,       # print each read point's depth distribution over the prompt
    export='',                # write the run's weights and model configuration to this .safetensors file, exit
    weights='',               # sample from this .safetensors file (written by --export) instead of out_dir
)


ROUTES = {'qk': "the input of queries and keys (attnres: its one route, of values too)",
          'v': "the input of values (RD-AttnRes)",
          'heads1': "the q, k and v input of the first half of the heads (ctrl_heads)",
          'heads2': "the q, k and v input of the second half of the heads (ctrl_heads)", 'mlp': "the MLP's input",
          'final': "the read after the last sublayer, into the LM head"}


def print_routing(model, n_tokens):
    """One row per read point: the share of each depth source in its input, averaged over the prompt's tokens."""
    S, L = model.config.attnres_block_size, 2 * model.config.n_layer
    print("---- depth routing over the prompt: where each sublayer's input comes from ----")
    print(textwrap.fill(
        f"One row per read point, in order: the sublayer it feeds (0..{L - 1}: attention at even numbers, the MLP at "
        f"odd ones; {L} sublayers in AttnRes blocks of {S}) and its route. A cell is a source's share of the read: emb = "
        f"the token embedding, bN = the sum of AttnRes block N's outputs, part = the partial, the sum of the current "
        f"AttnRes block's outputs so far. Each token "
        f"of the prompt reads with its own shares; a cell is their mean over the prompt's {n_tokens} tokens, so a "
        f"row adds up to 100%. The last row, sublayer {L} final, is the read after the last sublayer: the input of "
        f"the final norm and the LM head.", 100))
    routes = list(dict.fromkeys(r['route'] for r in model.routing))
    print("routes: " + '; '.join(f"{r} = {ROUTES[r]}" for r in routes))
    for r in model.routing:
        alpha = r['alpha'].tolist()
        kind = 'final' if r['sublayer'] == L else 'attn' if r['sublayer'] % 2 == 0 else 'mlp'
        cells = ' '.join(f"{n}:{a * 100:3.0f}%" for n, a in zip(source_labels(r['sublayer'], S, L), alpha))
        print(f"sublayer {r['sublayer']:2d} {kind:5s} {r['route']:6s} | {cells}")


def load_model(cfg):
    """(model, its configuration, a line saying where it came from): from out_dir/ckpt.pt, or from a
    .safetensors file whose header holds the model configuration and a digest of it and the tensors. The
    configuration is checked as train.py checks its keys, every tensor's name, shape and dtype against the
    model (built first on the meta device, which allocates nothing), and the checksum or digest, before the
    model is built and loaded."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file
    if cfg['weights']:
        path = cfg['weights']
        try:
            with safe_open(path, framework='pt') as f:
                header = f.metadata() or {}
                saved = json.loads(header.get('config', 'null'))
                tensors = {k: (f.get_slice(k).get_shape(), DTYPES.get(f.get_slice(k).get_dtype())) for k in f.keys()}
        except (OSError, SafetensorError, ValueError) as e:
            raise SystemExit(f"{path} cannot be read as a .safetensors file: {e}") from None
        if saved is None:
            raise SystemExit(f"{path} has no model configuration in its header: write it with "
                             "python sample.py --out_dir=<run> --export=<file>.safetensors")
    else:
        path = os.path.join(cfg['out_dir'], CHECKPOINT)
        if not os.path.exists(path):
            raise SystemExit(f"no checkpoint at {path}: train one first (python train.py config/quickstart.py) "
                             "or pass --out_dir=<a run directory>")
        ckpt = load_checkpoint(path)   # onto the CPU first: the model is moved once, below
        saved, weights = ckpt['config'], ckpt['model']
        tensors = {k: (tuple(t.shape), t.dtype) for k, t in weights.items()}
    config = model_config(saved, path)
    with torch.device('meta'):
        skeleton = GPT(config)
        tensors = renamed_keys(skeleton, tensors)   # a file of an older version: today's tensor names
        check_tensors(skeleton, tensors, path)
    if cfg['weights']:
        try:
            weights = load_file(path)
        except (OSError, SafetensorError) as e:
            raise SystemExit(f"{path} cannot be read as a .safetensors file: {e}") from None
        if 'sha256' not in header:
            warnings.warn(f"{path} has no digest (exported by an older sample.py): its configuration and tensors "
                          "are not verified")
        elif header['sha256'] != weights_digest(header['config'], weights):
            raise SystemExit(f"{path} was changed after it was exported: its configuration or tensors do not match "
                             "the digest written with them. Export it again from its run (python sample.py "
                             "--out_dir=<run> --export=<file>.safetensors).")
    try:
        model = GPT(config)
    except (RuntimeError, MemoryError) as e:   # a configuration valid for train.py, but too big for this machine
        raise SystemExit(f"{path}: the model its configuration describes ({', '.join(f'{k}={saved[k]}' for k in MODEL_KEYS)}) "
                         f"cannot be built here ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    # every tensor of the model is there (check_tensors), a tied weight once: strict=False lets the other name be
    model.load_state_dict(renamed_keys(model, weights), strict=not cfg['weights'])
    if cfg['weights']:
        return model, saved, f"{path} (step {saved.get('step')})"
    saved = dict(saved, step=ckpt['step'], best_val_loss=ckpt['best_val_loss'])
    return model, saved, f"{path} (step {saved['step']}, best val loss {saved['best_val_loss']:.4f})"


DTYPES = {'F32': torch.float32, 'BF16': torch.bfloat16, 'F16': torch.float16, 'F64': torch.float64}


def weights_digest(config_text, tensors):
    """The digest an exported file carries: of its header's configuration (as text) and of every tensor, by name."""
    return content_digest(dict(config=config_text, tensors={k: tensors[k] for k in sorted(tensors)}))


def export(model, saved, path):
    """The weights (the tied embedding / LM head once) and, in the header, the model configuration and
    their digest, written through run_files.atomic_write."""
    from safetensors.torch import save
    # (source: what study.py's export of a run's final model says it was derived from, study.export_final)
    config = json.dumps({k: saved[k] for k in (*MODEL_KEYS, 'step', 'best_val_loss', 'seed', 'dataset', 'data_id',
                                               'source') if k in saved})
    names = {}   # a tied weight (one tensor, two names) is stored once, under the name first in order, as save_model does
    for name, t in model.state_dict(keep_vars=True).items():
        names.setdefault(id(t), (t, []))[1].append(name)
    tensors = {min(group): t.detach().contiguous() for t, group in names.values()}
    header = {'config': config, 'sha256': weights_digest(config, tensors), 'format': 'pt'}
    try:
        atomic_write(path, save(tensors, metadata=header))
    except OSError as e:
        raise WriteFailed(write_failed(path, e, "nothing was written under that name", then="export again",
                                       elsewhere="a path").code) from None
    print(f"wrote {path}: {model.get_num_params():,} parameters of a {saved['residual']} model, step {saved.get('step')}")


def main(argv):
    cfg = configure(DEFAULTS, argv)
    device = check_device(cfg['device'])
    if torch.device(device).type == 'cpu' and cfg['cpu_threads']:
        torch.set_num_threads(cfg['cpu_threads'])
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
        except UnicodeDecodeError as e:
            raise SystemExit(f"--start={start}: the prompt file is not UTF-8 text (byte {e.start})") from None
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
        print_routing(model, x.shape[1])

    torch.manual_seed(cfg['seed'])
    for _ in range(cfg['num_samples']):
        y = model.generate(x, cfg['max_new_tokens'], temperature=cfg['temperature'], top_k=cfg['top_k'] or None)
        print(enc.decode([t for t in y[0].tolist() if t < enc.n_vocab]))
        print('---------------')


if __name__ == '__main__':
    sys.exit(run_command(main, sys.argv[1:], 'sample.py', "nothing was written (an export is written whole or not at all)"))
