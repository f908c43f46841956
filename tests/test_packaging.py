"""Packaging: the shipped scenarios and data are found from any folder (a path relative to the
working folder wins, then the shipped copy; bare built-in names), ``python -m sim`` runs the
CLI, and a built wheel carries the scenarios, the reported measurements and ``py.typed``."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sim import resources
from sim.cli import main, scenario_path
from sim.errors import ScenarioError
from sim.model.specs import load_hardware, load_model, load_scenario

ROOT = Path(__file__).resolve().parent.parent
TINY_SCENARIO = (ROOT / "scenarios" / "tiny" / "tiny.toml").read_text()


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def test_the_checkout_is_the_shipped_root():
    assert resources.shipped_root() == ROOT
    assert resources.shipped("scenarios/default.toml") == ROOT / "scenarios" / "default.toml"


def test_a_wheel_reads_its_package_data(tmp_path, monkeypatch):
    pkg = tmp_path / "site-packages" / "sim"
    (pkg / "_data").mkdir(parents=True)
    monkeypatch.setattr(resources, "_package_dir", lambda: pkg)
    assert resources.shipped("scenarios/default.toml") == pkg / "_data" / "scenarios" / "default.toml"


def test_the_shipped_copy_when_the_working_folder_has_none(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert scenario_path(None) == ROOT / "scenarios" / "default.toml"
    assert scenario_path("scenarios/laguna-2x3090.toml") == ROOT / "scenarios" / "laguna-2x3090.toml"
    assert scenario_path("laguna-2x3090") == ROOT / "scenarios" / "laguna-2x3090.toml"
    assert scenario_path("tiny") == ROOT / "scenarios" / "tiny" / "tiny.toml"
    assert resources.cwd_or_shipped("data/reported_measurements.csv") == ROOT / "data" / "reported_measurements.csv"
    # a path that is nowhere stays as given, so the error names what was typed
    assert scenario_path("elsewhere/none.toml") == Path("elsewhere/none.toml")


def test_a_folder_of_the_name_does_not_hide_a_built_in_scenario(monkeypatch):
    monkeypatch.chdir(ROOT / "scenarios")  # holds the folder tiny/
    assert scenario_path("tiny").resolve() == ROOT / "scenarios" / "tiny" / "tiny.toml"


def test_crossover_figures_take_a_built_in_scenario_name(tmp_path, monkeypatch, capsys):
    import sim.cli.crossover as X  # the command calls run_figure by this name

    got = []
    monkeypatch.setattr(X, "run_figure", lambda spec, out, *, scenario, **kw: got.append(scenario) or 1 / 0)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ZeroDivisionError):
        main(["crossover", "laguna-2x3090", "--figure", "b", "--out", str(tmp_path / "o")])
    assert got == [ROOT / "scenarios" / "laguna-2x3090.toml"]


def test_a_file_in_the_working_folder_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "scenarios" / "laguna-2x3090.toml"
    mine.parent.mkdir()
    mine.write_text(TINY_SCENARIO)
    (tmp_path / "scenarios" / "default.toml").write_text(TINY_SCENARIO)
    assert scenario_path("scenarios/laguna-2x3090.toml") == Path("scenarios/laguna-2x3090.toml")
    assert scenario_path("laguna-2x3090") == Path("scenarios/laguna-2x3090.toml")
    assert scenario_path(None) == tmp_path / "scenarios" / "default.toml"
    assert scenario_path("default").resolve() == (tmp_path / "scenarios" / "default.toml").resolve()


def test_missing_paths_and_unknown_names_are_one_line_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "run", "elsewhere/none.toml")
    assert rc == 2 and not out and "file not found" in err and len(err.strip().splitlines()) == 1
    rc, out, err = run(capsys, "run", "no-such-scenario")
    assert rc == 2 and not out and len(err.strip().splitlines()) == 1
    assert "unknown scenario 'no-such-scenario'" in err and "laguna-2x3090" in err and "tiny" in err
    # names of the other kinds are not scenarios
    with pytest.raises(ScenarioError, match="unknown scenario 'tiny-moe'"):
        scenario_path("tiny-moe")


def _scenario(folder: Path, model: str, hardware: str) -> Path:
    p = folder / "mine.toml"
    p.write_text(f'[scenario]\nname = "mine"\nmodel = "{model}"\nhardware = "{hardware}"\n\n'
                 '[placement]\nngl = 999\nn_cpu_moe = 24\nhost_memory = "pinned"\n\n'
                 '[workload]\nn_prompt = [512]\nn_gen = [0]\nrepetitions = 1\n')
    return p


def test_bare_model_and_hardware_names_are_the_shipped_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scn = load_scenario(_scenario(tmp_path, "qwen3-30b-a3b", "h200"))
    assert scn.model == load_model(ROOT / "scenarios" / "models" / "qwen3-30b-a3b.toml")
    shipped_hw = load_hardware(ROOT / "scenarios" / "hardware" / "h200.toml")
    assert (scn.hardware.name, scn.hardware.h2d_pinned) == (shipped_hw.name, shipped_hw.h2d_pinned)
    assert resources.builtin_names("model") == (
        "gemma3-27b", "gpt-oss-20b", "laguna-118b", "llama3-8b", "mistral-small-24b", "mixtral-8x7b", "qwen3-30b-a3b",
        "tiny-moe")
    assert "h200" in resources.builtin_names("hardware") and "tiny-gpu" in resources.builtin_names("hardware")


def test_a_file_of_that_name_beside_the_scenario_wins(tmp_path):
    tiny_gpu = (ROOT / "scenarios" / "tiny" / "tiny-gpu.toml").read_text()
    (tmp_path / "h200").write_text(tiny_gpu)
    (tmp_path / "hardware").mkdir()  # a folder of the name does not count
    scn = load_scenario(_scenario(tmp_path, "qwen3-30b-a3b", "h200"))
    assert scn.hardware.name == load_hardware(ROOT / "scenarios" / "tiny" / "tiny-gpu.toml").name != "h200"


def test_an_unknown_model_or_hardware_name_lists_the_known_ones(tmp_path, capsys):
    path = _scenario(tmp_path, "qwen3-30b-a3b", "h100")
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path)
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg and "scenario.hardware" in msg
    assert "unknown hardware 'h100'" in msg and "h200, h200-datasheet, h200-llamacpp, h200x2-llamacpp, rtx3090" in msg
    rc, out, err = run(capsys, "run", str(_scenario(tmp_path, "qwen4", "h200")))
    assert rc == 2 and not out and "unknown model 'qwen4'" in err and "qwen3-30b-a3b" in err
    assert len(err.strip().splitlines()) == 1
    # a value with a suffix is a path, never a name
    with pytest.raises(ScenarioError, match="file not found"):
        load_scenario(_scenario(tmp_path, "qwen3-30b-a3b.toml", "h200"))


def test_python_dash_m_sim_runs_the_cli(tmp_path):
    r = subprocess.run([sys.executable, "-m", "sim", "--help"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert "usage:" in r.stdout and "run" in r.stdout and "reproduce" in r.stdout


def test_setup_ships_what_resources_reads():
    """setup.py (which must not import the package) copies the files sim.resources reads."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    consts = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Name)}
    assert ast.literal_eval(consts["SHIPPED"]) == resources.SHIPPED
    assert ast.unparse(consts["PACKAGED_DIR"]) == f"Path('sim') / '{resources.PACKAGED_DIR}'"


