"""Staging per GPU under -sm layer (issue #18 item 7): as the project's prefetch patch keeps a
copy stream, slots and events per device, each GPU's staged splits chain among themselves, the
first of each fired at the graph's start, and a slot id names a buffer on one GPU only."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sim.plan.builder import build_plan
from sim.plan.hazards import check_plan
from sim.model.specs import BenchTest, load_scenario, parse_variant

REPO = Path(__file__).resolve().parent.parent


def _x2_plan(variant: str):
    scn = load_scenario(REPO / "scenarios/h200x2-qwen3-30b-a3b.toml")
    scn = replace(scn, placement=replace(scn.placement, n_cpu_moe=48))  # host experts on both GPUs
    return build_plan(scn, parse_variant(variant), BenchTest(n_prompt=512, n_gen=0), np.random.default_rng(0))


@pytest.mark.parametrize("variant", ["prefetch_ungated", "slots3"])
def test_each_gpu_stages_into_its_own_slots_one_split_ahead_of_its_own_splits(variant):
    plan = _x2_plan(variant)
    ops = plan.ops
    copies = [op for op in ops if op.tag == "prefetch"]
    devs = {op.device for op in copies}
    assert devs == {0, 1}
    # slot ids of one GPU are never used on the other
    slots = {d: {op.slot for op in copies if op.device == d} for d in devs}
    assert not slots[0] & slots[1]
    # a copy's free-wait depends only on its own GPU's consumers
    by_id = {op.id: op for op in ops}
    for c in copies:
        for dep in c.deps:
            d = by_id[dep]
            if d.stream.value == "compute":
                assert d.device == c.device, (c.name, d.name)
    # the first copy of each GPU is issued before any split of the graph ran (graph start), and
    # waits for no consumer
    for d in devs:
        first = min((op for op in copies if op.device == d), key=lambda o: o.id)
        assert not any(by_id[x].stream.value == "compute" for x in first.deps)
        assert first.split <= min(op.split for op in copies if op.device == d)
    assert check_plan(plan) == []


def test_a_slot_read_on_the_other_gpu_is_still_flagged():
    """The checker names a buffer by slot id: re-labelling a GPU-1 consumer's slot with a GPU-0
    slot id is the reported corruption (a slot filled on one device read by a split on another)."""
    from sim.plan.hazards import HazardKind, replace_op

    plan = _x2_plan("prefetch_ungated")
    ops = plan.ops
    c0 = next(op for op in ops if op.tag == "staged" and op.device == 0)
    c1 = max((op for op in ops if op.tag == "staged" and op.device == 1), key=lambda o: o.id)
    bad = replace_op(plan, c1.id, slot=c0.slot)
    kinds = {h.kind for h in check_plan(bad)}
    assert HazardKind.CROSS_DEVICE_SLOT in kinds
