"""
The course kit's probes: what the grader asks of a student's code (COURSE.md, "Grading").

    python course_worker.py < request.safetensors > answers      (its name in the sandbox's tree)

A probe calls one of the functions an assignment asks for on inputs it is given and returns what it
computed. The grader (course_kit/grader.py, which never runs student code) sends a request, this worker runs
each probe on the project it sits in, inside a sandbox, and writes the answers; the grader runs the same
probes on the instructor's project and compares. Requests and answers are safetensors (tensors and a
JSON header: nothing in them can run code), never pickle.

A request holds the probes of one or more concepts. The worker first writes a frame that says it is ready
(Python and torch started), then the answers of each concept as soon as its probes are done (each frame
8 bytes of length, then a safetensors blob); each concept gets its own CPU time
(a soft limit, raised before each concept): a concept that loops or ends the process leaves the earlier
concepts answered, and the grader runs the later ones again. Before it reads anything, the worker sets its
limits, moves into namespaces of its own where the grader asks (the uid sandbox, as root: own_namespaces), becomes
the user the grader names, and, where the grader found Landlock, takes every write to the file system from itself
(no_writes): the code under test writes nowhere on disk; then it refuses itself memfd, System V IPC and sockets
(no_sharing): no memory its limits do not count, nothing shared with a student graded beside it, nothing sent to
the machine.
"""

import contextlib
import json
import os
import resource
import struct
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
MATMULS = {'matmul', '__matmul__', 'mm', 'bmm', 'einsum', 'linear', 'addmm', 'tensordot', 'inner', 'dot', 'baddbmm'}


# -----------------------------------------------------------------------------
# The probes: (args, tensors) -> (tensors, values)

def given_sources(t, n):
    import model
    return [model.source(t[f'x{i}']) for i in range(n)]


def probe_read_sources(args, t):
    """Assignment 1: model.read_sources over the given sources and pseudo-queries (bf16 autocast if asked)."""
    import torch
    import model
    sources = given_sources(t, args['n_sources'])
    ctx = torch.autocast('cpu', dtype=torch.bfloat16) if args.get('autocast') else contextlib.nullcontext()
    with ctx:
        h, alpha = model.read_sources(sources, t['w'])
    return {'h': h, 'alpha': alpha}, {}


def probe_read_sources_autocast(args, t):
    """Assignment 1: the read under bf16 autocast on float32 sources, and the same read on the same values in
    float64 (the code's own, to compare with: how it is computed, not what)."""
    import torch
    import model
    with torch.autocast('cpu', dtype=torch.bfloat16):
        h, alpha = model.read_sources(given_sources(t, args['n_sources']), t['w'])
    exact = {k: v.double() for k, v in t.items()}
    h64, alpha64 = model.read_sources(given_sources(exact, args['n_sources']), exact['w'])
    return {'h': h, 'alpha': alpha, 'h64': h64, 'alpha64': alpha64}, {}


def probe_read_sources_ops(args, t):
    """Assignment 1: the names of the operations the read runs."""
    from torch.utils._python_dispatch import TorchDispatchMode
    import model
    ops = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            ops.append(func.overloadpacket.__name__)
            return func(*a, **(kw or {}))
    sources = given_sources(t, args['n_sources'])
    with Record():
        model.read_sources(sources, t['w'])
    return {}, {'ops': sorted(set(ops))}


def small_model(args, t):
    """A GPT of the given configuration with the given weights (float64)."""
    import torch
    import model
    torch.manual_seed(0)
    gpt = model.GPT(model.GPTConfig(**args['config'])).double()
    gpt.load_state_dict({k[len('w.'):]: v for k, v in t.items() if k.startswith('w.')})
    return gpt


def probe_read_point(args, t):
    """Assignment 2: the attention read point of block `layer` (its routes, pseudo-queries and source gain) over the
    given sources, with its routing log."""
    gpt = small_model(args, t)
    log = []
    h = gpt.transformer.h[args['layer']].attn_read(given_sources(t, args['n_sources']), log)
    return {'h': h}, {'routes': [r['route'] for r in log]}


def probe_attn_inputs_of(args, t):
    """Assignment 2: the attention sublayer's two inputs (x_qk, x_v) of block `layer` from a given read h
    (R, B, T, d): the inputs alone, whatever the code's read point computes."""
    gpt = small_model(args, t)
    x_qk, x_v = gpt.transformer.h[args['layer']].attn_inputs(t['h'])
    return {'x_qk': x_qk, 'x_v': x_v}, {}


