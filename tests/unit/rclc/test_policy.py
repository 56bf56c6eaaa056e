from __future__ import annotations

import functools

import pytest
from hypothesis import given, strategies as st

import rclc
from rclc import policy, selectors
from rclc.errors import ContextLimitError, RclcError
# private on purpose: the transfer plan's internals under test
from rclc._transfer_plan import ReasoningOptions
from rclc.policy import BudgetPolicy, fit, floor, policy_label


def test_relative_and_bounded_formulas():
    r4 = BudgetPolicy.from_options()
    assert r4.ratio == 4
    assert r4.cap(82) == 21
    assert r4.cap(80, reserve=4) == 21
    assert r4.cap(100, inherited=40) == 55
    assert BudgetPolicy.from_options(budget=128).cap(300) == 128
    assert BudgetPolicy.from_options(budget=128).cap(100) == 100


@pytest.mark.parametrize(
    "ratio,budget,field",
    [(4, 8, "ratio, budget"), (0, None, "ratio"), (None, -1, "budget"), (True, None, "ratio"), (2.0, None, "ratio")],
)
def test_bad_options_name_the_field(ratio, budget, field):
    with pytest.raises(ValueError, match=field):
        BudgetPolicy.from_options(ratio=ratio, budget=budget)


def test_worked_fitting_examples():
    assert fit([30, 10, 50], [3, 3, 3], 60) == [25, 10, 25]
    assert fit([30, 10, 50], [3, 3, 3], 61) == [26, 10, 25]
    assert fit([5, 5, 5], [1, 1, 1], 8) == [3, 3, 2]
    assert fit([5, 5], [1, 1], None) == [5, 5]


def test_cap_below_floor_and_receiver_too_small():
    with pytest.raises(ValueError, match="at least 3"):
        fit([2], [3], None)
    with pytest.raises(ValueError, match="handoff positions"):
        fit([10, 10], [3, 3], 5)


def test_floor_rules():
    assert floor(builtin=True, latent_steps=4, reserve=2) == 7
    assert floor(builtin=False, latent_steps=4, reserve=2) == 3


@given(st.integers(1, 10_000), st.integers(0, 10_000), st.integers(1, 64))
def test_relative_cap_matches_ceiling(total, inherited, ratio):
    inherited = min(inherited, total)
    cap = BudgetPolicy(ratio=ratio).cap(total, inherited)
    assert cap == inherited + -(-(total - inherited) // ratio)
    assert inherited <= cap <= total


@given(
    st.lists(st.tuples(st.integers(1, 200), st.integers(1, 5)), min_size=1, max_size=6),
    st.integers(0, 800),
)
def test_fit_properties(pairs, available):
    caps = [max(cap, least) for cap, least in pairs]
    floors = [least for _, least in pairs]
    if sum(floors) > available and sum(caps) > available:
        with pytest.raises(ValueError):
            fit(caps, floors, available)
        return
    counts = fit(caps, floors, available)
    if sum(caps) <= available:
        assert counts == caps
        return
    assert sum(counts) == available  # all space used when caps exceed it
    for count, cap, least in zip(counts, caps, floors):
        assert least <= count <= cap
    # Equal shares on top of the floors: a sender left below its cap got at most one
    # position fewer than any other sender (the remainder goes to the earliest ones).
    added = [count - least for count, least in zip(counts, floors)]
    for i, (count, cap) in enumerate(zip(counts, caps)):
        if count < cap:
            assert all(other <= added[i] + 1 for other in added)
            assert all(added[j] >= added[i] or counts[j] == caps[j] for j in range(i))


# -- names, defaults and labels shared with the graph layer ------------------------------


def test_labels():
    assert policy_label("state", ratio=4) == "r4" == BudgetPolicy.from_options().label
    assert policy_label("state", budget=128) == "b128" == BudgetPolicy.from_options(budget=128).label
    assert policy_label("full") == "full" and policy_label("text") == "text"
    with pytest.raises(RclcError, match="mode"):
        policy_label("stat", ratio=4)
    with pytest.raises(RclcError, match="ratio, budget"):
        policy_label("state", ratio=4, budget=8)
    with pytest.raises(RclcError, match="ratio, budget"):
        policy_label("state")


def test_names_match_what_the_core_runs():
    assert tuple(selectors.BUILTIN) == policy.ATTENTION_SELECTORS
    assert policy.DEFAULT_SELECTOR in policy.ATTENTION_SELECTORS
    assert set(policy.BUILTIN_SELECTORS) == set(policy.ATTENTION_SELECTORS) | {"recent", "random"}
    assert all(selectors.is_builtin(selectors.BUILTIN[name]) for name in policy.ATTENTION_SELECTORS)
    assert not selectors.is_builtin(selectors.recent), "baselines reserve no protected positions"
    assert [getattr(rclc, name) for name in policy.BUILTIN_REASONING] == [rclc.latent_mass]
    assert policy.DEFAULT_REPRESENTATION == policy.REPRESENTATIONS[0]
    assert policy.BACKENDS == rclc.backends.BACKENDS
    # transfer refuses what these tuples do not list, and accepts what they do
    for context in policy.REASONING_CONTEXTS:
        assert ReasoningOptions.check(functools.partial(rclc.latent_mass, steps=1), context, 1).context == context
    with pytest.raises(RclcError, match="reasoning_context"):
        ReasoningOptions.check(rclc.latent_mass, "partial", 1)


def test_policy_arithmetic_errors_are_rclc_errors():
    with pytest.raises(RclcError):
        BudgetPolicy.from_options(ratio=0)
    with pytest.raises(ContextLimitError, match="handoff positions"):
        fit([10, 10], [3, 3], 5)


# issue 16 item 8: the torch-free option table planning checks is the selectors' real signatures
def test_selector_options_table_matches_the_selectors():
    import inspect

    from rclc import policy, selectors

    functions = {**selectors.BUILTIN, "recent": selectors.recent}
    for name, options in policy.SELECTOR_OPTIONS.items():
        if name == "random":
            assert list(inspect.signature(selectors.random_selector).parameters) == ["seed"]
            continue
        keywords = [p.name for p in inspect.signature(functions[name]).parameters.values() if p.kind is p.KEYWORD_ONLY]
        assert sorted(keywords) == sorted(options), name
    assert set(policy.SELECTOR_OPTIONS) == set(policy.BUILTIN_SELECTORS)
    assert policy.selector_option_problems("cacheback", {"span_size": 4, "span": "sentence"}) == []
    assert [p[0] for p in policy.selector_option_problems("cacheback", {"span_size": 0, "x": 1, "span": True})] == [
        "span_size", "x", "span"]
    assert policy.selector_option_problems("pkg.mod:fn", {"anything": 1}) == []


# issue 25 item 4: the built-in selectors' names are kept in one table, and everything else derives from it
def test_one_table_names_every_builtin_selector():
    from rclc import policy, selectors

    assert tuple(policy.SELECTORS) == policy.BUILTIN_SELECTORS
    for name, entry in policy.SELECTORS.items():
        assert entry.function in selectors.__all__, name
        made = selectors.builtin(name, {"seed": 3} if entry.seeded else {}, seed=1)
        assert callable(made) and selectors.is_builtin(made) == entry.attention, name
    assert selectors.builtin("recent", {"exclude": None}).keywords == {"exclude": None}
    assert selectors.builtin("random", seed=7).__name__ == "random_seed7"
    assert selectors.builtin("random", {"seed": 2}, seed=7).__name__ == "random_seed2"
    with pytest.raises(RclcError, match="not a built-in"):
        selectors.builtin("pkg.mod:fn")
