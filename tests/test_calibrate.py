"""Calibration: fits against theory, TOML/profile writing, the CLI end to end on the numpy
stand-in for CuPy, and a clean error without a GPU."""

from __future__ import annotations

import math
import sys
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import calibrate._fakecupy as fakecp
from calibrate import fit as F
from calibrate import shapes as S
from calibrate.profile import dumps_toml, write_files_atomically
from calibrate.run import Sweep, run_calibration, summary_table, write_calibration
from sim.model.costs import ACT_BYTES, gemm_s
from sim.errors import GPUUnavailableError
from sim.model.specs import HardwareProfile, LinkSpec, load_hardware

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ copy-link fit


@settings(max_examples=25, deadline=None)
@given(bw=st.floats(1e9, 1e11), lat=st.floats(1e-7, 5e-5))
def test_fit_link_recovers_latency_and_bandwidth(bw, lat):
    sizes = np.array([2**p for p in range(12, 31)], dtype=float)
    t = lat + sizes / bw
    f = F.fit_link(np.repeat(sizes, 3), np.repeat(t, 3))
    assert f.bytes_per_s == pytest.approx(bw, rel=1e-6)
    assert f.latency_s == pytest.approx(lat, rel=1e-4, abs=1e-12)
    assert f.max_rel_err < 1e-6


def test_fit_link_uses_medians_and_small_sizes_for_latency():
    rng = np.random.default_rng(1)
    sizes = np.array([2**p for p in range(12, 31)], dtype=float)
    bw, lat = 25e9, 8e-6
    b = np.repeat(sizes, 5)
    t = lat + b / bw
    t = t * (1 + 0.01 * rng.standard_normal(t.size))
    t[::5] *= 3.0  # one outlier in five repeats: the median ignores it
    f = F.fit_link(b, t)
    assert f.bytes_per_s == pytest.approx(bw, rel=0.03)
    assert f.latency_s == pytest.approx(lat, rel=0.1)


def test_fit_link_rejects_bad_input():
    with pytest.raises(ValueError, match="sizes >="):
        F.fit_link([4096, 8192], [1e-5, 2e-5])
    with pytest.raises(ValueError, match="> 0"):
        F.fit_link([4096, 2**25, 2**26], [0.0, 1e-3, 2e-3])


# ------------------------------------------------------------------ roofline fit


def _synthetic_gemms(p, w, k_s, noise, seed=0):
    rng = np.random.default_rng(seed)
    pts = S.gemm_points(S.gemm_sweep(), S.GEMM_TOKENS)
    m = np.array([x[4] for x in pts], float)
    n = np.array([x[2] for x in pts], float)
    k = np.array([x[3] for x in pts], float)
    groups = np.array([x[0] for x in pts], dtype=object)
    fl = F.gemm_flops(m, n, k)
    by = F.gemm_bytes(m, n, k, 2 * n * k)
    t = F.roofline_time(fl, by, p, w, k_s) * np.exp(noise * rng.standard_normal(m.size))
    return groups, fl, by, t


def test_fit_roofline_recovers_parameters_of_exact_data():
    groups, fl, by, t = _synthetic_gemms(7.5e14, 4.2e12, 7e-6, 0.0)
    f = F.fit_roofline(fl, by, t)
    assert f.flops_per_s == pytest.approx(7.5e14, rel=0.01)
    assert f.bytes_per_s == pytest.approx(4.2e12, rel=0.01)
    assert f.kernel_s == pytest.approx(7e-6, rel=0.05)
    assert f.median_rel_err < 0.005


def test_roofline_holdout_error_reflects_noise():
    groups, fl, by, t = _synthetic_gemms(7.5e14, 4.2e12, 7e-6, 0.05, seed=3)
    hold = F.holdout_errors(groups, fl, by, t)
    assert {h.group for h in hold} == set(groups.tolist())
    for h in hold:
        # log-normal noise of sigma 5%: the median |error| of a good fit is about 0.67 sigma
        assert h.median_rel_err < 0.08
        assert h.fit.flops_per_s == pytest.approx(7.5e14, rel=0.1)


