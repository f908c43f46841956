"""calibrate.llamacpp.fit: the choice of fitted numbers and the profile copy it writes."""

from pathlib import Path

import numpy as np
import pytest

from sim.errors import PrefetchSimError

ROOT_DIR = Path(__file__).resolve().parents[1]


def test_select_fitted_names_a_subset_in_table_order_and_refuses_unknown_names():
    from calibrate.llamacpp import fit as F

    # a full fill measures split_us (the split timing) and fits the rest, cpu_split_us among them
    assert [r[0] for r in F.select_fitted(None)] == [r[0] for r in F.FITTED if r[0] != "split_us"]
    assert "cpu_split_us" in [r[0] for r in F.select_fitted(None)]
    assert [r[0] for r in F.select_fitted("cpu_rate_scale,split_us")] == ["split_us", "cpu_rate_scale"]
    for bad in ("split_us,bogus", "", "split_us,split_us"):
        with pytest.raises(PrefetchSimError, match="--params"):
            F.select_fitted(bad)


def test_a_rebased_profile_copy_reads_the_same_kernel_tables(tmp_path):
    from calibrate.llamacpp import fit as F
    from sim.model.specs import load_hardware

    src = Path("scenarios/hardware/h200-llamacpp.toml")
    dst = tmp_path / "deep" / "copy.toml"
    dst.parent.mkdir()
    dst.write_text(F.rebase_profile(src.read_text(), src, dst))
    a, b = load_hardware(src), load_hardware(dst)
    assert a.ggml.cpu.equals(b.ggml.cpu) and a.ggml.gpu.equals(b.ggml.gpu)
    assert dst.read_text() != src.read_text()


@pytest.mark.parametrize("extra, what", [
    (["--iterations", "0"], "--iterations must be >= 1"),
    (["--jobs", "0"], "--jobs must be >= 1"),
    (["--out", "scenarios/hardware/h200-llamacpp.toml"], "is --profile itself"),
    (["--out", "-"], "not standard output"),
    (["--max-steal", "0.1"], "field '--max-steal'"),   # that folder predates the host sampler
])
def test_fit_refuses_bad_arguments_before_any_work(extra, what, capsys):
    from calibrate.llamacpp import fit as F

    before = Path("scenarios/hardware/h200-llamacpp.toml").read_bytes()
    assert F.main(["--run", "data/llamacpp/h200-20261203-tg", "--params", "split_us"] + extra) == 2
    err = capsys.readouterr().err
    assert what in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert Path("scenarios/hardware/h200-llamacpp.toml").read_bytes() == before


