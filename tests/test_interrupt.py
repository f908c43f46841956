"""Ctrl-C (SIGINT), SIGTERM and a hang-up (SIGHUP) end every command cleanly (sim.cli.interrupt): exit
status 130 / 143 / 129,
one line on stderr and no traceback (from the parent or a worker), no worker process or build
tool left alive, no output (or temporary file) written half-way.

The end-to-end tests start a real command in a session of its own, wait until it has started its
worker processes (or its stand-in cmake has started a "compiler"), send the signal -- SIGINT to
the whole process group as a terminal's Ctrl-C does (SIGHUP too, as a closed terminal does),
SIGTERM to the command alone as ``kill`` does -- and check what is left. The workloads take minutes and the signal goes as soon as the
workers exist, so no outcome depends on the host's speed; the timeouts only guard against a hang.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sim.cli import interrupt as I

ROOT = Path(__file__).resolve().parent.parent
HANG_S = 120  # a guard only: a clean exit takes well under a second


# ---- helpers --------------------------------------------------------------------------------------

def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` fields after the command name (state first), None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].decode().split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    f = _stat(pid)
    return f is not None and f[0] not in ("Z", "X")


def _children(pid: int) -> list[int]:
    out = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            f = _stat(int(e))
            if f is not None and int(f[1]) == pid and f[0] not in ("Z", "X"):
                out.append(int(e))
    return out


def _group_members(pgid: int) -> list[int]:
    out = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            f = _stat(int(e))
            if f is not None and int(f[2]) == pgid and f[0] not in ("Z", "X"):
                out.append(int(e))
    return out


def _wait_for(cond, proc: subprocess.Popen, what: str, timeout_s: float = HANG_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            pytest.fail(f"the command ended (exit {proc.returncode}) before {what}: {err[-2000:]}")
        time.sleep(0.01)
    pytest.fail(f"no {what} after {timeout_s} s")


def _start(cmd: list[str], cwd: Path = ROOT, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)


def _send(proc: subprocess.Popen, sig: int) -> None:
    if sig in (signal.SIGINT, signal.SIGHUP):  # a terminal's Ctrl-C or hang-up: the whole process group
        os.killpg(proc.pid, sig)
    else:  # kill PID
        proc.send_signal(sig)


def _finish(proc: subprocess.Popen) -> str:
    try:
        _out, err = proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the command hung after the signal")
    return err


def _check_clean(proc: subprocess.Popen, err: str, sig: int, prog: str, pids: list[int]) -> None:
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err and "Error" not in err, err
    suffix = "" if sig == signal.SIGINT else f" ({signal.Signals(sig).name})"
    assert err == f"{prog}: interrupted{suffix}\n", err
    left = [p for p in pids if _alive(p)]
    left += [p for p in _group_members(proc.pid) if p not in left]
    for p in left:  # do not leave them running even when the test fails
        os.kill(p, signal.SIGKILL)
    assert not left, f"processes left alive: {left}"


def _no_partial_files(folder: Path) -> None:
    if folder.exists():
        assert not list(folder.iterdir()), list(folder.iterdir())


@pytest.fixture
def reaper():
    """Kill (SIGKILL) the process groups a test started if it failed half-way."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs /proc (Linux)")
SIGS = [pytest.param(signal.SIGINT, id="SIGINT-group"), pytest.param(signal.SIGTERM, id="SIGTERM-pid"),
        pytest.param(signal.SIGHUP, id="SIGHUP-group")]


# ---- end to end: worker pools -----------------------------------------------------------------------

def _interrupt_pool_command(cmd: list[str], sig: int, prog: str, out_dir: Path, reaper, n_workers: int = 2):
    proc = _start(cmd)
    reaper.append(proc)
    workers = _wait_for(lambda: (lambda k: k if len(k) >= n_workers else None)(_children(proc.pid)), proc,
                        f"{n_workers} worker processes")
    _send(proc, sig)
    err = _finish(proc)
    _check_clean(proc, err, sig, prog, workers)
    _no_partial_files(out_dir)