def test_fit_formula_is_the_cost_models_formula():
    """The roofline fitted here, written into a profile with efficiencies 1 and no table,
    gives sim.model.costs.gemm_s exactly."""
    assert F.ACT_BYTES == ACT_BYTES
    p, w, k_s = 7.1e14, 4.0e12, 6e-6
    link = LinkSpec(50e9, 1e-6)
    hw = HardwareProfile(name="x", gpu_name="x", n_gpu=1, vram_bytes=1e11, vram_reserved_bytes=0,
                         gpu_flops_per_s=p, gemm_efficiency=1.0, hbm_bytes_per_s=w, hbm_efficiency=1.0,
                         kernel_s=k_s, h2d_pinned=link, h2d_pageable=link, d2h=link, host_sync_s=1e-6,
                         op_issue_s=1e-6, event_s=1e-6, cpu_bytes_per_s=1e11, cpu_flops_per_s=1e12)
    for m, n, k in ((1, 4096, 2048), (512, 14336, 4096), (16384, 768, 2048)):
        wb = 2 * n * k
        ours = F.roofline_time(F.gemm_flops(m, n, k), F.gemm_bytes(m, n, k, wb), p, w, k_s)
        assert float(ours) == pytest.approx(gemm_s(hw, m, n, k, wb), rel=1e-12)


def test_spread():
    s = F.spread([10.0, 12.0, 11.0])
    assert s["median"] == 11.0 and s["min"] == 10.0 and s["max"] == 12.0
    assert s["rel_spread"] == pytest.approx(2 / 11)


# ------------------------------------------------------------------ shapes


def test_gemm_sweep_is_deduplicated_and_covers_the_brief():
    shapes = S.gemm_sweep()
    nk = [(n, k) for _m, _r, n, k in shapes]
    assert len(nk) == len(set(nk))
    # qwen3: q 4096x2048, kv 512x2048, fused qkv 5120x2048, expert 768x2048 and 2048x768
    for need in ((4096, 2048), (512, 2048), (5120, 2048), (768, 2048), (2048, 768), (21504, 5376),
                 (5376, 21504), (14336, 4096), (640, 4096), (2880, 2880)):
        assert need in nk


def test_shipped_models_shapes_match_their_files():
    from sim.model.specs import load_model

    models = S.shipped_models(str(REPO / "scenarios/models"))
    if not models:
        pytest.skip("no shipped model files")
    for ms in models:
        spec = load_model(REPO / "scenarios/models" / f"{ms.name}.toml")
        want = {(t.n_out, t.n_in) for t in spec.tensors if t.group != "embd" and t.is_matrix}
        got = {(n, k) for _r, n, k in ms.gemm_shapes()}
        assert want <= got
        assert ms.n_head == spec.n_head and ms.head_dim == spec.head_dim


def test_output_head_swept_only_to_last_token_sizes():
    pts = S.gemm_points((("m", "output", 1000, 64), ("m", "attn_q", 64, 64)), (1, 512, 4096))
    assert [p[4] for p in pts if p[1] == "output"] == [1, 512]
    assert [p[4] for p in pts if p[1] == "attn_q"] == [1, 512, 4096]


def test_route_uniform_counts():
    from calibrate.measure import route_uniform

    rng = np.random.default_rng(0)
    c = route_uniform(rng, 300, 64, 6)
    assert c.sum() == 300 * 6
    assert c.max() <= 300  # top-k experts of one token are distinct
    # uniform routing: expected used experts 64 * (1 - (1 - 6/64)^300) ~ 64
    assert (c > 0).sum() == 64


# ------------------------------------------------------------------ TOML and files