def probe_forward(args, t):
    """Assignment 3: a whole forward pass with the routing recorded, and the gradient of every pseudo-query;
    and what every read point was given, seen from outside the code (a hook on each read point): the sources
    of each call, in order, and whether each is in the graph."""
    import torch
    import model
    gpt = small_model(args, t)
    gpt.record_routing = True
    reads = {m: name for name, m in gpt.named_modules() if isinstance(m, model.DepthRead)}
    calls, given = [], {}

    def seen(module, inputs):
        sources = inputs[0] if inputs else []
        xs = [s[0] for s in sources if isinstance(s, (tuple, list)) and s and isinstance(s[0], torch.Tensor)]
        given[f'src{len(calls)}'] = xs
        calls.append([module.sublayer, len(sources), all(x.requires_grad for x in xs)])
    hooks = [m.register_forward_pre_hook(seen) for m in reads]
    try:
        logits, loss = gpt(t['idx'], t['targets'])
    finally:
        for h in hooks:
            h.remove()
    loss.backward()
    out = {'logits': logits.detach(), **{f'alpha{i}': r['alpha'] for i, r in enumerate(gpt.routing)}}
    out.update({f'{k}.{j}': x.detach() for k, xs in given.items() for j, x in enumerate(xs)})
    grads, states, sublayers = {}, {}, {}
    for m, prefix in reads.items():
        for n, p in m.named_parameters(recurse=False):
            if n in m.routes.values():   # a pseudo-query (w_qk, w_v, ...), not the source_gain
                name = f'{prefix}.{n}'
                grads[f'grad.{name}'] = p.grad if p.grad is not None else torch.full_like(p, float('nan'))
                states[name] = 'none' if p.grad is None else 'zero' if not p.grad.abs().max() > 0 else 'nonzero'
                sublayers[name] = m.sublayer
    logged = [[r['sublayer'], r['route'], r['alpha'].numel()] for r in gpt.routing]
    return {**out, **grads}, {'reads': logged, 'calls': calls, 'grads': states, 'sublayer_of': sublayers,
                              'S': gpt.config.attnres_block_size, 'L': 2 * gpt.config.n_layer}


def probe_step_windows(args, t):
    """Assignment 4: train.step_windows, in a process that torchrun would have started as RANK of WORLD_SIZE."""
    import train
    before = dict(os.environ)
    os.environ.update({k: str(v) for k, v in args.get('env', {}).items()})
    try:
        windows = train.step_windows(args['step'], args['n_windows'], args['windows_per_step'], args['seed'])
    finally:
        os.environ.clear()
        os.environ.update(before)
    return {}, {'windows': [int(w) for w in windows]}


def probe_step_windows_anywhere(args, t):
    """Assignment 4: the windows of a step asked by RANK of WORLD_SIZE (args env), by a single process, and the
    next step's by a single process: what the order does not depend on, and what it does."""
    alone = dict(args, env=dict(RANK=0, LOCAL_RANK=0, WORLD_SIZE=1))
    here = probe_step_windows(args, t)[1]['windows']
    return {}, {'windows': here, 'alone': probe_step_windows(alone, t)[1]['windows'],
                'next': probe_step_windows(dict(alone, step=args['step'] + 1), t)[1]['windows']}


def probe_paired_stats(args, t):
    """Assignment 5: compare.paired_stats of the given differences."""
    import compare
    r = compare.paired_stats(list(args['deltas']))
    return {}, {'stats': {k: (list(map(float, v)) if isinstance(v, (list, tuple)) else float(v)) for k, v in r.items()}}


PROBES = {name[len('probe_'):]: fn for name, fn in dict(globals()).items() if name.startswith('probe_')}


