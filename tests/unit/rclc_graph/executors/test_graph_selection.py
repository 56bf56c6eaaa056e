"""Receiver-aware selection, span options and pooled budgets in the graph layer: the policy
fields (spec, plan defaults, YAML, builder), position roles, and runs on tiny models."""

from __future__ import annotations

import pytest

from rclc_graph import Graph, ModelPool, Policy
from rclc_graph.errors import SpecError
from rclc_graph.executors.prompts import compose_content, render_prompt
from rclc_graph.executors.roles import (
    INSTRUCTION,
    MATERIAL,
    TEMPLATE,
    char_roles,
    compress,
    content_parts,
    expand,
    prompt_roles,
    token_roles,
)
from rclc_graph.plan import policy as plan_policy
from rclc_graph.plan.policy import resolve_policy
from rclc_graph.run.scheduler import run_plan_sync
from rclc_graph.spec.load import load_graph_text
from rclc_graph.spec.models import ModelSpec, TransferPolicy
from rclc_graph.spec.templates import render_spans
from rclc_graph.testing import InProcessReplicasExecutor

DOC = "The Cedar project is owned by Alice. The Birch project is owned by Bob. Most staff work in Oslo."


# -- the policy fields --------------------------------------------------------------------------


def test_policy_fields_are_accepted_and_resolved():
    policy = resolve_policy(TransferPolicy(span="line", max_span=12, exclude=["known"], allocation="pooled"))
    assert (policy.span, policy.max_span, policy.exclude, policy.allocation) == ("line", 12, ("known",), "pooled")
    assert policy.options == {"span": "line", "max_span": 12, "bridge": 1}  # bridge: the graph's default
    data = policy.to_dict()
    assert data["exclude"] == ["known"] and data["allocation"] == "pooled" and data["span"] == "line"


def test_relevance_is_a_policy_field_and_0_keeps_the_whole_budget(monkeypatch):
    policy = resolve_policy(TransferPolicy(relevance=0.4, exclude=["template", "known"]))
    assert policy.relevance == 0.4 and policy.options == {"span": "sentence", "max_span": 32, "relevance": 0.4,
                                                          "bridge": 1}
    assert policy.to_dict()["relevance"] == 0.4
    assert resolve_policy(TransferPolicy(relevance=0)).relevance is None
    monkeypatch.setattr(plan_policy, "DEFAULT_RELEVANCE", 0.3)
    assert resolve_policy(TransferPolicy()).options["relevance"] == 0.3  # the default fills text-aligned spans
    assert "relevance" not in resolve_policy(TransferPolicy(span="fixed")).options  # not the seed's grid
    assert resolve_policy(TransferPolicy(relevance=0)).relevance is None  # 0 turns the default off
    assert resolve_policy(TransferPolicy(selector_options={"relevance": 0.6})).options["relevance"] == 0.6
    spec = load_graph_text(FAN_IN.replace("POLICY", "{mode: state, ratio: 4, relevance: 0.5}"))
    assert Graph.from_spec(spec).to_yaml().count("relevance: 0.5") == 1


def test_exclude_by_is_an_opt_in_policy_field(monkeypatch):
    policy = resolve_policy(TransferPolicy(exclude=["template", "known"], exclude_by="span"))
    assert policy.exclude_by == "span" and policy.options == {"span": "sentence", "max_span": 32, "exclude_by": "span",
                                                              "bridge": 1}
    assert policy.to_dict()["exclude_by"] == "span"
    assert resolve_policy(TransferPolicy(exclude=["known"], exclude_by="position")).options["exclude_by"] == "position"
    assert resolve_policy(TransferPolicy(selector_options={"exclude_by": "span"}, exclude=["instruction"])).options[
        "exclude_by"] == "span"
    monkeypatch.setattr(plan_policy, "DEFAULT_EXCLUDE_BY", "span")
    assert resolve_policy(TransferPolicy()).options["exclude_by"] == "span"  # the default fills attention selectors
    assert "exclude_by" not in resolve_policy(TransferPolicy(selector="recent")).options
    spec = load_graph_text(FAN_IN.replace("POLICY", "{mode: state, ratio: 4, exclude: [known], exclude_by: span}"))
    assert Graph.from_spec(spec).to_yaml().count("exclude_by: span") == 1


