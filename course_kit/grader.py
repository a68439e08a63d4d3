"""
The course kit's grader (instructor only: never in a handout, never in a sandbox). COURSE.md, "How
grading works", is the page for instructors; course.py is the command.

Marks are decided here, by a process that never runs student code. The student's answer runs in a
sandbox (course_kit/worker.py, as course_worker.py in the student's handout of the files it needs, with the student's marked
lines and nothing else of theirs), one for all the concepts of an assignment, each concept with CPU time of its own; it
receives inputs and returns what the student's functions computed, as safetensors. This process runs
the same probes on the instructor's own project and compares: a concept's marks are earned when every
one of its probes matches. The inputs, the expected values and these checks stay on this side.

The sandbox is bubblewrap (Debian: apt-get install bubblewrap), chosen because it is a standard,
unprivileged-capable, single-binary mechanism that needs no daemon: new mount, PID, network, IPC and UTS
namespaces, the grading tree read-only, a private /tmp and /dev/shm of 64 MB each, the rest read-only,
nothing else of the machine but the system's and Python's own read-only files, and an empty environment;
run as root, the worker drops to an unprivileged user of its own before it reads anything; then, where the
kernel has Landlock (worker_probe), it takes every write to the file system from itself, and TCP
(course_worker.no_writes), and a seccomp filter refuses it memfd, System V IPC and sockets (course_worker.no_sharing,
said where it cannot); resource limits (set by the worker on itself) on memory, CPU time, processes,
file size, and a wall clock per concept kept here; its whole process tree ends with it (a PID namespace).
Where bubblewrap cannot start (a container without user namespaces), --sandbox uid runs the worker as a
user of its own, as root, with the same limits, Landlock and filter, in network, IPC, PID and mount namespaces
of its own where the kernel makes them (course_worker.own_namespaces), and ends every process of that user
afterwards (COURSE.md says what it loses, and grading says so where a mechanism cannot be used: what_is_lost). Without a
sandbox, grading refuses unless told the submissions are trusted (--trusted): then the worker runs as a
plain process with the same limits.

What comes back from the sandbox (answers, messages) is data: each value is checked for its kind before
it is compared, and the student's text is shown inert (course.shown).
"""

import errno
import itertools
import json
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass

from course_kit import worker as course_worker

FIRST_UID = 2_000_000     # each sandbox runs as a user of its own (no account needed): its process limit is its own
MEMORY = 4 * 2 ** 30      # address space of a sandboxed process
FILE_SIZE = 64 * 2 ** 20  # the largest file it may write (answers, its printed output, /tmp)
PROCESSES = 64            # processes and threads of the sandbox's user
MESSAGE = 1000            # characters of an error's message shown (whole, or cut at a word): a stub's is about 400
STARTUP = 60.0            # wall-clock seconds a sandbox may take to start (Python, torch) and say it is ready


@dataclass(frozen=True)
class Concept:
    name: str
    marks: int
    hint: str          # what to look at when it fails
    probes: tuple      # (description, probe name, args, tensors, compare, reference (args, tensors) or None)


# -----------------------------------------------------------------------------
# Student text (names, messages, lines of code) is shown inert: one line, control characters visible

def shown(text, limit=300):
    """Text from a submission as it may be shown on a terminal, in a file or a spreadsheet: one line, every
    character that is not printable (newlines, escape sequences, bidirectional overrides) and every backslash
    written as an escape, so it cannot draw lines of its own or move the cursor; at most `limit` characters."""
    text = str(text)
    out = ''.join(c if c.isprintable() and c != '\\' else
                  {'\\': '\\\\', '\n': '\\n', '\r': '\\r', '\t': '\\t'}.get(c) or
                  (f'\\x{ord(c):02x}' if ord(c) < 0x100 else f'\\u{ord(c):04x}' if ord(c) < 0x10000 else f'\\U{ord(c):08x}')
                  for c in text[:limit])
    return out + ('...' if len(text) > limit else '')


# Letters of other scripts that print like Latin ones (after NFKC and casefold; Unicode's confusables, the
# letters a name is likely to hold): a name is told apart by what a person sees, not by its code points
LOOKALIKES = {
    # Cyrillic
    '\u0430': 'a', '\u0432': 'b', '\u0435': 'e', '\u0456': 'i', '\u0458': 'j', '\u043a': 'k', '\u043c': 'm',
    '\u043d': 'h', '\u043e': 'o', '\u0440': 'p', '\u0441': 'c', '\u0442': 't', '\u0443': 'y', '\u0445': 'x',
    '\u0455': 's', '\u04bb': 'h', '\u0501': 'd', '\u051b': 'q', '\u051d': 'w', '\u04cf': 'l', '\u0475': 'v',
    # Greek
    '\u03b1': 'a', '\u03b2': 'b', '\u03b5': 'e', '\u03b6': 'z', '\u03b7': 'n', '\u03b9': 'i', '\u03ba': 'k',
    '\u03bc': 'm', '\u03bd': 'v', '\u03bf': 'o', '\u03c1': 'p', '\u03c4': 't', '\u03c5': 'u', '\u03c7': 'x',
}


