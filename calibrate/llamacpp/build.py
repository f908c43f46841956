"""Build llama.cpp's ``llama-bench`` and ``test-backend-ops`` from source, cached by source hash.

The source is either the user's own checkout (``--llama-cpp DIR``, e.g. a PR branch) or, by
default, the llama.cpp tree vendored in the pinned PyPI source distribution
:data:`SDIST` (``vendor/llama.cpp``), fetched with pip. Either way only the subset a build of
those two programs needs (:data:`SUBSET_PATHS`) is copied into a work folder, the project's own
patches (:mod:`calibrate.llamacpp.patches`) are applied there, and the build folder is named
after the hash of that patched subset, so a second build of the same source is free. No
llama.cpp source is committed to this repository.

Build flags follow ``../shared/LLAMACPP.md`` (checked on the lent H200: 244–260 s wall for
llama-bench with 16 jobs).

Errors (no CMake, no CUDA compiler, a failed configure or build, a tree that lacks a needed
file) are :class:`BuildError`: one line naming what failed and where its log is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sim.errors import PrefetchSimError
from sim.cli.interrupt import run_group

#: the pinned source distribution whose ``vendor/llama.cpp`` is the default source
SDIST = "llama-cpp-python==0.3.36"
#: where the sdist keeps llama.cpp
SDIST_VENDOR = "vendor/llama.cpp"

#: paths of a llama.cpp tree that a build of llama-bench and test-backend-ops needs
#: (``../shared/LLAMACPP.md``); ``tools/CMakeLists.txt`` and ``tests/CMakeLists.txt`` are
#: replaced by :data:`TOOLS_CMAKE` and :data:`TESTS_CMAKE`.
SUBSET_PATHS = ("CMakeLists.txt", "cmake", "ggml", "src", "include", "common", "vendor", "licenses",
                "LICENSE", "tools/llama-bench", "tests/test-backend-ops.cpp")
#: files a tree must have to be a llama.cpp source tree (checked before copying)
REQUIRED = ("CMakeLists.txt", "ggml/src/ggml-backend.cpp", "tools/llama-bench/llama-bench.cpp",
            "include/llama.h")

TOOLS_CMAKE = "llama_add_compile_flags()\nadd_subdirectory(llama-bench)\n"
TESTS_CMAKE = ("llama_add_compile_flags()\n"
               "add_executable(test-backend-ops test-backend-ops.cpp)\n"
               "target_link_libraries(test-backend-ops PRIVATE llama llama-common)\n")

#: targets built by default
TARGETS = ("llama-bench", "test-backend-ops", "psim-decode")

#: CMake options of every build (``../shared/LLAMACPP.md``); CUDA ones are added by :func:`cmake_args`
BASE_CMAKE_ARGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                   "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF", "-DGGML_CCACHE=OFF")


class BuildError(PrefetchSimError):
    """A llama.cpp source or build step failed; the message names the step and its log."""


@dataclass(frozen=True)
class BuildResult:
    """A finished (or cached) build.

    Attributes:
        source: where the source came from (``"sdist llama-cpp-python==0.3.36"`` or a path).
        source_hash: SHA-256 (16 hex digits) of the patched subset (paths and contents).
        build_dir: the CMake build folder; programs are in ``build_dir/bin``.
        cuda: built with ``-DGGML_CUDA=ON``.
        cuda_arch: ``CMAKE_CUDA_ARCHITECTURES`` (``""`` for a CPU build).
        targets: programs built.
        cmake_args: the configure flags.
        build_s: wall seconds of configure + build (0 when cached).
        cached: reused an earlier build of the same hash.
        patches: names of the project patches applied.
    """

    source: str
    source_hash: str
    build_dir: str
    cuda: bool
    cuda_arch: str
    targets: tuple[str, ...]
    cmake_args: tuple[str, ...]
    build_s: float
    cached: bool
    patches: tuple[str, ...]

    def program(self, name: str) -> Path:
        """Path of a built program (``"llama-bench"``)."""
        return Path(self.build_dir) / "bin" / name


def check_tree(src: str | Path, what: str = "--llama-cpp") -> Path:
    """``src`` as a llama.cpp source tree (the folder with ``ggml/`` and ``tools/``).

    Raises:
        BuildError: not a folder, or one of :data:`REQUIRED` is missing.
    """
    p = Path(src)
    if not p.is_dir():
        raise BuildError(f"{what}: not a folder: {p}")
    missing = [r for r in REQUIRED if not (p / r).is_file()]
    if missing:
        raise BuildError(f"{what}: {p} is not a llama.cpp source tree (missing {', '.join(missing)})")
    return p


def fetch_sdist_tree(cache_dir: str | Path, spec: str = SDIST) -> Path:
    """Download the pinned sdist with pip (``--no-binary :all: --no-deps``) into ``cache_dir``
    once, unpack it, and return its ``vendor/llama.cpp``. Needs the network (PyPI).

    Raises:
        BuildError: pip failed (its output is in ``cache_dir/pip-download.log``) or the archive
            has no llama.cpp tree.
    """
    cache = Path(cache_dir)
    name = spec.replace("==", "-")
    tree = cache / name / SDIST_VENDOR
    if (tree / REQUIRED[1]).is_file():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    log = cache / "pip-download.log"
    dl = cache / "dl"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", spec, "-d", str(dl)]
    with open(log, "w") as fh:
        r = run_group(cmd, stdout=fh, stderr=subprocess.STDOUT)  # interrupted: pip is killed
    archives = sorted(dl.glob("*.tar.gz")) if dl.is_dir() else []
    if r.returncode != 0 or not archives:
        raise BuildError(f"pip download {spec} failed (exit {r.returncode}); log: {log}")
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".unpack-"))
    try:
        with tarfile.open(archives[-1]) as tf:
            members = [m for m in tf.getmembers() if f"/{SDIST_VENDOR}/" in f"/{m.name}"]
            tf.extractall(tmp, members=members, filter="data")
        found = [p for p in tmp.iterdir() if (p / SDIST_VENDOR / REQUIRED[1]).is_file()]
        if not found:
            raise BuildError(f"{archives[-1]}: no {SDIST_VENDOR} tree in the archive")
        (cache / name).parent.mkdir(parents=True, exist_ok=True)
        if (cache / name).exists():
            shutil.rmtree(cache / name)
        found[0].rename(cache / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tree


def make_subset(src: str | Path, dest: str | Path) -> Path:
    """Copy :data:`SUBSET_PATHS` of the llama.cpp tree ``src`` to ``dest`` (replaced if it
    exists), write the minimal ``tools/`` and ``tests/`` CMake files, and return ``dest``.

    Raises:
        BuildError: ``src`` is not a llama.cpp tree.
    """
    src = check_tree(src)
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    def ignore(folder: str, names: list[str]) -> set[str]:
        # VCS data, caches and CMake build folders (a folder whose CMakeCache.txt says so);
        # never files: ``cmake/build-info.cmake`` and ``common/build-info.cpp.in`` are sources
        return {n for n in names if n in (".git", "__pycache__")
                or (Path(folder, n).is_dir() and Path(folder, n, "CMakeCache.txt").is_file())}

    for rel in SUBSET_PATHS:
        s = src / rel
        if not s.exists():
            if rel in REQUIRED:
                raise BuildError(f"--llama-cpp: {src} lacks {rel}")
            continue
        d = dest / rel
        d.parent.mkdir(parents=True, exist_ok=True)
        if s.is_dir():
            shutil.copytree(s, d, ignore=ignore, symlinks=True)
        else:
            shutil.copy2(s, d)
    (dest / "tools" / "CMakeLists.txt").write_text(TOOLS_CMAKE)
    (dest / "tests").mkdir(exist_ok=True)
    (dest / "tests" / "CMakeLists.txt").write_text(TESTS_CMAKE)
    return dest


def tree_hash(root: str | Path) -> str:
    """SHA-256 (first 16 hex digits) over the relative paths and bytes of every file under
    ``root``, sorted by path; build folders (``build*``) are skipped."""
    root = Path(root)
    h = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.is_file()
                   and not any(part.startswith("build") for part in p.relative_to(root).parts[:1]))
    for p in files:
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def pack(tree: str | Path, out: str | Path) -> Path:
    """Write ``tree`` as a ``.tar.gz`` (members relative to ``tree``) to ``out`` atomically."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w:gz", compresslevel=6) as tf:
        for p in sorted(Path(tree).iterdir()):
            if not p.name.startswith("build"):
                tf.add(p, arcname=p.name)
    tmp.replace(out)
    return out


