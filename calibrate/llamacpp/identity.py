"""Output identity of the prefetch patch: greedy decoding with prefetch off and on must give
bit-identical logits (:mod:`calibrate.llamacpp.prefetch_patch`, program ``psim-decode``).

A grid run of ``kind = "identity"`` names ``psim-decode``'s flags (``args``: ``-ngl -ncmoe -lm
-b -ub -p -n -fa --seed``) and the prefetch variants to check, in llama-bench's spelling
(``variants = ["-pw 1 -pwg 0", "-pes 3"]``). The runner decodes once with every prefetch variable
at its off value and once per variant, and appends one record per variant to the run folder's
``identity.jsonl``::

    {"id": ..., "model": ..., "config": "<args>", "variant": "-pw 1 -pwg 0", "tokens": 500,
     "hash_off": "<prompt hash>/<last step hash>", "hash_on": ..., "identical": true,
     "first_diff_step": null}

``identical`` is true when the hash of the prompt's logits (every prompt token's) and the hash of
every decoding step's logits agree; ``first_diff_step`` is the first step whose hashes differ
(-1: the prompt's logits already differ), None when identical. A program failure is a record
with ``identical`` None and the ``error``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

from sim.cli.benchflags import PREFETCH_FLAGS
from sim.views.llamabench import PREFETCH_DEFAULTS

#: llama-bench's prefetch flags (the patch's) -> the scheduler's environment variable
#: the scheduler's environment variable of each prefetch field (set per test by the patched
#: llama-bench, read by ``ggml_backend_sched_new``: :mod:`calibrate.llamacpp.prefetch_patch`)
FIELD_ENV = {"prefetch_weights": "GGML_SCHED_PREFETCH_WEIGHTS", "prefetch_gate": "GGML_SCHED_PREFETCH_GATE",
             "prefetch_expert_slots": "GGML_SCHED_PREFETCH_EXPERT_SLOTS"}
#: llama-bench's prefetch flags (the patch's, :data:`sim.cli.benchflags.PREFETCH_FLAGS`) -> the variable
FLAG_ENV = {opt: FIELD_ENV[dest] for dest, opts, *_ in PREFETCH_FLAGS for opt in opts}
#: every variable at its off value (the patch's defaults, :data:`sim.views.llamabench.PREFETCH_DEFAULTS`)
OFF_ENV = {FIELD_ENV[k]: str(v) for k, v in PREFETCH_DEFAULTS.items()}
#: psim-decode's flags that take a value
DECODE_FLAGS = ("-ngl", "-ncmoe", "-lm", "-b", "-ub", "-p", "-n", "-fa", "--seed")


def variant_env(text: str) -> dict[str, str]:
    """The environment of one variant written as llama-bench flags (``"-pw 1 -pwg 0"``): the off
    values of :data:`OFF_ENV` with the named ones replaced.

    Raises:
        ValueError: an unknown flag, a missing or non-integer value, ``-pw`` other than 0/1, a
            negative value, or no flag at all.
    """
    words = shlex.split(text)
    if not words:
        raise ValueError("a variant needs at least one of -pw, -pwg, -pes")
    env = dict(OFF_ENV)
    for i in range(0, len(words), 2):
        flag = words[i]
        if flag not in FLAG_ENV:
            raise ValueError(f"unknown prefetch flag {flag!r} (expected {', '.join(sorted(FLAG_ENV))})")
        if i + 1 >= len(words) or not words[i + 1].isdigit():
            raise ValueError(f"{flag} needs a non-negative integer")
        v = int(words[i + 1])
        if FLAG_ENV[flag] == "GGML_SCHED_PREFETCH_WEIGHTS" and v > 1:
            raise ValueError(f"{flag} is 0 or 1, got {v}")
        env[FLAG_ENV[flag]] = str(v)
    return env


def check_args(args: tuple[str, ...]) -> None:
    """Raise ValueError unless ``args`` are ``psim-decode`` flags with values (``-m`` is the
    runner's)."""
    if len(args) % 2:
        raise ValueError("psim-decode flags come in pairs (flag value)")
    for flag, value in zip(args[::2], args[1::2]):
        if flag not in DECODE_FLAGS:
            raise ValueError(f"unknown psim-decode flag {flag!r} (expected {', '.join(DECODE_FLAGS)})")
        if flag != "-lm" and not value.lstrip("-").isdigit():
            raise ValueError(f"{flag} needs an integer, got {value!r}")
        if flag == "-lm" and value not in ("none", "mmap"):
            raise ValueError(f"-lm is none or mmap, got {value!r}")
        if flag in ("-p", "-n", "-b", "-ub") and int(value) < 1:
            raise ValueError(f"{flag} must be >= 1 (a check decodes a prompt and then tokens), got {value}")


def compare_outputs(off: dict, on: dict) -> tuple[bool, int | None]:
    """``(identical, first_diff_step)`` of two ``psim-decode`` outputs (their JSON objects):
    -1 when the prompt's logits differ, else the first differing step (a shorter output differs
    at its end), None when identical."""
    if off.get("hash_prompt") != on.get("hash_prompt"):
        return False, -1
    a, b = list(off.get("steps", [])), list(on.get("steps", []))
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i] != b[i]:
            return False, i
    return True, None