def test_bridge_is_a_policy_field_for_the_selectors_that_score_a_request(monkeypatch):
    policy = resolve_policy(TransferPolicy(bridge=2))
    assert policy.bridge == 2 and policy.options == {"span": "sentence", "max_span": 32, "bridge": 2}
    assert policy.to_dict()["bridge"] == 2
    assert resolve_policy(TransferPolicy(bridge=0)).bridge is None  # 0: off, nothing reaches the selector
    assert resolve_policy(TransferPolicy(selector="qsnap", selector_options={"bridge": 1})).options["bridge"] == 1
    monkeypatch.setattr(plan_policy, "DEFAULT_BRIDGE", 1)
    assert resolve_policy(TransferPolicy()).options["bridge"] == 1  # the default fills cacheback and qsnap ...
    assert "bridge" not in resolve_policy(TransferPolicy(selector="chunkkv")).options  # ... not chunkkv
    assert "bridge" not in resolve_policy(TransferPolicy(selector="recent")).options
    assert resolve_policy(TransferPolicy(bridge=0)).bridge is None  # 0 turns the default off
    spec = load_graph_text(FAN_IN.replace("POLICY", "{mode: state, ratio: 4, bridge: 1}"))
    assert Graph.from_spec(spec).to_yaml().count("bridge: 1") == 1


def test_a_bridged_fan_in_records_its_bridge_on_every_hop(pool):
    # documents that differ: the same document three times holds no distinctive token to bridge with
    texts = [DOC, "The Lynx agency belongs to Jonas Moreno. Jonas Moreno was born in 1964.", "Oslo has a harbour."]
    result = run_plan_sync(fan_in(Policy(ratio=3, bridge=1), texts=texts), pool=pool)
    assert result.status == "finished", result.error
    bridges = {hop.bridge for hop in result.hops}
    assert len(bridges) == 1 and isinstance(bridges.pop(), str)  # one bridge for the whole group
    assert all("bridge" in hop.to_dict() for hop in result.hops)
    plain = run_plan_sync(fan_in(Policy(ratio=3, bridge=0), texts=texts), pool=pool)
    assert all(hop.bridge is None and "bridge" not in hop.to_dict() for hop in plain.hops)
    alike = run_plan_sync(fan_in(Policy(ratio=3, bridge=1)), pool=pool)
    assert alike.status == "finished" and all(hop.bridge is None for hop in alike.hops)


def test_unset_levers_keep_a_plans_fingerprint():
    """A graph that does not use relevance or exclude_by fingerprints as it did before they
    existed (a resumed run checks it), and one that sets them fingerprints differently."""
    plain = load_graph_text(FAN_IN.replace("POLICY", "{mode: state, ratio: 4, exclude: [known]}"))
    assert "relevance" not in plain.model_dump_json() and "exclude_by" not in plain.model_dump_json()
    inputs = {"question": "Q?", "documents": ["a", "b"]}
    fingerprints = {Graph.from_spec(load_graph_text(FAN_IN.replace("POLICY", policy))).plan(inputs).fingerprint()
                    for policy in ("{mode: state, ratio: 4, exclude: [known]}",
                                   "{mode: state, ratio: 4, exclude: [known], exclude_by: span}",
                                   "{mode: state, ratio: 4, exclude: [known], relevance: 0.5}")}
    assert len(fingerprints) == 3