def unpack(archive: str | Path, dest: str | Path) -> Path:
    """Unpack a :func:`pack` archive into ``dest`` (replaced).

    Raises:
        BuildError: not a readable archive, or no llama.cpp tree in it.
    """
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    try:
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")
    except (OSError, tarfile.TarError) as exc:
        raise BuildError(f"{archive}: cannot unpack ({exc})") from None
    return check_tree(dest, what=str(archive))



def unpack_patched(archive: str | Path, dest: str | Path) -> tuple[Path, str, tuple[str, ...]]:
    """:func:`unpack` an archive and apply the project's current patches to it (each is applied
    once: :func:`calibrate.llamacpp.patches.apply` skips one already in the tree), so an archive
    packed before a patch existed still builds with it. Returns ``(tree, source label, patch
    names)``; the label comes from the archive's ``prefetch-sim-source.json``.

    Raises:
        BuildError: as :func:`unpack`, or a patch's anchor is missing in the tree.
    """
    import json

    from .patches import apply_all

    tree = unpack(archive, dest)
    info = tree / "prefetch-sim-source.json"
    src = json.loads(info.read_text()) if info.is_file() else {}
    patches = apply_all(tree)
    return tree, str(src.get("source", archive)), patches

def cmake_args(cuda: bool, cuda_arch: str = "90", tests: bool = True) -> tuple[str, ...]:
    """Configure flags: :data:`BASE_CMAKE_ARGS`, ``-DGGML_CUDA=ON`` with the architecture
    (90 = Hopper, the H200) or OFF, and ``LLAMA_BUILD_TESTS`` for test-backend-ops."""
    args = list(BASE_CMAKE_ARGS) + [f"-DLLAMA_BUILD_TESTS={'ON' if tests else 'OFF'}"]
    args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}"] if cuda else ["-DGGML_CUDA=OFF"]
    return tuple(args)