def _decode(program: Path, gguf: Path, args: tuple[str, ...], env: dict[str, str], log: Path,
            timeout_s: float) -> tuple[int, dict | None, float]:
    cmd = [str(program), "-m", str(gguf), *args]
    t0 = time.monotonic()
    with open(log, "w") as err:
        err.write("$ " + " ".join(f"{k}={v}" for k, v in env.items()) + " " + shlex.join(cmd) + "\n")
        err.flush()
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout_s,
                                  env={**os.environ, **env})
            rc, out = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired:
            rc, out = 124, ""
    obj = None
    for ln in out.splitlines():
        if ln.startswith("{"):
            try:
                obj = json.loads(ln)
            except ValueError:
                obj = None
    return rc, obj, round(time.monotonic() - t0, 2)


def _hash(obj: dict) -> str:
    steps = obj.get("steps") or ["-"]
    return f"{obj.get('hash_prompt')}/{steps[-1]}"


def run_identity(run, spec, program: str | Path, models_dir: str | Path, out_dir: str | Path, *,
                 say=print, timeout_s: float | None = None) -> dict:
    """Run one identity run (module docstring) with ``program`` (``psim-decode``); appends its
    records to ``identity.jsonl`` and one invocation record (``kind = "identity"``, ``rows`` 0)
    to ``invocations.jsonl``; returns that record."""
    from .grid import VramSampler, _append

    out = Path(out_dir)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    m = spec.model(run.model)
    gguf = Path(models_dir) / m.gguf_name
    limit = timeout_s or spec.timeout_s
    rec = {"id": run.id, "kind": "identity", "model": m.key, "model_toml": m.toml, "gguf": m.gguf_name,
           "n_layer": m.n_layer, "args": list(run.args), "variants": list(run.variants), "rows": 0,
           "log": f"logs/{run.id}-off.log", "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    t0 = time.monotonic()
    records = []
    if not Path(program).is_file() or not gguf.is_file():
        rec.update(rc=-1, error=f"not found: {program if not Path(program).is_file() else gguf}", wall_s=0.0)
    else:
        with VramSampler() as vram:
            rc, base, w_off = _decode(Path(program), gguf, run.args, dict(OFF_ENV), out / "logs" / f"{run.id}-off.log", limit)
            if rc == 0 and base is None:
                rc = -2  # exited 0 without its JSON line
            rec.update(rc=rc, wall_off_s=w_off)
            for k, text in enumerate(run.variants):
                r = {"id": run.id, "model": m.key, "config": shlex.join(run.args), "variant": text,
                     "tokens": int(dict(zip(run.args[::2], run.args[1::2])).get("-n", 500)),
                     "log": f"logs/{run.id}-v{k}.log"}
                if rc != 0 or base is None:
                    r.update(identical=None, error=f"psim-decode off exited {rc}", hash_off=None, hash_on=None,
                             first_diff_step=None)
                else:
                    rc_on, on, w_on = _decode(Path(program), gguf, run.args, variant_env(text),
                                              out / "logs" / f"{run.id}-v{k}.log", limit)
                    if rc_on != 0 or on is None:
                        r.update(identical=None, error=f"psim-decode on exited {rc_on}", hash_off=_hash(base),
                                 hash_on=None, first_diff_step=None, wall_s=w_on)
                    else:
                        same, first = compare_outputs(base, on)
                        r.update(identical=same, first_diff_step=first, hash_off=_hash(base), hash_on=_hash(on),
                                 wall_s=w_on, tokens=len(on.get("steps", [])))
                records.append(r)
        rec.update(wall_s=round(time.monotonic() - t0, 2), peak_vram_mib=vram.peak_mib)
        if rc != 0:
            rec["error"] = f"psim-decode exited {rc}"
    if records:
        _append(out / "identity.jsonl", [json.dumps(r) for r in records])
    for r in records:
        verdict = "identical" if r.get("identical") else r.get("error") or f"DIFFERS from step {r['first_diff_step']}"
        say(f"[identity] {run.id} {r['variant']}: {verdict}")
    if not records:
        say(f"[identity] {run.id}: {rec.get('error')}")
    _append(out / "invocations.jsonl", [json.dumps(rec)])
    return rec
