"""Clean interruption of the command-line tools: Ctrl-C (SIGINT), SIGTERM or a hang-up (SIGHUP:
the terminal closed) ends a command promptly with exit status 130 / 143 / 129 and one line on stderr, no traceback, no worker process or
build tool left running, no output written half-way.

Three pieces, shared by every entry point (``prefetch-sim``, ``python -m calibrate.llamacpp``
and its ``compare``, ``ab``, ``fit``, ``gguf_writer``):

* :func:`run_interruptible` runs a command's body with handlers that turn SIGINT, SIGTERM and
  SIGHUP into :class:`Interrupted` (a :class:`KeyboardInterrupt`, so ``except Exception`` does not
  swallow it); what the body has started is cleaned up as the exception unwinds (``with``
  blocks, ``finally``), then it says ``<prog>: interrupted`` and returns ``128 + signal``. A
  second signal during that clean-up is noted, not raised (the clean-up is not cut short).
* :class:`WorkerPool`, a :class:`~concurrent.futures.ProcessPoolExecutor` whose workers ignore
  SIGINT (a terminal's Ctrl-C reaches the whole process group: only the parent acts on it) and
  die at once of SIGTERM; leaving its ``with`` block by an exception cancels what has not
  started and terminates the workers (:meth:`WorkerPool.terminate`) instead of waiting for them.
* :func:`run_group`, :func:`subprocess.run` with the child in a session (process group) of its
  own: on a time-out or an interruption the whole group is killed (CMake's ninja and compilers
  too, not only ``cmake``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

#: the signals handled: Ctrl-C, ``kill``'s default and a hang-up (the terminal or ssh session closed)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread when the process receives SIGINT, SIGTERM or SIGHUP inside
    :func:`run_interruptible`.

    Attributes:
        signum: the signal's number.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def exit_status(self) -> int:
        """The shell's status of a process ended by this signal: ``128 + signum`` (130, 143)."""
        return 128 + self.signum


class _State:
    depth = 0  # nesting of run_interruptible (a command that runs another's main)
    pid = 0  # the process that installed the handlers (a forked child is not it)
    armed = False  # raise Interrupted on the first signal
    raised = False
    received: int | None = None
    shielded = 0  # inside signals_blocked(): a signal is raised when the block ends


_state = _State()


def _handler(signum, frame) -> None:
    if os.getpid() != _state.pid:  # a forked child that did not reset its handlers: die of the signal
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _state.received is None:
        _state.received = signum
    if _state.armed and not _state.raised and not _state.shielded:
        _state.raised = True
        raise Interrupted(signum)


def _raise_pending() -> None:
    """Raise the :class:`Interrupted` a signal noted while shielded would have raised."""
    if _state.received is not None and _state.armed and not _state.raised and not _state.shielded \
            and os.getpid() == _state.pid:
        _state.raised = True
        raise Interrupted(_state.received)


