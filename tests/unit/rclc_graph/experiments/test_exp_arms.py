"""Arms: parsing every field, errors that name the field, YAML arm files, applying arms to the
shipped topologies, and how cases map onto a topology's inputs."""

from __future__ import annotations

import re

import pytest

from rclc_graph import compile_plan, load_graph, load_graph_text
from rclc_graph.errors import PlanError, SpecError
from rclc_graph.experiments.arm_graphs import apply_arm, spec_fingerprint, validate_arms
from rclc_graph.experiments.arms import Arm, load_arms, parse_arm, parse_arms
from rclc_graph.experiments.datasets import make_case
from rclc_graph.experiments.inputs import check_case_fits, documents_read, parse_mapping, resolve_mapping
from rclc_graph.experiments.synthetic import make_dataset
from tests.paths import ROOT

CHAIN = ROOT / "topologies" / "chain_of_agents.yaml"
FANOUT = ROOT / "topologies" / "fanout_qa.yaml"
ALL_ARMS = [
    "r4=state:ratio=4,selector=cacheback",
    "recent2=state:ratio=2,selector=recent",
    "rand=state:budget=64,selector=random,seed=3",
    "q8=state:ratio=8,selector=qsnap,span_size=2",
    "ck=state:budget=128,selector=chunkkv,opt.window_size=3",
    "lat=state:ratio=4,reasoning=latent_mass,reasoning_steps=8,reasoning_context=selected,reasoning_budget=8",
    "ids=state:ratio=4,representation=token_ids+continuous",
    "full=full",
    "fullr=full:reasoning_steps=4",
    "text=text",
    "text16=text:max_new_tokens=16",
    "floor=question_only",
    "single=single_context",
]


def test_parse_every_field():
    arm = parse_arm("r4=state:ratio=4,selector=cacheback,span_size=2")
    assert (arm.name, arm.kind, arm.mode, arm.label) == ("r4", "policy", "state", "r4")
    assert arm.policy.ratio == 4 and arm.policy.selector == "cacheback" and arm.policy.selector_options == {"span_size": 2}
    arm = parse_arm("b=state:budget=256,selector=random,seed=3,opt.flag=true,opt.scale=0.5,opt.name=x")
    assert arm.label == "b256" and arm.policy.selector_options == {"seed": 3, "flag": True, "scale": 0.5, "name": "x"}
    arm = parse_arm("lat=state:reasoning=latent_mass,reasoning_steps=8,reasoning_context=selected,reasoning_budget=8")
    assert arm.policy.reasoning.steps == 8 and arm.policy.reasoning.context == "selected" and arm.policy.reasoning.budget == 8
    assert parse_arm("ids=state:representation=token_ids+continuous").policy.representation == "token_ids+continuous"
    assert parse_arm("f=full").policy.mode == "full" and parse_arm("f=full").label == "full"
    text = parse_arm("t=text:max_new_tokens=16")
    assert text.policy.mode == "text" and text.max_new_tokens == 16
    assert parse_arm("x=state:selector=my.module:pick").policy.selector == "my.module:pick"  # colon inside a value
    for special in ("question_only", "single_context"):
        arm = parse_arm(f"s={special}")
        assert arm.kind == special and arm.policy is None and arm.label == special
    assert parse_arm(" r4 = state : ratio=4 ").policy.ratio == 4
    assert parse_arm("s=state").describe() == {"name": "s", "kind": "policy", "mode": "state", "policy": {"mode": "state"}, "source": "s=state"}


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        ("r4", "", "no '='"),
        ("4r=state", "arms", "arm name '4r'"),
        ("a=stat", "arms.a.mode", "did you mean 'state'"),
        ("a=state:ratio=four", "arms.a.ratio", "whole number"),
        ("a=state:ratio=0", "arms.a.ratio", "greater than 0"),
        ("a=state:ratio=-1", "arms.a.ratio", "whole number"),
        ("a=state:budget=1.5", "arms.a.budget", "whole number"),
        ("a=state:ratio=4,budget=8", "arms.a", "ratio and budget are both set"),
        ("a=state:selector=best", "arms.a.selector", "selector 'best' is unknown"),
        ("a=state:span_size=x", "arms.a.span_size", "whole number"),
        ("a=state:seed=x", "arms.a.seed", "whole number"),
        ("a=state:representation=pixels", "arms.a.representation", "embeddings"),
        ("a=state:reasoning=magic", "arms.a.reasoning", "reasoning method 'magic'"),
        ("a=state:reasoning_steps=x", "arms.a.reasoning_steps", "whole number"),
        ("a=state:reasoning_context=later", "arms.a.reasoning_context", "full"),
        ("a=state:reasoning_context=selected", "arms.a.reasoning", "needs a budget"),
        ("a=state:ratoi=4", "arms.a.ratoi", "did you mean 'ratio'"),
        ("a=state:ratio", "arms.a", "not key=value"),
        ("a=state:ratio=4,ratio=8", "arms.a.ratio", "given twice"),
        ("a=text:selector=recent", "arms.a", "mode 'text' does not use selector"),
        ("a=full:ratio=2", "arms.a", "mode 'full' does not use ratio"),
        ("a=state:max_new_tokens=8", "arms.a.max_new_tokens", "text report"),
        ("a=text:max_new_tokens=0", "arms.a.max_new_tokens", "at least 1"),
        ("a=question_only:ratio=2", "arms.a.ratio", "takes no options"),
    ],
)
def test_bad_arms_name_the_field(text, path, message):
    with pytest.raises(SpecError) as raised:
        parse_arm(text)
    error = raised.value
    assert message in str(error)
    assert str(error).startswith(f"{path}: " if path else "arm")
    assert error.fix