@needs_proc
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="prefetch-sim run uses one worker per core")
@pytest.mark.parametrize("sig", SIGS)
def test_run_interrupted_stops_its_workers_and_writes_nothing(tmp_path, sig, reaper):
    out = tmp_path / "out"
    # minutes of work: four variants (two with an expert cache, never memoised), 50 repetitions
    cmd = [sys.executable, "-m", "sim", "run", "--variant", "baseline,cache_lru,cache_lfu,slots3", "-n", "512",
           "-r", "50", "--engine", "des", "--max-work", "100000000", "-q", "--out", str(out / "table.csv")]
    _interrupt_pool_command(cmd, sig, "prefetch-sim", out, reaper)


@needs_proc
@pytest.mark.parametrize("sig", SIGS)
def test_crossover_interrupted_stops_its_workers_and_writes_nothing(tmp_path, sig, reaper):
    out = tmp_path / "cx"
    cmd = [sys.executable, "-m", "sim", "crossover", "--axis", "depth=0-16384+1024", "--variant",
           "baseline,cache_lru,cache_lfu", "--test", "tg256", "-r", "30", "--engine", "des", "-j", "3", "-q",
           "--max-work", "100000000", "--out", str(out)]
    _interrupt_pool_command(cmd, sig, "prefetch-sim", out, reaper, n_workers=3)


@needs_proc
def test_compare_interrupted_stops_its_workers_and_writes_nothing(tmp_path, reaper):
    out = tmp_path / "cmp"
    cmd = [sys.executable, "-m", "calibrate.llamacpp.compare", "data/llamacpp/h200-20261201", "--jobs", "2", "-q",
           "--repetitions", "200", "--engine", "des", "--max-work", "1000000000", "--out", str(out / "c.csv"),
           "--summary", str(out / "c.md"), "--figure", str(out / "c.png")]
    _interrupt_pool_command(cmd, signal.SIGTERM, "compare", out, reaper)


@needs_proc
def test_ab_interrupted_stops_its_workers(tmp_path, reaper):
    out = tmp_path / "ab"
    cmd = [sys.executable, "-m", "calibrate.llamacpp.ab", "data/llamacpp/h200-20261202-prefetch", "--jobs", "2",
           "-q", "--repetitions", "1000", "--engine", "des", "--max-work", "1000000000", "--out", str(out / "a.csv")]
    _interrupt_pool_command(cmd, signal.SIGINT, "ab", out, reaper)


@needs_proc
def test_fit_interrupted_leaves_the_profile_as_it_was(tmp_path, reaper):
    import shutil

    hw = tmp_path / "scenarios" / "hardware"
    shutil.copytree(ROOT / "scenarios" / "hardware", hw)
    profile = hw / "h200-llamacpp.toml"
    before = profile.read_bytes()
    cmd = [sys.executable, "-m", "calibrate.llamacpp.fit", "--jobs", "2", "--profile", str(profile), "--write",
           "--iterations", "50"]
    _interrupt_pool_command(cmd, signal.SIGTERM, "fit", tmp_path / "none", reaper)
    assert profile.read_bytes() == before
    assert not [p.name for p in hw.iterdir() if p.name.startswith(".")]  # no temporary file


# ---- end to end: the build's process group ----------------------------------------------------------

FAKE_CMAKE = """#!{python}
# a stand-in cmake: configure succeeds; --build starts a long "compiler" (its own child, as
# ninja's are) and waits for it, after writing both pids
import os, subprocess, sys, time
if "--build" not in sys.argv:
    sys.exit(0)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["PIDS"] + ".tmp", "w") as fh:
    fh.write(f"{{os.getpid()}} {{child.pid}}\\n")
os.replace(os.environ["PIDS"] + ".tmp", os.environ["PIDS"])
child.wait()
"""

BUILD_DRIVER = """
import sys
from pathlib import Path
import calibrate.llamacpp.build as B
tree = Path(sys.argv[1])
B.prepare = lambda llama_cpp, work, cache: (tree, "stand-in", ())  # no sdist, no patches
from calibrate.llamacpp.__main__ import main
sys.exit(main(["build", "--llama-cpp", str(tree), "--cpu", "--work", sys.argv[2], "--targets", "llama-bench"]))
"""


def _fake_build_env(tmp_path: Path) -> tuple[dict, Path, Path]:
    from calibrate.llamacpp import build as B

    tree = tmp_path / "tree"
    for rel in B.REQUIRED:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text("// stand-in\n")
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    cmake = bin_dir / "cmake"
    cmake.write_text(FAKE_CMAKE.format(python=sys.executable))
    cmake.chmod(cmake.stat().st_mode | stat.S_IEXEC)
    pids = tmp_path / "pids"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PIDS": str(pids),
           "PYTHONPATH": str(ROOT)}
    return env, tree, pids