def test_dumps_toml_round_trips():
    doc = {"hardware": {"name": "h\"x\" é", "n": 3, "f": 1.2345678e-6, "big": 5.5e12, "flag": True,
                        "lst": [1.5, 2, "a"], "inl": {"value": 0.1, "source": "measured: x = y"}},
           "measured": {"nan": float("nan"), "neg": -2.0}}
    text = dumps_toml(doc, header="line one\nline two")
    back = tomllib.loads(text)
    h = back["hardware"]
    assert h["name"] == "h\"x\" é" and h["n"] == 3 and h["flag"] is True
    assert h["f"] == pytest.approx(1.2345678e-6, rel=1e-5)
    assert h["big"] == 5.5e12
    assert h["lst"] == [1.5, 2, "a"]
    assert h["inl"] == {"value": 0.1, "source": "measured: x = y"}
    assert math.isnan(back["measured"]["nan"])
    assert text.startswith("# line one\n# line two\n")


def test_write_files_atomically_all_or_nothing(tmp_path):
    good = {tmp_path / "a" / "x.csv": pd.DataFrame({"a": [1]}), tmp_path / "b.txt": "hello"}
    paths = write_files_atomically(good)
    assert all(p.exists() for p in paths)

    class Boom:
        pass

    bad = {tmp_path / "c.txt": "fine", tmp_path / "d.txt": Boom()}
    with pytest.raises(TypeError):
        write_files_atomically(bad)  # type: ignore[arg-type]
    assert not (tmp_path / "c.txt").exists()
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_full_disk_leaves_no_new_folder_and_names_the_file(tmp_path, monkeypatch):
    """A write that fails (ENOSPC) removes the temporary files and the folders the call made,
    keeps folders that were there, and the error names the target file."""
    import errno

    real = Path.write_text

    def full(self, *a, **k):
        if self.name.startswith(".h.toml."):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    (tmp_path / "kept").mkdir()
    files = {tmp_path / "new" / "deep" / "gemm.csv": pd.DataFrame({"m": [1]}), tmp_path / "kept" / "h.toml": "x"}
    with pytest.raises(OSError) as info:
        write_files_atomically(files)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "kept" / "h.toml")
    assert not (tmp_path / "new").exists() and (tmp_path / "kept").is_dir()
    assert not list((tmp_path / "kept").iterdir())


# ------------------------------------------------------------------ end to end (numpy stand-in)


@pytest.fixture(scope="module")
def fake_calibration():
    return run_calibration("fake", sweep=Sweep.quick(), rounds=2, cp=fakecp, progress=False,
                           command="pytest", log=lambda _l: None)


def test_fake_calibration_writes_a_loadable_profile(fake_calibration, tmp_path):
    out = tmp_path / "hw" / "fake.toml"
    paths = write_calibration(fake_calibration, out, tmp_path / "raw")
    assert paths[-1] == out  # the TOML is moved into place last
    hw = load_hardware(out)
    assert hw.gpu_name.startswith("FakeGPU")
    for key, src in hw.sources.items():
        assert src.startswith(("measured:", "by definition:")), (key, src)
    for key in ("h2d_pinned_gb_per_s", "h2d_pageable_gb_per_s", "gpu_tflops", "kernel_us", "cpu_gb_per_s",
                "op_issue_us", "host_sync_us", "event_us"):
        assert key in hw.sources
    # the gemm table is f16 only and covers every swept shape and token count
    tab = hw.gemm_table
    assert set(tab.dtype) == {"f16"}
    sweep = fake_calibration.sweep
    assert len(tab) == len(S.gemm_points(sweep.gemm_shapes, sweep.gemm_tokens))
    # a covered shape is looked up in the table, not priced by the roofline
    row = tab.iloc[0]
    assert gemm_s(hw, int(row.m), int(row.n), int(row.k), 1) == pytest.approx(row.t_s, rel=1e-9)
    att = hw.attn_table
    assert list(att.columns[:6]) == ["n_tokens", "kv_len", "n_head", "n_head_kv", "head_dim", "t_s"]
    assert len(att) == len(sweep.attn) * len(sweep.attn_tokens) * len(sweep.attn_kv)
    meas = hw.measured
    assert meas["command"] == "pytest" and meas["rounds"] == "2"
    assert len(tomllib.loads(out.read_text())["measured"]["h2d_pinned_gb_per_s_rounds"]) == 2
    for f in ("copies.csv", "ref_gemm.csv", "measurements.json"):
        assert (tmp_path / "raw" / f).exists()