def test_parse_arms_refuses_duplicates_and_nothing():
    with pytest.raises(SpecError, match="declared twice"):
        parse_arms(["a=text", "a=full"])
    with pytest.raises(SpecError, match="no arms"):
        parse_arms([])


def test_arms_from_yaml(tmp_path):
    path = tmp_path / "arms.yaml"
    path.write_text(
        "arms:\n"
        "  r4: state:ratio=4,selector=cacheback\n"
        "  recent2: {mode: state, ratio: 2, selector: recent}\n"
        "  spans: {mode: state, budget: 64, selector_options: {span_size: 2, window: 3}}\n"
        "  lat: {reasoning: {method: latent_mass, steps: 4}}\n"
        "  floor: question_only\n"
    )
    arms = load_arms(path)
    assert [arm.name for arm in arms] == ["r4", "recent2", "spans", "lat", "floor"]
    assert arms[1].policy.selector == "recent" and arms[1].policy.ratio == 2
    assert arms[2].policy.selector_options == {"span_size": 2, "window": 3}
    assert arms[3].policy.reasoning.steps == 4 and arms[3].mode == "state"
    assert arms[4].kind == "question_only"


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("arms:\n  a: state\n  b: {mode: state, ratio: \"4\"}\n", 3, "ratio must be a whole number"),
        ("arms:\n  a: {mode: stat}\n", 2, "did you mean 'state'"),
        ("arms:\n  a: state\n  a: full\n", 3, "appears twice"),
        ("arms:\n  a: 4\n", 2, "POLICY string or a mapping"),
        ("r4: state\n", 1, "`arms:`"),
        ("arms: {}\n", 1, "`arms:`"),
    ],
)
def test_yaml_arm_errors_cite_the_line(tmp_path, body, line, message):
    path = tmp_path / "arms.yaml"
    path.write_text(body)
    with pytest.raises(SpecError) as raised:
        load_arms(path)
    assert message in str(raised.value)
    assert raised.value.location.file == str(path) and raised.value.location.line == line


