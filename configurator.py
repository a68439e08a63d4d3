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