def test_a_row_the_fit_leaves_out_is_said(tmp_path, capsys):
    """A fit row edited to a placement its invocation did not ask for is not fitted on, and the
    fit says which line and why (compare's note), not only a smaller count."""
    import json
    import shutil

    from calibrate.llamacpp import fit as F
    from sim.model.specs import load_hardware

    run = tmp_path / "run"
    shutil.copytree("data/llamacpp/h200-20261203-tg", run)
    lines = (run / "llama-bench.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    assert row["n_cpu_moe"] == 48
    row["n_cpu_moe"] = 7
    lines[1] = json.dumps(row)
    (run / "llama-bench.jsonl").write_text("\n".join(lines) + "\n")
    hw = load_hardware("scenarios/hardware/h200-llamacpp.toml")
    cases, t, _rows = F.fit_rows(run, hw)
    assert len(cases) == len(t) == 15
    err = capsys.readouterr().err
    assert "row at line 2 not used" in err and "n_cpu_moe 7" in err


def test_fit_cpu_table_needs_out_and_an_existing_table(tmp_path, capsys):
    from calibrate.llamacpp import fit as F

    base = ["--run", "data/llamacpp/h200-20261203-tg", "--params", "split_us"]
    assert F.main(base + ["--cpu-table", "data/llamacpp/h200-20261203-tg4/kernels-cpu.csv"]) == 2
    assert "give --out" in capsys.readouterr().err
    assert F.main(base + ["--cpu-table", str(tmp_path / "none.csv"), "--out", str(tmp_path / "p.toml")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("backend,op\ncpu,MUL_MAT\n")
    assert F.main(base + ["--cpu-table", str(bad), "--out", str(tmp_path / "p.toml")]) == 2
    err = capsys.readouterr().err
    assert f"--cpu-table {bad}" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.toml").exists() and not list(tmp_path.glob(".fit-*"))


def test_fit_out_into_a_folder_that_does_not_exist_yet_creates_it(tmp_path, capsys):
    """--out some/new/dir/profile.toml with --cpu-table (whose copy is loaded before the fit):
    the folders are made and the copy written; a copy that does not load leaves no folder behind."""
    from calibrate.llamacpp import fit as F
    from sim.model.specs import load_hardware

    base = ["--run", "data/llamacpp/h200-20261203-tg", "--params", "split_us", "--iterations", "1", "--jobs", "1"]
    bad = tmp_path / "no" / "such" / "p.toml"
    assert F.main(base + ["--cpu-table", "scenarios/hardware/h200-llamacpp/kernels-cuda.csv", "--out", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "--cpu-table" in err and "backend 'gpu'" in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []
    out = tmp_path / "some" / "new" / "dir" / "profile.toml"
    table = Path("data/llamacpp/h200-20261203-tg4/kernels-cpu.csv")
    assert F.main(base + ["--cpu-table", str(table), "--out", str(out)]) == 0, capsys.readouterr().err
    assert f"wrote {out}" in capsys.readouterr().out
    from sim.model.ggmlcost import read_table

    assert load_hardware(out).ggml.cpu.equals(read_table(table)) and list(out.parent.iterdir()) == [out]


def test_a_profile_with_another_cpu_table_prices_the_cpu_from_it(tmp_path):
    """with_cpu_table + load_profile_text: the copy reads the given CPU table (and the profile's
    GPU table), and cpu_numbers name that table in their sources."""
    from calibrate.llamacpp import fit as F
    from sim.model.specs import load_hardware

    src = Path("scenarios/hardware/h200-llamacpp.toml")
    table = Path("data/llamacpp/h200-20261203-tg4/kernels-cpu.csv")
    dst = tmp_path / "p.toml"
    text = F.with_cpu_table(F.rebase_profile(src.read_text(), src, dst), table, dst)
    hw = F.load_profile_text(text, dst, table)
    ship = load_hardware(src)
    assert hw.ggml.gpu.equals(ship.ggml.gpu) and not hw.ggml.cpu.equals(ship.ggml.cpu)
    assert list(tmp_path.iterdir()) == []
    nums = F.cpu_numbers(hw, table)
    assert table.as_posix() in nums["cpu_op_us"][1] and nums["cpu_op_us"][0] != F.cpu_numbers(ship)["cpu_op_us"][0]
    dst.write_text(text)
    assert load_hardware(dst).ggml.cpu.equals(hw.ggml.cpu)


def test_set_values_adds_a_number_older_profiles_lack_after_its_neighbour_and_refuses_others():
    from calibrate.llamacpp import fit as F

    text = '# a profile\n[ggml]\nsplit_us = { value = 84, source = "x" }\nlaunch_us = { value = 3, source = "y" }\n\n[other]\n'
    out = F.set_values(text, {"cpu_split_us": (158.0, "fitted"), "split_us": (13.0, "measured")})
    lines = out.splitlines()
    assert lines[2].startswith("split_us = { value = 13,") and lines[3].startswith("cpu_split_us = { value = 158,")
    assert lines[4].startswith("launch_us") and out.endswith("\n\n[other]\n")
    with pytest.raises(PrefetchSimError, match="graph_us"):  # not optional: a profile must have it
        F.set_values(text, {"graph_us": (1.0, "fitted")})


def test_the_fit_writes_a_round_off_above_zero_as_zero():
    """The active set's round-off (8e-14 us seen) is written as 0: a profile refuses such a value."""
    from calibrate.llamacpp import fit as F

    step = 20e-6
    assert F.clamp_fitted(8.5e-20, step) == 0.0 and F.clamp_fitted(-1e-3, step) == 0.0
    assert F.clamp_fitted(158e-6, step) == 158e-6


def test_fit_refuses_a_run_folder_given_twice_before_any_work(capsys):
    from calibrate.llamacpp import fit as F

    run = "data/llamacpp/h200-20261203-tg"
    assert F.main(["--run", run, run, "--params", "cpu_split_us"]) == 2
    err = capsys.readouterr().err
    assert "given twice" in err and len(err.strip().splitlines()) == 1


def test_fit_pools_the_fit_rows_of_several_run_folders(monkeypatch, capsys):
    """Several --run folders: their fit rows are fitted together (the count is their sum) and the
    written source names every folder."""
    from calibrate.llamacpp import fit as F

    runs = ["data/llamacpp/h200-20261203-tg5a", "data/llamacpp/h200-20261203-tg5b"]
    n = {r: len(F.fit_rows(r, __import__("sim.model.specs", fromlist=["load_hardware"]).load_hardware(
        "scenarios/hardware/h200-llamacpp.toml"))[0]) for r in runs}
    seen = {}

    def fake_gauss_newton(cases, t_meas, hw, iterations, jobs, fitted=None, say=print):
        seen["n"] = len(cases)
        assert len(t_meas) == len(cases)
        return {f: 1e-6 for _k, f, *_ in fitted}, np.zeros(len(cases))

    monkeypatch.setattr(F, "gauss_newton", fake_gauss_newton)
    assert F.main(["--run", *runs, "--params", "cpu_split_us"]) == 0
    out = capsys.readouterr().out
    assert seen["n"] == sum(n.values()) and "2 run folders (" + ", ".join(runs) + ")" in out


def test_the_measured_numbers_are_found_from_any_folder(tmp_path, monkeypatch):
    """A full fill's measured numbers read the model TOML and the lease folders through the
    repository and shipped files, not the working folder: the same values from elsewhere."""
    from calibrate.llamacpp import fit as F
    from sim.model.specs import load_hardware

    repo = Path(__file__).resolve().parent.parent
    hw = load_hardware(repo / "scenarios/hardware/h200-llamacpp.toml")
    here = (F.ew_rate(repo / "data/llamacpp/h200-20261201-kernels")[0],
            F.kv_cold_rate(repo / "data/llamacpp/h200-20261202-depth", hw)[0])
    monkeypatch.chdir(tmp_path)
    there = (F.ew_rate(repo / "data/llamacpp/h200-20261201-kernels")[0],
             F.kv_cold_rate(repo / "data/llamacpp/h200-20261202-depth", hw)[0])
    assert here == there


def test_fit_out_writes_a_profile_that_loads_from_its_own_folder(tmp_path, monkeypatch, capsys):
    """fit --out: the written profile's gpu_kernels / cpu_kernels reach the source profile's
    tables from the written file's folder, whatever quoting the source used ('...' was left as it
    was, so the copy looked for the tables beside itself), and it loads from any working folder."""
    import shutil

    from calibrate.llamacpp import fit as F
    from sim.model.specs import load_hardware

    root = Path.cwd()
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    shutil.copytree("scenarios/hardware/h200-llamacpp", src_dir / "h200-llamacpp")
    text = Path("scenarios/hardware/h200-llamacpp.toml").read_text()
    quoted = text.replace('gpu_kernels = "h200-llamacpp/kernels-cuda.csv"', "gpu_kernels = 'h200-llamacpp/kernels-cuda.csv'")
    assert quoted != text
    (src_dir / "p.toml").write_text(quoted)
    out = tmp_path / "elsewhere" / "deep" / "fitted.toml"
    argv = ["--profile", str(src_dir / "p.toml"), "--run", str(root / "data/llamacpp/h200-20261203-tg"),
            "--params", "split_us", "--iterations", "1", "--jobs", "1", "--out", str(out)]
    assert F.main(argv) == 0, capsys.readouterr().err
    monkeypatch.chdir(tmp_path / "elsewhere")
    got, ship = load_hardware(out), load_hardware(root / "scenarios/hardware/h200-llamacpp.toml")
    assert got.ggml.gpu.equals(ship.ggml.gpu) and got.ggml.cpu.equals(ship.ggml.cpu)
    lines = [ln for ln in out.read_text().splitlines() if "_kernels = " in ln]
    assert lines == ['gpu_kernels = "../../src/h200-llamacpp/kernels-cuda.csv"',
                     'cpu_kernels = "../../src/h200-llamacpp/kernels-cpu.csv"']


def test_fit_refuses_a_based_profile_it_could_not_write_before_any_work(tmp_path, capsys):
    """A profile built on another ([hardware] base, no [ggml] of its own): --out elsewhere would
    not find the base, and its numbers have no [ggml] table to go in; both said before the fit."""
    from calibrate.llamacpp import fit as F

    base = ["--profile", "scenarios/hardware/h200x2-llamacpp.toml", "--run", "data/llamacpp/h200-20261203-tg",
            "--params", "split_us", "--iterations", "1", "--jobs", "1"]
    before = Path("scenarios/hardware/h200x2-llamacpp.toml").read_bytes()
    assert F.main(base + ["--out", str(tmp_path / "x.toml")]) == 2
    out, err = capsys.readouterr()
    assert "based on h200-llamacpp.toml" in err and len(err.strip().splitlines()) == 1 and "fitting" not in out
    assert F.main(base + ["--write"]) == 2
    out, err = capsys.readouterr()
    assert "no [ggml] table of its own" in err and "fitting" not in out
    assert list(tmp_path.iterdir()) == [] and Path("scenarios/hardware/h200x2-llamacpp.toml").read_bytes() == before


def test_fit_max_steal_leaves_out_the_loads_the_hypervisor_took_cpu_from(capsys):
    """On the committed tg11 folder (host sampler on), --max-steal 0.1 leaves out every fit row of
    a load with more steal, naming its share; the loads at or under it stay."""
    from calibrate.llamacpp import fit as F
    from calibrate.llamacpp.compare import invocation_steal
    from sim.model.specs import load_hardware

    run = Path("data/llamacpp/h100-20261206-tg11")
    steal = invocation_steal(run)
    hw = load_hardware("scenarios/hardware/h200-llamacpp.toml")
    all_cases, _t, all_rows = F.fit_rows(run, hw)
    capsys.readouterr()
    stolen = {i: f"steal {v:.2f} %" for i, v in steal.items() if v > 0.1}
    cases, t, rows = F.fit_rows(run, hw, skip_invocations=stolen)
    err = capsys.readouterr().err
    kept = [ln for ln in all_rows.index if ln not in rows.index]
    assert 0 < len(cases) == len(t) < len(all_cases) and kept
    for ln in kept:
        assert f"row at line {ln} not used: steal " in err
    assert "a-gemma3-ffn-cpu" in stolen and "b-qwen3-ncmoe48" not in stolen


def test_fit_max_steal_reads_invocations_once_more_not_twice(monkeypatch, capsys):
    """--max-steal needs invocations.jsonl for the loads' windows and ids: one read of it (it was
    read twice, once for each); counted up to --iterations 0's refusal, after the steal is known."""
    from calibrate.llamacpp import fit as F

    reads = []
    real = Path.read_text

    def counting(self, *a, **k):
        if self.name == "invocations.jsonl":
            reads.append(self)
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", counting)
    base = ["--run", "data/llamacpp/h100-20261206-tg11", "--params", "cpu_split_us", "--iterations", "0"]
    counts = []
    for extra in ([], ["--max-steal", "0.1"]):
        reads.clear()
        assert F.main(base + extra) == 2 and "--iterations must be >= 1" in capsys.readouterr().err
        counts.append(len(reads))
    assert counts[1] == counts[0] + 1, counts



def test_fit_warns_when_the_run_was_measured_on_another_gpu_than_the_profiles():
    """An H100 lease refit into the H200 profile: the copy keeps the H200's name and GPU
    figures, so fit says so (as compare does); the H200 ground truth gives no such line."""
    from sim.model.specs import load_hardware

    from calibrate.llamacpp.fit import other_gpu_warnings

    hw = load_hardware(ROOT_DIR / "scenarios/hardware/h200-llamacpp.toml")
    (line,) = other_gpu_warnings(ROOT_DIR / "data/llamacpp/h100-20261206-tg9", hw)
    assert "NVIDIA H100" in line and "NVIDIA H200" in line and "\n" not in line
    assert other_gpu_warnings(ROOT_DIR / "data/llamacpp/h200-20261201", hw) == []


def test_gauss_newton_halves_a_step_that_raises_the_error(monkeypatch):
    """A full Gauss-Newton step on rows the model follows only loosely overshoots (a saturating
    time, atan-like: from 2 above the root the step lands 3.5 below it and the next ones run
    away); halved until the squared error does not rise, the fit converges (fresh-user round 7:
    cpu_rate_scale 1.4e4 written into a profile compare then refused)."""
    import calibrate.llamacpp.fit as F

    monkeypatch.setattr(F, "predict_times", lambda cases, hw, p, jobs: np.array([1.0 + np.arctan(p["x"] - 10.0)]))
    rows = [("x_us", "x", 1.0, 12.0, 1e-4)]
    p, err = F.gauss_newton([0], np.array([1.0]), None, iterations=8, jobs=1, say=lambda *_: None, fitted=rows)
    assert abs(p["x"] - 10.0) < 1e-3 and abs(err[0]) < 1e-3
    # no step from the start that lowers the error: refused (the start values are not a fit)
    # (the start is the error's minimum, 100 % off: every step along the direction raises it)
    monkeypatch.setattr(F, "predict_times", lambda cases, hw, p, jobs: np.array([2.0 + (p["x"] - 12.0) ** 2]))
    with pytest.raises(PrefetchSimError, match="no step from the fit's start values"):
        F.gauss_newton([0], np.array([1.0]), None, iterations=3, jobs=1, say=lambda *_: None,
                       fitted=[("x_us", "x", 1.0, 12.0, 1e-2)])


def test_a_fitted_profile_that_would_not_load_is_not_written(monkeypatch, capsys, tmp_path):
    """What fit would write is loaded first: a fitted number outside the profile's bounds is an
    error naming it, and --out is not written (fresh-user round 7: cpu_rate_scale = 13556 had been
    written, and compare refused the file)."""
    from calibrate.llamacpp import fit as F

    def fake_gauss_newton(cases, t_meas, hw, iterations, jobs, fitted=None, say=print):
        return {f: 1.4e4 for _k, f, *_ in fitted}, np.zeros(len(cases))

    monkeypatch.setattr(F, "gauss_newton", fake_gauss_newton)
    out = tmp_path / "p.toml"
    runs = ["data/llamacpp/h200-20261203-tg5a", "data/llamacpp/h200-20261203-tg5b"]
    assert F.main(["--run", *runs, "--params", "cpu_rate_scale", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "would not load" in err and "cpu_rate_scale" in err and not out.exists()