def test_defaults_fill_only_what_is_not_said(monkeypatch):
    monkeypatch.setattr(plan_policy, "DEFAULT_SPAN", "sentence")
    monkeypatch.setattr(plan_policy, "DEFAULT_MAX_SPAN", 24)
    monkeypatch.setattr(plan_policy, "DEFAULT_EXCLUDE", ("template", "known"))
    monkeypatch.setattr(plan_policy, "DEFAULT_ALLOCATION", "pooled")
    monkeypatch.setattr(plan_policy, "DEFAULT_BRIDGE", 0)
    cacheback = resolve_policy(TransferPolicy())
    assert cacheback.options == {"span": "sentence", "max_span": 24}
    assert cacheback.exclude == ("template", "known") and cacheback.allocation == "pooled"
    fixed = resolve_policy(TransferPolicy(span="fixed", exclude=[]))
    assert fixed.options == {"span": "fixed"} and fixed.exclude == ()  # no max_span for the fixed grid
    in_options = resolve_policy(TransferPolicy(selector_options={"span": "line"}))
    assert in_options.options == {"span": "line", "max_span": 24}
    recent = resolve_policy(TransferPolicy(selector="recent"))
    assert recent.options == {} and recent.exclude == ("template", "known") and recent.allocation == "per_sender"
    custom = resolve_policy(TransferPolicy(selector="my.module:pick"))
    assert custom.options == {} and custom.exclude == () and custom.allocation == "per_sender"
    assert resolve_policy(TransferPolicy(mode="full")).exclude == ()
    grid = resolve_policy(TransferPolicy(selector_options={"span_size": 4}))
    assert grid.options == {"span": "fixed", "span_size": 4}  # a span_size alone asks for the grid


def test_the_graph_defaults_are_the_measured_ones():
    # docs/experiments.md#receiver-aware-selection-and-pooled-budgets: sentence spans, only
    # chat markup passed over (instructions and known text cost accuracy on both topologies)
    policy = resolve_policy(TransferPolicy())
    # bridge: docs/experiments.md#bridging-a-second-fact-dev-split-r4 (issue 26; fan-ins only,
    # see test_a_default_bridge_bridges_fan_ins_only)
    assert policy.options == {"span": "sentence", "max_span": 32, "bridge": 1}
    assert policy.bridge == 1 and not policy.bridge_named and policy.to_dict()["bridge"] == 1
    assert resolve_policy(TransferPolicy(bridge=1)) == policy  # naming the default changes no grouping
    assert resolve_policy(TransferPolicy(selector="chunkkv")).bridge is None  # it scores no request
    # pooled fan-in budgets: docs/experiments.md#task-families-dev-split-r4 (issue 26, 320 dev cases)
    assert policy.exclude == ("template",) and policy.allocation == "pooled" and not policy.allocation_named
    named = resolve_policy(TransferPolicy(allocation="per_sender"))
    assert named.allocation == "per_sender" and named.allocation_named
    # naming the default changes no grouping: the resolved policies are equal
    assert resolve_policy(TransferPolicy(allocation="pooled")) == policy
    # issue 26's other levers are off until measured: nothing reaches the selector, records or fingerprints
    assert policy.relevance is None and policy.exclude_by is None
    assert not {"relevance", "exclude_by"} & (set(policy.to_dict()) | set(TransferPolicy().model_dump()))
    assert "bridge" not in TransferPolicy().model_dump()  # a spec that leaves it out fingerprints as before
    assert resolve_policy(TransferPolicy(exclude=["template", "instruction", "known"])).exclude == (
        "template", "instruction", "known")  # still there when an edge asks for it


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"span": "sentence", "selector_options": {"span": "line"}}, "span is set both"),
        ({"selector": "recent", "span": "sentence"}, "selector 'recent' keeps no spans"),
        ({"selector": "random", "max_span": 8}, "selector 'random' keeps no spans"),
        ({"selector": "recent", "allocation": "pooled"}, "allocation 'pooled'"),
        ({"selector": "my.mod:fn", "allocation": "pooled"}, "allocation 'pooled'"),
        ({"mode": "full", "exclude": ["known"]}, "does not use exclude"),
        ({"mode": "text", "allocation": "pooled"}, "does not use allocation"),
        ({"exclude": ["known", "known"]}, "names a reason twice|lists a reason twice"),
        ({"exclude": ["question"]}, "exclude"),
        ({"span": "chapter"}, "span"),
        ({"max_span": 0}, "max_span"),
        ({"relevance": 1.5}, "relevance"),
        ({"relevance": -0.1}, "relevance"),
        ({"selector": "recent", "relevance": 0.5}, "selector 'recent' keeps no spans"),
        ({"relevance": 0.5, "selector_options": {"relevance": 0.5}}, "relevance is set both"),
        ({"exclude_by": "sentence", "exclude": ["known"]}, "exclude_by"),
        ({"exclude_by": "span"}, "exclude_by 'span' changes how instruction, known, duplicate exclusion"),
        ({"exclude_by": "span", "exclude": ["template"]}, "exclude lists none of them"),
        ({"selector_options": {"exclude_by": "span"}, "exclude": []}, "exclude lists none of them"),
        ({"selector": "recent", "exclude_by": "span", "exclude": ["known"]}, "selector 'recent' keeps no spans"),
        ({"exclude_by": "span", "exclude": ["known"], "selector_options": {"exclude_by": "span"}}, "exclude_by is set both"),
        ({"mode": "full", "exclude_by": "span"}, "does not use exclude_by"),
        ({"allocation": "shared"}, "allocation"),
        ({"bridge": -1}, "bridge"),
        ({"selector": "chunkkv", "bridge": 1}, "selector 'chunkkv' scores none"),
        ({"selector": "chunkkv", "selector_options": {"bridge": 1}}, "selector 'chunkkv' scores none"),
        ({"selector": "recent", "bridge": 1}, "selector 'recent' keeps no spans"),
        ({"bridge": 1, "selector_options": {"bridge": 1}}, "bridge is set both"),
        ({"mode": "text", "bridge": 1}, "does not use bridge"),
    ],
)
def test_bad_selection_fields_are_refused(fields, message):
    with pytest.raises(SpecError, match=message):
        Policy(**fields)


