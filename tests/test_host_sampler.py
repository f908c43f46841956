"""The lease's host sampler (calibrate.llamacpp.lease.host_sample / start_host_sampler)."""

import json
import os
import time

from calibrate.llamacpp import lease


def test_kv_kb_reads_only_the_named_fields():
    text = "Rss:      1200 kB\nAnonHugePages:  2048 kB\nBogus: x kB\nLocked: 7 kB\n"
    assert lease._kv_kb(text, ("Rss", "AnonHugePages", "Bogus")) == {"Rss": 1200, "AnonHugePages": 2048}


def test_host_sample_finds_this_process_by_its_comm():
    comm = open(f"/proc/{os.getpid()}/comm").read().strip()
    rec = lease.host_sample(comm)
    assert "at" in rec and len(rec["stat_cpu"]) == 8
    assert str(os.getpid()) in rec[comm] and rec[comm][str(os.getpid())]["Rss"] > 0
    assert "no-such-program" not in lease.host_sample("no-such-program")


def test_sampler_writes_the_settings_then_samples(tmp_path):
    path = tmp_path / "host_state.jsonl"
    stop = lease.start_host_sampler(path, period_s=0.01)
    try:
        for _ in range(500):
            if path.is_file() and len(path.read_text().splitlines()) >= 3:
                break
            time.sleep(0.01)
    finally:
        stop.set()
    lines = [json.loads(x) for x in path.read_text().splitlines()[:3]]
    assert "transparent_hugepage" in lines[0]
    assert all("meminfo" in x for x in lines[1:])


def test_a_lease_without_cmake_nvcc_or_a_gpu_stops_before_writing_anything(tmp_path):
    """preflight: each missing tool is one line; run_lease calls it before it makes its folder."""
    import pytest

    from calibrate.llamacpp.build import BuildError
    from calibrate.llamacpp.lease import preflight, run_lease

    have = {"cmake": "/usr/bin/cmake", "nvcc": "/usr/bin/nvcc", "nvidia-smi": "/usr/bin/nvidia-smi"}
    gpu = lambda cmd: "GPU 0: NVIDIA H200 (UUID: GPU-x)"  # noqa: E731
    preflight(which=have.get, cmd=gpu)  # all there: no error
    for missing, words in (("cmake", "cmake not found"), ("nvidia-smi", "no NVIDIA GPU visible")):
        with pytest.raises(BuildError, match=words):
            preflight(which={k: v for k, v in have.items() if k != missing}.get, cmd=gpu)
    with pytest.raises(BuildError, match="no NVIDIA GPU visible"):
        preflight(which=have.get, cmd=lambda cmd: "")
    import shutil

    if shutil.which("nvidia-smi") is None:  # this host: run_lease refuses before any file
        with pytest.raises(BuildError):
            run_lease("none.tgz", "none.toml", tmp_path / "w", deadline_s=1, repo=".")
        assert not (tmp_path / "w").exists()
