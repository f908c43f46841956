"""Crossover sweeps: interpolation against theory, serial == parallel, CSV/PNG outputs, the
axes' effect on scenario/variants/test, and clean errors naming the flag."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import cli
from sim.views.crossover import (
    AXES, CSV_COLUMNS, FIGURES, apply_point, check_axes, figure_spec, find_crossovers, parse_axis,
    parse_test, sweep,
)
from sim.errors import ScenarioError
from sim.engines.metrics import run_variant_test
from sim.model.specs import BenchTest, load_scenario, parse_variant
from sim.units import GB

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "scenarios" / "tiny" / "tiny.toml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny():
    return load_scenario(TINY)


# ---------------------------------------------------------------------------------------
# find_crossovers on synthetic data
# ---------------------------------------------------------------------------------------


def test_crossing_between_neighbours_is_linear_interpolation():
    # y crosses 1.0 between x=2 (0.8) and x=4 (1.3): 2 + (1 - 0.8) * (4 - 2) / (1.3 - 0.8) = 2.8
    out = find_crossovers([1, 2, 4, 8], [0.5, 0.8, 1.3, 1.6])
    assert len(out) == 1
    value, lo, hi, rises = out[0]
    assert value == pytest.approx(2.8, rel=1e-12)
    assert (lo, hi, rises) == (2.0, 4.0, True)


def test_falling_and_rising_crossings_in_order():
    # 1.2 -> 0.9 between 10 and 20: 10 + 0.2 / 0.3 * 10 ; 0.9 -> 1.5 between 30 and 40: 30 + 0.1 / 0.6 * 10
    out = find_crossovers([10, 20, 30, 40], [1.2, 0.9, 0.9, 1.5])
    assert [round(v, 9) for v, *_ in out] == [round(10 + 20 / 3, 9), round(30 + 10 / 6, 9)]
    assert [r for *_, r in out] == [False, True]


def test_points_on_the_level_between_sides_give_their_middle():
    out = find_crossovers([1, 2, 3, 4, 5], [0.9, 1.0, 1.0, 1.0, 1.1])
    assert out == [(3.0, 1.0, 5.0, True)]


@pytest.mark.parametrize("y", [[1.1, 1.0, 1.2], [1.0, 1.0, 1.0], [0.9, 1.0, 0.95], [1.2, 1.3, 1.4]])
def test_touching_or_staying_on_one_side_is_no_crossing(y):
    assert find_crossovers([1, 2, 3], y) == []


def test_nan_points_are_skipped():
    out = find_crossovers([1, 2, 3], [0.5, float("nan"), 1.5])
    assert out == [(2.0, 1.0, 3.0, True)]


def test_bad_input_is_rejected():
    with pytest.raises(ValueError):
        find_crossovers([1, 2], [1.0])
    with pytest.raises(ValueError):
        find_crossovers([2, 1], [0.5, 1.5])


@settings(max_examples=60, deadline=None)
@given(x0=st.floats(-50, 50), slope=st.one_of(st.floats(0.05, 10), st.floats(-10, -0.05)),
       n_left=st.integers(1, 5), n_right=st.integers(1, 5), step=st.floats(0.5, 5))
def test_linear_series_crosses_at_its_root(x0, slope, n_left, n_right, step):
    """Theory: y = 1 + slope (x - x0) crosses 1 at x0 exactly; interpolation of a line is exact."""
    x = np.concatenate([x0 - step * (np.arange(n_left, 0, -1) - 0.37), x0 + step * (np.arange(n_right) + 0.41)])
    y = 1.0 + slope * (x - x0)
    out = find_crossovers(x, y)
    assert len(out) == 1
    value, lo, hi, rises = out[0]
    assert value == pytest.approx(x0, abs=1e-9 * max(1.0, abs(x0)) + 1e-9)
    assert lo < value < hi
    assert rises == (slope > 0)


# ---------------------------------------------------------------------------------------
# axes, tests and points
# ---------------------------------------------------------------------------------------


def test_parse_axis_values_and_ranges():
    assert parse_axis("slots=1-4").values == (1, 2, 3, 4)
    assert parse_axis("ubatch=32-256*2").values == (32, 64, 128, 256)
    assert parse_axis("depth=8192,0,0").values == (0, 8192)
    assert parse_axis("pcie=16, 8.5,32").values == (8.5, 16.0, 32.0)
    assert parse_axis("CACHE=1,64").spec.column == "cache_experts_requested"
    # 0 was documented as "no cache" but uncapped the cache (placement.expert_cache_experts 0):
    # refused; the baseline is the run without one
    with pytest.raises(ScenarioError, match=">= 1, got 0"):
        parse_axis("cache=0,64")


@pytest.mark.parametrize("text, flag, words", [
    ("foo=1,2", "--axis", "unknown axis 'foo'"),
    ("ubatch", "--axis2", "NAME=V1"),
    ("ubatch=abc", "--axis", "ubatch"),
    ("ubatch=0,32", "--axis", ">= 1"),
    ("pcie=0,16", "--axis2", "> 0"),
])
def test_bad_axis_names_the_flag(text, flag, words):
    with pytest.raises(ScenarioError) as ei:
        parse_axis(text, flag)
    assert ei.value.field == flag
    assert words in str(ei.value)


def test_parse_test():
    assert parse_test("pp512") == BenchTest(512, 0, 0)
    assert parse_test("tg128") == BenchTest(0, 128, 0)
    assert parse_test("pp512 @ d8192") == BenchTest(512, 0, 8192)
    with pytest.raises(ScenarioError) as ei:
        parse_test("pp")
    assert ei.value.field == "--test"


def test_check_axes_rejects_axes_that_cannot_apply():
    vs = [parse_variant("baseline"), parse_variant("prefetch_ungated")]
    for name in ("gate", "slots", "cache"):
        with pytest.raises(ScenarioError, match=name) as ei:
            check_axes([parse_axis(f"{name}=1,2")], vs, BenchTest(512, 0, 0))
        assert ei.value.field == "--axis"
    with pytest.raises(ScenarioError, match="pp test") as ei:
        check_axes([parse_axis("depth=0"), parse_axis("prompt=64")], vs, BenchTest(0, 16, 0))
    assert ei.value.field == "--axis2"
    with pytest.raises(ScenarioError, match="twice"):
        check_axes([parse_axis("depth=0"), parse_axis("depth=1")], vs, BenchTest(64, 0, 0))


def test_apply_point_sets_each_axis(tiny):
    vs = [parse_variant(v) for v in ("baseline", "prefetch_gated_512", "slots2", "cache_lru")]
    t = BenchTest(64, 0, 0)
    s, v, t2 = apply_point(tiny, vs, t, [("ubatch", 128)])
    assert (s.workload.n_ubatch, s.workload.n_batch) == (128, 128)  # n_batch (64) raised to the ubatch
    s, v, t2 = apply_point(tiny, vs, t, [("depth", 1000), ("prompt", 32)])
    assert t2 == BenchTest(32, 0, 1000)
    assert s.placement.ctx_size == 1032  # raised from 256 to depth + prompt
    s, v, _ = apply_point(tiny, vs, t, [("gate", 64)])
    assert [x.gate_min_batch for x in v] == [None, 64, None, None]
    assert [x.name for x in v] == [x.name for x in vs]
    s, v, _ = apply_point(tiny, vs, t, [("slots", 5)])
    assert [x.expert_slots for x in v] == [0, 0, 5, 0]
    s, v, _ = apply_point(tiny, vs, t, [("cache", 7)])
    assert s.placement.expert_cache_experts == 7
    s, v, _ = apply_point(tiny, vs, t, [("cache", 0)])
    assert [x.expert_cache for x in v] == ["none"] * 4
    s, v, _ = apply_point(tiny, vs, t, [("pcie", 2.5)])
    assert s.hardware.h2d_pinned.bytes_per_s == 2.5 * GB
    assert s.hardware.h2d_pinned.latency_s == tiny.hardware.h2d_pinned.latency_s
    assert s.hardware.h2d_pageable == tiny.hardware.h2d_pageable


def test_placement_axes_parse_and_apply(tiny):
    from sim.model.quant import bpw_of

    ax = parse_axis("kv=q4_0,f16,q8_0")
    assert ax.values == (bpw_of("q4_0") / 8, bpw_of("q8_0") / 8, 2.0)
    assert parse_axis("fa=1,0").values == (0, 1)
    assert parse_axis("ngl=0-3").values == (0, 1, 2, 3)
    vs = [parse_variant("baseline")]
    t = BenchTest(64, 0, 0)
    s, _, _ = apply_point(tiny, vs, t, [("ngl", 1)])
    assert s.placement.ngl == 1
    s, _, _ = apply_point(replace(tiny, placement=replace(tiny.placement, fit_experts=True)), vs, t, [("ncmoe", 1)])
    assert (s.placement.n_cpu_moe, s.placement.fit_experts) == (1, False)
    s, _, _ = apply_point(tiny, vs, t, [("fa", 0)])
    assert s.placement.flash_attn is False
    s, _, _ = apply_point(tiny, vs, t, [("kv", 1.0625)])
    assert s.model.kv_bytes_per_elem == 1.0625


@pytest.mark.parametrize("text, words", [
    ("kv=f16,q9_0", "unknown KV cache type 'q9_0'"),
    ("fa=0,2", "'2' is not on, off, auto, 0, 1 or -1"),
    ("fa=", "axis 'fa' has no values"),   # it had been told to give integers like 512,1024
    ("fa=maybe", "'maybe' is not on, off"),
    ("ncmoe=-1", "cannot be negative"),
])
def test_bad_placement_axis_values_are_refused(text, words):
    with pytest.raises(ScenarioError, match=words) as ei:
        parse_axis(text)
    assert ei.value.field == "--axis"


def test_placement_axes_refuse_impossible_points_and_cap_ncmoe(tiny):
    vs, t = [parse_variant("baseline")], BenchTest(64, 0, 0)
    s, _, _ = apply_point(tiny, vs, t, [("ncmoe", 3)])  # past the blocks: every expert on the host
    assert s.placement.n_cpu_moe == 2
    with pytest.raises(ScenarioError, match="needs FlashAttention"):
        apply_point(tiny, vs, t, [("fa", 0), ("kv", 1.0625)])
    dense = replace(tiny, model=replace(tiny.model, moe=None))
    with pytest.raises(ScenarioError, match="has no experts"):
        apply_point(dense, vs, t, [("ncmoe", 1)])


def test_axis_notes_say_what_an_axis_cannot_change(tiny):
    from sim.views.crossover import axis_notes

    notes = axis_notes([parse_axis("ubatch=32,64,128")], BenchTest(64, 0, 0), tiny)
    assert len(notes) == 1 and "1 value above the pp64 prompt (64 tokens) runs the same graphs" in notes[0]
    assert axis_notes([parse_axis("ubatch=32,64")], BenchTest(64, 0, 0), tiny) == []
    assert "every expert" in axis_notes([parse_axis("ncmoe=1,5")], BenchTest(64, 0, 0), tiny)[0]
    assert "priced as F16" in axis_notes([parse_axis("kv=f16,q8_0")], BenchTest(64, 0, 0), tiny)[0]


def test_ncmoe_sweep_moves_experts_to_the_host(tiny):
    # more blocks with host experts: more bytes copied and less VRAM at prefill, never faster
    res = sweep(tiny, [parse_axis("ncmoe=0,1,2")], [parse_variant("baseline")], BenchTest(64, 0, 0), jobs=1)
    df = res.to_dataframe()
    assert list(df.n_cpu_moe) == [0, 1, 2]
    assert np.all(np.diff(df.h2d_bytes) > 0) and df.h2d_bytes.iloc[0] == 0
    assert np.all(np.diff(df.peak_vram_bytes) < 0)
    assert np.all(np.diff(df.tps_mean) <= 0)


# ---------------------------------------------------------------------------------------
# sweeps
# ---------------------------------------------------------------------------------------


def _tiny_sweep(tiny, jobs):
    return sweep(tiny, [parse_axis("prompt=8,16,32,64"), parse_axis("pcie=1,10,40")],
                 [parse_variant("prefetch_ungated"), parse_variant("slots2")], BenchTest(64, 0, 0),
                 repetitions=2, jobs=jobs)


def test_parallel_sweep_equals_serial(tiny):
    serial = _tiny_sweep(tiny, 1)
    parallel = _tiny_sweep(tiny, 2)
    # repr of a float round-trips exactly, and NaN (ttft of nothing, no cache) compares equal
    assert repr(serial.cells) == repr(parallel.cells)
    pd.testing.assert_frame_equal(serial.to_dataframe(), parallel.to_dataframe(), check_exact=True)


def test_sweep_cell_matches_a_direct_run(tiny):
    """A cell is what run_variant_test gives on the scenario with the axis applied by hand."""
    res = _tiny_sweep(tiny, 1)
    i, j = 2, 0  # prompt 32, pcie 1 GB/s
    hw = tiny.hardware.with_(h2d_pinned=replace(tiny.hardware.h2d_pinned, bytes_per_s=1 * GB))
    scn = tiny.with_(hardware=hw)
    for name in ("baseline", "prefetch_ungated"):
        r = run_variant_test(scn, parse_variant(name), BenchTest(32, 0, 0), 2)
        assert res.metric(name, "tps_mean")[i, j] == r.tps_mean
        assert res.metric(name, "ttft_s")[i, j] == r.ttft_s
    base = res.metric("baseline", "tps_mean")
    np.testing.assert_array_equal(res.speedup("baseline"), base / base)


def test_cells_an_axis_leaves_alone_are_evaluated_once_and_placed_at_every_point(tiny):
    """On a slots axis the baseline's inputs are the same at every point: the sweep evaluates
    it once (sim.views.crossover._same_cells) and gives each point that cell with its own index and
    value, in worker processes (which read the jobs from memory) as in this one; every cell is
    a direct run's."""
    from sim.views.crossover import _Job, _same_cells, apply_point

    axes = [parse_axis("slots=1,2,3")]
    variants = [parse_variant("slots2")]
    test = BenchTest(64, 0, 0)
    serial = sweep(tiny, axes, variants, test, jobs=1)
    parallel = sweep(tiny, axes, variants, test, jobs=2, prefetch_plots=True)
    assert repr(serial.cells) == repr(parallel.cells)
    base = [c for c in serial.cells if c.variant == "baseline"]
    assert [c.index for c in base] == [(0,), (1,), (2,)] and [c.point for c in base] == [(1,), (2,), (3,)]
    r = run_variant_test(tiny, parse_variant("baseline"), test, 1)
    assert all(c.tps_mean == r.tps_mean for c in base)
    for i, n in enumerate((1, 2, 3)):
        s2, v2, t2 = apply_point(tiny, [parse_variant("slots2")], test, [("slots", n)])
        direct = run_variant_test(s2, v2[0], t2, 1)
        assert serial.metric("slots2", "tps_mean")[i] == direct.tps_mean
    jobs = [_Job((i,), (i,), tiny, parse_variant("baseline"), test, 1, "analytic") for i in range(3)]
    jobs.append(_Job((3,), (3,), tiny.with_(), parse_variant("baseline"), test, 1, "analytic"))  # another object
    assert _same_cells(jobs) == [0, 0, 0, 3]


