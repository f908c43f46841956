"""One GPU lease, end to end: unpack the llama.cpp source, write the grid's synthetic GGUFs
while llama.cpp builds, run the routing check and the grid, record provenance.

Made for the lent H200 (``../shared/LLAMACPP.md``): a machine stays warm only 30 s after a call
and one call runs at most 10 minutes, so the whole lease runs as one background process
(``start``, detached with ``setsid``) that outlives the calls, and each call ``collect``-s:
it waits for progress, then packs the run folder (data and logs, no models) into ``$OUT``.
Everything is written under a work folder outside the repository:

* ``status.json`` — the current step and its start time, ``done`` at the end;
* ``progress.log`` — one line per step and per grid invocation;
* ``run/`` — the data: ``meta.json`` (provenance), ``build.json``, ``gguf.jsonl`` (one record
  per written model), ``llama-bench.jsonl``, ``routing.jsonl``, ``invocations.jsonl``,
  ``logs/``, ``perf/`` (``test-backend-ops perf`` output), ``host_state.jsonl`` (the host's
  load, clock, memory and huge pages every 5 s, :func:`start_host_sampler`);
* ``models/`` — the GGUFs (not packed).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from sim.cli.interrupt import kill_group

from .build import TARGETS, BuildError, build, nvcc_found, unpack_patched
from .grid import load_grid, run_grid

#: disk kept free beside the GGUFs (the llama.cpp build takes ~1.5 GB)
DISK_RESERVE_BYTES = 4 * 2**30
#: test-backend-ops perf runs made after the grid while time is left: (name, backend, case
#: list, seconds limit). With the ``perf-cases`` patch the cases are the models' own shapes
#: (:func:`calibrate.llamacpp.perf_cases.gpu_cases` / ``cpu_cases``); the CPU backend runs with
#: llama-bench's thread count (all hardware threads).
PERF_RUNS = (("cuda", "CUDA0", "gpu_cases", 420), ("cpu", "CPU", "cpu_cases", 240))
#: minimum timed span per case (µs; test-backend-ops' own is 1 s): enough repetitions for a
#: stable mean of the short kernels, a quarter of the device time
PERF_MIN_US = 250_000


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Lease:
    """The state of one lease's work folder (see the module docstring)."""

    def __init__(self, work: str | Path):
        self.work = Path(work).resolve()
        self.run_dir = self.work / "run"
        self.models = self.work / "models"
        self.t0 = time.monotonic()

    def say(self, msg: str) -> None:
        line = f"{_now()} +{time.monotonic() - self.t0:7.1f}s {msg}"
        print(line, flush=True)
        with open(self.work / "progress.log", "a") as fh:
            fh.write(line + "\n")

    def status(self, step: str, **extra) -> None:
        tmp = self.work / "status.json.tmp"
        tmp.write_text(json.dumps({"step": step, "at": _now(), "elapsed_s": round(time.monotonic() - self.t0, 1),
                                   **extra}))
        tmp.replace(self.work / "status.json")


def _cmd(cmd: list[str], timeout: float = 20) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return (r.stdout + r.stderr).strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unavailable ({exc.__class__.__name__})"


#: the /proc/cpuinfo flags ``meta.json`` keeps: the ones ggml-cpu's kernels depend on (-march=native)
CPU_FLAGS_KEPT = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni",
                  "amx_int8", "amx_bf16", "amx_tile", "f16c", "fma", "hypervisor")