def _say(prog: str, signum: int) -> int:
    name = "" if signum == signal.SIGINT else f" ({signal.Signals(signum).name})"
    try:
        print(f"{prog}: interrupted{name}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr gone (a closed terminal): the status still says it
        pass
    return 128 + signum


def run_interruptible(prog: str, body, *args, **kwargs) -> int:
    """Call ``body(*args, **kwargs)`` (a command's work; returns its exit status) with SIGINT,
    SIGTERM and SIGHUP raising :class:`Interrupted` in it. On an interruption (also when another
    exception, such as a :class:`~concurrent.futures.process.BrokenProcessPool` from workers
    killed by the same SIGTERM, arrives with it) print ``<prog>: interrupted`` (and the signal's
    name unless SIGINT) on stderr and return ``128 + signal``. A closed standard output (``| head``)
    is a quiet 141 (:func:`closed_pipe`). A worker process that died without
    a signal to this process (``BrokenProcessPool``: killed from outside, e.g. out of memory) is
    one line on stderr and exit status 2. Other exceptions propagate.

    The previous handlers are restored on return. Outside the main thread no handler can be
    installed: only a :class:`KeyboardInterrupt` is caught. Nested calls (a command running
    another's ``main``) leave the handling to the outermost.
    """
    if _state.depth:
        return body(*args, **kwargs)
    previous = {}
    _state.raised, _state.received, _state.shielded = False, None, 0
    if threading.current_thread() is threading.main_thread():
        _state.pid, _state.armed = os.getpid(), True
        for s in SIGNALS:
            previous[s] = signal.getsignal(s)
            signal.signal(s, _handler)
    _state.depth += 1
    try:
        try:
            status = body(*args, **kwargs)
            sys.stdout.flush()   # here: a closed pipe is met inside, not at the interpreter's exit
        finally:
            _state.armed = False  # from here on a signal is noted, never raised
        if _state.received is not None:  # arrived as the command ended
            return _say(prog, _state.received)
        return status
    except BrokenPipeError:
        return closed_pipe()
    except KeyboardInterrupt as exc:
        return _say(prog, _state.received or getattr(exc, "signum", signal.SIGINT))
    except BrokenProcessPool:
        if _state.received is not None:
            return _say(prog, _state.received)
        print(f"{prog}: error: a worker process died (killed from outside, e.g. by the kernel's out-of-memory "
              "killer); nothing was written: run again, with --jobs 1 or a smaller sweep if memory is short",
              file=sys.stderr)
        return 2
    except BaseException:
        if _state.received is not None:
            return _say(prog, _state.received)
        raise
    finally:
        _state.depth -= 1
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        _state.armed = False


def closed_pipe() -> int:
    """The reader of standard output went away (``| head -1``): stdout to ``/dev/null`` (so the
    interpreter's last flush is quiet) and the status of a program SIGPIPE ended, 141 (128 + 13),
    with no message, as every command of the project ends then."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141


@contextlib.contextmanager
def signals_blocked():
    """Block SIGINT, SIGTERM and SIGHUP in this thread for the ``with`` block (a signal that arrives
    meanwhile is delivered when it ends). Processes forked or spawned inside inherit the block:
    :func:`worker_init` lifts it once the worker's own handlers are set. Inside
    :func:`run_interruptible`, a signal whose handler was due as the block began is held too:
    its :class:`Interrupted` is raised as the block ends (never half-way through the block)."""
    mask = getattr(signal, "pthread_sigmask", None)
    old = mask(signal.SIG_BLOCK, SIGNALS) if mask else None
    _state.shielded += 1
    try:
        yield
    finally:
        _state.shielded -= 1
        if mask:
            mask(signal.SIG_SETMASK, old)
    _raise_pending()


def worker_init(initializer=None, initargs=()) -> None:
    """A worker process's initializer: ignore SIGINT (the parent handles it and stops the
    workers), SIGTERM's default action (die at once, silently), then lift the block
    :class:`WorkerPool` started it with, then call ``initializer(*initargs)`` if given."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a hang-up reaches the group: die, the parent says it
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    if initializer is not None:
        initializer(*initargs)


