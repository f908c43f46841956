"""Progress bars show on a terminal only, and never with -q; sweeps start with their largest cells."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from sim.cli.progress import bar, progress_enabled


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_only_on_a_terminal_and_not_quiet(monkeypatch):
    assert progress_enabled(False, _Tty())
    assert not progress_enabled(True, _Tty())
    assert not progress_enabled(False, io.StringIO())
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert list(bar(range(3), desc="simulating", unit="cell")) == [0, 1, 2]
    assert "simulating" in tty.getvalue()
    quiet = _Tty()
    monkeypatch.setattr(sys, "stderr", quiet)
    list(bar(range(3), desc="simulating", unit="cell", quiet=True))
    assert quiet.getvalue() == ""


def test_run_prints_no_bar_when_stderr_is_not_a_terminal(capsys):
    from sim.cli import main

    root = Path(__file__).resolve().parents[1]
    assert main(["run", str(root / "scenarios" / "default.toml"), "-p", "64", "-n", "0", "-r", "1"]) == 0
    err = capsys.readouterr().err
    assert "simulating" not in err and "it/s" not in err and "variant/s" not in err


def test_breakdown_takes_q_as_the_other_subcommands_do(monkeypatch, capsys):
    """breakdown draws a bar on a terminal (one step per table), none with -q; -q is accepted."""
    from sim.cli import main

    flags = ["breakdown", "-p", "64", "-n", "0", "-r", "1", "--variant", "baseline"]
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(flags) == 0
    assert "simulating" in tty.getvalue() and "1/1" in tty.getvalue()
    quiet = _Tty()
    monkeypatch.setattr(sys, "stderr", quiet)
    assert main(flags + ["-q"]) == 0 and main(flags + ["--quiet"]) == 0
    assert quiet.getvalue() == ""
    assert capsys.readouterr().out.count("baseline / pp64") == 3


def test_trace_takes_q_and_draws_a_bar_per_variant_on_a_terminal(monkeypatch, capsys, tmp_path):
    """trace (seconds for a long test, silent until its file is written) draws a bar on a
    terminal, one step per variant, none with -q or --quiet; the trace file is the same."""
    from sim.cli import main

    flags = ["trace", "-p", "64", "-n", "0", "--variant", "baseline", "--variant", "slots3"]
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(flags + ["--out", str(tmp_path / "a.csv")]) == 0
    assert "simulating" in tty.getvalue() and "2/2" in tty.getvalue()
    quiet = _Tty()
    monkeypatch.setattr(sys, "stderr", quiet)
    assert main(flags + ["--out", str(tmp_path / "b.csv"), "-q"]) == 0
    assert main(flags + ["--out", str(tmp_path / "c.csv"), "--quiet"]) == 0
    assert quiet.getvalue() == ""
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text() == (tmp_path / "c.csv").read_text()
    assert capsys.readouterr().out.count("slots3 / pp64") == 3


def test_check_takes_q_as_a_no_op(monkeypatch, capsys):
    """check prints a line per plan and draws no bar; -q and --quiet are accepted (said so in its
    help) and change nothing."""
    from sim.cli import main

    flags = ["check", "-p", "64", "-n", "0", "--variant", "baseline"]
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(flags) == 0
    loud = capsys.readouterr().out
    assert main(flags + ["-q"]) == 0 and capsys.readouterr().out == loud
    assert main(flags + ["--quiet"]) == 0 and capsys.readouterr().out == loud
    assert tty.getvalue() == "" and "baseline / pp64" in loud
    with pytest.raises(SystemExit):
        main(["check", "-h"])
    assert "-q, --quiet" in (h := " ".join(capsys.readouterr().out.split())) and "does nothing here" in h


def test_calibrate_takes_q_as_well_as_quiet():
    """prefetch-sim calibrate and python -m calibrate took --quiet but refused -q."""
    import argparse

    from calibrate.cli import add_arguments
    from sim.cli import build_parser

    for flag in ("-q", "--quiet"):
        assert build_parser().parse_args(["calibrate", "--out", "x.toml", flag]).quiet is True
        p = argparse.ArgumentParser()
        add_arguments(p)
        assert p.parse_args(["--out", "x.toml", flag]).quiet is True
    assert build_parser().parse_args(["calibrate", "--out", "x.toml"]).quiet is False


def test_sweep_cells_cost_more_with_more_graphs():
    from sim.views.crossover import _Job, cell_cost
    from sim.model.specs import BenchTest, load_scenario, parse_variant

    scn = load_scenario(Path(__file__).resolve().parents[1] / "scenarios" / "default.toml")
    v = parse_variant("baseline")
    small = _Job((0,), (512,), scn, v, BenchTest(512, 0), 1, "analytic")
    large = _Job((1,), (8192,), scn, v, BenchTest(8192, 0), 1, "analytic")
    assert cell_cost(large) > cell_cost(small)
    cached = _Job((0,), (0,), scn, parse_variant("cache_lru"), BenchTest(0, 128), 1, "analytic")
    assert cell_cost(cached) > cell_cost(_Job((0,), (0,), scn, v, BenchTest(0, 128), 1, "analytic"))


def test_the_llamacpp_tools_draw_no_bar_off_a_terminal(monkeypatch):
    """compare, ab, pool and report take their progress wrapper from check_common_args: none with
    -q, none when stderr is a pipe or a file (hundreds of carriage-return updates in a log)."""
    import argparse
    import io

    from calibrate.llamacpp.compare import check_common_args

    args = argparse.Namespace(repetitions=3, jobs=None, out=None, figure=None, summary=None, quiet=False)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert check_common_args(args) is None

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    monkeypatch.setattr("sys.stderr", tty)
    wrap = check_common_args(args)
    assert wrap is not None and list(wrap(range(2))) == [0, 1] and "simulating" in tty.getvalue()
    args.quiet = True
    assert check_common_args(args) is None