def nvcc_found(which=None) -> bool:
    """Whether CUDA's compiler is there: on the PATH (``which``, default :func:`shutil.which`) or
    at ``/usr/local/cuda/bin/nvcc`` (where :func:`build` then puts it on the PATH)."""
    return bool((which or shutil.which)("nvcc")) or Path("/usr/local/cuda/bin/nvcc").is_file()


def _which_or_fail(tool: str, why: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise BuildError(f"{tool} not found on PATH: {why}")
    return path


def build(tree: str | Path, build_root: str | Path, *, cuda: bool = True, cuda_arch: str = "90",
          targets: tuple[str, ...] = TARGETS, jobs: int | None = None, source: str = "",
          patches: tuple[str, ...] = ()) -> BuildResult:
    """Configure and build ``targets`` from the (already patched) subset ``tree`` into
    ``build_root/<hash>-<cuda|cpu>``; reuse it when a stamp of the same hash and targets exists.

    Raises:
        BuildError: CMake (or, with ``cuda``, nvcc) missing, or configure/build failed; the
            message names the log file.
    """
    tree = check_tree(tree, what="source tree")
    _which_or_fail("cmake", "install CMake (>= 3.14) to build llama.cpp")
    if cuda and not nvcc_found():
        raise BuildError("nvcc not found: a CUDA build of llama.cpp needs CUDA's compiler (or pass --cpu)")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    h = tree_hash(tree)
    bdir = Path(build_root) / f"{h}-{'cuda' + cuda_arch if cuda else 'cpu'}"
    stamp = bdir / "prefetch-sim-build.json"
    args = cmake_args(cuda, cuda_arch, tests="test-backend-ops" in targets)
    if stamp.is_file():
        try:
            old = json.loads(stamp.read_text())
        except (OSError, ValueError):
            old = {}
        if old.get("source_hash") == h and set(targets) <= set(old.get("targets", ())) and all(
                (bdir / "bin" / t).is_file() for t in targets):
            return BuildResult(**{**old, "targets": tuple(old["targets"]), "cmake_args": tuple(old["cmake_args"]),
                                  "patches": tuple(old.get("patches", ())), "cached": True, "build_s": 0.0})
    bdir.mkdir(parents=True, exist_ok=True)
    log = bdir / "build.log"
    env = dict(os.environ)
    if cuda and not shutil.which("nvcc"):
        env["PATH"] = "/usr/local/cuda/bin:" + env.get("PATH", "")
    t0 = time.monotonic()
    steps = [["cmake", "-S", str(tree), "-B", str(bdir), *gen, *args],
             ["cmake", "--build", str(bdir), "-j", str(jobs or os.cpu_count() or 1), "--target", *targets]]
    with open(log, "w") as fh:
        for step, cmd in zip(("configure", "build"), steps):
            fh.write("$ " + " ".join(cmd) + "\n")
            fh.flush()
            # in a process group of its own: an interruption kills cmake, ninja and the compilers
            r = run_group(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
            if r.returncode != 0:
                raise BuildError(f"llama.cpp {step} failed (exit {r.returncode}); log: {log}")
    res = BuildResult(source=source or str(tree), source_hash=h, build_dir=str(bdir), cuda=cuda,
                      cuda_arch=cuda_arch if cuda else "", targets=tuple(targets), cmake_args=args,
                      build_s=round(time.monotonic() - t0, 1), cached=False, patches=tuple(patches))
    from sim.atomic import write_atomic

    write_atomic(stamp, json.dumps(asdict(res), indent=1))  # the build is complete only with it
    return res


def prepare(llama_cpp: str | Path | None, work: str | Path, cache_dir: str | Path) -> tuple[Path, str, tuple[str, ...]]:
    """Cut the subset of ``llama_cpp`` (or of the pinned sdist's tree when None) into
    ``work/src``, apply the project patches, and return ``(tree, source label, patch names)``.

    Raises:
        BuildError: the source is not a llama.cpp tree, the sdist cannot be fetched, or a patch
            does not apply (its anchor is not in the file).
    """
    from .patches import apply_all

    if llama_cpp is None:
        src = fetch_sdist_tree(cache_dir)
        label = f"sdist {SDIST} ({SDIST_VENDOR})"
        archives = sorted((Path(cache_dir) / "dl").glob("*.tar.gz"))
        if archives:
            label += f", archive sha256 {hashlib.sha256(archives[-1].read_bytes()).hexdigest()[:16]}"
    else:
        src = check_tree(llama_cpp)
        label = str(Path(llama_cpp).resolve())
        commit = _git_commit(src)
        if commit:
            label += f" (git {commit})"
    tree = make_subset(src, Path(work) / "src")
    names = apply_all(tree)
    return tree, label, names


def _git_commit(path: Path) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(path), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None