def run_probe(name, args, tensors):
    """(tensors, values) of one probe, or raises what the code under it raised."""
    import torch
    out, values = PROBES[name](args, tensors)
    bad = [k for k, v in out.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise TypeError(f"returned {type(out[bad[0]]).__name__} where a tensor was expected ({bad[0]})")
    json.dumps(values)   # plain values only
    return {k: v.detach().contiguous() for k, v in out.items()}, values


# -----------------------------------------------------------------------------
# The wire format: safetensors with a JSON header (tensors keyed "<probe index>/<name>"); answers
# length-prefixed, one blob per concept

def pack(tensors, meta):
    from safetensors.torch import save
    return save({k: v.detach().clone().contiguous() for k, v in tensors.items()}, metadata={'json': json.dumps(meta)})


MAX_ANSWER_HEADER = 2 ** 20   # bytes of an answer's JSON header: an honest one has under 10 kB


def unpack(data, max_header=None):
    """(tensors, meta) of a safetensors blob; anything else (a header over max_header bytes too) is a ValueError."""
    from safetensors.torch import load
    if len(data) < 8:
        raise ValueError("empty")
    (size,) = struct.unpack('<Q', data[:8])
    if max_header is not None and size > max_header:   # (parsed, a JSON of 60 MB takes gigabytes)
        raise ValueError(f"a header of {size} bytes")
    header = json.loads(data[8:8 + size])
    return load(data), json.loads(header.get('__metadata__', {}).get('json', 'null'))


def frame(tensors, meta):
    """One concept's answers as the worker writes them: 8 bytes of length (little-endian), then the blob."""
    blob = pack(tensors, meta)
    return struct.pack('<Q', len(blob)) + blob


def read_answers(data, most):
    """The concepts' answers in a worker's output: a list of (tensors, meta), one per concept answered, in
    order, at most `most` of them; whatever follows the last whole one (a cut or a bad blob, a header over
    MAX_ANSWER_HEADER bytes) is dropped, and nothing after the first `most` is read."""
    out, at = [], 0
    while at + 8 <= len(data) and len(out) < most:
        (size,) = struct.unpack('<Q', data[at:at + 8])
        try:
            out.append(unpack(data[at + 8:at + 8 + size], MAX_ANSWER_HEADER))
        except Exception:
            break
        at += 8 + size
    return out


def where_in_student_code(e):
    """'model.py, line 12: <the line>' of the innermost frame of an answer file, or ''."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if os.path.dirname(os.path.abspath(f.filename)) == HERE
              and os.path.basename(f.filename) != os.path.basename(__file__)]
    if isinstance(e, SyntaxError) and e.filename:
        return f"{os.path.basename(e.filename)}, line {e.lineno}: {(e.text or '').strip()}"
    return f"{os.path.basename(frames[-1].filename)}, line {frames[-1].lineno}: {frames[-1].line}" if frames else ''


def apply_limits(limits):
    """The sandbox's limits, set by the worker on itself before anything else runs (the grader starts it with
    no preexec_fn, which can deadlock in a threaded process): address space, CPU time in all (each concept
    lowers its own soft limit below), file size (its answers and printed output too), processes and threads
    of its user, no core files, no POSIX message queue (one outlives its process, and the uid sandbox has no IPC
    namespace of its own). A hard limit once lowered cannot be raised by the code under test."""
    for which, value in ((resource.RLIMIT_AS, limits['memory']), (resource.RLIMIT_FSIZE, limits['file_size']),
                         (resource.RLIMIT_NPROC, limits['processes']), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_MSGQUEUE, 0)):
        resource.setrlimit(which, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (limits['cpu_seconds'], limits['cpu_seconds'] + 1))


# -----------------------------------------------------------------------------
# Landlock (Linux 5.13 on): a process takes rights from itself, for good, and passes the loss to every process it
# starts. The worker takes every write to the file system from itself before any student code can run, so that
# a submission writes nowhere on disk, in any sandbox (the uid sandbox shares the machine's temporary folders)

LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446   # (every architecture but alpha)
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH, PR_SET_NO_NEW_PRIVS = 1, 1, 38
FS_WRITE_FILE, FS_TRUNCATE = 1 << 1, 1 << 14
FS_READ_FILE = 1 << 2
FS_READS = 1 << 0 | FS_READ_FILE | 1 << 3   # ABI 1: execute a file, read a file, list a folder
FS_WRITES = {   # the file system's write rights each ABI knows: writing a file, removing and making anything
    1: FS_WRITE_FILE | sum(1 << i for i in range(4, 13)),   # (remove a folder or file; make a char device, folder,
    2: 1 << 13,                                             #  file, socket, FIFO, block device, link), refer
    3: FS_TRUNCATE}                                         # (a link or rename across folders), truncate
NET_TCP = 1 << 0 | 1 << 1          # ABI 4: bind and connect TCP ports
SCOPE_ABSTRACT_UNIX = 1 << 0       # ABI 6: connect to an abstract Unix socket outside the worker's own processes
EX_OSERR = 71                      # the worker's exit status where it cannot take its rights (sysexits.h)


def libc_call(name, *args):
    """libc's `name` on args (ints as C longs), its result, or OSError with its errno."""
    import ctypes
    fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    fn.restype = ctypes.c_long
    result = fn(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    if result < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return result


def syscall(*args):
    return libc_call('syscall', *args)


def landlock_abi():
    """The Landlock ABI version this kernel offers (1 on), or 0 where it cannot be used: a kernel before 5.13 or
    without Landlock, Landlock disabled at boot, or a seccomp filter (a container's) that refuses its system calls."""
    try:
        return syscall(LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    except OSError:
        return 0


def no_writes(readable=None):
    """Take from this process, and every process it starts, every write to the file system but /dev/null's: no file,
    folder, link, socket or FIFO made, none written, truncated, renamed or removed; the descriptors already open
    (the answers, the stderr pipe) stay as they are, since Landlock checks a file when it is opened. With ABI 4 no
    TCP port either (bound or connected), with ABI 6 no abstract Unix socket of another process. With `readable`
    (folders and files), no read either but beneath those folders and of those files: no file opened or run, no
    folder listed elsewhere, whatever its permissions (the uid sandbox: another copy of the project, another
    student's folder). OSError where Landlock cannot be used (its strerror: why)."""
    abi = syscall(LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    fs = sum(bits for version, bits in FS_WRITES.items() if version <= abi) | (FS_READS if readable is not None else 0)
    attr = struct.pack('=QQQ', fs, NET_TCP if abi >= 4 else 0, SCOPE_ABSTRACT_UNIX if abi >= 6 else 0)
    attr = attr[:8 if abi < 4 else 16 if abi < 6 else 24]   # (the struct as this ABI knows it)
    ruleset = syscall(LANDLOCK_CREATE_RULESET, attr, len(attr), 0)

    def allow(path, rights, flags=0):
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC | flags)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return   # (a folder this user cannot reach it cannot read either)
        try:
            syscall(LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, struct.pack('=Qi', rights, fd), 0)
        finally:
            os.close(fd)
    try:
        if os.path.exists('/dev/null'):   # (written by honest code: open(os.devnull, 'w'), as torch's import does)
            allow('/dev/null', FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0)
                  | (FS_READ_FILE if readable is not None else 0))
        for path in readable or ():   # (a folder: what is beneath it; a file, /dev/urandom say: only it)
            allow(path, FS_READS, os.O_DIRECTORY) if os.path.isdir(path) else allow(path, FS_READ_FILE)
        libc_call('prctl', PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)   # (no setuid program gives back what is taken)
        syscall(LANDLOCK_RESTRICT_SELF, ruleset, 0)
    finally:
        os.close(ruleset)


def confine(readable=None):
    """What the worker does to itself before any student code can run, when the grader asks (it found Landlock
    where the sandbox runs): the temporary folder resolved first (tempfile tries to write a file in it, as
    torch's import asks for it through dill), torch's compile cache put in it (torch._dynamo makes that folder
    when it is first imported, which iterating over a tensor under a dispatch mode does: a folder that exists
    is not made), then no writes (and, given `readable`, no reads but beneath those folders: no_writes)."""
    import tempfile
    os.environ['TORCHINDUCTOR_CACHE_DIR'] = tempfile.gettempdir()
    no_writes(readable)


# -----------------------------------------------------------------------------
# A seccomp filter (Linux 3.17 on), the worker's own, for good and for every process it starts: no memory the
# address-space limit does not count (memfd_create, memfd_secret: a file in memory, held without being mapped), no
# System V IPC (shmget, shmat, msgget, semget: two students graded at once would share it where there is no IPC
# namespace) and no socket of any family (socket: UDP, which Landlock does not restrict, and the Unix sockets in the
# file system that every user may connect to; honest code needs none, and glibc's lookups that try nscd's socket
# go on without it), nor io_uring (io_uring_setup, _enter, _register: a ring's requests make and connect sockets
# without the socket call). Each fails with EPERM; every other system call is left alone, and socketpair for a
# stream pair (a connected pair of streams reaches nothing outside; a datagram one could send to a socket of the
# file system by its path, /dev/log's: refused).

SECCOMP_SET_MODE_FILTER, EPERM = 1, 1
IO_URING = {'io_uring_setup': 425, 'io_uring_enter': 426, 'io_uring_register': 427}   # (x86_64's and aarch64's alike)
AUDIT_ARCHES = {   # the machine -> (its AUDIT_ARCH, seccomp's number, the numbers refused)
    'x86_64': (0xC000003E, 317, {'memfd_create': 319, 'memfd_secret': 447, 'shmget': 29, 'shmat': 30,
                                 'msgget': 68, 'semget': 64, 'socket': 41, **IO_URING}),
    'aarch64': (0xC00000B7, 277, {'memfd_create': 279, 'memfd_secret': 447, 'shmget': 194, 'shmat': 196,
                                  'msgget': 186, 'semget': 190, 'socket': 198, **IO_URING})}
X32 = 0x40000000   # x86_64's x32 calls: the same table with this bit set (none is needed here: all refused)
SOCKETPAIR = {'x86_64': 53, 'aarch64': 199}   # allowed for SOCK_STREAM (1) alone: its type, args[1] & 0xf


def refusing_filter(arch, refused, socketpair=None):
    """The classic BPF program (struct sock_filter's, 8 bytes each) that refuses the calls numbered `refused`
    with EPERM, every call made under another architecture than `arch` (a 64-bit process can make i386's
    calls, whose numbers differ: int 0x80), and the call numbered `socketpair` but for a pair of streams; the
    rest allowed."""
    def op(code, k, jt=0, jf=0):
        return struct.pack('=HBBI', code, jt, jf, k)
    LD, JEQ, JGE, AND, RET = 0x20, 0x15, 0x35, 0x54, 0x06       # ld [k]; jeq #k; jge #k; and #k; ret #k (BPF_K)
    ALLOW, DENY = 0x7fff0000, 0x00050000 | EPERM                # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    # socketpair: its type (args[1], low word) without its flags a stream's; else on to ALLOW (3 ahead)
    pair = [op(JEQ, 0xffffffff if socketpair is None else socketpair, 0, 3), op(LD, 24), op(AND, 0xf),
            op(JEQ, 1, 0, 1)]
    n, k = len(refused), len(pair)     # (a jump's offset counts the instructions it skips: DENY is the last)
    prog = [op(LD, 4), op(JEQ, arch, 1, 0), op(RET, DENY),     # seccomp_data.arch: another one refused
            op(LD, 0), op(JGE, X32, n + k + 1, 0)]              # seccomp_data.nr: x32's refused
    prog += [op(JEQ, nr, n - i + k, 0) for i, nr in enumerate(sorted(refused))]
    return b''.join(prog + pair + [op(RET, ALLOW), op(RET, DENY)])


def no_sharing():
    """Refuse this process, and every process it starts, memfd_create, memfd_secret, System V IPC, socket, io_uring
    and a socketpair of datagrams (EPERM). OSError where it cannot (its strerror: why): a machine this table does
    not know, a kernel without seccomp, or a container's filter that refuses seccomp itself."""
    import ctypes
    import platform
    machine = platform.machine() if struct.calcsize('P') == 8 else 'a 32-bit Python'
    if machine not in AUDIT_ARCHES:
        raise OSError(0, f"no system call numbers for {machine}")
    arch, seccomp, refused = AUDIT_ARCHES[machine]
    prog = refusing_filter(arch, refused.values(), SOCKETPAIR[machine])
    code = ctypes.create_string_buffer(prog, len(prog))
    fprog = ctypes.create_string_buffer(struct.pack('@HP', len(prog) // 8, ctypes.addressof(code)))
    libc_call('prctl', PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)   # (needed by an unprivileged process, and kept anyway)
    syscall(seccomp, SECCOMP_SET_MODE_FILTER, 0, fprog)


# -----------------------------------------------------------------------------
# Namespaces of its own (the uid sandbox, as root, before the worker becomes its user): a network namespace (no
# interface but a loopback of its own, down: no datagram reaches the machine's ports), an IPC namespace (no System V
# object of another student's), a PID namespace and a mount namespace with a /proc of its own (hidepid=2: the code
# sees its own processes and no other's command line, the grader's among them). Bubblewrap makes the same for its
# sandbox. The process the grader started stays outside and waits; the first process inside (PID 1) mounts /proc
# and waits for the worker (PID 2, never PID 1: the kernel ignores a signal without a handler sent to PID 1, which
# SIGXCPU, the CPU limit's, would be); when the worker ends, the namespace ends with every process in it.

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x08000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
PR_SET_PDEATHSIG = 1


def exit_status(status):
    """A wait status as an exit status: the code, or 128 + the signal that ended it (as bubblewrap says it)."""
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def own_namespaces():
    """Move what follows into new network, IPC, PID and mount namespaces with a /proc of their own; returns in the
    worker (PID 2 of the new PID namespace). The calling process stays outside and exits with the worker's exit
    status once it ends. OSError where the kernel refuses any step (its strerror: why): a kernel without them, a
    container whose seccomp filter refuses unshare, a process without CAP_SYS_ADMIN."""
    import signal
    libc_call('unshare', CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET)
    libc_call('mount', b'none', b'/', None, MS_REC | MS_PRIVATE, None)   # (no mount of ours seen by the machine)
    said, tell = os.pipe()   # the first process inside tells the one outside why it could not mount /proc
    first = os.fork()
    if first:   # outside: wait, and end as the worker ended
        os.close(tell)
        why = b''
        while True:
            chunk = os.read(said, 512)
            if not chunk:
                break
            why += chunk
        os.close(said)
        status = exit_status(os.waitpid(first, 0)[1])
        if why:
            e, _, text = why.decode('utf-8', 'replace').partition(' ')
            raise OSError(int(e), text)
        os._exit(status)
    os.close(said)
    try:   # PID 1: ended with the process outside (the grader's kill reaches both: one process group)
        libc_call('prctl', PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        libc_call('mount', b'proc', b'/proc', b'proc', MS_NOSUID | MS_NODEV | MS_NOEXEC, b'hidepid=2')
        worker = os.fork()
    except OSError as e:
        os.write(tell, f"{e.errno} {e.strerror or e}".encode())
        os._exit(EX_OSERR)
    os.close(tell)
    if worker == 0:
        return
    while True:   # (every orphan of the namespace is PID 1's to reap)
        pid, status = os.wait()
        if pid == worker:
            os._exit(exit_status(status))


def main():
    limits = json.loads(os.environ.pop('COURSE_WORKER_LIMITS'))
    apply_limits(limits)
    user = os.environ.pop('COURSE_WORKER_USER', None)
    if user and limits.get('namespaces'):   # (as root: only root can make them, before it becomes its user)
        try:
            own_namespaces()
        except OSError as e:
            print(f"course_worker: namespaces refused: {e}", file=sys.stderr, flush=True)
            sys.exit(EX_OSERR)
    if user:   # started as root in the sandbox: become an unprivileged user before anything else is read
        os.setgroups([])
        os.setgid(int(user))
        os.setuid(int(user))
    if limits.get('no_writes'):   # (before sys.path holds the tree: no student file can run first)
        try:
            confine(limits.get('readable'))
        except OSError as e:
            print(f"course_worker: Landlock refused: {e}", file=sys.stderr, flush=True)
            sys.exit(EX_OSERR)
    try:
        no_sharing()
    except OSError:   # (the grader found the same and said so first: check_sandbox)
        pass
    sys.path.insert(0, HERE)
    import torch
    torch.set_num_threads(1)
    request = sys.stdin.buffer.read()
    answers_out = os.fdopen(os.dup(1), 'wb')
    os.dup2(2, 1)   # what the code under test prints goes to stderr, not into the answers
    tensors, meta = unpack(request)
    answers_out.write(frame({}, {'ready': True}))   # the grader's clock per concept starts now
    answers_out.flush()
    first = 0
    for count in meta['concepts']:   # the number of probes of each concept, in order
        used = sum(getattr(resource.getrusage(resource.RUSAGE_SELF), f) for f in ('ru_utime', 'ru_stime'))
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        soft = int(used + meta['cpu_seconds']) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
        out_tensors, results = {}, []
        for i in range(first, first + count):
            probe = meta['probes'][i]
            mine = {k.split('/', 1)[1]: v for k, v in tensors.items() if k.split('/', 1)[0] == str(i)}
            try:
                got, values = run_probe(probe['probe'], probe['args'], mine)
                out_tensors.update({f'{i}/{k}': v for k, v in got.items()})
                results.append(dict(ok=True, values=values))
            except BaseException as e:   # noqa: B902 (SystemExit, KeyboardInterrupt from the code under test too)
                error = f"SyntaxError: {e.msg}" if isinstance(e, SyntaxError) else f"{type(e).__name__}: {str(e)[:2000]}"
                results.append(dict(ok=False, error=error, where=where_in_student_code(e)[:160]))
        answers_out.write(frame(out_tensors, {'results': results}))
        answers_out.flush()
        first += count


if __name__ == '__main__':
    main()
