"""Property-based fuzz of the inputs (issue #16): one mutation of a shipped scenario, model,
hardware profile, table, routing trace or command line (tests/fuzzgen.py) never ends in a
traceback, and a mutation labelled invalid never runs as if it were fine. A fast subset; the
full run is ``python benchmarks/fuzz_inputs.py`` (>= 2,000 cases under a time limit)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzzgen
from sim.errors import ScenarioError


def _cheap(case: fuzzgen.Case) -> bool:
    """Cases that finish in well under a second in-process (no crossover sweep, no big model)."""
    return case.argv[0] != "crossover" and "-m" not in case.argv and not case.fifo


# the same 25 cases on every run (tests/conftest.py's default profile); new cases come from
# benchmarks/fuzz_inputs.py (>= 2,000) or HYPOTHESIS_PROFILE=explore
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.filter_too_much])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1).map(fuzzgen.make_case).filter(_cheap))
def test_a_mutated_input_is_a_clean_error_or_a_valid_run(seed, tmp_path_factory, monkeypatch):
    case = seed
    monkeypatch.setattr(os, "cpu_count", lambda: 1)  # serial engines: no process pool per example
    folder = tmp_path_factory.mktemp("fuzz")
    fuzzgen.setup_case(case, folder)
    rc, out, err = fuzzgen.run_case(case, folder)
    outcome = fuzzgen.classify(case, rc, out, err)
    assert outcome in ("clean error", "valid run"), f"{outcome}: {case.what}\n{case.argv}\n{err[-2000:]}"


@pytest.mark.parametrize("text, label", [
    ("[hardware]\ngpu_tflops = {value = 1e-320, source = 'x'}", "gpu_tflops"),
    ("[hardware]\nvram_gb = {value = 1e308, source = 'x'}", "vram_gb"),
    ("[hardware]\nh2d_pinned_gb_per_s = {value = 1e-300, source = 'x'}", "h2d_pinned_gb_per_s"),
])
def test_non_physical_hardware_numbers_are_refused_naming_the_field(tmp_path, text, label):
    from sim.model.specs import load_hardware

    base = (fuzzgen.SCN / "tiny" / "tiny-gpu.toml").read_text()
    key = label
    lines = [ln for ln in base.splitlines() if not ln.startswith(key + " ")]
    p = tmp_path / "hw.toml"
    p.write_text("\n".join(lines).replace("[hardware]", text))
    with pytest.raises(ScenarioError) as info:
        load_hardware(p)
    assert info.value.field == f"hardware.{label}"
    assert "physical" in str(info.value) or "finite" in str(info.value)


@pytest.mark.parametrize("points, why", [
    ("[[34, 0.9], [2048, 0.1]]", "cannot fall"),
    ("[[34, 0.5], [34, 0.6]]", "twice"),
    ("[[1, 0.9]]", "between"),
    ("[[2, 0.3], [3, 0.31], [4, 0.99]]", "no skewed routing"),
])
def test_impossible_fit_points_are_refused(tmp_path, points, why):
    from sim.model.specs import load_scenario

    case = fuzzgen.Case(0, "invalid", "", [])
    fuzzgen.setup_case(case, tmp_path)
    (tmp_path / "s.toml").write_text(fuzzgen.tiny_scenario(routing=f'kind = "skewed"\nfit_points = {points}'))
    with pytest.raises(ScenarioError, match=why) as info:
        load_scenario(tmp_path / "s.toml")
    assert info.value.field.startswith("routing.fit_points")


def test_special_files_deep_nesting_and_a_bom(tmp_path):
    from sim.tomlio import load_toml

    for dev in ("/dev/zero", "/dev/urandom"):
        with pytest.raises(ScenarioError, match="not a regular file"):
            load_toml(dev)
    os.mkfifo(tmp_path / "fifo.toml")
    with pytest.raises(ScenarioError, match="not a regular file"):
        load_toml(tmp_path / "fifo.toml")
    for depth in (40, 5000):
        (tmp_path / "deep.toml").write_text("x = " + "[" * depth + "1" + "]" * depth + "\n")
        with pytest.raises(ScenarioError, match="nested"):
            load_toml(tmp_path / "deep.toml")
    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbfa = 1\n")
    assert load_toml(tmp_path / "bom.toml") == {"a": 1}


@pytest.mark.parametrize("argv, flag", [
    (["run", "-p", "1-1000000"], "-p"),
    (["run", "-r", "1001"], "-r"),
    (["run", "-r", "1000000"], "-r"),
    (["run", "-n", "512", "-r", "1000", "--max-work", "1000"], "--max-work"),
    (["check", "--test", "tg99999999999"], "--test"),
    (["check", "--test", "pp512 @ d99999999"], "--test"),
    (["run", "--out", ""], "--out"),
])
def test_sizes_beyond_the_limits_are_one_line_errors(capsys, argv, flag):
    from sim.cli import main

    tiny = str(fuzzgen.SCN / "tiny" / "tiny.toml")
    try:
        rc = main([argv[0], tiny, *argv[1:]])
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and flag in err and len([ln for ln in err.splitlines() if "error" in ln]) == 1, err


def test_a_name_with_a_pipe_or_newline_keeps_the_md_table(tmp_path, capsys):
    from sim.cli import main

    case = fuzzgen.Case(0, "valid", "", [])
    fuzzgen.setup_case(case, tmp_path)
    (tmp_path / "s.toml").write_text(fuzzgen.tiny_scenario().replace('spec = "slots2"',
                                                                     'spec = "slots2"\nname = "a|b c"'))
    assert main(["run", str(tmp_path / "s.toml"), "-q"]) == 0
    out = capsys.readouterr().out
    assert "a\\|b c" in out and fuzzgen.md_table_ok(out)
    # a newline (or spaces around the name) would make the rows' variant column and build id
    # ambiguous: refused, one line naming the field
    (tmp_path / "s.toml").write_text(fuzzgen.tiny_scenario().replace('spec = "slots2"',
                                                                     'spec = "slots2"\nname = "a|b\\nc"'))
    assert main(["run", str(tmp_path / "s.toml"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "variant[1].name" in err and "control characters" in err and len(err.strip().splitlines()) == 1