FAN_IN = """
version: 1
name: fan
inputs: {question: str, documents: "list[str]"}
models: [{name: base, source: embedded}]
agents: [{name: reader, model: base}]
nodes:
  - {name: r, agent: reader, foreach: documents, item: doc, generate: false, prompt: "Q: {question} D: {doc}"}
  - {name: final, agent: reader, output: true, prompt: "{question}"}
edges:
  - {source: r, target: final, policy: POLICY}
"""


def test_yaml_and_builder_carry_the_fields():
    text = f"""
version: 1
name: fan
inputs: {{question: str, documents: "list[str]"}}
models: [{{name: base, source: embedded}}]
agents: [{{name: reader, model: base}}]
nodes:
  - {{name: r, agent: reader, foreach: documents, item: doc, generate: false, prompt: "Q: {{question}} D: {{doc}}"}}
  - {{name: final, agent: reader, output: true, prompt: "{{question}}"}}
edges:
  - source: r
    target: final
    policy: {{mode: state, ratio: 4, span: paragraph, max_span: 16, exclude: [template, instruction], allocation: pooled}}
"""
    spec = load_graph_text(text)
    policy = spec.edges[0].policy
    assert (policy.span, policy.max_span, policy.exclude, policy.allocation) == (
        "paragraph", 16, ["template", "instruction"], "pooled")
    graph = Graph.from_spec(spec)
    again = load_graph_text(graph.to_yaml())
    assert again.edges[0].policy == policy


def test_plan_nodes_know_where_values_sit_in_their_prompts():
    text, spans = render_spans("Question: {question}\nDocument {index}:\n{doc}", {"question": "Who?", "index": 2, "doc": "D."})
    assert text == "Question: Who?\nDocument 2:\nD." and [text[a:b] for a, b in spans] == ["Who?", "2", "D."]
    graph = Graph("g").input("question").input("documents", "list[str]").model("base").agent("a", model="base")
    graph.node("r", agent="a", foreach="documents", item="doc", prompt="Q: {question} D: {doc}", generate=False)
    graph.node("final", agent="a", prompt="{question}", output=True).edge("r", "final")
    plan = graph.plan({"question": "why", "documents": ["x y", "z"]})
    node = plan.node("r[1]")
    assert [node.prompt[a:b] for a, b in node.prompt_values] == ["why", "z"]


