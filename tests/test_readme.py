"""The README shows the output of its main command: the table under "Run" is what
`prefetch-sim run` prints on the shipped default scenario and its H200 profile now (it
changes whenever the profile or the model does; regenerate it with `prefetch-sim run`)."""

from __future__ import annotations

import re

import pytest
from pathlib import Path

from sim.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_readme_table_is_what_prefetch_sim_run_prints(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"\nprefetch-sim run\n```\n.*?\n```\n(\| model .*?)```", readme, re.S)
    assert block, "README: no code block after the `prefetch-sim run` command"
    monkeypatch.chdir(tmp_path)  # the shipped default scenario, whatever the working folder
    out = tmp_path / "table.md"
    assert main(["run", "-q", "--out", str(out)]) == 0
    assert out.read_text() == block.group(1)