@pytest.mark.parametrize("topology", [CHAIN, FANOUT], ids=["chain", "fanout"])
def test_every_arm_applies_to_the_shipped_topologies(topology):
    spec = load_graph(topology)
    arms = parse_arms(ALL_ARMS)
    blueprints = validate_arms(spec, arms)
    assert list(blueprints) == [arm.name for arm in arms]
    case = make_dataset(1, seed=0, documents=4)[0]
    mapping = resolve_mapping(spec)
    for arm in arms:
        arm_spec = apply_arm(spec, arm)
        plan = compile_plan(arm_spec, mapping.inputs(case))
        assert len(plan.outputs) == 1
        if arm.kind == "policy":
            assert [node.name for node in arm_spec.nodes] == [node.name for node in spec.nodes]
            assert arm_spec.policies == {}
            for edge in plan.edges:
                assert edge.policy.mode == arm.policy.mode
                # every edge keeps its own request template (the question), except text edges
                assert edge.request == (None if arm.policy.mode == "text" else case.question)
                if arm.policy.mode == "state":
                    assert edge.policy.ratio == arm.policy.ratio or edge.policy.budget == arm.policy.budget
        else:
            assert len(plan.nodes) == 1 and plan.edges == ()
            node = plan.nodes[0]
            assert node.agent.name == "answerer" and node.output
            assert case.question in node.prompt
            assert all(doc in node.prompt for doc in case.documents) == (arm.kind == "single_context")
            assert not any(doc in node.prompt for doc in case.documents) or arm.kind == "single_context"
    assert load_graph(topology) == spec  # pure: the spec itself is unchanged


def test_text_arm_turns_senders_into_writers_and_caps_their_reports():
    spec = load_graph(CHAIN)
    assert not spec.nodes[0].generate
    text = apply_arm(spec, parse_arm("t=text:max_new_tokens=16"))
    generate = {node.name: node.generate for node in text.nodes}
    assert generate == {"reader_1": True, "reader_2": True, "reader_3": True, "reader_4": True, "final": True}
    agents = {agent.name: agent for agent in text.agents}
    assert agents["reader"].max_new_tokens == 16 and agents["answerer"].max_new_tokens == 32  # the answer keeps its cap
    # an agent shared by a sender and the answering node is copied for the sender only
    shared = load_graph_text(
        "name: g\ninputs: {question: str, documents: 'list[str]'}\nmodels: [{name: m}]\n"
        "agents: [{name: a, model: m, max_new_tokens: 40}]\n"
        "nodes:\n  - {name: r, agent: a, foreach: documents, prompt: '{item}', generate: false}\n"
        "  - {name: f, agent: a, prompt: '{question}', output: true}\n"
        "edges: [{source: r, target: f}]\n"
    )
    capped = apply_arm(shared, parse_arm("t=text:max_new_tokens=8"))
    agents = {agent.name: agent.max_new_tokens for agent in capped.agents}
    assert agents == {"a": 40, "a_report": 8}
    assert [node.agent for node in capped.nodes] == ["a_report", "a"]


def test_bad_arms_fail_validation_before_any_model_work():
    spec = load_graph(FANOUT)
    with pytest.raises(PlanError) as raised:
        validate_arms(spec, parse_arms(["ok=full", "mine=state:selector=my.mod:pick"]))
    assert raised.value.code == "E_TRUST_CODE" and "arm 'mine'" in str(raised.value)
    assert validate_arms(spec, parse_arms(["mine=state:selector=my.mod:pick"]), trust_code=True)
    two_outputs = load_graph_text(
        "name: g\ninputs: {question: str, documents: 'list[str]'}\nmodels: [{name: m}]\nagents: [{name: a, model: m}]\n"
        "nodes:\n  - {name: r, agent: a, foreach: documents, prompt: '{item}', output: true}\n"
        "  - {name: f, agent: a, prompt: '{question}', output: true}\nedges: [{source: r, target: f}]\n"
    )
    with pytest.raises(PlanError, match="one answer"):
        validate_arms(two_outputs, parse_arms(["r4=state"]))
    with pytest.raises(PlanError, match="exactly one output node"):
        validate_arms(two_outputs, parse_arms(["q=question_only"]))