class WorkerPool(ProcessPoolExecutor):
    """A :class:`~concurrent.futures.ProcessPoolExecutor` for the CLI's parallel work: its
    workers ignore SIGINT and die of SIGTERM (:func:`worker_init`); they are started with both
    signals blocked, so that no signal can reach a worker before its handlers are set. Leaving
    the ``with`` block normally waits for the work as usual; leaving it by an exception (an
    interruption, an error in a result) cancels the work not started and terminates the workers
    (:meth:`terminate`), so nothing is left running and nothing hangs.

    Do not cancel its futures (nor use :meth:`map`, whose iterator cancels those left when it
    is closed early): on Python < 3.12 a cancel racing with the pool's handling of killed
    workers breaks its manager thread (see :meth:`terminate`)."""

    def __init__(self, max_workers: int | None = None, mp_context=None, initializer=None, initargs=()):
        super().__init__(max_workers, mp_context, initializer=worker_init, initargs=(initializer, tuple(initargs)))

    def map(self, fn, *iterables, timeout=None, chunksize=1):
        """``fn`` over ``iterables`` as :meth:`concurrent.futures.Executor.map` (results in
        order), except that an early exit cancels nothing (the class docstring says why); with
        ``chunksize`` 1 only."""
        if timeout is not None or chunksize != 1:
            raise ValueError("WorkerPool.map takes neither timeout nor chunksize")
        futures = [self.submit(fn, *args) for args in zip(*iterables)]

        def results():
            for f in futures:
                yield f.result()

        return results()

    def submit(self, fn, /, *args, **kwargs):
        """Schedule ``fn(*args, **kwargs)`` as the base class does; the workers this starts are
        started with SIGINT and SIGTERM blocked (:func:`signals_blocked`)."""
        with signals_blocked():
            return super().submit(fn, *args, **kwargs)

    def terminate(self, timeout_s: float = 5.0) -> None:
        """Stop now: terminate every worker (SIGTERM; SIGKILL after ``timeout_s``), shut the
        pool down without waiting (cancelling the futures not started, on Python >= 3.12) and
        wait for the pool's manager thread, which fails the futures left
        (:class:`~concurrent.futures.process.BrokenProcessPool`) and ends."""
        procs = list((getattr(self, "_processes", None) or {}).values())
        manager = getattr(self, "_executor_manager_thread", None)
        call_queue = getattr(self, "_call_queue", None)
        for p in procs:
            with contextlib.suppress(Exception):
                p.terminate()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            with contextlib.suppress(Exception):
                p.join(max(0.0, deadline - time.monotonic()))
                if p.is_alive():
                    p.kill()
                    p.join(timeout_s)
        # Python < 3.12: a future cancelled while the manager thread fails the pending ones
        # raises InvalidStateError in that thread (a traceback), which then dies leaving the call
        # queue's feeder thread blocked on a full pipe, and the interpreter's exit waits for it
        # forever; the futures are failed by the manager thread instead (nothing waits on them)
        self.shutdown(wait=False, cancel_futures=sys.version_info >= (3, 12))
        if manager is not None and manager is not threading.current_thread():
            manager.join(timeout_s)
        if call_queue is not None:  # whatever happened to it, the exit never waits for its feeder
            with contextlib.suppress(Exception):
                call_queue.cancel_join_thread()

    def __exit__(self, exc_type, exc_val, exc_tb):
        if exc_type is None:
            self.shutdown(wait=True)
        else:
            self.terminate()
        return False


def kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Kill the process group that ``proc`` leads (started with ``start_new_session=True``):
    SIGTERM to the group, SIGKILL to what is left of it after ``grace_s``; reaps ``proc``."""
    pgid = proc.pid

    def signal_group(sig) -> bool:
        try:
            os.killpg(pgid, sig)
            return True
        except ProcessLookupError:  # the group is gone
            return False
        except PermissionError:  # not ours (cannot happen for a group we started): the leader only
            with contextlib.suppress(OSError):
                proc.send_signal(sig)
            return False

    if signal_group(signal.SIGTERM):
        deadline = time.monotonic() + grace_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.05)
        signal_group(signal.SIGKILL)
    proc.wait()


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` other than a zombie is left (``/proc``; without it,
    whether ``killpg(pgid, 0)`` finds one)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        try:
            os.killpg(pgid, 0)
            return True
        except OSError:
            return False
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def run_group(cmd, *, timeout: float | None = None, check: bool = False, input=None, grace_s: float = 5.0,
              **popen_kwargs) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` with the command in a session of its own (``start_new_session``):
    on a time-out, an interruption or any other exception while it runs, the command's whole
    process group is killed (:func:`kill_group`), not only the command (a build's ``cmake``
    leaves ninja and the compilers running otherwise). Arguments as :func:`subprocess.run`'s
    (``capture_output`` included).

    Raises:
        subprocess.TimeoutExpired: past ``timeout`` (after the group is killed), with the
            output read so far.
        subprocess.CalledProcessError: ``check`` and a non-zero exit status.
    """
    if popen_kwargs.pop("capture_output", False):
        popen_kwargs["stdout"] = popen_kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        popen_kwargs["stdin"] = subprocess.PIPE
    popen_kwargs["start_new_session"] = True
    with subprocess.Popen(cmd, **popen_kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            kill_group(proc, grace_s)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, exc.timeout, output=out, stderr=err) from None
        except BaseException:
            kill_group(proc, grace_s)
            raise
        status = proc.poll()
    if check and status:
        raise subprocess.CalledProcessError(status, proc.args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(proc.args, status, stdout, stderr)


__all__ = ["Interrupted", "SIGNALS", "WorkerPool", "kill_group",
           "run_group", "run_interruptible", "signals_blocked", "worker_init"]
