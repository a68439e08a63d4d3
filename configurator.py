"""
nanoGPT-style configuration: a script keeps its defaults as globals, then

    python train.py config/rd_120m.py --batch_size=8 --compile=False

runs the config file (plain Python assignments) and applies --key=value overrides on top.
A config file is Python and runs as code, as in nanoGPT: run only config files you trust. A
--key=value override is parsed (ast.literal_eval), never run.
Unlike nanoGPT's exec() version this one is a function, and it is strict: every key must already
exist among the defaults (an unknown key names the closest valid ones), and every value must have
the default's type (an int may stand where a float is expected).
"""

import ast
import difflib
import traceback


def _check(key, value, defaults, where):
    if key not in defaults:
        close = difflib.get_close_matches(key, list(defaults), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; valid keys: {', '.join(sorted(defaults))}"
        raise SystemExit(f"unknown config key {key!r} in {where}{hint}")
    expected = type(defaults[key])
    if defaults[key] is None or isinstance(value, expected) and not (expected is int and isinstance(value, bool)):
        return value
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    raise SystemExit(f"config key {key!r} in {where} must be a {expected.__name__}, got {value!r} "
                     f"({type(value).__name__})")


def settings(argv, defaults=None):
    """The (key, value, where) assignments of config files and --key=value arguments, in order, not yet
    checked against any defaults (study.py reads a run's shape this way without importing train.py)."""
    defaults = defaults or {}
    for arg in argv:
        if not arg.startswith('--'):
            try:
                with open(arg, encoding='utf-8') as f:
                    source = f.read()
            except OSError as e:
                raise SystemExit(f"cannot read config file {arg!r}: {e.strerror}") from None
            except UnicodeDecodeError as e:
                raise SystemExit(f"config file {arg!r} is not UTF-8 text (byte {e.start}): a config file holds "
                                 "Python assignments, e.g. n_layer = 12") from None
            scope = {}
            try:   # a config file is Python, run as code, as in nanoGPT: run only files you trust
                exec(compile(source, arg, 'exec'), {}, scope)
            except SyntaxError as e:
                raise SystemExit(f"{arg}, line {e.lineno}: {e.msg} (a config file holds Python assignments, "
                                 "e.g. n_layer = 12)") from None
            except Exception as e:
                line = next((f.lineno for f in reversed(traceback.extract_tb(e.__traceback__))
                             if f.filename == arg), '?')
                raise SystemExit(f"{arg}, line {line}: {type(e).__name__}: {e}") from None
            for key, value in scope.items():
                if not key.startswith('_'):
                    yield key, value, arg
        else:
            key, sep, text = arg[2:].partition('=')
            if not sep:
                raise SystemExit(f"override {arg!r} must look like --key=value")
            try:
                value = ast.literal_eval(text)
            except (SyntaxError, ValueError):
                value = text  # a bare word is a string: --residual=attnres
            if isinstance(defaults.get(key), str) and not isinstance(value, str):
                value = text  # keep e.g. --out_dir=123 a string
            yield key, value, f"--{key}"


def configure(defaults, argv):
    """Return a copy of `defaults` updated by config files and --key=value arguments, in order."""
    config = dict(defaults)
    for key, value, where in settings(argv, defaults):
        config[key] = _check(key, value, defaults, where)
    return config


# -----------------------------------------------------------------------------
# --help: a script's keys, read from its source (nothing is imported, so `python train.py --help` answers
# before torch would have loaded)

HELP_FLAGS = ('-h', '--help')


def _default_text(node, source):
    """A default as Python writes it: its value where the expression is a constant or arithmetic on constants
    (2 ** 19), else the expression as written (','.join(RESIDUAL_MODES))."""
    text = ast.get_source_segment(source, node)
    try:
        return repr(ast.literal_eval(node))
    except ValueError:
        try:
            return repr(eval(compile(ast.Expression(node), '<default>', 'eval'), {'__builtins__': {}}))
        except Exception:
            return text


def defaults_listing(source):
    """The defaults of a script, read from its source: [(group, [(key, default text), ...], comment)], one
    entry per source line of keys, in the file's order. The keys are the keywords of `DEFAULTS = dict(...)`
    (sample.py, bench.py) or, for a script whose defaults are globals (train.py), the assignments just above
    `DEFAULTS = `. A comment on a line of its own starts a group (train.py's `# data`), unless it continues,
    at the same column, the comment of the line above."""
    import io
    import tokenize
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], 'id', '') == 'DEFAULTS')
    if isinstance(node.value, ast.Call) and getattr(node.value.func, 'id', '') == 'dict':
        items = [(kw.arg, kw.value) for kw in node.value.keywords]
    else:
        body = tree.body[:tree.body.index(node)]
        first = len(body)
        while first and isinstance(body[first - 1], ast.Assign) and isinstance(body[first - 1].targets[0], ast.Name):
            first -= 1
        items = [(n.targets[0].id, n.value) for n in body[first:]
                 if n.targets[0].id.islower() and not n.targets[0].id.startswith('_')]
    comments = {t.start[0]: (t.start[1], t.string.lstrip('#').strip())
                for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT}
    lines = source.splitlines()
    keys_on = {}
    for key, value in items:
        keys_on.setdefault(value.lineno, []).append((key, _default_text(value, source)))
    start, end = min(keys_on), max(keys_on)
    while start > 1 and lines[start - 2].lstrip().startswith('#') and not lines[start - 2].startswith('# ---'):
        start -= 1   # the group heading just above the first key
    out, group, last = [], None, None   # last: the column of the comment a comment-only line would continue
    for n in range(start, end + 2):
        only_comment = n in comments and lines[n - 1].lstrip().startswith('#')
        if n in keys_on:
            out.append([group, keys_on[n], comments.get(n, (None, ''))[1]])
            last = comments.get(n, (None, ''))[0]
        elif only_comment and last is not None and comments[n][0] == last and out:
            out[-1][2] += ' ' + comments[n][1]
        elif only_comment and n <= end:
            group, last = comments[n][1], None
        else:
            last = None
    return [tuple(entry) for entry in out]


def help_text(path, more):
    """What `python <script> --help` prints: the script's docstring, its keys grouped as in the file with
    their defaults and comments, and where to read more."""
    with open(path, encoding='utf-8') as f:
        source = f.read()
    name = path.replace('\\', '/').rsplit('/', 1)[-1]
    import textwrap
    out = [f"usage: python {name} [config_file.py ...] [--key=value ...]", "",
           (ast.get_docstring(ast.parse(source)) or '').strip(), "",
           *textwrap.wrap("keys and their defaults: a config file (Python assignments), then --key=value, override "
                          "them in order; an unknown key or a value of another type is an error", 100)]
    group = None
    for g, keys, comment in defaults_listing(source):
        if g != group:
            out += ["", g]
            group = g
        assignment = ', '.join(f"{k}={v}" for k, v in keys)
        if not comment:
            out.append(f"  {assignment}")
            continue
        first = f"  {assignment:34s}  " if len(assignment) <= 34 else f"  {assignment}\n" + ' ' * 38
        out.append(textwrap.fill(comment, 108, initial_indent=first, subsequent_indent=' ' * 38))
    return '\n'.join(out + ["", f"more: {more}"])


def exit_on_help(name, path, more):
    """Print the help and exit 0 if a script run as a program (name == '__main__') was given -h or --help.
    Called at the top of a script, before its heavy imports."""
    import sys
    if name == '__main__' and any(arg in HELP_FLAGS for arg in sys.argv[1:]):
        print(help_text(path, more))
        raise SystemExit(0)

