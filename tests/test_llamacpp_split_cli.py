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


def test_rows_of_an_older_llama_bench_are_split_by_what_they_ran():
    """A row without load_mode (llama-bench's -mmp era: use_mmap), n_cpu_moe or n_gpu_layers is
    split by what that version ran (use_mmap false: weights read into host buffers, as -lm none;
    no -ncmoe: 0; -ngl unset: every layer), where a KeyError or NaN had stopped fit and split
    (fresh-user round 7); NaN (a column other rows have) is a missing field."""
    import math

    from calibrate.llamacpp.split import is_fit_row

    row = dict(model_filename="m/qwen3-30b-a3b.gguf", load_mode="none", n_ubatch=512, n_gpu_layers=99, n_cpu_moe=48,
               tensor_buft_overrides="none")
    assert is_fit_row(row)
    old = {k: v for k, v in row.items() if k != "load_mode"}
    assert is_fit_row(old | {"use_mmap": False}) and not is_fit_row(old | {"use_mmap": True}) and not is_fit_row(old)
    assert is_fit_row(old | {"use_mmap": False, "load_mode": math.nan})
    gemma = dict(model_filename="gemma3-27b.gguf", use_mmap=0, n_ubatch=128, tensor_buft_overrides="ffn_(gate|up|down)=CPU")
    assert is_fit_row(gemma) and is_fit_row(gemma | {"n_cpu_moe": math.nan}) and not is_fit_row(gemma | {"n_gpu_layers": 31})
    assert is_fit_row({k: v for k, v in row.items() if k != "n_cpu_moe"})  # no -ncmoe: 0, fully resident
    assert not is_fit_row({k: v for k, v in row.items() if k != "n_cpu_moe"} | {"n_gpu_layers": 20})