def test_question_only_refuses_an_output_prompt_that_reads_the_documents():
    spec = load_graph_text(
        "name: g\ninputs: {question: str, documents: 'list[str]'}\nmodels: [{name: m}]\nagents: [{name: a, model: m}]\n"
        "nodes: [{name: f, agent: a, prompt: 'Read {documents} then answer {question}', output: true}]\n"
    )
    with pytest.raises(PlanError, match="cannot answer from the question alone"):
        apply_arm(spec, Arm("q", "question_only"))
    single = apply_arm(spec, Arm("s", "single_context"))
    assert single.nodes[0].prompt == spec.nodes[0].prompt  # already reads every document


def test_spec_fingerprint_changes_with_the_arm():
    spec = load_graph(FANOUT)
    prints = {spec_fingerprint(apply_arm(spec, parse_arm(text))) for text in ALL_ARMS}
    assert len(prints) == len(ALL_ARMS)
    assert spec_fingerprint(apply_arm(spec, parse_arm("a=full"))) == spec_fingerprint(apply_arm(spec, parse_arm("b=full")))


# -- input mapping -------------------------------------------------------------------------


def test_mapping_of_the_shipped_topologies():
    assert resolve_mapping(load_graph(FANOUT)).to_dict() == {"question": "question", "documents": "documents"}
    assert resolve_mapping(load_graph(CHAIN)).to_dict() == {"question": "question", "documents": "chunks"}
    assert documents_read(load_graph(CHAIN), "chunks") == 4
    assert documents_read(load_graph(FANOUT), "documents") is None
    case = make_case(documents=["a", "b"], question="q", answers=["a"])
    assert resolve_mapping(load_graph(CHAIN)).inputs(case) == {"question": "q", "chunks": ["a", "b"]}


def test_chain_needs_exactly_its_number_of_documents():
    spec = load_graph(CHAIN)
    mapping = resolve_mapping(spec)
    check_case_fits(spec, mapping, make_dataset(1, documents=4)[0])
    with pytest.raises(PlanError, match="has 3 documents but topology 'chain_of_agents' reads 4") as raised:
        check_case_fits(spec, mapping, make_dataset(1, documents=3)[0])
    assert "--documents 4" in raised.value.fix
    with pytest.raises(PlanError, match="silently dropped"):
        check_case_fits(spec, mapping, make_dataset(1, documents=5)[0])
    check_case_fits(load_graph(FANOUT), resolve_mapping(load_graph(FANOUT)), make_dataset(1, documents=7)[0])


@pytest.mark.parametrize(
    ("inputs", "explicit", "message"),
    [
        ("{q: str, documents: 'list[str]'}", None, "no input 'question'"),
        ("{question: 'list[str]', documents: 'list[str]'}", None, "is a list[str]"),
        ("{question: str}", None, "declares no list[str] input"),
        ("{question: str, a: 'list[str]', b: 'list[str]'}", None, "declares list inputs a, b"),
        ("{question: str, documents: 'list[str]', extra: str}", None, "input 'extra' has no default"),
        ("{question: str, documents: 'list[str]'}", {"documents": "docs"}, "no input 'docs'"),
        ("{question: str, documents: 'list[str]'}", {"documents": "question"}, "is a str"),
    ],
)
def test_mapping_errors(inputs, explicit, message):
    spec = load_graph_text(
        f"name: g\ninputs: {inputs}\nmodels: [{{name: m}}]\nagents: [{{name: a, model: m}}]\n"
        "nodes: [{name: f, agent: a, prompt: 'hello', output: true}]\n"
    )
    with pytest.raises(PlanError, match=re.escape(message)) as raised:
        resolve_mapping(spec, explicit)
    assert raised.value.code == "E_INPUT"


def test_explicit_mapping_and_its_parsing():
    spec = load_graph_text(
        "name: g\ninputs: {q: str, a: {type: 'list[str]', default: [x]}, b: 'list[str]', extra: {type: str, default: x}}\nmodels: [{name: m}]\n"
        "agents: [{name: n, model: m}]\nnodes: [{name: f, agent: n, prompt: '{q} {b}', output: true}]\n"
    )
    mapping = resolve_mapping(spec, parse_mapping(["question=q", "documents=b"]))
    assert mapping.to_dict() == {"question": "q", "documents": "b"}
    for bad, message in ((["documents"], "FIELD=INPUT"), (["answers=x"], "not a case field"), (["question=a", "question=b"], "twice")):
        with pytest.raises(ValueError, match=message):
            parse_mapping(bad)