# Characters that print as nothing (Unicode's default-ignorable code points: joiners, fillers, variation selectors)
INVISIBLE = ((0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
             (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
             (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
             (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))


def invisible(c):
    import unicodedata
    return unicodedata.category(c) == 'Cf' or any(lo <= ord(c) <= hi for lo, hi in INVISIBLE)


def skeleton(name):
    """What a name looks like, as one string: compatibility-normalised (NFKC: the Kelvin sign is K, the
    Angstrom sign A-ring), case folded, look-alike letters of other scripts as the Latin ones they print as,
    without the characters that print as nothing, and in a name with Latin letters without combining marks (a
    dot over a letter). Two names with one skeleton may print the same."""
    import unicodedata
    folded = unicodedata.normalize('NFKC', unicodedata.normalize('NFKC', name).casefold())
    latin = any(c.isascii() and c.isalpha() for c in folded)
    return ''.join(LOOKALIKES.get(c, c) for c in folded
                   if not invisible(c) and not (latin and unicodedata.combining(c)))


def shown_name(name, lookalikes=False):
    """A student's folder name as shown: inert, and with every character that could make it print like another
    name written as an escape (\\uXXXX): combining marks of a name not in composed form (NFC), characters that
    compatibility normalisation (NFKC) changes (the Kelvin sign, the Angstrom sign, full-width letters), letters
    of another script that print as Latin ones in a name that has Latin letters, and with lookalikes (a name
    whose skeleton is another's) every character outside ASCII."""
    import unicodedata
    name = shown(name, 200)
    nfc = unicodedata.normalize('NFC', name) == name
    latin = any(c.isascii() and c.isalpha() for c in name)

    def suspect(c):
        return (lookalikes and not c.isascii() or (not nfc or latin) and unicodedata.combining(c) or invisible(c)
                or unicodedata.normalize('NFKC', c) != c or latin and c.casefold() in LOOKALIKES)
    return ''.join(f'\\u{ord(c):04x}' if ord(c) < 0x10000 and suspect(c) else
                   f'\\U{ord(c):08x}' if suspect(c) else c for c in name)


def look_alike(a, b):
    """Whether two skeletons may print the same: one skeleton, or of one length, alike in most places, and apart
    only where one holds an ASCII letter and the other a letter outside ASCII (a look-alike LOOKALIKES does not
    list: the dotless i, Armenian oh). Two names of other scripts (two Chinese names of one length), or a Latin
    name beside one of another script, are not taken as alike."""
    if a == b:
        return True
    apart = [(x, y) for x, y in zip(a, b) if x != y]
    return (len(a) == len(b) and 2 * len(apart) <= len(a) and
            all(x.isalpha() and y.isalpha() and x.isascii() != y.isascii() for x, y in apart))


def name_note(name):
    """Why a name is shown with escapes (shown_name), in words, or ''."""
    import unicodedata
    why = []
    if unicodedata.normalize('NFC', name) != name:
        why.append('not in composed form (NFC)')
    if any(unicodedata.normalize('NFKC', c) != c for c in name if not unicodedata.combining(c)):
        why.append('compatibility characters (NFKC changes it)')
    if any(c.isascii() and c.isalpha() for c in name) and any(c.casefold() in LOOKALIKES for c in name):
        why.append('letters of another script that print as Latin ones')
    if any(invisible(c) for c in name):
        why.append('characters that print as nothing')
    elif (unicodedata.normalize('NFC', name) == name and any(c.isascii() and c.isalpha() for c in name)
          and any(unicodedata.combining(c) for c in name)):
        why.append('combining marks (a mark over a letter that is not one letter)')
    return ', '.join(why)


def spreadsheet_cell(value):
    """A CSV cell that a spreadsheet does not run: text starting with =, +, -, @, a tab or a CR gets a leading
    quote (OWASP's advice on CSV injection); numbers stay numbers."""
    if isinstance(value, str) and value[:1] in ('=', '+', '-', '@', '\t', '\r'):
        return "'" + value
    return value


def cut_at_word(text, limit):
    """text whole when it has at most `limit` characters, else cut at the last space before it, with ' ...'."""
    text = str(text)
    if len(text) <= limit:
        return text
    cut = text[:limit]
    return (cut.rsplit(' ', 1)[0] if ' ' in cut[limit // 2:] else cut) + ' ...'


def student_said(text, limit=300):
    """Text that the student's code produced (an exception's message, a line of their file), labelled as theirs."""
    return f"[from the submission: {shown(text, limit)}]"


# -----------------------------------------------------------------------------
# Inputs (made here, sent to the sandbox) and comparisons (said in words, never with an expected value)

def generator(seed):
    import torch
    return torch.Generator().manual_seed(seed)


def sources(seed, n, d=8, dtype=None):
    """n sources of very different scales (so that normalising them before scoring matters), (2, 3, d)."""
    import torch
    g = generator(seed)
    return {f'x{i}': torch.randn(2, 3, d, generator=g, dtype=dtype or torch.float64) * (1 + 3 * i) for i in range(n)}


def model_weights(config, seed):
    """A small model of the instructor's code with every pseudo-query, source gain and pre-norm gain random,
    so that no read is uniform and the two pre-norms differ; as tensors 'w.<name>'."""
    import warnings
    import torch
    import model
    torch.manual_seed(seed)
    with warnings.catch_warnings():   # (attnres_block_size past the sublayers, on purpose)
        warnings.simplefilter('ignore')
        gpt = model.GPT(model.GPTConfig(**config)).double()
    g = generator(seed + 1)
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            if name.split('.')[-1].startswith('w_'):   # a pseudo-query: w_qk, w_v, ...
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif name.endswith(('source_gain', 'input_gain', 'norm_attn.weight', 'norm_mlp.weight')):
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return {f'w.{k}': v for k, v in gpt.state_dict().items()}


def config(mode, S=2, n_layer=2):
    return dict(block_size=16, vocab_size=64, n_layer=n_layer, n_head=2, n_embd=16, residual=mode, attnres_block_size=S)


# What comes back from the sandbox is data from the student's side: every comparison checks its kind (type,
# shape, dtype) before its value, and an answer of the wrong kind fails its concept with a message in words.

def their_value(x):
    """A value the student's code returned, as feedback may quote it (short, inert)."""
    return student_said(repr(x), 60)


def number(x):
    """x as a float when it is a real number (not a bool, not an integer too large for a float), else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        return float(x)
    except OverflowError:
        return None


def same_tensors(*names, rtol=1e-9, atol=1e-12, dtype=None):
    """A comparison of the named tensors (shape, dtype if given, values)."""
    def compare(got, ref):
        import torch
        for name in names:
            a, b = got[0].get(name), ref[0][name]
            if a is None:
                return f"{name} is missing"
            if not isinstance(a, torch.Tensor) or a.is_complex() or not (a.is_floating_point() or a.dtype == b.dtype):
                return (f"{name} should be a tensor of {str(b.dtype).replace('torch.', '')}; got "
                        f"{str(a.dtype).replace('torch.', '') if isinstance(a, torch.Tensor) else type(a).__name__}")
            if tuple(a.shape) != tuple(b.shape):
                return f"{name} has shape {tuple(a.shape)}, not the shape asked for ({tuple(b.shape)})"
            if dtype is not None and a.dtype != dtype:
                return f"{name} is {str(a.dtype).replace('torch.', '')}, not {str(dtype).replace('torch.', '')}"
            wrong = ~torch.isclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True)
            if (wrong & torch.isnan(a)).any():   # (a NaN where a number is expected: said as NaN)
                return nan_said(name, torch.where(wrong, a.double(), 0.0))
            if wrong.any():
                return f"{name} differs from the expected values at {int(wrong.sum())} of {wrong.numel()} entries"
        return None
    return compare


def same_values(*keys):
    def compare(got, ref):   # (JSON values: any of them compares with == without raising)
        for key in keys:
            if got[1].get(key) != ref[1][key]:
                return f"{key} differ{'s' if not key.endswith('s') else ''} from what is expected"
        return None
    return compare


def close_stats(got, ref):
    stats = got[1].get('stats')
    if not isinstance(stats, dict):
        return f"paired_stats should give a dict of statistics; got {their_value(stats)}"
    for key, want in ref[1]['stats'].items():
        have = stats.get(key)
        if isinstance(want, list):
            xs = [number(x) for x in have] if isinstance(have, list) and len(have) == len(want) else [None]
            if None in xs:
                return f"{key} should be a pair of numbers; got {their_value(have)}"
        else:
            xs, want = [number(have)], [want]
            if xs[0] is None:
                return f"{key} should be a number; got {their_value(have)}"
        if not all(math.isnan(x) and math.isnan(y) or not math.isnan(y) and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
                   for x, y in zip(xs, want)):
            return f"{key} is not what it should be"
    return None


def all_of(*compares):
    def compare(got, ref):
        return next((r for r in (c(got, ref) for c in compares) if r), None)
    return compare


def nan_said(name, x, where=''):
    """'<name> is NaN at k of N entries ...' where a tensor of floats holds NaN (its value is NaN, whatever the
    dtype: no advice about precision), else None."""
    import torch
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return None
    bad = int(torch.isnan(x).sum())
    if not bad:
        return None
    return (f"{name}{' ' + where if where else ''} is NaN at {bad} of {x.numel()} entries: its value is NaN, not a "
            "number (a division by zero, a log or sqrt of a negative, an overflow in the softmax?)")


def as_specified(inputs):
    """The read under autocast (got: h, alpha) against the same code's read in float64 (h64, alpha64): float32,
    not rounded to bf16; and a read of `inputs`' sources (x0, x1, ...): alpha a distribution over them that the
    pseudo-queries move, h the sources mixed by it."""
    import torch
    sources = torch.stack([inputs[f'x{i}'] for i in range(len(inputs) - 1)], -1).double()   # (B, T, d, N)
    return lambda got, ref: read_as_specified(got, ref, sources)


def read_as_specified(got, ref, sources):
    import torch
    t = got[0]
    for name in ('h', 'alpha', 'h64', 'alpha64'):
        if not isinstance(t.get(name), torch.Tensor) or not t[name].is_floating_point():
            return f"{name} should be a tensor of floats; got {their_value(t.get(name))}"
    for name in ('h', 'alpha'):
        if t[name + '64'].dtype != torch.float64:
            return (f"{name} of float64 sources is {str(t[name + '64'].dtype).replace('torch.', '')}, not float64: "
                    "outside autocast the read keeps its sources' dtype")
        nan = nan_said(name, t[name], 'under bf16 autocast') or nan_said(name, t[name + '64'], 'in float64')
        if nan:
            return nan
        if t[name].dtype != torch.float32:
            return f"under bf16 autocast {name} is {str(t[name].dtype).replace('torch.', '')}, not float32: turn autocast off for the read"
        if t[name].shape != t[name + '64'].shape or t[name].shape != ref[0][name].shape:
            return f"{name} has shape {tuple(t[name].shape)}, not the shape asked for ({tuple(ref[0][name].shape)})"
        if not torch.allclose(t[name].double(), t[name + '64'], rtol=1e-5, atol=1e-6):
            return (f"{name} under bf16 autocast is not your own read in float64 to float32's precision: computed in "
                    "bf16 (turn autocast off for the read)")
    alpha = t['alpha64']
    if not torch.allclose(alpha.sum(-1), torch.ones_like(alpha.sum(-1)), atol=1e-9) or (alpha < 0).any():
        return "alpha is not a distribution over the sources (a softmax over the last axis)"
    if not (alpha[0] - alpha[1]).abs().max() > 1e-6:
        return "alpha is the same for two different pseudo-queries: the read does not use them"
    if alpha.shape[-1] != sources.shape[-1] or not torch.allclose(
            t['h64'], torch.einsum('btdn,rbtn->rbtd', sources, alpha), rtol=1e-7, atol=1e-9):
        return "h is not the sources mixed by alpha (h = sum_s alpha_s b_s, the raw sources)"
    return None


def no_matmul(got, ref):
    ops = got[1].get('ops')
    if not isinstance(ops, list) or not all(isinstance(op, str) for op in ops):
        return "the recorded operations could not be read"
    if not ops:
        return "no operation was recorded"
    found = sorted(set(ops) & course_worker.MATMULS)
    return f"the read uses {', '.join(found)}: a matmul, which TF32 rounds on GPUs" if found else None


# -----------------------------------------------------------------------------
# The concepts of each assignment (the statements: COURSE.md; titles and tasks: course.py)

def assignment1():
    import torch
    eq = [(f"the read over {n} sources with {r} routes, float64", 'read_sources', dict(n_sources=n),
           {**sources(10 + n, n), 'w': torch.randn(r, 8, generator=generator(20 + n), dtype=torch.float64)},
           same_tensors('h', 'alpha', dtype=torch.float64), None) for n, r in ((1, 1), (2, 1), (3, 2), (5, 3))]
    f32 = {**sources(31, 4, dtype=torch.float32), 'w': torch.randn(2, 8, generator=generator(32))}
    # (how the read is computed, not what: under autocast it must give what the same code gives in float64, so
    # that a wrong formula loses the equations alone; and it must be a read at all: alpha moved by w, h the
    # sources mixed by alpha)
    spec = [("the read under bf16 autocast, float32 sources", 'read_sources_autocast', dict(n_sources=4), f32,
             as_specified(f32), None),
            ("the operations of the read", 'read_sources_ops', dict(n_sources=4), f32, no_matmul, None)]
    return (
        Concept("the read's equations: normalised sources scored, raw sources mixed, a softmax over the sources", 2,
                "score each source normalised, b_s / rms(b_s) (already folded: (b_s * w_r).sum(-1) times 1/rms), no "
                "1/sqrt(d) or temperature; the softmax runs over the sources; alpha mixes the sources as they are",
                tuple(eq)),
        Concept("the read as specified: elementwise scores (no matmul), float32 under autocast", 3,
                "compute each score as (b * w_r).sum(-1): a matmul (@, einsum, mm) is rounded to TF32 on GPUs; turn "
                "autocast off and keep float32 (float64 inputs stay float64)", tuple(spec)))


MODES = ('attnres', 'rd_attnres', 'ctrl_dup', 'ctrl_fixed_v', 'ctrl_params', 'ctrl_heads')


ROUTES_OF = {   # the number of routes of each mode's attention read (model.ATTENTION_ROUTES)
    'attnres': 1, 'rd_attnres': 2, 'ctrl_dup': 2, 'ctrl_fixed_v': 2, 'ctrl_params': 1, 'ctrl_heads': 2}


def assignment2():
    import torch
    read = [(f"the attention read point of an {mode} model over 3 sources", 'read_point',
             dict(config=config(mode), layer=1, n_sources=3), {**model_weights(config(mode), 40 + i), **sources(50 + i, 3, d=16)},
             all_of(same_tensors('h', rtol=1e-10), same_values('routes')), None) for i, mode in enumerate(MODES)]
    # (the inputs from a given read, not the code's own: a wrong read point loses "one pseudo-query per route" alone)
    inputs = [(f"the attention inputs of an {mode} model from a read of {ROUTES_OF[mode]} route(s)",
               'attn_inputs_of', dict(config=config(mode), layer=1),
               {**model_weights(config(mode), 60 + i),
                'h': torch.randn(ROUTES_OF[mode], 2, 3, 16, generator=generator(70 + i), dtype=torch.float64)},
               same_tensors('x_qk', 'x_v', rtol=1e-10), None) for i, mode in enumerate(MODES)]
    return (
        Concept("one pseudo-query per route, the source gain folded in", 2,
                "stack getattr(self, name) for every route in self.routes (ctrl_dup's two routes share one name and "
                "are still two reads), times self.source_gain", tuple(read)),
        Concept("the attention inputs: q/k from the first route, v from the last, through norm_attn", 5,
                "x = self.norm_attn(h) for all routes at once (the same pre-norm for both, not norm_mlp), then x[0] "
                "for attention's q and k and x[-1] for its v", tuple(inputs)))


def source_names(l, S, L):
    """The sources sublayer l reads (l = L: the final read), in words: b_0 .. b_{n-1}, and the partial."""
    finished = 1 + (l // S if l < L else -(-L // S))
    names = [f'b_{i}' for i in range(finished)] + (['the partial'] if l < L and l % S else [])
    return names


def source_said(j, l, S, L):
    """Source j of sublayer l's read, and what it should be, in words."""
    names = source_names(l, S, L)
    if j == 0:
        return "b_0, which should be the embedding alone"
    if names[j] == 'the partial':
        return "the partial, which should be the sum of the current AttnRes block's outputs so far"
    return f"{names[j]}, which should be the sum of AttnRes block {j}'s own outputs (not a running sum; the embedding never added in)"


def read_said(l, L, route=None):
    """Sublayer l's read (l = L: the final read), in words, with its route where it has two."""
    if l == L:
        return 'the final read'
    return (f"sublayer {l}'s read ({'attention' if l % 2 == 0 else 'MLP'}"
            + (f", route {route})" if route not in (None, 'qk', 'mlp') else ')'))


def count_said(l, got, want, S, L, route=None):
    """A read's number of sources against the expected one, in words: which are missing or extra."""
    names = source_names(l, S, L)
    return (f"{read_said(l, L, route)} reads {got} source{'s' if got != 1 else ''}, not {want} ({', '.join(names)}): "
            f"{abs(got - want)} {'missing' if got < want else 'extra'}")


def whole(v):
    return isinstance(v, int) and not isinstance(v, bool)


def read_calls(meta):
    """The hook's record of the reads that ran, [[sublayer, number of sources, in the graph], ...], as the sandbox
    sent it; None where it is anything else (the submission's code can write there what it likes)."""
    calls = meta.get('calls')
    if not isinstance(calls, list) or not all(isinstance(c, list) and len(c) == 3 and whole(c[0]) and whole(c[1])
                                              and isinstance(c[2], bool) for c in calls):
        return None
    return calls


def increments(got, ref):
    """The whole model's logits; when they differ, the first read whose sources differ from the instructor's
    model's (seen by a hook on every read point), and which of its sources."""
    import torch
    problem = same_tensors('logits', rtol=1e-9, atol=1e-10)(got, ref)
    if not problem:
        return None
    S, L = ref[1]['S'], ref[1]['L']
    calls = read_calls(got[1])
    if calls is None:
        return f"{problem}: the record of the reads that ran could not be read"
    firsts = {}
    for k, call in enumerate(calls):   # each read point's first call (a read called twice: its first)
        firsts.setdefault(call[0], (k, call[1]))
    for k, (l, n, _) in enumerate(ref[1]['calls']):
        if l not in firsts:
            return f"{problem}: {read_said(l, L)} never ran"
        theirs, count = firsts[l]
        if count != n:
            return f"{problem}: the first read that differs: {count_said(l, count, n, S, L)}"
        for j in range(n):
            a, b = got[0].get(f'src{theirs}.{j}'), ref[0][f'src{k}.{j}']
            if not isinstance(a, torch.Tensor) or a.shape != b.shape or not torch.allclose(a.double(), b.double(),
                                                                                           rtol=1e-9, atol=1e-10):
                return f"{problem}: the first read that differs is {read_said(l, L)}: its source {source_said(j, l, S, L)}"
    return (f"{problem}: every read's sources are right, but the output is not the final read's: "
            "h = self.final_read(all the blocks, log)[0]")


def reads_recorded(got, ref):
    """The routing log: one entry per read point and route, in order, each with its number of sources."""
    S, L = ref[1]['S'], ref[1]['L']
    reads, want = got[1].get('reads'), ref[1]['reads']
    if not isinstance(reads, list) or not reads:
        return "no read was recorded: pass `log` to every read"
    if not all(isinstance(r, list) and len(r) == 3 and whole(r[0]) and (r[1] is None or isinstance(r[1], str))
               and whole(r[2]) for r in reads):
        return "the recorded reads could not be read"
    if len(reads) < len(want) and all(r in [w[:2] for w in want] for r in [r[:2] for r in reads]):
        missing = [read_said(l, L, route) for l, route, _ in want if [l, route] not in [r[:2] for r in reads]]
        return (f"{len(reads)} of the {len(want)} reads were recorded ({missing[0]} was not"
                f"{f', nor {len(missing) - 1} more' if len(missing) > 1 else ''}): pass `log` to every read")
    if [r[:2] for r in reads] != [r[:2] for r in want]:
        return ("the recorded reads are not one per read point and route, in order: call each read point once, with "
                "`log`")
    for (l, route, count), (_, _, n) in zip(reads, want):
        if count != n:
            return count_said(l, count, n, S, L, route)
    return None


def pseudo_queries_learn(got, ref):
    """Each pseudo-query's gradient given its read's own inputs (seen by a hook): a read of one source has a
    constant softmax (a zero gradient), a read of more must pass a gradient to its pseudo-query when it feeds the
    loss. So a wrong source is not counted here: only a read that runs apart from the loss."""
    L = ref[1]['L']
    states, calls = got[1].get('grads'), read_calls(got[1])
    if not isinstance(states, dict) or calls is None:
        return "the gradients could not be read"
    counts = {}
    for call in calls:
        counts.setdefault(call[0], call[1])
    cut = any(call[2] is False for call in calls)
    for name, l in ref[1]['sublayer_of'].items():
        if l not in counts:
            return f"{name} cannot learn: {read_said(l, L)} never ran (every read takes part in the forward pass)"
        want = 'nonzero' if counts[l] > 1 else 'zero'
        have = states.get(name)
        if want == 'nonzero' and have != 'nonzero':
            if cut:
                return (f"{name} gets no gradient, though {read_said(l, L)} runs: no gradient reaches the sources, a "
                        "source is cut from the graph (.detach(), .data or torch.no_grad()): keep every source in it")
            return (f"{name} gets no gradient, though {read_said(l, L)} runs: its output never reaches the loss "
                    "(every AttnRes block's source is read later; the last, shorter one by the final read)")
        if want == 'zero' and have not in ('zero', 'none'):
            return f"{name} gets a gradient from a read of one source, whose softmax is constant"
    return None


def assignment3():
    import torch
    cases = [('attnres', 1), ('attnres', 2), ('attnres', 3), ('attnres', 50), ('rd_attnres', 3), ('ctrl_heads', 4)]
    g = generator(80)
    idx = torch.randint(0, 64, (2, 13), generator=g)

    def probes(compare):
        return tuple((f"a forward pass of a 3-layer {mode} model, attnres_block_size {S}", 'forward',
                      dict(config=config(mode, S, n_layer=3)),
                      {**model_weights(config(mode, S, n_layer=3), 90 + S), 'idx': idx[:, :-1], 'targets': idx[:, 1:]},
                      compare, None) for mode, S in cases)
    # Each concept's probe isolates what it names, so that a mistake loses the concepts it breaks: the logits
    # (whose failure is traced to the first read whose sources differ), the log's reads and their counts, each
    # pseudo-query's gradient given what its own read was given
    return (
        Concept("sources are increments: the embedding, finished blocks, the partial", 5,
                "b_0 is the embedding alone; a block's source is the sum of its sublayers' outputs (not a running "
                "sum of everything so far); it closes after its S-th sublayer; the last, shorter block is closed "
                "before the final read", probes(increments)),
        Concept("every read point reads its sources and is recorded", 2,
                "sublayer l reads 1 + l // S + (l % S != 0) sources, the final read 1 + ceil(L / S); pass `log` to "
                "every read", probes(reads_recorded)),
        Concept("every pseudo-query learns", 1,
                "a read's pseudo-query learns when its output reaches the loss: keep every source in the graph (no "
                ".detach(), .data or torch.no_grad()) and read every block later (the last, shorter one in the final "
                "read)", probes(pseudo_queries_learn)))


def same_anywhere(n_windows):
    """A step's windows asked by another rank are the ones a single process gets: M windows of the data (indices
    of its n_windows) that change from step to step (so a fixed list is no order); whether they are the right
    ones is the exact order's concept."""
    return lambda got, ref: windows_anywhere(got, ref, n_windows)


def windows_anywhere(got, ref, n_windows):
    v = got[1]
    here, alone, after = v.get('windows'), v.get('alone'), v.get('next')
    n = len(ref[1]['alone'])
    if not all(isinstance(x, list) and all(whole(i) for i in x)
               for x in (here, alone, after)):
        return f"a step's windows should be a list of ints; got {their_value(alone)}"
    if here != alone:
        return ("another rank got other windows than a single process: return the whole step, whoever asks "
                "(nothing may depend on RANK or WORLD_SIZE)")
    if len(alone) != n:
        return f"a step has {len(alone)} windows, not M = {n}: the whole step, all ranks together"
    if not all(0 <= i < n_windows for i in alone):
        return f"a step's windows should be indices of the data's {n_windows} windows (0 to {n_windows - 1})"
    if alone == after:
        return "the windows are the same at every step: no data order"
    return None


def assignment4():
    def probes(env, cases):
        return tuple((f"the windows of step {step} ({w} per step, {n} windows, seed {seed})"
                      + (f", asked by rank {env['RANK']} of {env['WORLD_SIZE']}" if env['WORLD_SIZE'] > 1 else ''),
                      'step_windows', dict(step=step, n_windows=n, windows_per_step=w, seed=seed, env=env), {},
                      same_values('windows'), None) for step, n, w, seed in cases)
    one = dict(RANK=0, LOCAL_RANK=0, WORLD_SIZE=1)

    def anywhere(env, cases):   # (the code's own order asked by another rank: its independence, not its order)
        return tuple((f"the windows of step {step} ({w} per step, {n} windows, seed {seed}), asked by rank "
                      f"{env['RANK']} of {env['WORLD_SIZE']} and by one process", 'step_windows_anywhere',
                      dict(step=step, n_windows=n, windows_per_step=w, seed=seed, env=env), {}, same_anywhere(n), None)
                     for step, n, w, seed in cases)
    return (
        Concept("the exact order: each epoch a seed-keyed permutation, steps crossing epochs", 2,
                "epoch e is window_order(n_windows, seed, e); step s takes positions [s*M, (s+1)*M) of the endless "
                "sequence of epochs",
                probes(one, [(0, 1000, 64, 5), (15, 1000, 64, 5), (16, 1000, 64, 5), (47, 1000, 64, 5),
                             (3, 100, 250, 2), (7, 4096, 512, 1)])),
        Concept("the same order on any number of processes", 4,
                "return the whole step's M windows, whoever asks: train.py splits them between the ranks; nothing "
                "may depend on RANK or WORLD_SIZE",
                anywhere(dict(RANK=1, LOCAL_RANK=1, WORLD_SIZE=2), [(15, 1000, 64, 5), (3, 100, 250, 2)])
                + anywhere(dict(RANK=3, LOCAL_RANK=3, WORLD_SIZE=4), [(31, 1000, 64, 7), (2, 4096, 512, 1)])))


def assignment5():
    def probes(*cases):
        return tuple((f"paired_stats of {len(d)} differences", 'paired_stats', dict(deltas=d), {}, close_stats, None)
                     for d in cases)
    return (
        Concept("the paired table", 2, "sample sd over n - 1; half-width t(0.975, n-1) * sd / sqrt(n)",
                probes([-0.03, -0.02, -0.04, -0.01, -0.05], [0.011, -0.023, 0.031, -0.047, 0.002])),
        Concept("the statistics on other values", 2,
                "a tie (delta = 0) is neither a win nor a loss: the sign test counts the wins out of the pairs that "
                "are not ties, n - ties of them; p = min(1, 2 * sum_{i <= k} C(n, i) / 2^n)",
                probes([0.01, -0.03], [-0.01] * 9 + [0.0], [0.02, 0.05, -0.01], [-0.1, 0.2, -0.3, 0.05, -0.07, 0.0, 0.4])),
        Concept("one pair (n = 1)", 2,
                "with one pair there is no spread: sd and the interval are NaN (no division by n - 1 = 0), the sign "
                "test gives p = 1", probes([0.02], [-0.015])))


CONCEPTS = {1: assignment1, 2: assignment2, 3: assignment3, 4: assignment4, 5: assignment5}
_built = {}


def concepts(n):
    """The concepts of assignment n, their probes' inputs made once."""
    if n not in _built:
        _built[n] = CONCEPTS[n]()
    return _built[n]


# -----------------------------------------------------------------------------
# The sandbox

class NoSandbox(Exception):
    pass


def python_paths():
    """The folders Python and its packages live in: read-only in the sandbox."""
    import site
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             *site.getsitepackages()}
    return sorted(p for p in paths if os.path.isdir(p))


UID_BLOCKS, UID_BLOCK = 1000, 100_000   # a grader's uids: one block of its own, FIRST_UID + block * UID_BLOCK + i
_uids = None
_uid_lock = threading.Lock()
_uid_claim = None   # the open lock file of this process's block: held until the process ends


def uid_lock_folder():
    """The folder of the uid blocks' lock files: root's (or this user's) own, mode 0700, never a link (a
    sandboxed user may create names in /tmp first: such a folder is not used, the next name is)."""
    base = os.path.join(tempfile.gettempdir(), f'rd-attnres-course-uids-{os.geteuid()}')
    for i in range(100):
        folder = base if i == 0 else f'{base}-{i}'
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(folder)
        if os.path.isdir(folder) and not os.path.islink(folder) and st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0:
            return folder
    raise NoSandbox(f"no folder of its own for the uid sandbox's locks next to {base}: remove the folders named so")


def claim_uid_block():
    """A block of uids no other grader on this machine holds: the first block whose lock file this process can
    lock (flock, released by the kernel when the process ends, however it ends)."""
    import fcntl
    global _uid_claim
    folder = uid_lock_folder()
    for block in range(UID_BLOCKS):
        fd = os.open(os.path.join(folder, f'block-{block}'), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _uid_claim = fd
        return block
    raise NoSandbox(f"every one of the {UID_BLOCKS} blocks of uids is held by a grader running now: wait for one")


def next_uid():
    """A uid for one sandbox: never given twice by this process, and never one another grader running on this
    machine gives (each grader claims a block of UID_BLOCK uids of its own, claim_uid_block)."""
    global _uids
    with _uid_lock:
        if _uids is None:
            _uids = itertools.count(FIRST_UID + claim_uid_block() * UID_BLOCK)
        return next(_uids)


SANDBOXES = ('bubblewrap', 'uid', 'none')


def check_sandbox(sandbox):
    """NoSandbox with what to do, where grading cannot run student code in `sandbox`; else what the sandbox loses
    on this machine, in one line (the uid sandbox where Landlock cannot be used), or None."""
    if sandbox == 'bubblewrap':
        sandbox_command(os.path.dirname(os.path.abspath(__file__)))
        probe = subprocess.run(sandbox_command('/', 1)[:-4] + ['/bin/true'], env={}, capture_output=True, text=True)
        if probe.returncode != 0:
            raise NoSandbox(f"bubblewrap cannot start a sandbox here ({last_line(probe.stderr) or probe.returncode}): "
                            "this machine or container does not allow the namespaces it needs. As root, grade with "
                            "--sandbox uid (a user of its own: COURSE.md says what it loses).")
    elif sandbox == 'uid' and os.geteuid() != 0:
        raise NoSandbox("--sandbox uid runs each submission as a user of its own, which only root can do: run the "
                        "grader as root, or use bubblewrap (the default)")
    elif sandbox == 'uid':   # that user must be able to run this Python and its packages, and reach the tree
        python = (sys.executable, os.path.realpath(sys.executable), *python_paths())
        needed = [(p, 'this Python and its packages') for p in python]
        needed.append((os.path.join(tempfile.gettempdir(), 'x'), 'the temporary folder the grading tree is made in'))
        for path, what in needed:
            closed = closed_to_others(path)
            if closed:
                raise NoSandbox(f"--sandbox uid: a submission's user of its own cannot enter {closed}, which holds "
                                f"{what}: open it to every user (chmod o+x {closed}, and the same for the folders "
                                "above it), or install Python and the packages where every user can reach them "
                                "(as Gradescope's image does: /usr, or a venv under /autograder) with TMPDIR=/tmp")
    elif sandbox not in SANDBOXES:
        raise NoSandbox(f"no sandbox {sandbox!r}: choose one of {', '.join(SANDBOXES)}")
    return '; and '.join(x for x in (what_is_lost(sandbox, *worker_probe(sandbox)), memory_lost(sandbox)) if x) or None


def memory_lost(sandbox):
    """What `sandbox` loses where no memory cgroup can be made here, in one clause, or None."""
    cgroups, why = memory_cgroups()
    if sandbox == 'none' or cgroups:
        return None
    return (f"--sandbox {sandbox}: a memory cgroup cannot be made here ({why}): a submission can hold "
            f"{MEMORY // 2 ** 30} GB in each of {PROCESSES} processes (COURSE.md, \"The sandbox\")")


# What a submission could do were a mechanism missing, and the mechanisms that each stop it (any one suffices), for
# each sandbox: said where all of them are missing here, under the first (LANDLOCK, SECCOMP, NAMESPACES)
LANDLOCK, SECCOMP, NAMESPACES = 'Landlock', 'seccomp', 'namespaces'
SHARED_WRITES = ("write to the machine's shared temporary folders (/tmp, /var/tmp, /dev/shm, /run/lock) like any user "
                 "(64 MB a file but not bounded in total, removed after its run)")
OTHER_FILES = ("read every file that other users may read (the kit's own secret files are checked closed first): "
               "a copy of the project elsewhere on the machine, a student's folder beside the one graded alone")
UNCOUNTED = "hold memory its address-space limit does not count (memfd_create)"
SYSTEM_V = "share System V shared memory, message queues and semaphores with a student graded at the same time"
UDP = "send UDP datagrams to the machine's ports (127.0.0.1)"
TCP = "connect to the machine's TCP ports"
ABSTRACT = "connect to abstract Unix sockets outside its own processes"
UNIX_FILES = "connect to the Unix sockets in the file system that every user may connect to"
PROCESSES_SEEN = ("see every process on the machine in /proc, with its command line (the grader's, with its class "
                  "and --out folders, among them)")


def losses(sandbox, abi):
    """[(what a submission could do, the mechanisms that each stop it)] in `sandbox` with Landlock's ABI `abi` (0:
    none; TCP is Landlock's from ABI 4, abstract sockets from ABI 6)."""
    if sandbox == 'bubblewrap':   # (its own namespaces and tmpfs of FILE_SIZE: what Landlock and sockets would reach)
        return [(UNCOUNTED, (SECCOMP,))]
    if sandbox != 'uid':
        return []
    return [(SHARED_WRITES, (LANDLOCK,)), (OTHER_FILES, (LANDLOCK,)), (UNCOUNTED, (SECCOMP,)),
            (SYSTEM_V, (SECCOMP, NAMESPACES)),
            (TCP, (LANDLOCK,) * (abi == 0 or abi >= 4) + (SECCOMP, NAMESPACES)), (UDP, (SECCOMP, NAMESPACES)),
            (ABSTRACT, (LANDLOCK,) * (abi == 0 or abi >= 6) + (SECCOMP, NAMESPACES)), (UNIX_FILES, (SECCOMP,)),
            (PROCESSES_SEEN, (NAMESPACES,))]


def what_is_lost(sandbox, abi, why_landlock='', why_seccomp='', why_namespaces=''):
    """What `sandbox` loses on this machine, in one line, or None: for each mechanism that cannot be used here (why:
    its reason; Landlock where abi is 0), "--sandbox S: <it> cannot be used here (why): a submission can ..." with
    each loss that no other mechanism stops, said once, under the first of them."""
    missing = {LANDLOCK: why_landlock if not abi else '', SECCOMP: why_seccomp, NAMESPACES: why_namespaces}
    said, clauses = set(), []
    where = '"Where bubblewrap cannot start"' if sandbox == 'uid' else '"The sandbox"'
    for mechanism in (LANDLOCK, SECCOMP, NAMESPACES):
        if not missing[mechanism]:
            continue
        lost = [what for what, stoppers in losses(sandbox, abi)
                if mechanism in stoppers and what not in said and all(missing[m] for m in stoppers)]
        if lost:
            said.update(lost)
            clauses.append(f"--sandbox {sandbox}: {mechanism} cannot be used here ({shown(missing[mechanism], 120)}): "
                           f"a submission can {', '.join(lost[:-1]) + ' and ' if len(lost) > 1 else ''}{lost[-1]} "
                           f"(COURSE.md, {where})")
    return '; and '.join(clauses) or None


# What a worker does before any student code runs, done once by a process of the sandbox's kind: the uid sandbox's
# user (FIRST_UID - 1, after namespaces of its own) or this process's, with an empty environment. Its result: whether
# Landlock takes writing from the worker here (so the grader asks every worker to: run_worker), whether the seccomp
# filter refuses what it should, whether namespaces hide the machine's processes (the uid sandbox), and that torch
# starts without writing.
PROBE = """import importlib.util, json, os, socket, sys, tempfile
spec = importlib.util.spec_from_file_location('course_worker', sys.argv[1])
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)
ns = ''
if sys.argv[3]:
    try:
        worker.own_namespaces()
    except OSError as e:
        ns = e.strerror or str(e)
if sys.argv[2]:
    os.setgroups([]); os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[2]))
if sys.argv[3] and not ns and sorted(p for p in os.listdir('/proc') if p.isdigit()) != [str(os.getpid())]:
    ns = 'its /proc shows other processes'
abi, why = worker.landlock_abi(), ''
try:
    worker.confine(json.loads(sys.argv[4]))
    try:
        os.remove(tempfile.mkstemp()[1])
        abi, why = 0, 'it took no writes'
    except PermissionError:
        pass
except OSError as e:
    abi, why = 0, e.strerror or str(e)
ipc = ''
try:
    worker.no_sharing()
    for refused in (lambda: os.close(os.memfd_create('probe')), lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)):
        try:
            refused()
            ipc = 'it refused nothing'
        except PermissionError:
            pass
except OSError as e:
    ipc = e.strerror or str(e)
import torch, safetensors
print(json.dumps([abi, why, ipc, ns]))
"""
_probed = {}   # the probing user ('': this process's) -> (ABI, why not, why seccomp not, why namespaces not)
_probe_lock = threading.Lock()


def worker_probe(sandbox):
    """(Landlock's ABI, '', '', '') where the worker of `sandbox` takes writing from itself, refuses memfd, System V
    IPC and sockets (course_worker.no_sharing) and, in the uid sandbox, moves into namespaces of its own
    (course_worker.own_namespaces); else 0 and why not in the first place, why not in the second, why not in the
    third; NoSandbox where a process of the sandbox's kind cannot start torch. Asked once per process and sandbox."""
    user = str(FIRST_UID - 1) if sandbox == 'uid' else ''   # (bubblewrap's worker: as this process, for Landlock)
    with _probe_lock:
        if user not in _probed:
            # (the uid sandbox's worker reads only uid_readable(): torch started under it here, so that a list
            # that misses a folder Python needs fails once, here, not in every student's run)
            readable = json.dumps(uid_readable() if user else None)
            p = subprocess.run([sys.executable, '-I', '-c', PROBE, course_worker.__file__, user, '1' if user else '',
                                readable], env={}, cwd='/', capture_output=True, text=True)
            try:
                abi, why, ipc, ns = json.loads(p.stdout.strip().split('\n')[-1])
            except (ValueError, IndexError):
                if sandbox == 'uid':
                    raise NoSandbox(f"--sandbox uid: a user of its own cannot run this Python ({sys.executable}: "
                                    f"{last_line(p.stderr) or p.returncode}); install Python and the packages where "
                                    "every user can read them (as Gradescope's image does: /usr, or a venv under "
                                    "/autograder)") from None
                raise NoSandbox(f"this Python cannot start torch as a sandbox's worker does ({sys.executable}: "
                                f"{last_line(p.stderr) or p.returncode})") from None
            _probed[user] = (int(abi), str(why), str(ipc), str(ns))
        return _probed[user]


def readable_by_others(paths):
    """The paths among `paths` that a user who is neither their owner nor in their group (the uid sandbox's
    user, with no groups) can read: open, for a file; list, for a folder. Asked of such a user itself (a
    process that becomes FIRST_UID - 1), so that every folder above, ACLs and mounts count as they are."""
    code = ('import json, os, sys\nos.setgroups([]); os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))\n'
            'out = []\nfor p in json.loads(sys.stdin.read()):\n    try:\n'
            '        os.listdir(p) if os.path.isdir(p) else os.close(os.open(p, os.O_RDONLY | os.O_NONBLOCK))\n'
            '        out.append(p)\n    except OSError:\n        pass\nprint(json.dumps(out))\n')
    p = subprocess.run([sys.executable, '-I', '-S', '-c', code, str(FIRST_UID - 1)], input=json.dumps(list(paths)),
                       env={}, cwd='/', capture_output=True, text=True)
    try:
        out = json.loads(p.stdout)
    except ValueError:
        raise NoSandbox(f"--sandbox uid: could not ask a user of its own what it can read "
                        f"({last_line(p.stderr) or p.returncode})") from None
    return [x for x in out if x in paths]


def closed_to_others(path):
    """The first folder on the way to path (path itself where it is a folder) that a user who is neither its
    owner nor in its group cannot enter (no o+x), or None: the uid sandbox's user is such a user."""
    path = os.path.abspath(path)
    path = path if os.path.isdir(path) else os.path.dirname(path)
    folders = [path]
    while folders[-1] != '/':
        folders.append(os.path.dirname(folders[-1]))
    for folder in reversed(folders):
        try:
            if not os.stat(folder).st_mode & 0o001:
                return folder
        except OSError:
            return folder
    return None


SHARED_FOLDERS = ('/tmp', '/var/tmp', '/dev/shm', '/run/lock', '/var/lock')   # every user may write in them


# -----------------------------------------------------------------------------
# A memory cgroup of its own for each run, where this process can make one (root, and a memory controller in
# which its own cgroup may have children: cgroup v1's memory hierarchy, or v2 with memory enabled below it): every
# process of the run together holds at most MEMORY, the memory its tmpfs files take included. The address-space
# limit is per process: without a cgroup, PROCESSES processes of MEMORY each (grading says so: check_sandbox)

def memory_cgroups():
    """(the folder new memory cgroups are made in, the file of their limit, the file of their out-of-memory
    kills), or (None, why not) where none can be made here (or swap would hold what the limit does not)."""
    if os.geteuid() != 0:
        return None, 'only root can make them'
    if not os.access('/bin/sh', os.X_OK):
        return None, 'no /bin/sh to start a run in its cgroup'
    try:
        lines = open('/proc/self/cgroup').read().splitlines()
    except OSError as e:
        return None, f"/proc/self/cgroup cannot be read ({e.strerror})"
    for line in lines:
        _, controllers, path = line.split(':', 2)
        if 'memory' in controllers.split(','):   # (v1: a hierarchy of the memory controller's own)
            base = os.path.join('/sys/fs/cgroup/memory', path.lstrip('/'))
            if os.path.isfile(os.path.join(base, 'memory.limit_in_bytes')) and os.access(base, os.W_OK):
                if swap_on() and not os.path.isfile(os.path.join(base, 'memory.memsw.limit_in_bytes')):
                    return None, 'swap is on and this kernel does not count it in a cgroup (no memory.memsw)'
                return (base, 'memory.limit_in_bytes', 'memory.oom_control'), ''
        elif controllers == '':                  # (v2: one hierarchy, memory enabled for children or not)
            for mount in ('/sys/fs/cgroup', '/sys/fs/cgroup/unified'):
                base = os.path.join(mount, path.lstrip('/'))
                try:
                    enabled = open(os.path.join(base, 'cgroup.subtree_control')).read().split()
                except OSError:
                    continue
                if 'memory' in enabled and os.access(base, os.W_OK):
                    return (base, 'memory.max', 'memory.events'), ''
    return None, 'no memory controller in which this process may make a cgroup'


def swap_on():
    try:
        return len(open('/proc/swaps').read().splitlines()) > 1
    except OSError:
        return False


class MemoryCgroup:
    """A cgroup of the memory controller for one run, made in `where` (memory_cgroups()'s first answer), limited to
    `limit` bytes, swap included (v1: memory and swap together; v2: no swap); `wrap(cmd)` starts cmd in it (a shell
    that moves itself in, then runs cmd: every process cmd starts is in it too; where it cannot move, it ends with
    EX_OSERR before cmd runs, which run_worker says is the grader's failure, never the student's)."""

    def __init__(self, where, limit):
        self.base, self.limit_file, self.events = where
        self.path = tempfile.mkdtemp(prefix='rd-attnres-', dir=self.base)
        for name, value in ((self.limit_file, limit), ('memory.memsw.limit_in_bytes', limit), ('memory.swap.max', 0)):
            if os.path.exists(os.path.join(self.path, name)):
                with open(os.path.join(self.path, name), 'w') as f:
                    f.write(str(value))

    def wrap(self, cmd):
        # (PWD unset: the shell sets it, and bubblewrap's sandbox is to start with an empty environment)
        return ['/bin/sh', '-c', f'unset PWD; echo $$ > "$0" || exit {course_worker.EX_OSERR}; exec "$@"',
                os.path.join(self.path, 'cgroup.procs'), *cmd]

    def out_of_memory(self):
        """Whether the kernel killed a process of the run for the cgroup's limit."""
        try:
            text = open(os.path.join(self.path, self.events)).read()
        except OSError:
            return False
        return any(line.split()[:1] == ['oom_kill'] and int(line.split()[1]) > 0 for line in text.splitlines())

    def remove(self):
        """Every process still in it killed, then the cgroup removed (once its last process is reaped)."""
        for _ in range(100):
            try:
                for pid in open(os.path.join(self.path, 'cgroup.procs')).read().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.05)


def end_processes_of(uid, tops=()):
    """Every process of user `uid` ended (the uid sandbox's tree, whatever it started), its System V shared memory,
    message queues and semaphores removed (they outlive processes), and the files it left in the machine's shared
    temporary folders removed (where Landlock took its writes, there are none). A process of that user sends the
    kill: kill(-1) reaches every process it may signal, that is every process of the user, and never itself.
    Returns the bytes of disk the removed files held (also those in the grader's TMPDIR, where its own TMPDIR and
    HOME lie)."""
    code = ('import os, signal, sys\nos.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))\n'
            'for _ in range(100):\n    try:\n        os.kill(-1, signal.SIGKILL)\n    except ProcessLookupError:\n'
            '        break\n')
    subprocess.run([sys.executable, '-I', '-S', '-c', code, str(uid)], env={}, check=True)
    remove_ipc_of(uid)
    took = 0   # bytes of disk its files held (st_blocks: a sparse file holds what it wrote, not its size)
    for top in dict.fromkeys(os.path.realpath(p) for p in (*SHARED_FOLDERS, tempfile.gettempdir(), *tops)):
        for path, is_folder in reversed(tree_of(top)):   # (what is inside a folder before the folder)
            try:
                st = os.lstat(path)
                if st.st_uid == uid:
                    os.rmdir(path) if is_folder else os.remove(path)
                    took += 0 if is_folder else st.st_blocks * 512
            except OSError:   # (a folder that still holds another user's files stays)
                pass
    return took


def ipc_of(uid):
    """[(kind, id)] of the System V IPC objects (shm, msg, sem) that user `uid` created or owns (/proc/sysvipc)."""
    found = []
    for kind in ('shm', 'msg', 'sem'):
        try:
            with open(f'/proc/sysvipc/{kind}') as f:
                head, *rows = [line.split() for line in f if line.strip()]
        except (OSError, ValueError):
            continue
        for row in rows:
            if len(row) == len(head) and uid in (int(row[head.index('uid')]), int(row[head.index('cuid')])):
                found.append((kind, int(row[1])))
    return found


def remove_ipc_of(uid):
    """The System V IPC objects of user `uid` removed (IPC_RMID; a shared memory segment still attached goes when
    the last process detaches, and every one of them has ended)."""
    import ctypes
    libc, IPC_RMID = ctypes.CDLL(None, use_errno=True), 0
    for kind, ipc_id in ipc_of(uid):
        if kind == 'sem':
            libc.semctl(ipc_id, 0, IPC_RMID)         # (the set's semaphore number, unused by IPC_RMID)
        else:
            getattr(libc, f'{kind}ctl')(ipc_id, IPC_RMID, None)   # shmctl, msgctl


def tree_of(top):
    """[(path, is a folder)] of everything under top, each folder before what it holds, links not followed.
    A loop, not a recursion (os.walk and shutil.rmtree recurse): a tree a thousand folders deep, which code in
    the uid sandbox can leave in /tmp, is walked like any other."""
    found, stack = [], [top]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                is_folder = e.is_dir(follow_symlinks=False)
            except OSError:
                continue
            found.append((e.path, is_folder))
            if is_folder:
                stack.append(e.path)
    return found


SYSTEM_FOLDERS = ('/usr', '/lib', '/lib32', '/lib64', '/bin', '/sbin', '/etc')   # read-only in either sandbox
DEVICES = ('/dev/null', '/dev/zero', '/dev/full', '/dev/random', '/dev/urandom')   # (not the machine's /dev/shm)


def uid_readable(*own):
    """What the uid sandbox's worker may read (Landlock): what bubblewrap's sandbox shows (the system's folders,
    Python's, /proc and /sys, the devices honest code opens), and its own folders."""
    return [*SYSTEM_FOLDERS, '/proc', '/sys', *DEVICES, *python_paths(), *own]


def sandbox_command(tree, cpu_seconds=60, no_writes=False):
    """bubblewrap's command line for a worker in `tree` (read-only at /grade) with cpu_seconds of CPU time in
    all (no_writes: worker_env), or NoSandbox."""
    bwrap = shutil.which('bwrap')
    if not bwrap:
        raise NoSandbox("grading runs each submission in a sandbox and needs bubblewrap, which is not installed "
                        "(Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap). Only if every "
                        "submission is trusted (your own, say), grade with --trusted instead.")
    cmd = [bwrap, '--die-with-parent', '--new-session', '--unshare-pid', '--unshare-net', '--unshare-ipc',
           '--unshare-uts', '--unshare-cgroup-try']
    if os.geteuid() != 0:
        cmd += ['--unshare-user']   # unprivileged: a user namespace; as root the worker drops to a user of its own
    for path in SYSTEM_FOLDERS:
        if os.path.islink(path):
            cmd += ['--symlink', os.readlink(path), path]
        elif os.path.isdir(path):
            cmd += ['--ro-bind', path, path]
    # every writable place is a tmpfs of FILE_SIZE: /tmp (first: Python may live under /tmp) and /dev/shm; the
    # root and /dev are remounted read-only at the end
    cmd += ['--perms', '1777', '--size', str(FILE_SIZE), '--tmpfs', '/tmp']
    made = {'/tmp'}
    for path in python_paths():   # (the folders above them made readable: bubblewrap makes them 0700)
        parents = [p for p in (os.path.dirname(path[:i]) for i in range(len(path) + 1) if path[i:i + 1] in ('/', ''))
                   if p not in ('/', '') and not any(p == x or p.startswith(x + '/') for x in ('/usr', '/lib', '/etc'))]
        for parent in sorted(set(parents) - made, key=len):
            cmd += ['--perms', '0755', '--dir', parent]
            made.add(parent)
        cmd += ['--ro-bind', path, path]
    cmd += ['--ro-bind', tree, '/grade', '--proc', '/proc', '--dev', '/dev',
            '--perms', '1777', '--size', str(FILE_SIZE), '--tmpfs', '/dev/shm', '--remount-ro', '/dev',
            '--remount-ro', '/', '--chdir', '/grade', '--clearenv']
    for key, value in worker_env(cpu_seconds, no_writes).items():
        cmd += ['--setenv', key, value]
    return cmd + [sys.executable, '-I', '-B', '/grade/course_worker.py']


def worker_env(cpu_seconds, no_writes=False, namespaces=False, readable=None):
    """The worker's whole environment: nothing of the grader's (it may hold secrets), its limits (with no_writes:
    Landlock takes writing from it, course_worker.confine, and with `readable` every read but beneath those
    folders; with namespaces: it moves into namespaces of its own before it becomes its user,
    course_worker.own_namespaces), and, as root, the user it becomes."""
    env = dict(PATH='/usr/bin:/bin', HOME='/tmp', OMP_NUM_THREADS='1', PYTHONDONTWRITEBYTECODE='1',
               COURSE_WORKER_LIMITS=json.dumps(dict(memory=MEMORY, cpu_seconds=int(cpu_seconds) + 1,
                                                    file_size=FILE_SIZE, processes=PROCESSES, no_writes=no_writes,
                                                    namespaces=namespaces, readable=readable)))
    if os.geteuid() == 0:
        env['COURSE_WORKER_USER'] = str(next_uid())
    return env


class Answers:
    """The worker's output file as it grows: how many of its frames so far are answers (the ready frame, then
    one per concept: a safetensors blob whose header says 'ready' or holds a list of results). Each frame is
    read once; the first frame that is not an answer (an empty one, a cut or garbled one) ends the count for
    good: what follows it is never read, so writing frames cannot move the clock (run_worker)."""

    def __init__(self, path, most):
        self.path, self.most, self.at, self.count, self.broken = path, most, 0, 0, False

    def __call__(self):
        size = os.path.getsize(self.path)
        with open(self.path, 'rb') as f:
            while not self.broken and self.count < self.most and self.at + 8 <= size:
                f.seek(self.at)
                (length,) = struct.unpack('<Q', f.read(8))
                if self.at + 8 + length > size:
                    break   # (still being written)
                if length > FILE_SIZE:
                    self.broken = True
                    break
                try:
                    _, meta = course_worker.unpack(f.read(length), course_worker.MAX_ANSWER_HEADER)
                    ok = isinstance(meta, dict) and (meta.get('ready') is True if self.count == 0 else
                                                     isinstance(meta.get('results'), list))
                except Exception:   # noqa: BLE001 (whatever the bytes are, they are not an answer)
                    ok = False
                if not ok:
                    self.broken = True
                    break
                self.at, self.count = self.at + 8 + length, self.count + 1
        return self.count


class DiskFull(Exception):
    """Grading itself could not write (the disk of its folder was full during a run): the row is "not graded: the
    disk was full", flagged, never a 0 that blames the student's code."""


FULL_BELOW = 2 ** 20   # bytes free on the grading folder's disk under which it counts as full
FILLED = 16 * 2 ** 20  # bytes a run's own files held, past which a disk full while it ran is its own doing


def disk_full(path):
    """Whether the file system of `path` has less than FULL_BELOW bytes free (for this process: root's reserve not
    counted), or cannot be asked."""
    try:
        st = os.statvfs(path)
    except OSError:
        return True
    return st.f_bavail * st.f_frsize < FULL_BELOW


def wait_for_room(cpu_seconds):
    """Wait until the grading folder's disk has room again (a run that filled it ends within its start-up and
    twice its CPU time per concept, and its files go with it), at most that long."""
    until = time.time() + STARTUP + 2 * cpu_seconds
    while disk_full(grading_folder()) and time.time() < until:
        time.sleep(0.2)


_grading_folder = None


def grading_folder():
    """This grader's own folder, made once per process in the temporary folder: the students' folders (each
    with its tree, and under the uid sandbox its user's TMPDIR and HOME) and the runs' outputs. Mode 0711: the
    sandbox's user passes through it to its own folder, but cannot list it; each folder in it has a random name
    (mkdtemp) and mode 0700, the student's user's alone (run_worker) or the grader's. Removed when the grader
    ends."""
    global _grading_folder
    with _uid_lock:
        if _grading_folder is None or not os.path.isdir(_grading_folder):
            import atexit
            _grading_folder = tempfile.mkdtemp(prefix='rd-attnres-grading-')
            os.chmod(_grading_folder, 0o711)
            atexit.register(remove_tree, _grading_folder)
        return _grading_folder


def remove_tree(top):
    """top and everything under it removed, however deep (tree_of: no recursion), links not followed."""
    for path, is_folder in reversed(tree_of(top)):
        try:
            os.rmdir(path) if is_folder else os.remove(path)
        except OSError:
            pass
    try:
        os.rmdir(top)
    except OSError:
        pass


def captured(stream, keep):
    """A thread that reads `stream` to its end and keeps only its last `keep` bytes (in .tail): what the code
    prints is capped where it is captured, never first written to a disk."""
    out = bytearray()

    def drain():
        while True:
            try:
                chunk = os.read(stream.fileno(), 65536)   # (what is there: the tail is current whenever it ends)
            except (OSError, ValueError):
                break
            if not chunk:
                break
            out.extend(chunk)
            del out[:-keep]
        stream.close()
    t = threading.Thread(target=drain, daemon=True)
    t.tail = out
    t.start()
    return t


def run_worker(tree, request, n_concepts, cpu_seconds, sandbox):
    """Run the worker on `request` (bytes) for n_concepts concepts: (answers bytes, stderr text, what ended it
    early (None, 'cpu', 'clock', 'killed', 'disk': the grading folder's disk was full while it ran, or 'filled':
    full, and the run's own files held FILLED bytes of it), seconds).
    Each concept has cpu_seconds of CPU time (the worker's own limit: a loop) and twice that in wall-clock time
    from the previous answer (this clock: code that sleeps or waits); the worker's first frame says it is ready
    (Python and torch started, within STARTUP). Once every concept has answered, whatever the code left running
    ends with the sandbox. `tree` lies in a student's folder of grading_folder(): under the uid sandbox that
    folder becomes the sandbox user's alone (0700) for the run, with its TMPDIR and HOME in it."""
    abi, _, _, no_namespaces = worker_probe(sandbox)
    uid, no_writes = None, abi > 0   # (Landlock here: the worker takes its writes from itself)
    if sandbox == 'bubblewrap':   # (bubblewrap itself starts with an empty environment: the code's /proc/1/environ is empty)
        env, cmd = {}, sandbox_command(tree, cpu_seconds * n_concepts, no_writes)
    else:   # (the uid sandbox: namespaces of its own where the kernel makes them here; with Landlock, it reads
        # what bubblewrap's sandbox shows: the system's folders, Python's, and its own student folder)
        student = os.path.dirname(os.path.abspath(tree))
        env, cmd = (worker_env(cpu_seconds * n_concepts, no_writes, sandbox == 'uid' and not no_namespaces,
                               uid_readable(student) if no_writes and sandbox == 'uid' else None),
                    [sys.executable, '-I', '-B', os.path.join(tree, 'course_worker.py')])
        if sandbox == 'uid':   # the worker becomes a user of its own (COURSE_WORKER_USER) before it reads anything
            uid = int(env['COURSE_WORKER_USER'])
            home = os.path.join(student, f'home-{uid}')
            os.mkdir(home, 0o700)
            os.chown(home, uid, uid)
            os.chown(student, uid, uid)   # (0700: no other student's user can enter it, nor list grading_folder())
            os.chmod(student, 0o700)
            env.update(HOME=home, TMPDIR=home)
        else:                  # none: trusted code runs as we are
            env.pop('COURSE_WORKER_USER', None)
    work, cgroup = tempfile.mkdtemp(dir=grading_folder()), None   # the outputs: the grader's alone, outside the tree
    try:
        where = memory_cgroups()[0] if sandbox != 'none' else None
        if where:
            cgroup = MemoryCgroup(where, MEMORY)
            cmd = cgroup.wrap(cmd)
        paths = [os.path.join(work, name) for name in ('request', 'answers')]
        with open(paths[0], 'wb') as f:
            f.write(request)
        t0, ended, done, full, took = time.time(), None, 0, False, 0
        with open(paths[0], 'rb') as stdin, open(paths[1], 'wb') as stdout:
            proc = subprocess.Popen(cmd, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, cwd=tree, env=env,
                                    start_new_session=True)
            stderr = captured(proc.stderr, 20_000)
            deadline = t0 + STARTUP   # until the worker says it is ready (its first frame), then per concept
            answered = Answers(paths[1], n_concepts + 1)   # (only an answer moves the clock, never any frame)
            try:
                while proc.poll() is None:
                    count = answered()
                    full = full or disk_full(work)
                    if count > done:
                        done, deadline = count, time.time() + 2 * cpu_seconds
                    if done > n_concepts:   # (the ready frame and every concept's answers)
                        break
                    if time.time() > deadline:
                        ended = 'clock'
                        break
                    time.sleep(0.05)
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)   # (the sandbox's PID namespace goes with it)
                except ProcessLookupError:
                    pass
                proc.wait()
                if uid is not None:   # (no PID namespace: every process of its user, wherever it went)
                    took = end_processes_of(uid)
                stderr.join(10)       # (every writer ended: the pipe is at its end)
        full = full or disk_full(work)
        if proc.returncode == course_worker.EX_OSERR and answered() == 0:   # (before any student code ran)
            said = last_line(bytes(stderr.tail).decode('utf-8', 'replace'))
            raise NoSandbox(f"the worker could not confine itself before running any code ({said})")
        # the CPU limit sends SIGXCPU (bubblewrap reports its child's death by a signal as 128 + the signal);
        # SIGKILL is the hard limit's, when SIGXCPU was ignored, or the kernel's when memory ran out
        if ended is None and proc.returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
            ended = 'cpu'
        elif ended is None and proc.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL) and answered() <= n_concepts:
            ended = 'memory' if cgroup and cgroup.out_of_memory() else 'killed'
        if full and answered() <= n_concepts and ended not in ('cpu', 'clock'):
            # a disk it filled itself (the uid sandbox: its files held a good part of it) is its own doing; one
            # that another filled is not: run again (run_with_room)
            ended = 'filled' if took >= FILLED else 'disk'
        with open(paths[1], 'rb') as f:
            answers = f.read(FILE_SIZE)
        stderr_text = bytes(stderr.tail).decode('utf-8', 'replace')
    finally:
        remove_tree(work)
        if cgroup:
            cgroup.remove()
    return answers, stderr_text, ended, time.time() - t0


def run_with_room(tree, request, n_concepts, cpu_seconds, sandbox):
    """run_worker, once more when the grading folder's disk was full (another's files perhaps, not yet cleaned
    up) and there is room again; DiskFull when it was full both times."""
    for attempt in (0, 1):
        try:
            result = run_worker(tree, request, n_concepts, cpu_seconds, sandbox)
        except OSError as e:   # (its request or outputs could not be written)
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            result = None, None, 'disk', 0.0
        if result[2] != 'disk':
            return result
        if not attempt:
            wait_for_room(cpu_seconds)
    raise DiskFull(f"the disk was full (the disk of {grading_folder()}, where grading writes its copy of the "
                   "submission and the answers, had no room while the code ran): make room and grade it again")


def evaluate_concepts(concepts, tree, cpu_seconds, sandbox, place=lambda where: where):
    """[(passed, [feedback lines], timed out, seconds)] for each concept: its probes, run by the student's
    code in the sandbox and by the instructor's code here, compared. The concepts share one sandbox (one
    start of Python and torch), each with cpu_seconds of its own; a concept that ends the run (a loop, a
    sleep, a crash, memory) fails alone, and the concepts after it run again in a new sandbox. `place` turns
    the worker's 'file, line N: text' of an error into what the feedback shows."""
    out = []
    while len(out) < len(concepts):
        rest = concepts[len(out):]
        output, stderr, ended, seconds = run_with_room(tree, request_of(rest, cpu_seconds), len(rest), cpu_seconds,
                                                       sandbox)
        answers = course_worker.read_answers(output, len(rest) + 1)[1:]   # (after the ready frame)
        share = seconds / (len(answers) + (len(answers) < len(rest)))
        firsts = [sum(len(c.probes) for c in rest[:j]) for j in range(len(rest))]   # in this request
        for c, got, first in zip(rest, answers, firsts):
            out.append((*judge(c, got, first, place), False, share))
        if len(answers) < len(rest):   # the next concept ended the run
            if ended == 'filled':   # (not run again: it would fill the disk again, beside others)
                out += [(False, ["the code filled the disk (it wrote more than "
                                 f"{FILLED // 2 ** 20} MB in temporary files while the disk ran out of room): "
                                 "its concepts are not run again"], False, share)] * (len(rest) - len(answers))
                continue
            what = {'cpu': f"did not finish within {cpu_seconds:.0f} s of CPU time",
                    'clock': f"did not finish within {2 * cpu_seconds:.0f} s of wall-clock time (twice its "
                             f"{cpu_seconds:.0f} s of CPU time: code that sleeps or waits is stopped by the clock)",
                    'killed': "was killed: past its CPU time, or out of memory",
                    'memory': f"was stopped: its processes together held more than {MEMORY // 2 ** 30} GB of "
                              "memory"}.get(ended)
            what = what or "ended without answering" + (f": {student_said(last_line(stderr))}" if last_line(stderr) else '')
            out.append((False, [f"the code {what}"], ended in ('cpu', 'clock'), share))
    return out


def request_of(concepts, cpu_seconds):
    """The worker's request: every probe of the concepts, in order, its tensors keyed '<probe index>/<name>'
    (counted from 0 in this request), the number of probes of each concept and its CPU seconds."""
    tensors, meta = {}, {'probes': [], 'concepts': [len(c.probes) for c in concepts], 'cpu_seconds': cpu_seconds}
    for i, (_, probe, args, inputs, _, _) in enumerate(p for c in concepts for p in c.probes):
        meta['probes'].append(dict(probe=probe, args=args))
        tensors.update({f'{i}/{k}': v for k, v in inputs.items()})
    return course_worker.pack(tensors, meta)


def judge(concept, got, first, place=lambda where: where):
    """(passed, [feedback lines]) of a concept from its answers (tensors, meta): meta['results'] has one
    result per probe, and probe i's tensors are keyed by its index in the request, first + i."""
    import torch
    got_tensors, got_meta = got
    results = got_meta.get('results') if isinstance(got_meta, dict) else None
    if not isinstance(results, list) or len(results) != len(concept.probes):
        return False, ["the code's answers could not be read"]
    for i, (description, probe, args, inputs, compare, reference) in enumerate(concept.probes):
        result = results[i]
        if not isinstance(result, dict) or result.get('ok') is not True:
            error = result.get('error', '?') if isinstance(result, dict) else '?'
            where = result.get('where') if isinstance(result, dict) else None
            return False, [f"{description}: the code raised {student_said(cut_at_word(error, MESSAGE), MESSAGE + 10)}" +
                           (f" ({place(where[:200])})" if isinstance(where, str) and where else '')]
        answer = ({k.partition('/')[2]: v for k, v in got_tensors.items() if k.partition('/')[0] == str(first + i)},
                result.get('values') if isinstance(result.get('values'), dict) else {})
        ref_args, ref_inputs = reference or (args, inputs)
        # (the instructor's code needs no environment: a process's env is shared; its warnings, a block size past
        # the sublayers on purpose, are not the grader's to print)
        with torch.random.fork_rng(), warnings.catch_warnings():
            warnings.simplefilter('ignore')
            ref = course_worker.run_probe(probe, {k: v for k, v in ref_args.items() if k != 'env'}, ref_inputs)
        problem = compare(answer, ref)
        if problem:
            return False, [f"{description}: {problem}"]
    return True, []


def last_line(text):
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ''