def test_sweep_crossovers_are_bracketed(tiny):
    """Every reported crossing lies between two sweep points whose speedups are on opposite
    sides of 1.0 (at the same value of the other axis)."""
    res = _tiny_sweep(tiny, 1)
    a0, a1 = res.axes
    for c in res.crossovers():
        s = res.speedup(c.variant)
        if c.axis == a0.name:
            line, vals = s[:, a1.values.index(c.fixed[1])], a0.values
        else:
            line, vals = s[a0.values.index(c.fixed[1]), :], a1.values
        lo, hi = line[vals.index(c.lo)], line[vals.index(c.hi)]
        assert (lo - 1.0) * (hi - 1.0) < 0
        assert c.lo < c.value < c.hi
        assert c.gains_above == (hi > 1.0)


def test_a_point_that_does_not_fit_is_a_row_with_the_error(tiny):
    # the tiny GPU has 1 GB; 4M tokens of KV cache (256 B/token) do not fit
    res = sweep(tiny, [parse_axis("depth=0,4000000")], [parse_variant("prefetch_ungated")], BenchTest(64, 0, 0),
                jobs=1)
    df = res.to_dataframe()
    bad = df[df.n_depth == 4000000]
    assert len(bad) == 2 and bad.error.str.contains("does not fit").all()
    # the scenario named from the working folder (the suite runs from the checkout), not as an
    # absolute path: a committed figure's CSV differed between checkouts in that alone
    assert not bad.error.str.contains(str(Path.cwd().resolve()) + "/", regex=False).any()
    assert bad.tps_mean.isna().all() and bad.speedup_vs_baseline.isna().all()
    good = df[df.n_depth == 0]
    assert (good.error == "").all() and good.tps_mean.notna().all()