def _read_pids(path: Path):
    try:
        return [int(x) for x in path.read_text().split()] or None
    except (OSError, ValueError):
        return None


@needs_proc
@pytest.mark.parametrize("sig", SIGS)
def test_build_interrupted_kills_cmake_and_its_children(tmp_path, sig, reaper):
    env, tree, pids_file = _fake_build_env(tmp_path)
    driver = tmp_path / "driver.py"
    driver.write_text(BUILD_DRIVER)
    work = tmp_path / "work"
    proc = _start([sys.executable, str(driver), str(tree), str(work)], env=env)
    reaper.append(proc)
    pids = _wait_for(lambda: _read_pids(pids_file), proc, "a running build")
    cmake_pid, compiler_pid = pids
    _wait_for(lambda: _alive(compiler_pid), proc, "a running compiler")
    _send(proc, sig)
    err = _finish(proc)
    _check_clean(proc, err, sig, "calibrate.llamacpp", pids)
    assert not list(work.rglob("prefetch-sim-build.json"))  # not recorded as built


LEASE_DRIVER = """
import subprocess, sys
from pathlib import Path
import calibrate.llamacpp.lease as L
tree, work = Path(sys.argv[1]), Path(sys.argv[2])

def writers(lease, spec, repo, procs=None):  # one long stand-in GGUF writer
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    procs.append(("stand-in", p, None, 0.0, None))
    (work / "writer.pid").write_text(str(p.pid))
    return procs

L.start_writers = writers
L.unpack_patched = lambda archive, dest: (tree, "stand-in", ())
L.machine_info = lambda: {}
L.preflight = lambda: None  # no GPU on this host: the stand-in build runs all the same
from calibrate.llamacpp.__main__ import main
sys.exit(main(["lease", "--src", sys.argv[3], "--work", str(work)]))
"""


@needs_proc
def test_lease_interrupted_kills_the_build_and_the_gguf_writers(tmp_path, reaper):
    import json

    env, tree, pids_file = _fake_build_env(tmp_path)
    nvcc = tmp_path / "fakebin" / "nvcc"  # the lease builds for CUDA: a compiler must be there
    nvcc.write_text("#!/bin/sh\nexit 0\n")
    nvcc.chmod(0o755)
    driver = tmp_path / "driver.py"
    driver.write_text(LEASE_DRIVER)
    work = tmp_path / "work"
    work.mkdir()
    src = tmp_path / "src.tar.gz"
    src.write_bytes(b"")
    proc = _start([sys.executable, str(driver), str(tree), str(work), str(src)], env=env)
    reaper.append(proc)
    pids = _wait_for(lambda: _read_pids(pids_file), proc, "a running build")
    writer = int((work / "writer.pid").read_text())
    _send(proc, signal.SIGTERM)
    err = _finish(proc)
    _check_clean(proc, err, signal.SIGTERM, "calibrate.llamacpp", [*pids, writer])
    status = json.loads((work / "status.json").read_text())
    assert status["step"] == "failed" and status["error"] == "interrupted"


# ---- in process ---------------------------------------------------------------------------------------

def test_run_interruptible_returns_the_signal_status_and_restores_the_handlers(capsys):
    before = {s: signal.getsignal(s) for s in I.SIGNALS}

    def body(sig):
        os.kill(os.getpid(), sig)
        for _ in range(1000):  # the handler raises at the next bytecode
            time.sleep(0.01)
        return 0

    assert I.run_interruptible("x", body, signal.SIGTERM) == 143
    assert capsys.readouterr().err == "x: interrupted (SIGTERM)\n"
    assert I.run_interruptible("x", body, signal.SIGINT) == 130
    assert capsys.readouterr().err == "x: interrupted\n"
    assert {s: signal.getsignal(s) for s in I.SIGNALS} == before
    assert I.run_interruptible("x", lambda: 3) == 3  # a normal return passes through


def test_run_interruptible_reports_an_error_that_comes_with_the_signal(capsys):
    def body():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
        except KeyboardInterrupt:  # e.g. a BrokenProcessPool from workers killed by the same SIGTERM
            raise RuntimeError("a worker died") from None

    assert I.run_interruptible("x", body) == 143
    assert capsys.readouterr().err == "x: interrupted (SIGTERM)\n"

    def fails():
        raise RuntimeError("no signal")

    with pytest.raises(RuntimeError, match="no signal"):  # without a signal, an error is an error
        I.run_interruptible("x", fails)