def machine_info() -> dict:
    """GPU, driver, CUDA, CPU and OS of this machine, for ``meta.json``; never raises."""
    info = {
        "gpu": _cmd(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,pcie.link.gen.max,"
                     "pcie.link.width.max,clocks.max.sm", "--format=csv,noheader"]),
        "nvidia_smi": _cmd(["nvidia-smi"]).splitlines()[:4],
        "nvcc": _cmd(["nvcc", "--version"]).splitlines()[-2:],
        "cmake": _cmd(["cmake", "--version"]).splitlines()[:1],
        "cxx": _cmd(["c++", "--version"]).splitlines()[:1],
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "lscpu": [ln for ln in _cmd(["lscpu"]).splitlines()
                  if ln.split(":")[0].strip() in ("Thread(s) per core", "Core(s) per socket", "Socket(s)",
                                                  "NUMA node(s)", "L3 cache", "L2 cache", "Hypervisor vendor", "Model")],
        "python": sys.version.split()[0],
    }
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        cpu = [ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")]
        info["cpu"] = cpu[0] if cpu else ""
        # which host a VM landed on: the masked model name is the same on every lent machine
        first = cpuinfo.split("\n\n", 1)[0]
        fields = dict((k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in first.splitlines()))
        info["cpu_id"] = {k: fields.get(k, "") for k in ("cpu family", "model", "stepping", "microcode",
                                                          "cache size", "siblings", "cpu cores")}
        flags = set(fields.get("flags", "").split())
        info["cpu_flags"] = sorted(flags & set(CPU_FLAGS_KEPT))
        mem = [ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")]
        info["mem_total"] = mem[0].split(":", 1)[1].strip() if mem else ""
    except OSError:
        pass
    return info


#: seconds between two samples of :func:`start_host_sampler`
HOST_SAMPLE_S = 5.0
#: the /proc/meminfo fields a host sample keeps (kB)
MEMINFO_KEYS = ("MemFree", "Cached", "AnonHugePages", "HugePages_Total", "HugePages_Free", "Mlocked")
#: the /proc/<pid>/smaps_rollup fields kept for each running llama-bench (kB)
SMAPS_KEYS = ("Rss", "AnonHugePages", "Locked", "Shared_Hugetlb", "Private_Hugetlb")


def _kv_kb(text: str, keys) -> dict:
    out = {}
    for ln in text.splitlines():
        k, _, v = ln.partition(":")
        if k.strip() in keys:
            try:
                out[k.strip()] = int(v.split()[0])
            except (IndexError, ValueError):
                pass
    return out


#: the fields of /proc/stat's first (``cpu``) line a host sample keeps as ``stat_cpu``, in order
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def host_sample(program: str = "llama-bench") -> dict:
    """One sample of the host's state: UTC time, ``/proc/loadavg``, the ``cpu`` line of
    ``/proc/stat`` (jiffies: user nice system idle iowait irq softirq steal), the median CPU
    clock of ``/proc/cpuinfo`` (MHz), :data:`MEMINFO_KEYS` of ``/proc/meminfo`` (kB) and, for
    each running ``program``, :data:`SMAPS_KEYS` of its ``smaps_rollup`` (kB: how much of the
    process's memory, the CPU-resident weights included, is backed by transparent huge pages).
    Fields that cannot be read are left out; never raises."""
    rec: dict = {"at": _now()}
    try:
        rec["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
        rec["stat_cpu"] = [int(x) for x in
                           Path("/proc/stat").read_text().splitlines()[0].split()[1:1 + len(STAT_FIELDS)]]
    except (OSError, ValueError):
        pass
    try:
        mhz = sorted(float(ln.split(":", 1)[1]) for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("cpu MHz"))
        if mhz:
            rec["cpu_mhz"] = mhz[len(mhz) // 2]
    except (OSError, ValueError):
        pass
    try:
        rec["meminfo"] = _kv_kb(Path("/proc/meminfo").read_text(), MEMINFO_KEYS)
    except OSError:
        pass
    procs = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if (d / "comm").read_text().strip() != program[:15]:
                continue
            procs[d.name] = _kv_kb((d / "smaps_rollup").read_text(), SMAPS_KEYS)
        except OSError:
            continue
    if procs:
        rec[program] = procs
    return rec


def start_host_sampler(path: Path, period_s: float = HOST_SAMPLE_S):
    """Append :func:`host_sample` as one JSON line to ``path`` every ``period_s`` seconds from a
    daemon thread (it ends with the lease process), after one line of the transparent-huge-page
    settings (``/sys/kernel/mm/transparent_hugepage``). Returns a :class:`threading.Event`
    that stops it when set."""
    import threading

    stop = threading.Event()

    def thp() -> dict:
        out = {}
        for k in ("enabled", "defrag", "shmem_enabled"):
            try:
                out[k] = (Path("/sys/kernel/mm/transparent_hugepage") / k).read_text().strip()
            except OSError:
                pass
        return out

    def loop() -> None:
        try:
            with open(path, "a") as fh:
                fh.write(json.dumps({"at": _now(), "transparent_hugepage": thp()}) + "\n")
            while not stop.is_set():
                with open(path, "a") as fh:
                    fh.write(json.dumps(host_sample()) + "\n")
                stop.wait(period_s)
        except OSError:
            return

    threading.Thread(target=loop, name="host-sampler", daemon=True).start()
    return stop


def start_writers(lease: Lease, spec, repo: Path,
                  procs: list | None = None) -> list[tuple[str, subprocess.Popen, Path, float]]:
    """Start one GGUF writer process per grid model (``python -m calibrate.llamacpp.gguf_writer``);
    returns ``(key, process, log, start, stamp)``, process None for a GGUF kept from an earlier lease in
    the same work folder (same model TOML, writer source, seed and layers: ``models/<key>.json``).
    A model whose estimated size does not fit the free disk is skipped and recorded. ``procs``: the
    list to append to as each starts (an interruption half-way knows which to stop)."""
    from sim.model.specs import load_model

    lease.models.mkdir(parents=True, exist_ok=True)
    procs = [] if procs is None else procs
    free = shutil.disk_usage(lease.models).free - DISK_RESERVE_BYTES
    for m in spec.models:
        out = lease.models / m.gguf_name
        spec_m = load_model(repo / m.toml)
        need = spec_m.nbytes * (m.n_layer or spec_m.n_layer) / spec_m.n_layer
        stamp = {"model_toml": m.toml, "toml_sha256": hashlib.sha256((repo / m.toml).read_bytes()).hexdigest()[:16],
                 "writer_sha256": hashlib.sha256((repo / "calibrate/llamacpp/gguf_writer.py").read_bytes()).hexdigest()[:16],
                 "seed": m.seed, "n_layer": m.n_layer}
        stamp_file = lease.models / f"{m.key}.json"
        if out.is_file() and stamp_file.is_file():
            try:
                old = json.loads(stamp_file.read_text())
            except ValueError:
                old = {}
            if {k: old.get(k) for k in stamp} == stamp and old.get("bytes") == out.stat().st_size:
                lease.say(f"gguf {m.key}: reusing {out} (same model file, writer and seed)")
                procs.append((m.key, None, None, time.monotonic(), None))
                continue
        if need > free:
            lease.say(f"gguf {m.key}: SKIPPED: needs {need / 2**30:.1f} GiB, {max(free, 0) / 2**30:.1f} GiB of disk left")
            with open(lease.run_dir / "gguf.jsonl", "a") as fh:
                fh.write(json.dumps({"key": m.key, "model_toml": m.toml, "rc": None, "skipped": "disk",
                                     "need_bytes": need, "free_bytes": free}) + "\n")
            continue
        free -= need
        log = lease.run_dir / "logs" / f"gguf-{m.key}.log"
        cmd = [sys.executable, "-m", "calibrate.llamacpp.gguf_writer", "--model", str(repo / m.toml),
               "--out", str(out), "--seed", str(m.seed)]
        if m.n_layer:
            cmd += ["--n-layer", str(m.n_layer)]
        fh = open(log, "w")
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        stamp_file.unlink(missing_ok=True)
        # a session of its own: an interrupted lease kills it (kill_group), a terminal's Ctrl-C does not
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=repo, start_new_session=True)
        procs.append((m.key, proc, log, time.monotonic(), stamp))  # stamp: written when the writer succeeds
        lease.say(f"gguf {m.key}: writing {out}")
    return procs


def wait_writers(lease: Lease, spec, procs) -> list[str]:
    """Wait for the writers; record each in ``run/gguf.jsonl``; returns the keys that failed."""
    failed = []
    for key, p, log, t0, stamp in procs:
        if p is None:  # reused
            continue
        rc = p.wait()
        m = spec.model(key)
        path = lease.models / m.gguf_name
        if rc == 0 and path.is_file():
            (lease.models / f"{key}.json").write_text(json.dumps({**stamp, "bytes": path.stat().st_size}))
        rec = {"key": key, "model_toml": m.toml, "gguf": m.gguf_name, "n_layer": m.n_layer, "seed": m.seed,
               "rc": rc, "wall_s": round(time.monotonic() - t0, 1), "log": str(log.relative_to(lease.run_dir)),
               "bytes": path.stat().st_size if path.is_file() else None}
        with open(lease.run_dir / "gguf.jsonl", "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        if rc != 0 or not path.is_file():
            failed.append(key)
            lease.say(f"gguf {key}: FAILED (exit {rc}); log: {log}")
        else:
            lease.say(f"gguf {key}: {rec['bytes'] / 2**30:.2f} GiB in {rec['wall_s']} s")
    return failed


def h2d_probe(lease: Lease, timeout_s: float = 120) -> None:
    """Pinned/pageable H2D bandwidth with CuPy (:mod:`calibrate.llamacpp.h2d_probe`) into
    ``run/h2d.json``; a failure is logged, not fatal."""
    cmd = [sys.executable, "-m", "calibrate.llamacpp.h2d_probe", str(lease.run_dir / "h2d.json")]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        lease.say("h2d probe: " + (r.stdout.strip().replace("\n", "; ") if r.returncode == 0 else
                                    f"FAILED (exit {r.returncode}): {r.stderr.strip()[-300:]}"))
    except subprocess.TimeoutExpired:
        lease.say("h2d probe: timed out")


def run_perf(lease: Lease, program: Path, deadline_at: float, repo: Path,
             names: tuple[str, ...] | None = None, models: tuple[str, ...] = (),
             weights_only: bool = False) -> None:
    """``test-backend-ops perf`` on the shapes of ``models`` (repository paths of model TOMLs;
    empty: :data:`calibrate.llamacpp.perf_cases.LEASE_MODELS`) for the runs of
    :data:`PERF_RUNS` named in ``names``, in that order (None: all), while time is left:
    ``run/perf/<name>-cases.txt`` (the case file) and ``run/perf/<name>.txt`` (the output);
    ``weights_only``: the weight matmuls alone (:func:`calibrate.llamacpp.perf_cases.weight_cases`)."""
    from . import perf_cases

    perf = lease.run_dir / "perf"
    perf.mkdir(exist_ok=True)
    runs = {r[0]: r for r in PERF_RUNS}
    for name, backend, make, limit in (runs[n] for n in (names if names is not None else runs)):
        left = deadline_at - time.monotonic()
        if left < 30:
            lease.say(f"perf {name}: skipped (deadline)")
            continue
        cases = perf / f"{name}-cases.txt"
        listed = getattr(perf_cases, make)([repo / m for m in (models or perf_cases.LEASE_MODELS)])
        n = len(perf_cases.write_case_list(cases, perf_cases.weight_cases(listed) if weights_only else listed))
        env = {**os.environ, "PREFETCH_SIM_PERF_CASES": str(cases), "PREFETCH_SIM_THREADS": str(os.cpu_count() or 1),
               "PREFETCH_SIM_PERF_MIN_US": str(PERF_MIN_US)}
        cmd = [str(program), "perf", "-b", backend]
        t0 = time.monotonic()
        with open(perf / f"{name}.txt", "w") as fh:
            fh.write(f"$ PREFETCH_SIM_PERF_CASES={cases} PREFETCH_SIM_THREADS={env['PREFETCH_SIM_THREADS']} "
                     f"PREFETCH_SIM_PERF_MIN_US={PERF_MIN_US} " + " ".join(cmd) + "\n")
            fh.flush()
            try:
                rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                    timeout=min(limit, left - 10)).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        lease.say(f"perf {name}: {n} cases, exit {rc} in {time.monotonic() - t0:.0f} s")


#: the host-rate canary's source (:attr:`calibrate.llamacpp.grid.GridSpec.canary`)
CANARY_SRC = Path(__file__).with_name("src") / "psim-membw.cpp"


def compile_canary(lease: Lease, out: Path, compiler: str = "c++") -> Path | None:
    """Compile ``psim-membw`` (:data:`CANARY_SRC`) to ``out``; None (said in the progress log)
    when the compiler is missing or fails: the grid then runs without the canary."""
    cmd = [compiler, "-O3", "-march=native", "-pthread", "-std=c++17", "-o", str(out), str(CANARY_SRC)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        lease.say(f"canary: not compiled ({exc.__class__.__name__}: {exc}); the grid runs without it")
        return None
    if r.returncode != 0:
        lease.say(f"canary: not compiled (exit {r.returncode}): {r.stderr.strip()[-300:]}")
        return None
    return out


def make_canary(lease: Lease, program: Path, timeout_s: float = 30):
    """``before(run)`` for :func:`calibrate.llamacpp.grid.run_grid`: run ``program``
    (``psim-membw`` with every hardware thread, llama-bench's count) and append its JSON line to
    ``run/canary.jsonl`` as ``{"before": run id, "at": UTC time, "rc": exit status, ...}``
    (``error`` instead of the figures when it failed). Never raises."""
    threads = os.cpu_count() or 1

    def before(run) -> None:
        rec: dict = {"before": run.id, "at": _now()}
        try:
            r = subprocess.run([str(program), "--threads", str(threads)], capture_output=True, text=True,
                               timeout=timeout_s)
            rec["rc"] = r.returncode
            if r.returncode == 0:
                rec.update(json.loads(r.stdout.strip().splitlines()[-1]))
            else:
                rec["error"] = r.stderr.strip()[-300:]
        except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
            rec.update(rc=None, error=f"{exc.__class__.__name__}: {exc}")
        with open(lease.run_dir / "canary.jsonl", "a") as fh:
            fh.write(json.dumps(rec) + "\n")

    return before


def preflight(which=shutil.which, cmd=None) -> None:
    """What a lease needs before it writes a byte: CMake and nvcc for the CUDA build of llama.cpp
    and an NVIDIA GPU (``nvidia-smi -L`` lists one) for llama-bench; the GGUF writers it starts
    beside the build write ~45 GB, useless without them.

    Raises:
        BuildError: one line naming what is missing.
    """
    if not which("cmake"):
        raise BuildError("cmake not found: the lease builds llama.cpp with CMake (>= 3.14)")
    if not nvcc_found(which):
        raise BuildError("nvcc not found: the lease builds llama.cpp for CUDA (CUDA's compiler is needed)")
    listed = (cmd or _cmd)(["nvidia-smi", "-L"]) if which("nvidia-smi") else ""
    if "GPU" not in listed:
        raise BuildError("no NVIDIA GPU visible (nvidia-smi -L lists none): the lease runs llama-bench on a GPU; "
                         "nothing was written")


def run_lease(src_archive: str | Path, grid_path: str | Path, work: str | Path, *, deadline_s: float,
              repo: str | Path, jobs: int | None = None, command: str = "") -> int:
    """The whole lease (module docstring). Returns 0 when the grid ran (failed invocations are
    recorded, not fatal), 2 when the build or every GGUF failed.

    Raises:
        BuildError: :func:`preflight` (no CMake, nvcc or GPU), before any file is written.
    """
    repo = Path(repo).resolve()
    preflight()
    lease = Lease(work)
    lease.work.mkdir(parents=True, exist_ok=True)
    (lease.run_dir / "logs").mkdir(parents=True, exist_ok=True)
    deadline_at = lease.t0 + deadline_s
    spec = load_grid(grid_path)
    from sim.provenance import code_version

    meta = {"started_at": _now(), "command": command or " ".join(sys.argv), "grid": str(grid_path),
            "grid_name": spec.name, "repetitions": spec.repetitions, "deadline_s": deadline_s,
            "code_version": code_version(repo), "machine": machine_info()}
    (lease.run_dir / "meta.json").write_text(json.dumps(meta, indent=1))
    shutil.copy2(grid_path, lease.run_dir / "grid.toml")
    start_host_sampler(lease.run_dir / "host_state.jsonl")
    lease.status("writing+building")
    procs: list = []
    try:
        start_writers(lease, spec, repo, procs)
        return _after_writers(lease, spec, procs, src_archive, deadline_at, repo, jobs, meta)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (sim.cli.interrupt): stop what the lease started
        for _key, proc, *_ in procs:
            if proc is not None and proc.poll() is None:
                kill_group(proc)  # the writer removes its partial GGUF (OUT.tmp)
        lease.say(f"lease interrupted ({exc or 'SIGINT'}); GGUF writers stopped")
        lease.status("failed", error="interrupted")
        raise


def _after_writers(lease: Lease, spec, procs, src_archive, deadline_at: float, repo: Path, jobs, meta) -> int:
    try:
        tree, label, patches = unpack_patched(src_archive, lease.work / "src")
        lease.say(f"build: source {label}, patches {', '.join(patches)}")
        # test-backend-ops only when the grid has perf runs (it adds a minute to the build)
        targets = tuple(t for t in TARGETS if t != "test-backend-ops" or spec.perf is None or spec.perf)
        res = build(tree, lease.work / "build", cuda=True, jobs=jobs, source=label, patches=patches, targets=targets)
    except BuildError as exc:
        lease.say(f"build FAILED: {exc}")
        lease.status("failed (waiting for the GGUF writers, kept for a retry)", error=str(exc))
        wait_writers(lease, spec, procs)
        lease.status("failed", error=str(exc))
        log = Path(str(exc).rsplit("log: ", 1)[-1]) if "log: " in str(exc) else None
        if log and log.is_file():
            shutil.copy2(log, lease.run_dir / "logs" / "build.log")
        return 2
    shutil.copy2(Path(res.build_dir) / "build.log", lease.run_dir / "logs" / "build.log")
    from dataclasses import asdict

    (lease.run_dir / "build.json").write_text(json.dumps(asdict(res), indent=1))
    lease.say(f"build: done in {res.build_s} s (hash {res.source_hash}, cached {res.cached})")
    lease.status("h2d probe")
    h2d_probe(lease)
    lease.status("waiting for GGUFs")
    failed = wait_writers(lease, spec, procs)
    if len(failed) == len(spec.models):
        lease.status("failed", error="every GGUF writer failed")
        return 2
    has_perf = "test-backend-ops" in res.targets
    if has_perf and spec.perf_first:  # the CPU is quiet now: the writers have ended
        lease.status("perf")
        run_perf(lease, res.program("test-backend-ops"), deadline_at, repo, spec.perf, spec.perf_models, spec.perf_weights_only)
    before = None
    if spec.canary:
        exe = compile_canary(lease, lease.work / "psim-membw")
        before = make_canary(lease, exe) if exe is not None else None
    lease.status("grid")
    run_grid(spec, res.program("llama-bench"), lease.models, lease.run_dir, deadline_at=deadline_at - 60,
             say=lease.say, before=before)
    if has_perf and not spec.perf_first:
        lease.status("perf")
        run_perf(lease, res.program("test-backend-ops"), deadline_at, repo, spec.perf, spec.perf_models, spec.perf_weights_only)
    meta["ended_at"] = _now()
    (lease.run_dir / "meta.json").write_text(json.dumps(meta, indent=1))
    lease.status("done")
    lease.say("lease done")
    return 0


def collect(work: str | Path, out: str | Path, *, wait_s: float) -> int:
    """Wait until the lease in ``work`` is done (or failed) or ``wait_s`` passed, then pack its
    ``run/`` folder and progress log into ``out/run.tgz`` and print the progress tail.
    Returns 0 when done, 3 when still running, 2 when failed or absent."""
    work, out = Path(work), Path(out)
    t_end = time.monotonic() + wait_s
    step = "absent"
    while True:
        try:
            step = json.loads((work / "status.json").read_text()).get("step", "?")
        except (OSError, ValueError):
            step = "absent" if not work.is_dir() else "starting"
        if step in ("done", "failed") or time.monotonic() >= t_end:
            break
        time.sleep(2)
    out.mkdir(parents=True, exist_ok=True)
    if (work / "run").is_dir():
        with tarfile.open(out / "run.tgz", "w:gz") as tf:
            tf.add(work / "run", arcname="run")
            if (work / "progress.log").is_file():
                tf.add(work / "progress.log", arcname="run/progress.log")
    if (work / "progress.log").is_file():
        shutil.copy2(work / "progress.log", out / "progress.log")
        print("\n".join((work / "progress.log").read_text().splitlines()[-40:]))
    print(f"[collect] step: {step}")
    return 0 if step == "done" else 2 if step in ("failed", "absent") else 3