def _source_copy(dest: Path) -> Path:
    """The files a build reads (no build/, egg-info or caches of the checkout)."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".hypothesis", ".pytest_cache")
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("sim", "calibrate", "scenarios"):
        shutil.copytree(ROOT / name, dest / name, ignore=skip)
    (dest / "data").mkdir()
    shutil.copy2(ROOT / "data" / "reported_measurements.csv", dest / "data")
    return dest


@pytest.mark.slow
def test_the_wheel_carries_scenarios_data_and_py_typed(tmp_path):
    """Builds a wheel (about 20 s: pip fetches the build backend) and reads its file list; then
    runs the CLI from the unpacked wheel in another folder, which finds only its package data."""
    (tmp_path / "src").mkdir()
    src = _source_copy(tmp_path / "src")
    wheels = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(src), "-w", str(wheels)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = wheels.glob("prefetch_sim-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    want = {"sim/py.typed", "sim/__main__.py", "sim/resources.py", "sim/_data/data/reported_measurements.csv",
            "calibrate/llamacpp/grids/h200.toml"}
    want |= {f"sim/_data/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / "scenarios").rglob("*") if p.is_file()}
    assert want <= names, sorted(want - names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    assert not any(n.startswith(("scenarios/", "data/", "tests/")) for n in names)
    meta = zipfile.ZipFile(whl).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Requires-Dist: gguf>=0.17" in meta
    assert "cupy-cuda13x>=14; extra == \"gpu\"" in meta and "cupy-cuda12x>=13; extra == \"gpu-cuda12\"" in meta

    site = tmp_path / "site"
    zipfile.ZipFile(whl).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run([sys.executable, "-c", "import sim.resources as r; print(r.shipped_root())"],
                       cwd=elsewhere, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and Path(r.stdout.strip()) == site / "sim" / "_data", r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "sim", "run", "tiny", "-r", "1", "-q", "-o", "csv"],
                       cwd=elsewhere, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "tiny-moe" in r.stdout


def test_a_shipped_scenario_copied_elsewhere_still_finds_its_model_and_hardware(tmp_path):
    """The shipped scenarios name ``models/NAME.toml`` and ``hardware/NAME.toml`` beside them; a
    copy in another folder reads the shipped files of those names, while a name shipped under no
    such file stays a missing file naming the path tried, and a file beside the copy still wins."""
    from sim.errors import ScenarioError
    from sim.model.specs import load_scenario

    src = Path(__file__).resolve().parent.parent / "scenarios" / "default.toml"
    copy = tmp_path / "base.toml"
    copy.write_text(src.read_text())
    a, b = load_scenario(src), load_scenario(copy)
    assert a.model == b.model and a.hardware.name == b.hardware.name
    bad = tmp_path / "bad.toml"
    bad.write_text(src.read_text().replace("models/qwen3-30b-a3b.toml", "models/nothere.toml"))
    with pytest.raises(ScenarioError, match="nothere.toml") as info:
        load_scenario(bad)
    assert info.value.field == "scenario.model"
    (tmp_path / "models").mkdir()
    mine = (Path(__file__).resolve().parent.parent / "scenarios/models/qwen3-30b-a3b.toml").read_text()
    (tmp_path / "models" / "qwen3-30b-a3b.toml").write_text(mine.replace('name = "', 'name = "mine ', 1))
    assert load_scenario(copy).model.name.startswith("mine ")