def test_signals_blocked_holds_the_interruption_until_the_block_ends(capsys):
    done = []

    def body():
        with I.signals_blocked():
            os.kill(os.getpid(), signal.SIGTERM)
            for i in range(100):  # work the interruption must not cut in half
                time.sleep(0.001)
            done.append(i)
        done.append("after")  # never
        return 0

    assert I.run_interruptible("x", body) == 143
    assert done == [99] and capsys.readouterr().err == "x: interrupted (SIGTERM)\n"


def test_nested_run_interruptible_leaves_the_handling_to_the_outermost(capsys):
    seen = []

    def inner():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        seen.append("inner went on")  # never: the interruption ends the outer command too
        return 0

    def outer():
        I.run_interruptible("inner", inner)
        seen.append("outer went on")
        return 0

    assert I.run_interruptible("outer", outer) == 143
    assert seen == [] and capsys.readouterr().err == "outer: interrupted (SIGTERM)\n"


def test_run_interruptible_outside_the_main_thread_installs_nothing():
    got = []
    t = threading.Thread(target=lambda: got.append(I.run_interruptible("x", lambda: 5)))
    t.start()
    t.join()
    assert got == [5]


def test_worker_pool_leaving_by_an_exception_terminates_the_workers_at_once():
    t0 = time.monotonic()
    with pytest.raises(ZeroDivisionError):
        with I.WorkerPool(max_workers=2) as pool:
            procs = None
            futs = [pool.submit(time.sleep, 600) for _ in range(4)]
            procs = list(pool._processes.values())
            1 / 0
    assert time.monotonic() - t0 < 60  # not the ten minutes the tasks would take
    assert procs and not any(p.is_alive() for p in procs)
    assert all(f.done() for f in futs)


def test_worker_pool_workers_ignore_sigint_and_map_keeps_order():
    with I.WorkerPool(max_workers=2) as pool:
        assert list(pool.map(abs, [-3, 2, -1])) == [3, 2, 1]
        assert pool.submit(signal.getsignal, signal.SIGINT).result() == signal.SIG_IGN
        assert pool.submit(signal.getsignal, signal.SIGTERM).result() == signal.SIG_DFL
        assert not pool.submit(signal.pthread_sigmask, signal.SIG_BLOCK, []).result() & set(I.SIGNALS)


@needs_proc
def test_run_group_interrupted_kills_the_whole_group(tmp_path, capsys):
    pid_file = tmp_path / "pid"
    script = ("import os, subprocess, sys, time; "
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              f"open({str(pid_file)!r} + '.tmp', 'w').write(str(c.pid)); "
              f"os.replace({str(pid_file)!r} + '.tmp', {str(pid_file)!r}); time.sleep(600)")

    def signal_when_started():
        deadline = time.monotonic() + HANG_S
        while not pid_file.is_file() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    def body():
        threading.Thread(target=signal_when_started, daemon=True).start()
        I.run_group([sys.executable, "-c", script], grace_s=2)
        return 0

    assert I.run_interruptible("x", body) == 143
    assert capsys.readouterr().err == "x: interrupted (SIGTERM)\n"
    assert not _alive(int(pid_file.read_text()))


def test_run_group_times_out_as_subprocess_run_does():
    with pytest.raises(subprocess.TimeoutExpired):
        I.run_group([sys.executable, "-c", "import time; time.sleep(600)"], timeout=0.5, grace_s=2)
    r = I.run_group([sys.executable, "-c", "print('hi')"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "hi\n"
    with pytest.raises(subprocess.CalledProcessError):
        I.run_group([sys.executable, "-c", "raise SystemExit(3)"], check=True)


def _die_by_sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_from_outside_is_one_line_and_status_2(capsys):
    """A worker that dies of a signal this process never received (the out-of-memory killer's
    SIGKILL) breaks the pool: one line naming it, exit status 2, no traceback."""
    def body():
        with I.WorkerPool(max_workers=1) as pool:
            return pool.submit(_die_by_sigkill).result()

    assert I.run_interruptible("prog", body) == 2
    err = capsys.readouterr().err
    assert err.startswith("prog: error: a worker process died") and len(err.strip().splitlines()) == 1