# -- roles ----------------------------------------------------------------------------------


def test_roles_runs_round_trip():
    labels = [TEMPLATE, INSTRUCTION, INSTRUCTION, MATERIAL]
    assert compress(labels) == (("template", 1), ("instruction", 2), ("material", 1))
    assert expand(compress(labels), 4) == labels and expand(None, 2) == [MATERIAL, MATERIAL]
    with pytest.raises(ValueError, match="3 labels for a state of 2"):
        expand((("material", 3),), 2)


def test_content_parts_label_the_users_turn():
    graph = Graph("g").input("question").model("base").agent("a", model="base", max_new_tokens=2)
    graph.node("w", agent="a", prompt="Write about {question}.")
    graph.node("final", agent="a", prompt="Q: {question}", output=True)
    graph.edge("w", "final", Policy(mode="text"))
    plan = graph.plan({"question": "Cedar"})
    from rclc_graph.results.lineage import Lineage
    from rclc_graph.results.run_result import NodeResult

    sender = NodeResult("w", "  Alice owns it. ", 3, 0, Lineage.fresh("w", 3), "", 0, [])
    inbound = [(plan.edges[0], sender)]
    parts = content_parts(plan.node("final"), inbound)
    assert "".join(text for text, _ in parts) == compose_content(plan.node("final"), inbound)
    assert parts == [("Message from w:\n", INSTRUCTION), ("Alice owns it.", MATERIAL), ("\n\n", INSTRUCTION),
                     ("Q: ", INSTRUCTION), ("Cedar", MATERIAL)]


def test_char_and_token_roles():
    prompt = "<s>sys\nBe brief.</s>\n<s>user\nQ: Cedar</s>\n"
    labels = char_roles(prompt, "Be brief.", [("Q: ", INSTRUCTION), ("Cedar", MATERIAL)])

    def of(text):
        start = prompt.index(text)
        return set(labels[start : start + len(text)])

    assert of("Be brief.") == {INSTRUCTION} and of("Q: ") == {INSTRUCTION} and of("Cedar") == {MATERIAL}
    assert of("<s>sys\n") == of("</s>\n<s>user\n") == of("</s>\n") == {TEMPLATE}
    cedar = prompt.index("Cedar")
    # a token holding any material character is material; special tokens are markup
    offsets = [(0, 3), (7, 16), (cedar - 2, cedar + 1), (cedar + 2, cedar + 7), (cedar + 5, cedar + 9)]
    assert token_roles(labels, offsets, [True, False, False, False, False]) == [
        TEMPLATE, INSTRUCTION, MATERIAL, MATERIAL, TEMPLATE]
    # a turn the template rewrote beyond recognition: everything after the system text is material
    rewritten = char_roles("sys: Be brief. user: q: cedar", "Be brief.", [("Q: ", INSTRUCTION), ("Cedar", MATERIAL)])
    assert rewritten[-1] == MATERIAL and rewritten[5] == INSTRUCTION


def test_prompt_roles_on_a_chat_template(tiny_tokenizer):
    graph = Graph("g").input("question").model("base").agent("a", model="base", system="Read carefully.")
    graph.node("r", agent="a", prompt="Question: {question}\nText: The Cedar project.", output=True)
    plan = graph.plan({"question": "Who owns Cedar?"})
    node = plan.node("r")
    prompt = render_prompt(tiny_tokenizer, node.agent.system, compose_content(node, []), generation_prompt=False)
    roles = prompt_roles(tiny_tokenizer, node, [], prompt)
    ids = list(prompt.ids)
    assert len(roles) == len(ids)
    decoded = {role: tiny_tokenizer.decode([i for i, r in zip(ids, roles) if r == role]) for role in set(roles)}
    assert "Who owns Cedar?" in decoded[MATERIAL] and "Read carefully." in decoded[INSTRUCTION]
    assert "Text: The Cedar project." in decoded[INSTRUCTION] and "<|im_start|>" in decoded[TEMPLATE]


# -- runs on tiny models ------------------------------------------------------------------------


@pytest.fixture
def pool(tiny):
    model, tokenizer = tiny
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    return pool