def test_summary_table_lists_key_figures(fake_calibration):
    text = summary_table(fake_calibration)
    for label in ("H2D pinned bandwidth", "H2D pageable bandwidth", "roofline f16", "held out"):
        assert label in text


def test_copy_rows_cover_every_size_and_round(fake_calibration):
    c = fake_calibration.copies
    sw = fake_calibration.sweep
    got = c.groupby(["direction", "memory"]).nbytes.unique()
    assert sorted(got[("h2d", "pinned")]) == sorted(sw.copy_sizes)
    assert sorted(c["round"].unique()) == [0, 1]
    assert (c.t_s > 0).all()


def test_cli_fake_gpu(tmp_path, capsys):
    pytest.importorskip("simpy")  # sim.cli loads every subcommand, some need SimPy
    from sim.cli import main

    out = tmp_path / "p.toml"
    rc = main(["calibrate", "--out", str(out), "--fake-gpu", "--quick", "--rounds", "1", "--quiet",
               "--raw-dir", "none"])
    assert rc == 0
    assert load_hardware(out).name == "p"
    assert "H2D pinned bandwidth" in capsys.readouterr().out


def test_cli_without_cupy_reports_and_writes_nothing(tmp_path, capsys, monkeypatch):
    pytest.importorskip("simpy")
    from sim.cli import main

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    out = tmp_path / "p.toml"
    rc = main(["calibrate", "--out", str(out), "--quiet"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "CuPy" in err and "Traceback" not in err
    assert not out.exists() and not any(tmp_path.iterdir())


def test_require_cupy_raises_gpu_unavailable(monkeypatch):
    from calibrate._gpu import gpu_available, require_cupy

    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(GPUUnavailableError, match="CuPy"):
        require_cupy()
    assert gpu_available() is False


def test_python_m_calibrate_fake_gpu(tmp_path, capsys):
    from calibrate.cli import main

    out = tmp_path / "q.toml"
    assert main(["--out", str(out), "--fake-gpu", "--quick", "--rounds", "1", "--quiet", "--raw-dir",
                 str(tmp_path / "raw")]) == 0
    assert load_hardware(out).name == "q"
    assert (tmp_path / "raw" / "measurements.json").exists()
    assert "elapsed" in capsys.readouterr().out


def test_fake_gpu_refuses_to_replace_a_measured_profile(tmp_path, capsys):
    """--fake-gpu's numbers are meaningless: over a profile measured on a GPU (a copy of the
    shipped H200 one, its tables beside it) it writes nothing; over its own earlier output it
    writes again."""
    import shutil

    from calibrate.cli import main

    out = tmp_path / "h200.toml"
    shutil.copy(REPO / "scenarios/hardware/h200.toml", out)
    shutil.copytree(REPO / "scenarios/hardware/h200", tmp_path / "h200")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["--out", str(out), "--fake-gpu", "--quick", "--rounds", "1", "--quiet", "--raw-dir", "none"]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "NVIDIA H200" in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    fake = tmp_path / "fake.toml"
    for _ in range(2):
        assert main(["--out", str(fake), "--fake-gpu", "--quick", "--rounds", "1", "--quiet", "--raw-dir", "none"]) == 0
    assert load_hardware(fake).name == "fake"


@pytest.mark.parametrize("name", ["../evil", "a/b", "..", "", "a\\b"])
def test_name_is_one_path_component(tmp_path, capsys, name, monkeypatch):
    from calibrate.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["--out", str(tmp_path / "p.toml"), "--fake-gpu", "--quick", "--name", name]) == 2
    assert "--name" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_cli_rejects_bad_out(tmp_path, capsys):
    from calibrate.cli import main

    assert main(["--out", str(tmp_path / "x.txt"), "--fake-gpu", "--quick"]) == 2
    assert ".toml" in capsys.readouterr().err


def test_measured_h200_profile_loads():
    p = REPO / "scenarios/hardware/h200.toml"
    if not p.exists():
        pytest.skip("no measured H200 profile yet")
    hw = load_hardware(p)
    assert hw.gemm_table is not None and hw.attn_table is not None
    assert hw.measured["device"].startswith("NVIDIA H200")
    # the table is consistent with the fitted roofline within the reported error band
    tab = hw.gemm_table
    m, n, k = (tab[c].to_numpy(float) for c in "mnk")
    pred = F.roofline_time(F.gemm_flops(m, n, k), F.gemm_bytes(m, n, k, 2 * n * k), hw.gpu_flops_per_s,
                           hw.hbm_bytes_per_s, hw.kernel_s)
    assert np.median(np.abs(pred / tab.t_s.to_numpy() - 1)) < 0.15


def test_attention_table_interpolates_inside_and_fits_outside():
    """Inside the measured token range the attention time reproduces every table point and
    lies between its neighbours (linear in KV at a fixed token count, geometric between token
    counts); outside it the per-geometry fit takes over."""
    from dataclasses import replace

    import numpy as np
    import pandas as pd

    from sim.model.costs import _attn_table_s
    from sim.model.specs import load_hardware

    hw = load_hardware(Path(__file__).resolve().parent.parent / "scenarios" / "hardware" / "h200.toml")
    rows = []
    for n in (1, 64, 512):
        for kv in (0, 1024, 4096):
            rows.append(dict(n_tokens=n, kv_len=kv, n_head=8, n_head_kv=2, head_dim=64,
                             t_s=1e-5 + 2e-12 * n * (kv + n) + 1e-9 * (kv + n)))
    hw = replace(hw, attn_table=pd.DataFrame(rows))
    for r in rows:
        assert _attn_table_s(hw, r["n_tokens"], r["kv_len"], 8, 2, 64, 0) == pytest.approx(r["t_s"], rel=1e-12)
    mid_kv = _attn_table_s(hw, 64, 2048, 8, 2, 64, 0)
    assert mid_kv == pytest.approx(np.interp(2048, [1024, 4096], [rows[4]["t_s"], rows[5]["t_s"]]))
    t64, t512 = _attn_table_s(hw, 64, 1024, 8, 2, 64, 0), _attn_table_s(hw, 512, 1024, 8, 2, 64, 0)
    t200 = _attn_table_s(hw, 200, 1024, 8, 2, 64, 0)
    f = (np.log(200) - np.log(64)) / (np.log(512) - np.log(64))
    assert t200 == pytest.approx(np.exp((1 - f) * np.log(t64) + f * np.log(t512)))
    beyond = _attn_table_s(hw, 512, 8192, 8, 2, 64, 0)  # linear extrapolation along KV
    slope = (rows[8]["t_s"] - rows[7]["t_s"]) / 3072
    assert beyond == pytest.approx(rows[8]["t_s"] + slope * 4096)
    assert _attn_table_s(hw, 4096, 0, 8, 2, 64, 0) > t512  # the fit, beyond the largest token count
    assert _attn_table_s(hw, 64, 0, 16, 2, 64, 0) is None  # geometry not measured


def test_host_series_prices_the_cpu_backend_and_pageable_copies(fake_calibration):
    """The profile's cpu_gb_per_s / cpu_op_us come from the line through the host series'
    medians and h2d_pageable_gb_per_s from its copy median; degenerate series fall back to
    the single large matvec or clamp the intercept, with a note in [measured]."""
    import copy

    from calibrate.run import build_profile, fit_calibration

    cal = copy.deepcopy(fake_calibration)
    del cal.scalars["pageable_spread"]  # the host series prices pageable copies only without it
    hs = cal.scalars["host_series"]
    sb, bb = hs["mv_small_bytes"], hs["mv_big_bytes"]
    hs["mv_small_t_s"], hs["mv_big_t_s"] = [10e-6 + sb / 50e9] * 5, [10e-6 + bb / 50e9] * 5
    hs["page_t_s"] = [hs["page_bytes"] / 7e9] * 5
    doc, _ = build_profile(cal, fit_calibration(cal), "t")
    hw = doc["hardware"]
    assert hw["cpu_gb_per_s"]["value"] == pytest.approx(50.0, rel=1e-9)
    assert hw["cpu_op_us"]["value"] == pytest.approx(10.0, rel=1e-6)
    lat_s = hw["h2d_pageable_latency_us"]["value"] * 1e-6  # the copy median minus the fitted latency
    assert hw["h2d_pageable_gb_per_s"]["value"] == pytest.approx(
        hs["page_bytes"] / (hs["page_bytes"] / 7e9 - lat_s) / 1e9, rel=1e-3)
    assert "host_series_notes" not in doc["measured"]
    hs["mv_small_t_s"], hs["mv_big_t_s"] = [1e-3] * 5, [1e-3] * 5  # no slope
    doc, _ = build_profile(cal, fit_calibration(cal), "t")
    assert doc["hardware"]["cpu_gb_per_s"]["value"] == pytest.approx(cal.scalars["cpu"]["matvec_gb_per_s"])
    assert "single large matvec" in doc["measured"]["host_series_notes"][0]
    hs["mv_small_t_s"], hs["mv_big_t_s"] = [1e-4] * 5, [1.5e-3] * 5  # negative intercept
    doc, _ = build_profile(cal, fit_calibration(cal), "t")
    assert doc["hardware"]["cpu_op_us"]["value"] == pytest.approx(0.01)
    assert "clamped" in doc["measured"]["host_series_notes"][0]


def test_pageable_samples_through_the_run_price_pageable_copies(fake_calibration):
    """The pageable copies sampled through the whole calibration set h2d_pageable_gb_per_s
    (their median time minus the fitted latency) over the host series; fewer than five samples
    leave it to the series; [measured] records count, span and p10/p50/p90."""
    import copy

    from calibrate.run import build_profile, fit_calibration

    cal = copy.deepcopy(fake_calibration)
    ps = cal.scalars["pageable_spread"]
    assert len(ps["t_s"]) >= 5 and len(ps["t_s"]) == len(ps["t_at_s"])
    nb = ps["page_bytes"]
    ps["t_s"] = [nb / 6e9, nb / 8e9, nb / 8e9, nb / 8e9, nb / 9e9, nb / 6e9]
    ps["t_at_s"] = [0.0, 1.0, 2.0, 3.0, 4.0, 50.0]
    cal.scalars["host_series"]["page_t_s"] = [cal.scalars["host_series"]["page_bytes"] / 3e9] * 5
    doc, _ = build_profile(cal, fit_calibration(cal), "t")
    lat_s = doc["hardware"]["h2d_pageable_latency_us"]["value"] * 1e-6
    t_med = float(np.median(ps["t_s"]))
    assert doc["hardware"]["h2d_pageable_gb_per_s"]["value"] == pytest.approx(nb / (t_med - lat_s) / 1e9, rel=1e-6)
    assert "between the measurements of the calibration (50 s;" in doc["hardware"]["h2d_pageable_gb_per_s"]["source"]
    m = doc["measured"]
    assert m["pageable_spread_samples"] == 6 and m["pageable_spread_span_s"] == 50.0
    assert m["pageable_spread_gb_per_s_p10_p50_p90"][1] == pytest.approx(nb / t_med / 1e9, rel=1e-3)
    assert m["host_series_pageable_gb_per_s"] == pytest.approx(3.0, rel=1e-3)
    ps["t_s"], ps["t_at_s"] = ps["t_s"][:4], ps["t_at_s"][:4]  # too few: the host series decides
    doc, _ = build_profile(cal, fit_calibration(cal), "t")
    assert "samples over" in doc["hardware"]["h2d_pageable_gb_per_s"]["source"]
    assert doc["hardware"]["h2d_pageable_gb_per_s"]["value"] < 3.5


@given(i=st.integers(0, 10**6), nbytes=st.integers(1, 2**24), extra=st.integers(0, 2**24))
@settings(max_examples=200, deadline=None)
def test_host_offset_stays_inside_the_buffer_and_page_aligned(i, nbytes, extra):
    from calibrate.measure import host_offset

    span = nbytes + extra
    off = host_offset(i, nbytes, span)
    assert 0 <= off <= span - nbytes and off % 4096 == 0
    assert host_offset(i, nbytes, nbytes) == 0


def test_pageable_sampler_gates_on_its_interval_walks_the_buffer_and_rejects_bad_input(monkeypatch):
    """maybe_sample samples only when interval_s has passed; each sample is reps copies of
    copy_bytes (capped at the buffer) from offsets that walk through it; bad arguments raise."""
    import calibrate.measure as M

    g = M.open_gpu(fakecp)
    bufs = M.alloc_copy_buffers(g, 3 * 2**20)
    seen = []
    real = M.copy_series

    def spy(g_, dst, src, nbytes, kind, reps, **kw):
        seen.append((src - M._ptr_host(bufs.pageable), nbytes, kind, reps))
        return real(g_, dst, src, nbytes, kind, reps, **kw)

    monkeypatch.setattr(M, "copy_series", spy)
    smp = M.PageableSampler(g, bufs, copy_bytes=2**20, interval_s=1000.0, reps=2)
    smp.maybe_sample()                 # never sampled: samples
    smp.maybe_sample()                 # within the interval: nothing
    assert len(seen) == 2
    smp.last_at -= 1000.0              # the interval has passed
    smp.maybe_sample()
    r = smp.result()
    assert len(seen) == 4 and r["page_bytes"] == 2**20 and r["reps"] == 2
    assert len(r["t_s"]) == len(r["t_at_s"]) == 4 and r["t_at_s"] == sorted(r["t_at_s"])
    assert all(k == M.H2D and n == 2**20 and reps == 1 for _o, n, k, reps in seen)
    offs = [o for o, *_ in seen]
    assert offs[:3] == [0, 2**20, 2 * 2**20] and all(0 <= o <= 2 * 2**20 and o % 4096 == 0 for o in offs)
    assert M.PageableSampler(g, bufs, copy_bytes=2**30).nbytes == bufs.nbytes
    for kw in ({"copy_bytes": 0}, {"copy_bytes": -5}, {"reps": 0}, {"interval_s": -1.0}, {"interval_s": float("nan")}):
        with pytest.raises(ValueError):
            M.PageableSampler(g, bufs, **kw)


def test_a_failed_pageable_sample_does_not_lose_the_calibration(monkeypatch):
    """A copy that fails during the pageable sampling stops the sampling with a note; the run
    finishes and its profile prices pageable copies from what remains (here: too few samples,
    so the host series)."""
    import calibrate.measure as M
    from calibrate.run import build_profile, fit_calibration

    calls = {"n": 0}
    real = M.PageableSampler.sample

    def flaky(self):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("copy failed")
        real(self)

    monkeypatch.setattr(M.PageableSampler, "sample", flaky)
    cal = run_calibration("fake", sweep=Sweep.quick(), rounds=2, cp=fakecp, progress=False, command="pytest",
                          log=lambda _l: None)
    assert any("pageable samples stopped after 2 copies: RuntimeError: copy failed" in n for n in cal.notes)
    assert len(cal.scalars["pageable_spread"]["t_s"]) == 2
    doc, _ = build_profile(cal, fit_calibration(cal), "t")
    assert "samples over" in doc["hardware"]["h2d_pageable_gb_per_s"]["source"]  # the host series
    assert doc["measured"]["pageable_spread_samples"] == 2


def test_cli_checks_the_raw_and_tables_folders_before_measuring(tmp_path, capsys, monkeypatch):
    import calibrate.run as R
    from calibrate.cli import main

    monkeypatch.setattr(R, "run_calibration", lambda *a, **k: pytest.fail("measured before checking the paths"))
    (tmp_path / "afile").write_text("x")
    assert main(["--out", str(tmp_path / "q.toml"), "--fake-gpu", "--quick", "--raw-dir", str(tmp_path / "afile")]) == 2
    assert "--raw-dir" in capsys.readouterr().err
    (tmp_path / "t").write_text("x")  # the tables folder of t.toml is a file
    assert main(["--out", str(tmp_path / "t.toml"), "--fake-gpu", "--quick", "--raw-dir", "none"]) == 2
    assert "tables folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "t"]


def test_attention_table_guards_and_sliding_window():
    """Repeated points count once (their median), a token count measured at a single KV length
    is not interpolated from, zero times are ignored, and a window shorter than the ubatch
    scales the (keys tokens, KV 0) time by tokens / keys."""
    from dataclasses import replace

    import numpy as np
    import pandas as pd

    from sim.model.costs import _attn_table_s
    from sim.model.specs import load_hardware

    hw = load_hardware(Path(__file__).resolve().parent.parent / "scenarios" / "hardware" / "h200.toml")

    def t_of(n, kv):
        return 1e-5 + 2e-12 * n * (kv + n) + 1e-9 * (kv + n)

    rows = [dict(n_tokens=n, kv_len=kv, n_head=8, n_head_kv=2, head_dim=64, t_s=t_of(n, kv))
            for n in (64, 512, 2048) for kv in (0, 1024, 4096)]
    rows += [dict(rows[-1], t_s=rows[-1]["t_s"] * 1.5), dict(rows[-1], t_s=rows[-1]["t_s"] * 0.5)]  # repeats
    rows += [dict(n_tokens=1024, kv_len=0, n_head=8, n_head_kv=2, head_dim=64, t_s=1.0)]  # lone point
    rows += [dict(n_tokens=512, kv_len=2048, n_head=8, n_head_kv=2, head_dim=64, t_s=0.0)]  # failed point
    hw = replace(hw, attn_table=pd.DataFrame(rows))
    beyond = _attn_table_s(hw, 2048, 8192, 8, 2, 64, 0)
    assert np.isfinite(beyond) and beyond > t_of(2048, 4096)
    assert _attn_table_s(hw, 2048, 4096, 8, 2, 64, 0) == pytest.approx(t_of(2048, 4096))  # median of 3
    mid = _attn_table_s(hw, 1024, 0, 8, 2, 64, 0)  # geometric between 512 and 2048, not the lone 1.0 s
    assert t_of(512, 0) < mid < t_of(2048, 0)
    assert _attn_table_s(hw, 512, 2048, 8, 2, 64, 0) == pytest.approx(np.interp(2048, [1024, 4096], [t_of(512, 1024),
                                                                                                     t_of(512, 4096)]))
    # window 512 over a 2048-token ubatch: 2048 queries x 512 keys
    assert _attn_table_s(hw, 2048, 0, 8, 2, 64, 512) == pytest.approx(t_of(512, 0) * 2048 / 512)


@pytest.mark.slow
def test_bench_pageable_runs_on_the_stand_in_and_rejects_bad_arguments(tmp_path):
    """benchmarks/bench_pageable.py on the numpy stand-in writes its CSV with every part and
    prints its tables; bad arguments are one line and status 2 (numbers meaningless here)."""
    import os
    import subprocess

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "FAKE_GPU": "1", "OUT": str(tmp_path), "PYTHONPATH": str(root)}
    script = str(root / "benchmarks" / "bench_pageable.py")
    done = subprocess.run([sys.executable, script, "1", "0.2"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    df = pd.read_csv(tmp_path / "pageable_diag.csv")
    assert set(df.part) >= {"region", "affinity", "pinned_fast", "pinned_slow", "thp", "series"}
    assert (df.h2d_gb_per_s > 0).all() and df[df.part == "region"].region.nunique() == 16
    assert "H2D GB/s of 64 MiB windows" in done.stdout and "series by the CPU" in done.stdout
    bad = subprocess.run([sys.executable, script, "0", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "CYCLES" in bad.stderr and "Traceback" not in bad.stderr