# ---------------------------------------------------------------------------------------
# command line: CSV, PNG, errors
# ---------------------------------------------------------------------------------------


def test_cli_one_axis_writes_csv_and_png(tmp_path, capsys):
    rc = cli.main([
        "crossover", str(TINY), "--axis", "prompt=8,16,32,64", "--variant", "prefetch_ungated",
        "--variant", "slots2", "--out", str(tmp_path), "-q", "-j", "1", "-r", "1"])
    assert rc == 0
    csvs = list(tmp_path.glob("*.csv"))
    pngs = list(tmp_path.glob("*.png"))
    assert len(csvs) == 1 and len(pngs) == 1
    assert pngs[0].read_bytes()[:8] == PNG_MAGIC
    df = pd.read_csv(csvs[0], keep_default_na=False, na_values=[""])
    assert list(df.columns) == ["n_prompt", *CSV_COLUMNS]
    assert len(df) == 4 * 3  # points x (baseline + 2 variants)
    assert list(df.variant.unique()) == ["baseline", "prefetch_ungated", "slots2"]
    assert list(df.test.unique()) == ["pp8", "pp16", "pp32", "pp64"]
    base = df[df.variant == "baseline"].set_index("n_prompt").tps_mean
    for _, row in df.iterrows():
        assert row.speedup_vs_baseline == pytest.approx(row.tps_mean / base[row.n_prompt], rel=1e-12)
    out = capsys.readouterr().out
    assert str(csvs[0]) in out and str(pngs[0]) in out