def fan_in(policy, documents=3, texts=None):
    graph = Graph("fan").input("question").input("documents", "list[str]")
    graph.model("base").agent("reader", model="base", system="Read the part.", max_new_tokens=2)
    graph.node("r", agent="reader", foreach="documents", item="doc", generate=False,
               prompt="Question: {question}\nDocument {index}:\n{doc}")
    graph.node("final", agent="reader", prompt="Question: {question}\nAnswer:", output=True)
    graph.edge("r", "final", policy)
    return graph.plan({"question": "Who owns the Cedar project?", "documents": texts or [DOC] * documents})


def test_a_fan_in_passes_over_markup_instructions_and_the_question_copy(pool):
    result = run_plan_sync(fan_in(Policy(ratio=2, span="sentence", exclude=["template", "instruction", "known"])), pool=pool)
    assert result.status == "finished", result.error
    for name, node in result.nodes.items():
        assert sum(count for _, count in node.roles) == node.positions, name
    reader = result.nodes["r[0]"]
    labels = expand(reader.roles, reader.positions)
    assert {TEMPLATE, INSTRUCTION, MATERIAL} <= set(labels)
    for hop in result.hops:
        assert hop.excluded_by_reason.get("template") and hop.excluded_by_reason.get("instruction")
        assert hop.excluded_by_reason.get("known")  # "Who owns the Cedar project?" is the receiver's too
        assert hop.allocation == "pooled" and hop.fitted_budget is not None  # the graph's default for a fan-in
    # the final node's inherited rows carry the labels of what was kept
    final = result.nodes["final"]
    inherited = expand(final.roles, final.positions)[: final.inherited_positions]
    kept = sum(hop.kept_positions for hop in result.hops)
    assert len(inherited) == kept and inherited.count(MATERIAL) > kept // 2
    assert result.to_dict()["nodes"]["final"]["roles"][0][0] in (TEMPLATE, MATERIAL, INSTRUCTION)


@pytest.mark.parametrize("allocation", ["per_sender", "pooled"])
def test_a_fan_in_with_whole_span_exclusion_runs_and_records_it(pool, allocation):
    exclude = ["template", "instruction", "known"]
    plans = [fan_in(Policy(ratio=2, exclude=exclude, exclude_by="span", allocation=allocation)),
             fan_in(Policy(ratio=2, exclude=exclude, allocation=allocation))]
    whole, cut = (run_plan_sync(plan, pool=pool) for plan in plans)
    assert whole.status == cut.status == "finished", (whole.error, cut.error)
    kept = [[hop.kept_positions for hop in result.hops] for result in (whole, cut)]
    assert sum(kept[0]) == sum(kept[1]) and (allocation == "pooled" or kept[0] == kept[1])  # same budgets
    assert [plan.describe()["edges"][0]["policy"].get("exclude_by") for plan in plans] == ["span", None]


def test_a_pooled_fan_in_records_each_senders_fitted_budget(pool):
    result = run_plan_sync(fan_in(Policy(ratio=4, allocation="pooled", exclude=[])), pool=pool)
    assert result.status == "finished", result.error
    assert all(hop.allocation == "pooled" and hop.fitted_budget is not None for hop in result.hops)
    assert sum(hop.kept_positions for hop in result.hops) == sum(hop.fitted_budget for hop in result.hops)
    assert all(hop.excluded_by_reason == {} for hop in result.hops)


def test_pooled_across_replicas_is_refused_naming_the_fix(pool):
    plan = fan_in(Policy(ratio=4, allocation="pooled"), documents=2)
    refused = run_plan_sync(plan, executor=InProcessReplicasExecutor(pool, pins={"r[1]": 1}, replicas={"base": 2}))
    assert refused.status == "failed" and refused.failed_node == "final"
    assert "NotImplementedError" in refused.error and "allocation 'pooled' across hosts" in refused.error
    assert "--pin" in refused.error
    together = run_plan_sync(plan, executor=InProcessReplicasExecutor(pool))  # all on one host: the core pools
    assert together.status == "finished", together.error
    assert all(hop.allocation == "pooled" for hop in together.hops)


