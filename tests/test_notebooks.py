"""The notebooks run from a clean checkout without a GPU (nbclient), and are committed with
their outputs stripped. The validation notebook runs both without the H200 CSV (it must say
so) and with one (it must compare predicted and measured)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
NAMES = ("whatif.ipynb", "validation.ipynb")

pytestmark = pytest.mark.slow


def run_notebook(name: str) -> str:
    """Execute a notebook in its own directory; returns all its text outputs joined."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                texts.append(out["text"])
            elif "data" in out:
                for mime in ("text/markdown", "text/plain", "text/html"):
                    if mime in out["data"]:
                        texts.append(out["data"][mime])
    return "\n".join(texts)


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebooks_are_stripped(name):
    nb = json.loads((NOTEBOOKS / name).read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, name


def test_whatif_notebook_runs():
    text = run_notebook("whatif.ipynb")
    # the llama-bench table of each what-if and the crossover table
    assert text.count("| model") >= 4
    for what in ("H200", "RTX 5090", "gpt-oss 20B", "n_cpu_moe=24", "n_cpu_moe=48", "crosses 1.0"):
        assert what in text
    assert "speedup_vs_baseline" in text


def test_validation_notebook_without_csv_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PREFETCH_SIM_VALIDATION_CSV", str(tmp_path / "absent.csv"))
    text = run_notebook("validation.ipynb")
    assert "Validation data not available" in text
    assert "skipped: no validation CSV" in text
    assert "| model" in text  # the predictions are still shown


def test_validation_notebook_compares_predicted_and_measured(monkeypatch, tmp_path):
    csv = tmp_path / "h200_validation.csv"
    csv.write_text("variant,test,tps_predicted,tps_measured,ttft_s_predicted,ttft_s_measured\n"
                   "baseline,pp512,2800,2500,0.18,0.2\n"
                   "prefetch_ungated,pp512,2900,2750,0.17,0.19\n")
    monkeypatch.setenv("PREFETCH_SIM_VALIDATION_CSV", str(csv))
    text = run_notebook("validation.ipynb")
    assert "Loaded" in text and "2 rows" in text
    assert "rel_error" in text and "mean_abs_error" in text
    # 2800 / 2500 - 1 = 0.12, computed by the notebook
    assert "0.12" in text