def test_cli_two_axes_writes_heatmap(tmp_path):
    rc = cli.main([
        "crossover", str(TINY), "--axis", "prompt=16,64", "--axis2", "pcie=5,20", "--variant",
        "prefetch_ungated", "--out", str(tmp_path), "-q", "-j", "2"])
    assert rc == 0
    (png,) = tmp_path.glob("*.png")
    assert png.read_bytes()[:8] == PNG_MAGIC
    (csv,) = tmp_path.glob("*.csv")
    df = pd.read_csv(csv)
    assert list(df.columns[:2]) == ["n_prompt", "h2d_pinned_gb_per_s"]
    assert len(df) == 2 * 2 * 2


@pytest.mark.parametrize("argv, flag", [
    (["--axis", "bogus=1,2"], "--axis"),
    (["--axis", "ubatch=64", "--axis2", "bogus=1"], "--axis2"),
    ([], "--axis"),
    (["--axis", "gate=64,128", "--variant", "prefetch_ungated"], "--axis"),
    (["--axis", "ubatch=64", "--test", "xx1"], "--test"),
    (["--axis", "ubatch=64", "--variant", "nonsense"], "--variant"),
    (["--figure", "zzz"], "--figure"),
    (["--figure", "a", "--axis", "ubatch=64"], "--figure"),
    (["--axis", "ubatch=64", "-r", "0"], "--repetitions"),
])
def test_cli_bad_input_is_one_line_naming_the_flag(argv, flag, tmp_path, capsys):
    rc = cli.main(["crossover", str(TINY), "--out", str(tmp_path), "-q", *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert flag in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_builtin_figures_are_well_formed():
    """Each built-in figure names an existing scenario, parseable variants, test and axes that
    apply (without running the sweep)."""
    assert set(FIGURES) == {"a", "b", "c", "d"}
    for key, spec in FIGURES.items():
        assert figure_spec(key) is spec and figure_spec(spec.name) is spec
        scn = load_scenario(ROOT / spec.scenario)
        vs = [parse_variant(v) for v in spec.variants]
        test = parse_test(spec.test)
        for text in spec.fixed:
            ax = parse_axis(text)
            scn, vs, test = apply_point(scn, vs, test, [(ax.name, ax.values[0])])
        axes = [parse_axis(t) for t in spec.axes]
        assert all(a.name in AXES for a in axes)
        check_axes(axes, vs, test)


def test_outputs_are_written_both_or_neither(tmp_path, monkeypatch):
    """When the PNG cannot be written (a full disk) neither file changes: an earlier CSV of that
    name stays as it was, and no temporary file is left."""
    import errno
    import tempfile

    import sim.atomic as A
    import sim.views.crossover as C

    scn = load_scenario(TINY)
    res = sweep(scn, [parse_axis("pcie=8,16", "--axis")], [parse_variant("prefetch_ungated")], BenchTest(64, 0, 0))
    (tmp_path / "cx").mkdir()
    (tmp_path / "cx" / "s.csv").write_text("earlier\n")
    real = tempfile.mkstemp

    def full(*a, **kw):
        if kw.get("prefix", "").startswith(".s.png"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **kw)

    monkeypatch.setattr(A.tempfile, "mkstemp", full)
    with pytest.raises(OSError):
        C.write_outputs(res, tmp_path / "cx", "s")
    assert sorted(p.name for p in (tmp_path / "cx").iterdir()) == ["s.csv"]
    assert (tmp_path / "cx" / "s.csv").read_text() == "earlier\n"
    monkeypatch.setattr(A.tempfile, "mkstemp", real)
    out = C.write_outputs(res, tmp_path / "cx", "s")
    assert out.csv_path.exists() and out.png_path.read_bytes()[:8] == PNG_MAGIC


def test_the_fa_axis_takes_llama_benchs_on_off_spelling():
    from sim.views.crossover import parse_axis

    assert parse_axis("fa=on,off").values == parse_axis("fa=0,1").values
    # auto is on, as run -fa auto simulates it (it was refused where run accepts it)
    assert parse_axis("fa=auto,off").values == parse_axis("fa=on,off").values
    with pytest.raises(ScenarioError, match="'maybe' is not on, off, auto, 0, 1 or -1"):
        parse_axis("fa=on,maybe")
    # what the values became is said (fresh-user round 4: on,off,auto gave two cells silently)
    assert parse_axis("fa=on,off").note == ""
    assert "auto is simulated as on" in parse_axis("fa=auto,off").note
    assert "on and auto are one cell" in parse_axis("fa=on,off,auto").note


def test_the_ngl_axis_takes_llama_benchs_minus_one_as_every_layer():
    """run -ngl -1 (llama-bench's default: every layer and the output) is accepted; the crossover
    axis refused it ("values cannot be negative"). It is 999, said in a note; other negatives the
    same, as run takes them."""
    from sim.views.crossover import parse_axis

    ax = parse_axis("ngl=-1,0,24")
    assert ax.values == (0, 24, 999) and "every layer and the output" in ax.note
    assert parse_axis("ngl=0,24").note == ""
    with pytest.raises(ScenarioError, match="axis 'ngl': expected integers"):
        parse_axis("ngl=-1,x")


def test_a_gate_sweep_may_start_at_0_the_ungated_prefetch(tmp_path, capsys):
    """gate=0 is the patch's -pwg 0 (ungated; prefetch_gated_0 in run): accepted as a gate axis
    value, the gated variant there times as prefetch_ungated, and a gate above the ubatch as the
    baseline (a MoE scenario with host experts, where the gate applies)."""
    assert parse_axis("gate=0,512").values == (0, 512)
    with pytest.raises(ScenarioError, match="cannot be negative"):
        parse_axis("gate=-1,512")
    rc = cli.main(["crossover", str(ROOT / "scenarios" / "default.toml"), "--axis", "gate=0,1024", "--variant",
                   "prefetch_gated_512,prefetch_ungated", "--test", "pp512", "--out", str(tmp_path), "-q", "-j", "1"])
    assert rc == 0, capsys.readouterr().err
    df = pd.read_csv(next(tmp_path.glob("*.csv")))
    tps = {(int(r.gate_min_batch), r.variant): r.tps_mean for r in df.itertuples()}
    assert tps[(0, "prefetch_gated_512")] == tps[(0, "prefetch_ungated")] > tps[(0, "baseline")]
    assert tps[(1024, "prefetch_gated_512")] == tps[(1024, "baseline")]


def test_out_named_like_a_file_is_refused_as_it_names_a_folder(tmp_path, capsys):
    """--out is the folder the CSV and PNG go into: '--out cx.csv' (not there yet) would silently
    become a folder named cx.csv; refused in one line, nothing created. An existing folder of that
    name is still written into."""
    for name in ("cx.csv", "cx.PNG", "cx.json"):
        rc = cli.main(["crossover", str(TINY), "--axis", "pcie=8,16", "--variant", "prefetch_ungated", "-q",
                       "--out", str(tmp_path / "new" / name)])
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "names a folder" in err, err
        assert f"ends in {Path(name).suffix}" in err and "field '--out'" in err
    assert not (tmp_path / "new").exists()
    (tmp_path / "old.csv").mkdir()
    rc = cli.main(["crossover", str(TINY), "--axis", "pcie=8,16", "--variant", "prefetch_ungated", "-q",
                   "--out", str(tmp_path / "old.csv")])
    assert rc == 0 and any(p.suffix == ".png" for p in (tmp_path / "old.csv").iterdir())


def test_a_speedup_within_the_tolerance_of_one_is_no_crossover():
    """A 1.7 ppm deficit beside exact ties (a prefetch variant's event records at ubatch 1) is no
    crossover; a change of side by more than SPEEDUP_RTOL is."""
    from sim.views.crossover import SPEEDUP_RTOL, find_crossovers

    assert find_crossovers([1, 2, 4, 8, 16, 32], [0.9999983, 1.0, 1.0, 1.0, 1.0, 1.02]) == []
    got = find_crossovers([1, 2, 4], [1 - 3 * SPEEDUP_RTOL, 1.0, 1.02])
    assert len(got) == 1 and got[0][3]


def test_a_sweep_where_nothing_fits_is_one_error_and_writes_nothing(tmp_path, capsys):
    from sim.cli import main

    out = tmp_path / "x"
    rc = main(["crossover", "laguna-2x3090", "--axis", "ncmoe=0,1", "--test", "pp512", "-q", "--variant", "baseline",
               "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "no point of the sweep fits" in err and err.count("\n") == 1 and not out.exists()


def test_axis_values_print_as_typed():
    """An integral axis value (a depth of 2**24) prints in full, not as 1.67772e+07."""
    from sim.views.crossover import _fmt

    assert _fmt(16777216.0) == "16777216" and _fmt(512) == "512" and _fmt(0.5) == "0.5"
    assert _fmt(float("nan")) == "nan" and _fmt(1e300) == "1e+300"


def test_a_crossing_on_an_integer_axis_is_a_whole_value():
    """A crossing on ubatch (tokens) reads ~35, not 34.56; a bandwidth keeps its decimals."""
    from sim.views.crossover import Crossover

    assert "ubatch = ~35, between 32 and 64" in Crossover("slots3", "ubatch", 34.56, 32, 64, True).describe()
    assert "pcie = 12.34, between 8 and 16" in Crossover("slots3", "pcie", 12.34, 8, 16, True).describe()


def test_the_default_single_repetition_is_said_where_run_averages_more(tmp_path, capsys):
    """crossover's cells time one repetition (capture included, one routing draw) where run
    averages the scenario's five: baseline pp512 2052.8 against run's 2176.3 t/s with nothing said.
    A note says so; none with -r given."""
    argv = ["crossover", str(ROOT / "scenarios" / "default.toml"), "--axis", "prompt=64,512", "--variant",
            "prefetch_ungated", "--out", str(tmp_path), "-q", "-j", "1"]
    assert cli.main(argv) == 0
    assert "give -r 5 for run's numbers" in capsys.readouterr().err
    assert cli.main(argv + ["-r", "2"]) == 0
    assert "-r 1 (crossover's default)" not in capsys.readouterr().err


def test_a_sweep_past_the_trained_context_is_noted():
    """run notes a context past n_ctx_train; a crossover's depth or prompt axis said nothing."""
    from sim.model.specs import load_scenario
    from sim.views.crossover import axis_notes, parse_axis

    scn = load_scenario(ROOT / "scenarios" / "default.toml")     # Qwen3-30B-A3B, 40960 tokens
    got = axis_notes([parse_axis("depth=0,65536")], BenchTest(0, 32, 0), scn)
    assert len([n for n in got if "n_ctx_train" in n]) == 1 and "65,568 tokens" in got[-1]
    assert not [n for n in axis_notes([parse_axis("depth=0,8192")], BenchTest(0, 32, 0), scn) if "n_ctx_train" in n]


def test_a_sweep_of_the_baseline_alone_says_there_is_nothing_to_compare(tmp_path, capsys):
    """--variant X --baseline X sweeps one variant against itself: it wrote a CSV and figure and
    said nothing (fresh-user round 5); a note now says no crossing is looked for."""
    rc = cli.main(["crossover", str(TINY), "--axis", "prompt=64,128", "--variant", "prefetch_ungated",
                   "--baseline", "prefetch_ungated", "--out", str(tmp_path), "-q"])
    err = capsys.readouterr().err
    assert rc == 0 and "is the baseline itself" in err
    rc = cli.main(["crossover", str(TINY), "--axis", "prompt=64,128", "--variant", "prefetch_ungated",
                   "--out", str(tmp_path), "-q"])
    assert rc == 0 and "is the baseline itself" not in capsys.readouterr().err


def test_the_pcie_axis_on_pageable_memory_and_a_kv_axis2_error_name_what_they_should(tmp_path):
    """The pcie axis sets the pinned H2D rate: on a scenario whose host memory is pageable it is
    said to move almost nothing (it had swept silently); a quantised kv value on --axis2 with fa=0
    on --axis names --axis2 (fresh-user round 8)."""
    from dataclasses import replace as _replace

    from sim.model.specs import BenchTest, load_scenario, parse_variant
    from sim.views.crossover import apply_point, axis_notes, parse_axis

    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    t = BenchTest(512, 0)
    pageable = scn.with_(placement=_replace(scn.placement, pinned=False))
    ax = parse_axis("pcie=8,32")
    assert any("axis pcie" in n and "pageable" in n for n in axis_notes([ax], t, pageable))
    assert not any("axis pcie" in n for n in axis_notes([ax], t, scn))
    with pytest.raises(ScenarioError) as ei:
        apply_point(scn, [parse_variant("baseline")], t, [("fa", 0), ("kv", 1.0625)])
    assert ei.value.field == "--axis2"


def test_a_sweep_never_writes_over_an_input_its_file_names_fall_on(tmp_path, capsys):
    """The sweep's file names are built (<scenario>__<axis>...): one that falls on an input, here
    the scenario's routing trace, is refused naming --out and the trace is left as it was
    (fresh-user round 10: it was replaced by the sweep's CSV)."""
    import fuzzgen
    from sim.cli import main

    case = fuzzgen.Case(0, "valid", "", [])
    fuzzgen.setup_case(case, tmp_path)
    assert main(["crossover", str(tmp_path / "tiny-trace.toml"), "--axis", "prompt=32,64", "--variant", "slots2",
                 "--out", str(tmp_path / "o"), "-q"]) == 0
    stem = next((tmp_path / "o").glob("*.csv")).stem
    scn = (tmp_path / "tiny-trace.toml").read_text().replace('trace_file = "trace.csv"', f'trace_file = "{stem}.csv"')
    (tmp_path / "tiny-trace.toml").write_text(scn)
    (tmp_path / f"{stem}.csv").write_bytes((tmp_path / "trace.csv").read_bytes())
    before = (tmp_path / f"{stem}.csv").read_bytes()
    capsys.readouterr()
    rc = main(["crossover", str(tmp_path / "tiny-trace.toml"), "--axis", "prompt=32,64", "--variant", "slots2",
               "--out", str(tmp_path), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "the routing trace" in err and "--out" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / f"{stem}.csv").read_bytes() == before and not (tmp_path / f"{stem}.png").exists()
