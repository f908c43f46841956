"""``python -m calibrate.llamacpp.split``: the split's counts per run folder."""

from pathlib import Path

from calibrate.llamacpp import split

ROOT = Path(__file__).resolve().parent.parent


def test_split_prints_each_folders_counts_and_refuses_a_non_run_folder(tmp_path, capsys):
    gt = ROOT / "data" / "llamacpp" / "h200-20261201"
    assert split.main([str(gt), "--rows"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{gt}: 40 fit rows, 86 held-out rows" and len(out) == 1 + 126
    assert sum(ln.endswith(" fit") for ln in out[1:]) == 40
    assert split.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no llama-bench.jsonl" in err and len(err.strip().splitlines()) == 1