def test_the_default_pooling_falls_back_to_per_sender_budgets_across_replicas(pool):
    # pooling needs every sender's scores in one place: across hosts the graph's default gives
    # per-sender budgets (the hops say so) where an edge that names pooled is refused (above)
    remote = run_plan_sync(fan_in(Policy(ratio=4), documents=2),
                           executor=InProcessReplicasExecutor(pool, pins={"r[1]": 1}, replicas={"base": 2}))
    assert remote.status == "finished", remote.error
    assert all(hop.allocation == "per_sender" and hop.fitted_budget is None for hop in remote.hops)
    local = run_plan_sync(fan_in(Policy(ratio=4, allocation="per_sender"), documents=2), pool=pool)
    assert [hop.kept_by_origin for hop in remote.hops] == [hop.kept_by_origin for hop in local.hops]
    pooled = run_plan_sync(fan_in(Policy(ratio=4), documents=2), pool=pool)  # in one process the default pools
    assert all(hop.allocation == "pooled" for hop in pooled.hops)


def test_a_bridge_across_replicas_is_refused_when_named_and_left_out_when_defaulted(pool, monkeypatch):
    # the bridge is the best span across every sender's scores, like pooling: across hosts an
    # edge that names it is refused, and the graph's default leaves it out (the hops say so)
    spread = {"pins": {"r[1]": 1}, "replicas": {"base": 2}}
    named = run_plan_sync(fan_in(Policy(ratio=4, bridge=1, allocation="per_sender"), documents=2),
                          executor=InProcessReplicasExecutor(pool, **spread))
    assert named.status == "failed" and "bridge across hosts is not supported" in named.error and "--pin" in named.error
    monkeypatch.setattr(plan_policy, "DEFAULT_BRIDGE", 1)
    defaulted = run_plan_sync(fan_in(Policy(ratio=4), documents=2), executor=InProcessReplicasExecutor(pool, **spread))
    assert defaulted.status == "finished", defaulted.error
    assert all(hop.bridge is None for hop in defaulted.hops)
    local = run_plan_sync(fan_in(Policy(ratio=4, allocation="per_sender", bridge=0), documents=2), pool=pool)
    assert [hop.kept_by_origin for hop in defaulted.hops] == [hop.kept_by_origin for hop in local.hops]
    together = run_plan_sync(fan_in(Policy(ratio=4), documents=2), pool=pool)  # in one process the default bridges
    assert all(hop.bridge is not None for hop in together.hops)


def test_a_default_bridge_bridges_fan_ins_only(pool, monkeypatch):
    # measured: bridging cost the chain (a lone sender bridges from its own best span), so a
    # bridge the graph's default fills applies to transfers of several senders; one an edge
    # names applies everywhere
    # private on purpose: the bridge a transfer's selector was bound with
    from rclc.selectors.transfer_steps import bridge_of
    from rclc_graph.executors.transfer_options import transfer_options

    monkeypatch.setattr(plan_policy, "DEFAULT_BRIDGE", 1)
    default, named = resolve_policy(TransferPolicy()), resolve_policy(TransferPolicy(bridge=1))
    selector = {(name, senders): transfer_options(policy, trust_code=False, seed=0, senders=senders)["selector"]
                for name, policy in (("default", default), ("named", named)) for senders in (1, 3)}
    assert [bridge_of(selector[key]) > 0 for key in sorted(selector)] == [False, True, True, True]
    texts = [DOC, "The Lynx agency belongs to Jonas Moreno. Jonas Moreno was born in 1964."]
    fan = run_plan_sync(fan_in(Policy(ratio=3), texts=texts), pool=pool)
    assert fan.status == "finished" and all(hop.bridge is not None for hop in fan.hops)


