"""The published A/B figures that the shipped scenarios reproduce (docs/reproduction.md lists
every row, including those the model does not reproduce, and why)."""

from __future__ import annotations

import pytest

from sim.views.reproduce import compare, load_reported, to_frame


@pytest.fixture(scope="module")
def table():
    return to_frame(compare(repetitions=1)).set_index(["case", "metric", "variant"])


def _row(table, metric, variant, case="laguna_2x3090"):
    return table.loc[(case, metric, variant)]


@pytest.mark.slow
def test_every_reported_row_is_accounted_for(table):
    assert len(table) == len(load_reported())
    assert set(table.status) <= {"ok", "off", "sign", "wrong sign", "not modelled"}


@pytest.mark.slow
@pytest.mark.parametrize("metric", ["expert_fraction_copied_34_tokens", "expert_fraction_copied_ubatch_2048"])
def test_fitted_routing_reproduces_the_expert_fractions(table, metric):
    r = _row(table, metric, "baseline")
    assert abs(r.simulated - r.reported) <= 0.02


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["baseline", "prefetch_ungated", "baseline_without_selective_copy"])
def test_short_prompt_bytes_within_10_percent(table, variant):
    r = _row(table, "h2d_bytes_short_prompt_graph", variant)
    assert abs(r.rel_error) <= 0.10


@pytest.mark.slow
@pytest.mark.parametrize("metric,variant", [
    ("ttft_short_prompt", "prefetch_ungated"), ("ttft_short_prompt", "baseline_without_selective_copy"),
    ("ttft_short_prompt", "prefetch_gated_512"),
    ("prefill_5k", "prefetch_ungated"), ("prefill_5k", "prefetch_gated_512"),
    ("prefill_10k", "prefetch_ungated"), ("prefill_90k", "prefetch_ungated")])
def test_sign_of_prefetch_effect_matches(table, metric, variant):
    assert bool(_row(table, metric, variant).sign_ok)


@pytest.mark.slow
def test_gate_crossover_lies_in_the_reported_bracket(table):
    r = _row(table, "gate_crossover_moe_batch_low", "")
    assert 250 <= r.simulated <= 1040


@pytest.mark.slow
def test_short_prompt_ttft_cost_of_whole_copies_matches(table):
    """The TTFT added by copying whole expert tensors (control minus baseline) is a bandwidth
    effect; the reports give +640 ms."""
    base = _row(table, "ttft_short_prompt", "baseline")
    ctl = _row(table, "ttft_short_prompt", "baseline_without_selective_copy")
    assert (ctl.simulated - base.simulated) == pytest.approx(ctl.reported - base.reported, rel=0.10)


@pytest.mark.slow
def test_every_modelled_row_says_what_ok_means(table):
    """Each modelled row names its criterion: a reported bound or range is not "within 10%" (the
    crossover pair is +299 % and ok by its range, the matvec time ok by its bound), and ok agrees
    with the criterion's own test."""
    modelled = table[table.status != "not modelled"]
    assert set(modelled.criterion) == {"within 10%", "<= bound", "in range 250-1040"}
    assert (table[table.status == "not modelled"].criterion == "").all()
    for r in modelled.itertuples():
        if r.criterion == "within 10%" and r.sign_ok is None:
            assert (r.status == "ok") == (abs(r.rel_error) <= 0.10)
        elif r.criterion == "<= bound":
            assert (r.status == "ok") == (r.simulated <= r.reported)
        elif r.criterion.startswith("in range"):
            assert (r.status == "ok") == (250 <= r.simulated <= 1040)
