"""A run that starts or continues by itself, survives preemption, and ends cleanly under torchrun
(docs/run_safety.md). Every run is a real train.py process on the CPU (tiny model, the
built-in corpus); signals are sent to it mid-run, as a scheduler would."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from run_kit import run_control, run_files
import train
from helpers import HERE, TINY, assert_same_run, logged_steps, read_log, run, run_here, start, wait_for_step

TORCHRUN = (sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2')


def worker_pids(agent_pid):
    """{rank: pid} of torchrun's worker processes, the agent's children, read from /proc."""
    ranks = {}
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/stat') as f:
                ppid = int(f.read().rsplit(')', 1)[1].split()[1])
            with open(f'/proc/{pid}/environ', 'rb') as f:
                env = dict(e.split(b'=', 1) for e in f.read().split(b'\0') if b'=' in e)
        except OSError:
            continue
        if ppid == agent_pid and b'RANK' in env:
            ranks[int(env[b'RANK'])] = int(pid)
    return ranks


# ---------------------------------------------------------------------------------------------
# 1. A clean exit under torchrun

@pytest.mark.slow
def test_torchrun_exits_zero_every_time(data_dir, tmp_path):
    # Rank 0 writes the last checkpoint while the others are done: without the final barrier a rank
    # could tear its process group down under it and abort (SIGABRT), about 1 run in 5 here. A model
    # of the quickstart's size makes that checkpoint take long enough for the race to show.
    shape = ['--n_layer=4', '--n_embd=128', '--n_head=4', '--attnres_block_size=4', '--max_iters=2',
             '--eval_interval=2', '--eval_tokens=256']
    for attempt in range(5):
        p = run(shape, data_dir, str(tmp_path / f'run{attempt}'), expect_ok=False, launcher=TORCHRUN)
        assert p.returncode == 0, f"attempt {attempt}: exit {p.returncode}\n{p.stderr[-3000:]}"


@pytest.mark.slow
def test_a_finished_torchrun_run_leaves_no_gloo_thread_to_the_interpreters_shutdown(data_dir, tmp_path):
    # A gloo thread still alive while the interpreter shuts down can abort a run that went well (SIGABRT after
    # the last evaluation, rarely, under load). DDP imports torch._dynamo, which, imported after the process
    # group exists, kept the group and its threads alive past destroy_process_group: when main() returns,
    # every rank is down to its main thread.
    wrapper = tmp_path / 'then_list_threads.py'
    wrapper.write_text(
        'import os, sys\n'
        f'sys.path.insert(0, {HERE!r})\n'
        'import train\n'
        'code = train.main(sys.argv[1:])\n'
        "names = [open(f'/proc/self/task/{t}/comm').read().strip() for t in os.listdir('/proc/self/task')]\n"
        f"open(os.path.join({str(tmp_path)!r}, 'threads.rank' + os.environ['RANK']), 'w').write(repr(sorted(names)))\n"
        'sys.exit(code)\n')   # (a file a rank: the two ranks' lines on one stdout can interleave)
    args = [*TINY, f'--data_dir={data_dir}', f'--out_dir={tmp_path / "run"}', '--max_iters=2']
    p = subprocess.run([*TORCHRUN, str(wrapper), *args], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    said = [(tmp_path / f'threads.rank{rank}').read_text() for rank in (0, 1)]
    assert not any('gloo' in threads for threads in said), said


# ---------------------------------------------------------------------------------------------
# 2. init_from='auto'

@pytest.mark.slow
def test_auto_starts_resumes_finishes_and_refuses(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    args = ['--init_from=auto', '--lr_decay_iters=4']
    run_here(args + ['--max_iters=2'], data_dir, out)                          # nothing there: from scratch
    assert sorted(read_log(out)[0]) == [1, 2]
    p = run_here(args, data_dir, out)                                          # a checkpoint of this run: resume
    assert 'resumed at step 2' in p.stdout and sorted(read_log(out)[0]) == [1, 2, 3, 4]
    full = str(tmp_path / 'full')
    run_here(['--lr_decay_iters=4'], data_dir, full)
    assert_same_run(out, full)
    before = {name: open(os.path.join(out, name), 'rb').read() for name in run_files.RUN_FILES}
    p = run_here(args, data_dir, out)                                          # finished: nothing to do
    assert 'already finished at step 4' in p.stdout
    assert before == {name: open(os.path.join(out, name), 'rb').read() for name in run_files.RUN_FILES}
    p = run_here(args + ['--seed=2'], data_dir, out, expect_ok=False)         # another run: refused
    assert p.returncode != 0 and 'cannot resume' in p.stderr and 'seed' in p.stderr
    assert before == {name: open(os.path.join(out, name), 'rb').read() for name in run_files.RUN_FILES}


@pytest.mark.slow
def test_auto_restarts_a_run_killed_before_its_first_checkpoint(data_dir, tmp_path):
    out = str(tmp_path / 'run')
    run_here(['--max_iters=4'], data_dir, out)
    # what a kill at step 1, before the first checkpoint (the first evaluation, step 2), leaves
    os.remove(os.path.join(out, 'ckpt.pt'))
    rows = [json.loads(line) for line in open(os.path.join(out, 'log.jsonl'))]
    open(os.path.join(out, 'log.jsonl'), 'w').write(''.join(json.dumps(r) + '\n' for r in rows if r['step'] < 2))
    p = run_here(['--init_from=auto', '--seed=2'], data_dir, out, expect_ok=False)   # not this run: refused
    assert p.returncode != 0 and 'another configuration' in p.stderr and 'seed' in p.stderr
    run_here(['--init_from=auto'], data_dir, out)         # this run: started again, nothing trained was lost
    assert sorted(read_log(out)[0]) == [1, 2, 3, 4] and os.path.exists(os.path.join(out, 'ckpt.pt'))


# ---------------------------------------------------------------------------------------------
# 3. Preemption: a signal mid-run -> every rank stops at one log step with a checkpoint -> resume

PREEMPT = ['--max_iters=40', '--lr_decay_iters=40', '--eval_interval=20', '--log_interval=5', '--init_from=auto']


def stopped_step(stdout):
    line = next(line for line in stdout.splitlines() if line.startswith('stopped by'))
    return int(line.split(' at step ')[1].split(':')[0])


def preempt(out_dir, after, send, launcher=(sys.executable,), data_dir=None):
    """Start the run (or continue it), wait until it has logged step `after`, call send(proc), and
    return the step at which it stopped and its output. The checkpoint must be from that very step."""
    proc = start(PREEMPT, data_dir, out_dir, launcher)
    wait_for_step(proc, out_dir, after)
    send(proc)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode != 0, stderr[-3000:]
    step = stopped_step(stdout)
    assert after < step and step % 5 == 0, stdout[-2000:]
    assert torch.load(os.path.join(out_dir, 'ckpt.pt'), weights_only=False)['step'] == step
    assert max(logged_steps(out_dir)) == step    # nothing was logged past the checkpoint
    return step, proc.returncode, stdout


@pytest.mark.slow
def test_signals_checkpoint_at_the_next_log_step_and_resume_is_exact(data_dir, tmp_path):
    out, full = str(tmp_path / 'preempted'), str(tmp_path / 'full')
    first, code, stdout = preempt(out, 5, lambda p: p.send_signal(signal.SIGTERM), data_dir=data_dir)
    # at most log_interval steps are lost, not everything since the last evaluation (step 0)
    assert code == run_files.EXIT_STOPPED and 'stopped by SIGTERM' in stdout and first < 20
    second, code, stdout = preempt(out, first + 5, lambda p: p.send_signal(signal.SIGUSR1), data_dir=data_dir)
    assert code == run_files.EXIT_STOPPED and 'stopped by SIGUSR1' in stdout and 'resumed at step' in stdout
    run(PREEMPT, data_dir, out)                  # the same command once more: it carries on to the end
    run(PREEMPT, data_dir, full)
    assert_same_run(out, full)


@pytest.mark.slow
def test_two_processes_stop_together_whoever_gets_the_signal(data_dir, tmp_path):
    out, full = str(tmp_path / 'preempted'), str(tmp_path / 'full')
    # SIGTERM to torchrun, which forwards it to both ranks (torchrun itself then exits non-zero)
    first, _, stdout = preempt(out, 5, lambda p: p.send_signal(signal.SIGTERM), TORCHRUN, data_dir)
    assert 'stopped by SIGTERM' in stdout
    # SIGUSR1 to rank 1 alone: rank 0 learns of it at the next log step and stops at the same one
    second, _, stdout = preempt(out, first + 5, lambda p: os.kill(worker_pids(p.pid)[1], signal.SIGUSR1),
                                TORCHRUN, data_dir)
    assert 'stopped by a signal to another rank' in stdout
    run(PREEMPT, data_dir, out, launcher=TORCHRUN)
    run(PREEMPT, data_dir, full, launcher=TORCHRUN)
    assert_same_run(out, full)


def test_the_signal_handlers_are_given_back(data_dir, tmp_path):
    # a process that calls train.main (a test, a notebook) must still be stoppable by SIGTERM afterwards
    before = {sig: signal.getsignal(sig) for sig in run_control.STOP_SIGNALS}
    train.main([*TINY, f'--data_dir={data_dir}', f'--out_dir={tmp_path / "run"}', '--max_iters=1'])
    assert {sig: signal.getsignal(sig) for sig in run_control.STOP_SIGNALS} == before


@pytest.mark.slow
def test_the_world_sizes_a_run_used_are_in_its_config(data_dir, tmp_path):
    # 2 processes to a checkpoint, continued on 1: the same batches (the data order does not depend on the
    # number of processes), and config.json says both, with the step each began at
    out = str(tmp_path / 'run')
    run(['--max_iters=2', '--lr_decay_iters=4'], data_dir, out, launcher=TORCHRUN)
    assert run_files.read_config(out)['world_sizes'] == [dict(step=0, world_size=2)]
    run_here(['--init_from=auto', '--lr_decay_iters=4'], data_dir, out)
    config = run_files.read_config(out)
    assert config['world_size'] == 1 and config['world_sizes'] == [dict(step=0, world_size=2), dict(step=2, world_size=1)]
    run_here(['--init_from=auto', '--lr_decay_iters=4', '--max_iters=6', '--train_past_schedule=True'], data_dir, out)
    assert run_files.read_config(out)['world_sizes'] == [dict(step=0, world_size=2), dict(step=2, world_size=1)]