def test_the_shipped_arm_grid_applies_to_both_topologies():
    arms = load_arms(ROOT / "examples" / "experiment_arms.yaml")
    assert {"floor", "single", "text", "full", "r2", "r32", "recent4", "random4"} <= {arm.name for arm in arms}
    for topology in (CHAIN, FANOUT):
        assert len(validate_arms(load_graph(topology), arms)) == len(arms)


def test_the_family_arms_apply_to_both_topologies():
    """The arm file the task-family tables ran (docs/experiments.md) stays valid on both."""
    arms = load_arms(ROOT / "examples" / "experiment_arms_families.yaml")
    assert [arm.name for arm in arms][:4] == ["default", "seed", "recent", "single"]
    for topology in (CHAIN, FANOUT):
        assert len(validate_arms(load_graph(topology), arms)) == len(arms)


def test_selection_keys_are_policy_fields(tmp_path):
    arm = parse_arm("n4=state:ratio=4,span=sentence,max_span=32,exclude=template+known,allocation=pooled")
    assert (arm.policy.span, arm.policy.max_span, arm.policy.exclude, arm.policy.allocation) == (
        "sentence", 32, ["template", "known"], "pooled")
    assert parse_arm("a=state:exclude=all").policy.exclude == ["template", "instruction", "known"]
    assert parse_arm("a=state:exclude=none").policy.exclude == []
    assert parse_arm("a=state").policy.exclude is None  # unset: the graph's default applies
    path = tmp_path / "arms.yaml"
    path.write_text("arms:\n  m: {mode: state, ratio: 4, span: line, exclude: all, allocation: per_sender}\n")
    mapping = load_arms(path)[0]
    assert mapping.policy.exclude == ["template", "instruction", "known"] and mapping.policy.span == "line"


def test_issue_26_levers_are_arm_keys_and_off_unless_given():
    bridged = parse_arm("b=state:ratio=4,bridge=1")
    assert bridged.policy.bridge == 1 and bridged.describe()["policy"]["bridge"] == 1
    arm = parse_arm("w=state:ratio=4,exclude=template+known,exclude_by=span,relevance=0.5")
    assert (arm.policy.exclude_by, arm.policy.relevance) == ("span", 0.5)
    assert arm.describe()["policy"]["exclude_by"] == "span"
    plain = parse_arm("d=state:ratio=4")
    assert plain.policy.exclude_by is None and plain.policy.relevance is None
    assert not {"exclude_by", "relevance"} & set(plain.describe()["policy"])


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        ("a=state:span=word", "arms.a.span", "sentence"),
        ("a=state:max_span=x", "arms.a.max_span", "whole number"),
        ("a=state:exclude=markup", "arms.a.exclude", "template"),
        ("a=state:allocation=shared", "arms.a.allocation", "pooled"),
        ("a=state:selector=recent,span=sentence", "arms.a", "keeps no spans"),
        ("a=state:selector=random,allocation=pooled", "arms.a", "has none"),
        ("a=state:exclude_by=whole,exclude=known", "arms.a.exclude_by", "'position' or 'span'"),
        ("a=state:exclude_by=span", "arms.a", "exclude lists none of them"),
        ("a=state:relevance=x", "arms.a.relevance", "must be a number"),
        ("a=state:bridge=x", "arms.a.bridge", "must be a whole number"),
        ("a=state:selector=chunkkv,bridge=1", "arms.a", "scores none"),
        ("a=state:relevance=2", "arms.a.relevance", "less than or equal to 1"),
    ],
)
def test_bad_selection_keys_name_the_field(text, path, message):
    with pytest.raises(SpecError) as raised:
        parse_arm(text)
    assert str(raised.value).startswith(f"{path}") and message in str(raised.value)