def test_a_lone_sender_records_per_sender_under_the_pooled_default(pool):
    graph = Graph("pair").input("question")
    graph.model("base").agent("reader", model="base", max_new_tokens=2)
    graph.node("a", agent="reader", prompt=f"{DOC}\nQuestion: {{question}}")
    graph.node("b", agent="reader", prompt="Question: {question}\nAnswer:", output=True)
    graph.edge("a", "b", Policy(ratio=4))
    result = run_plan_sync(graph.plan({"question": "Who owns the Cedar project?"}), pool=pool)
    assert result.status == "finished", result.error
    [hop] = result.hops
    assert hop.allocation == "per_sender" and hop.fitted_budget is None  # one sender has nothing to pool with


def test_exclusion_across_replicas_matches_in_process(pool):
    policy = Policy(ratio=2, span="sentence", exclude=["template", "instruction", "known"], allocation="per_sender",
                    bridge=0)  # a bridge across replicas is refused (named) or left out (default)
    local = run_plan_sync(fan_in(policy, documents=2), pool=pool)
    remote = run_plan_sync(fan_in(policy, documents=2), executor=InProcessReplicasExecutor(pool, pins={"r[1]": 1}, replicas={"base": 2}))
    assert remote.status == "finished", remote.error
    for mine, theirs in zip(local.hops, remote.hops):
        assert (mine.kept_by_origin, mine.excluded_by_reason) == (theirs.kept_by_origin, theirs.excluded_by_reason)
    assert local.nodes["final"].roles == remote.nodes["final"].roles


# -- inherited runs: spans follow the rows' origins, not re-cut text -------------------------------


def test_lineage_run_starts_are_where_origins_stop_being_consecutive():
    from rclc_graph.results.lineage import Lineage

    kept = Lineage.fresh("r1", 10).take([0, 1, 2, 5, 6, 9]).hop()
    assert kept.run_starts() == [3, 5]
    assert kept.extend("r2", 4).run_starts() == [3, 5, 6]
    assert Lineage.fresh("r1", 7).run_starts() == [] and Lineage().run_starts() == []


def chain(policy, readers=3):
    graph = Graph("chain").input("question")
    graph.model("base").agent("reader", model="base", system="Read the part.", max_new_tokens=2)
    for index in range(1, readers + 1):
        graph.node(f"r{index}", agent="reader", generate=False, prompt=f"Question: {{question}}\nPart {index}:\n{DOC}")
        if index > 1:
            graph.edge(f"r{index - 1}", f"r{index}", policy)
    graph.node("final", agent="reader", prompt="Question: {question}\nAnswer:", output=True)
    graph.edge(f"r{readers}", "final", policy)
    return graph.plan({"question": "Who owns the Cedar project?"})


def test_a_chain_hands_each_senders_run_starts_to_selection(pool, monkeypatch):
    import rclc

    seen: list[dict] = []
    original = rclc.transfer

    async def spy(sender, receiver, request, **options):
        seen.append(options)
        return await original(sender, receiver, request, **options)

    monkeypatch.setattr(rclc, "transfer", spy)
    result = run_plan_sync(chain(Policy(ratio=2, span="sentence", exclude=[])), pool=pool)
    assert result.status == "finished", result.error
    assert len(seen) == 3  # r1 -> r2 -> r3 -> final
    assert "span_starts" not in seen[0]  # r1 holds one run: its own prompt
    for options, sender in zip(seen[1:], ("r2", "r3")):
        node = result.nodes[sender]
        assert options["span_starts"] == [node.lineage.run_starts()]
        assert node.inherited_positions in options["span_starts"][0]  # its own prompt starts a run
        assert len(options["span_starts"][0]) >= 2  # and the inherited rows hold runs of their own


def test_chain_spans_across_replicas_match_in_process(pool):
    policy = Policy(ratio=2, span="sentence", exclude=[])
    local = run_plan_sync(chain(policy), pool=pool)
    remote = run_plan_sync(chain(policy), executor=InProcessReplicasExecutor(pool, pins={"r2": 1}, replicas={"base": 2}))
    assert remote.status == "finished", remote.error
    for mine, theirs in zip(local.hops, remote.hops):
        assert mine.kept_by_origin == theirs.kept_by_origin
    assert local.nodes["final"].lineage == remote.nodes["final"].lineage
