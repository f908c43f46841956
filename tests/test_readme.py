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


def _readme_text() -> str:
    """The README with its line breaks as spaces (its sentences wrap anywhere)."""
    return re.sub(r"\s+", " ", (ROOT / "README.md").read_text())


def test_the_readme_lists_every_built_in_scenario_name():
    from sim.resources import builtin_names

    m = re.search(r"then of the shipped files \(((?:`[^`]+`(?:, )?)+)\)", _readme_text())
    assert m, "README: no list of built-in scenario names under 'Scenarios by name'"
    assert tuple(re.findall(r"`([^`]+)`", m.group(1))) == builtin_names("scenario")


def test_the_readme_names_the_default_variants_build_ids_as_the_code_makes_them():
    """``build_commit``: ``s``, ten hex digits of the name's SHA-1, ``-``, its first six
    characters (sim.cli.variant_ids), every id of the default four as the README spells them."""
    from sim.cli import variant_ids
    from sim.model.specs import DEFAULT_VARIANTS, parse_variant

    text = _readme_text()
    ids = [i for i, _ in variant_ids([parse_variant(v) for v in DEFAULT_VARIANTS]).values()]
    assert ", ".join(f"`{i}`" for i in ids) + " for the default four variants" in text
    assert "as short as keeps them distinct" not in text
    assert "ten hex digits of the SHA-1 of the variant's full name" in text
