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
    """A CSV as `prefetch-sim validate` writes it: the notebook computes the headline and the
    groups from it (not from anything precomputed)."""
    import pandas as pd

    from sim.views.validation import CASE_COLUMNS

    rows = []
    for i, (model, mem, test, err) in enumerate([("moe", "pinned", "pp512", 0.02), ("moe", "pinned", "pp2048", -0.04),
                                                 ("dense", "pageable", "pp128", 0.12), ("moe", "pinned", "tg8", -0.30)]):
        r = {c: None for c in CASE_COLUMNS}
        r.update(case=f"c{i}", model=model, host_memory=mem, test=test, measured_s=0.1, predicted_s=0.1 * (1 + err),
                 rel_error=err, pass_spread=0.01)
        rows.append(r)
    csv = tmp_path / "h200_validation.csv"
    pd.DataFrame(rows, columns=list(CASE_COLUMNS)).to_csv(csv, index=False)
    monkeypatch.setenv("PREFETCH_SIM_VALIDATION_CSV", str(csv))
    text = run_notebook("validation.ipynb")
    assert "Loaded" in text and "4 rows" in text
    # median of |0.02, 0.04, 0.12, 0.30| = 8.0%, max 30.0%, 2 cases above 10%
    assert "median |error| 8.0%" in text and "max 30.0%" in text and "2 cases above 10%" in text
    assert "moe, pinned, decode" in text and "dense, pageable, prefill" in text


def test_validation_notebook_reads_the_committed_csv():
    import pandas as pd

    from sim.views.validation import summarize

    text = run_notebook("validation.ipynb")
    s = summarize(pd.read_csv(Path(__file__).resolve().parent.parent / "data" / "validation" / "h200_validation.csv"))
    assert f"median |error| {s['median_abs_error']:.1%}" in text
    assert f"90th percentile {s['p90_abs_error']:.1%}" in text
