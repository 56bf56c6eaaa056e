"""Bad input, fuzzed (issue 6, item 4): hypothesis writes topology documents (structured
ones with wrong, missing and unknown fields; text edits of the shipped topologies; raw
bytes) and builder call sequences, and the library must either accept them or refuse them
with its own validation error (GraphError) that names where: file and line for a file,
the field path for both. Any other exception type fails the test, whatever it says.

Hostile input (issue 16): nesting at any depth and place (YAML flow and block style, JSON
inputs), plan and input sizes up to 10**9 rounds and millions of items or bytes (refused in
seconds), lone surrogates in every kind of field and input, and control-token text in system
prompts and user turns (only the template's turns become control tokens).

Validation only: nothing here loads a model. Each test counts the documents it ran and
checks the count, so the figure in the issue note (at least 2,000) is the suite's own:
3,020 documents and prompts per run.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rclc_graph import Graph, GraphError, Policy, Reasoning, load_graph_text, plan_file
from rclc_graph.plan.builder import chain_of_agents, fan_out
from rclc_graph.errors import ErrorCode, UsageError
from tests.paths import ROOT

CODES = {code.value for code in ErrorCode}

SHIPPED = ["chain_of_agents", "fanout_qa", "hierarchical", "debate", "triage", "review_loop", "tool_agent"]

# Documents per test; together well over the 2,000 the issue asks for.
STRUCTURED, EDITED, RAW, BUILDER = 900, 600, 250, 600
FUZZ = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Problems about a whole file have no field to name; every other one names its field.
FILE_LEVEL = {"E_FILE", "E_FILE_SIZE", "E_ENCODING", "E_YAML_SYNTAX", "E_YAML_TAG", "E_YAML_DUPLICATE", "E_TOO_DEEP"}


@pytest.fixture(scope="module")
def workdir():
    """topologies/ next to agents/ (profiles by name resolve), like the repository."""
    directory = Path(tempfile.mkdtemp(prefix="rclc-fuzz-"))
    shutil.copytree(ROOT / "agents", directory / "agents")
    (directory / "topologies").mkdir()
    yield directory / "topologies"
    shutil.rmtree(directory, ignore_errors=True)


def assert_located(error: BaseException, path: Path) -> None:
    """A file's refusal: the library's error, every problem with file, line and (but for
    file-level problems) the field path."""
    assert isinstance(error, GraphError), f"{type(error).__name__}: {error}"
    for problem in error.problems:
        assert problem.code in CODES and problem.message and problem.fix, problem
        assert problem.location is not None, f"no file/line: {problem}"
        assert problem.location.line >= 1 and problem.location.column >= 1, problem
        assert Path(problem.location.file).name in {path.name} | {p.name for p in (ROOT / "agents").glob("*.yaml")}, problem
        whole = problem.code == "E_FIELD" and problem.message.startswith("expected a topology mapping")
        assert problem.path or problem.code in FILE_LEVEL or whole, f"no field: {problem}"
        assert str(problem.location) in str(error), str(error)


def assert_named(error: BaseException) -> None:
    """A builder's refusal: the library's error, every problem naming its field."""
    assert isinstance(error, GraphError), f"{type(error).__name__}: {error}"
    for problem in error.problems:
        assert problem.code in CODES and problem.message and problem.fix, problem
        assert problem.path, f"no field: {problem}"


# -- values -----------------------------------------------------------------------------------

NAMES = st.sampled_from(["a", "b", "final", "reader", "answerer", "worker", "base", "x_y", "Q", "", "1st", "a b", "é"])
TEXTS = st.one_of(
    st.sampled_from([
        "{question}", "Question: {question}\nDocument:\n{document}", "{documents[0]}", "{documents[7]}", "{chunks[1]}",
        "{nope}", "{", "}", "{question!r}", "{question:>10}", "{{literal}}", "", "   ", "Answer:", "{index}", "{round}",
    ]),
    st.text(max_size=20),
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10), st.integers(), st.floats(), TEXTS,
    st.sampled_from(["embedded", "state", "text", "full", "cacheback", "qsnap", "chunkkv", "recent", "random", "nosuch",
                     "os:system", "tests.helpers.fault_plugins:flaky_selector", "latent_mass", "str", "list[str]", "float32", "auto"]),
)
JSONISH = st.recursive(
    SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=5,
)


GARBAGE_ODDS = st.integers(0, 99)


@st.composite
def _field(draw, plausible: st.SearchStrategy, odds: int) -> Any:
    return draw(JSONISH) if draw(GARBAGE_ODDS) < odds else draw(plausible)


def field(plausible: st.SearchStrategy, odds: int = 15) -> st.SearchStrategy:
    """A plausible value, or (`odds` percent of the time) anything."""
    return _field(plausible, odds)


@st.composite
def _mapping(draw, fields: dict[str, st.SearchStrategy], required: tuple[str, ...]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, strategy in fields.items():
        if draw(GARBAGE_ODDS) < (95 if key in required else 30):
            data[key] = draw(strategy)
    if draw(GARBAGE_ODDS) < 4:
        data[draw(UNKNOWN_KEYS)] = draw(JSONISH)
    return data


def mapping(fields: dict[str, st.SearchStrategy], required: tuple[str, ...] = ()) -> st.SearchStrategy:
    """Some of `fields` (the required ones nearly always), now and then an unknown key."""
    return _mapping(fields, required)


UNKNOWN_KEYS = st.sampled_from(["nmae", "promt", "ratios", "x", "policy_name"])
POSITIVE = st.one_of(st.integers(1, 300), st.integers(-2, 300))
REASONING = mapping({
    "method": field(st.sampled_from(["latent_mass", "latent_mass", "nosuch", "os:system"])), "steps": field(POSITIVE),
    "context": field(st.sampled_from(["full", "selected", "selected_with_request", "other"])), "budget": field(POSITIVE),
})
POLICY_FIELDS = {
    "mode": field(st.sampled_from(["state", "full", "text"])),
    "ratio": field(POSITIVE),
    "budget": field(POSITIVE),
    "selector": field(st.sampled_from(["cacheback", "qsnap", "chunkkv", "recent", "random", "nosuch", "os:system"])),
    "selector_options": field(st.dictionaries(st.sampled_from(["span_size", "seed", "sentences"]), SCALARS, max_size=2)),
    "reasoning": field(REASONING),
    "request": field(TEXTS),
    "representation": field(st.sampled_from(["embeddings", "token_ids+continuous", "pixels"])),
}
POLICY = mapping(POLICY_FIELDS)
# conditions (`when`, `until`): every operator, with plausible and broken operands, nested
LEAF_CONDITIONS = st.one_of(
    mapping({"contains": field(TEXTS), "ignore_case": field(st.booleans())}, required=("contains",)),
    mapping({"matches": field(st.sampled_from(["^yes", "(?i)approved", "(a+)+$", "(", "[", "x{1,3}", "a" * 300])),
             "ignore_case": field(st.booleans())}, required=("matches",)),
    mapping({"equals": field(TEXTS), "ignore_case": field(st.booleans())}, required=("equals",)),
    st.fixed_dictionaries({"json": mapping({
        "path": field(st.sampled_from(["route", "a.b", "a..b", "0", ""])), "equals": field(SCALARS),
        "in": field(st.lists(SCALARS, max_size=3))}, required=("path",))}),
    field(st.sampled_from(["mod.routes:pick", "os:system", "not a router", "tests.helpers.fault_plugins:flaky_selector"]), 50),
)
CONDITIONS = st.recursive(
    LEAF_CONDITIONS,
    lambda inner: st.one_of(
        st.fixed_dictionaries({"all": st.lists(inner, max_size=3)}),
        st.fixed_dictionaries({"any": st.lists(inner, max_size=3)}),
        st.fixed_dictionaries({"not": inner}),
        st.fixed_dictionaries({"all": inner, "not": inner}),
    ),
    max_leaves=4,
)
NODE_NAMES = st.sampled_from(["a", "b", "final"] * 4 + ["c", "x y", ""])
AGENT_NAMES = st.sampled_from(["reader", "answerer"] * 4 + ["writer", "1st", ""])
INPUT_TYPES = st.sampled_from(["str", "str", "list[str]", "list[str]", "int"])
TOOLS = st.lists(st.sampled_from(["shop_tools:lookup_order", "os:system", "a.b:c.d", "nocolon", ":x", "m:"]), max_size=3)
AGENT = mapping({
    "name": AGENT_NAMES, "model": field(st.sampled_from(["base", "base", "base", "other", "remote"])),
    "system": field(TEXTS), "max_new_tokens": field(POSITIVE), "temperature": field(st.floats(-1, 2)),
    "context_limit": field(POSITIVE), "tools": field(TOOLS), "max_tool_calls": field(st.integers(-1, 40)),
    "tool_timeout": field(st.floats(-1, 60)),
}, required=("name", "model"))
NODE = mapping({
    "name": NODE_NAMES, "agent": field(AGENT_NAMES), "prompt": field(TEXTS),
    "generate": field(st.booleans()), "output": field(st.booleans()),
    "foreach": field(st.sampled_from(["documents", "documents", "question", "nothing"])),
    "item": field(st.sampled_from(["document", "item", "question", "1", "answer"])),
    "call": field(st.sampled_from(["json:dumps", "os:system", "no.such:module", "not a ref"])),
    "interrupt": field(st.sampled_from(["before", "after", "during"])),
    "question": field(TEXTS),
}, required=("name", "agent", "prompt"))
EDGE = mapping({
    "source": NODE_NAMES, "target": NODE_NAMES, "rounds": field(POSITIVE),
    "policy": st.one_of(st.sampled_from(["handoff", "missing"]), POLICY),
    "when": CONDITIONS, "until": CONDITIONS,
}, required=("source", "target"))
MODEL = st.one_of(
    st.fixed_dictionaries({"name": st.sampled_from(["base", "base", "b", ""]),
                           "source": field(st.sampled_from(["embedded", "embedded", "./missing-model"]))}),
    mapping({"name": st.sampled_from(["remote", "base"]), "backend": field(st.sampled_from(["openai", "hf", "tgi"])),
             "base_url": field(st.sampled_from(["http://127.0.0.1:8000/v1", "https://api.example.com/v1", "ftp://x",
                                                "localhost:8000"])),
             "model": field(st.sampled_from(["smollm2", "", "gpt-x"])),
             "api_key_env": field(st.sampled_from(["OPENAI_API_KEY", "sk-1234", "1BAD", "lower_ok"])),
             "timeout": field(st.floats(-1, 120)), "max_retries": field(st.integers(-1, 12)),
             "source": field(st.sampled_from(["embedded", "./w"]))}, required=("name", "backend")),
)
RUN_INPUTS = st.dictionaries(st.sampled_from(["question", "documents", "documents", "question", "extra"]), field(
    st.one_of(st.text(max_size=30), st.lists(st.text(max_size=10), max_size=4))), max_size=4)
SECTIONS = {
    "inputs": st.dictionaries(st.sampled_from(["question", "documents", "chunks", "1x"]), field(INPUT_TYPES), max_size=3),
    "models": st.lists(MODEL, max_size=2),
    "agents": st.lists(st.one_of(AGENT, AGENT, AGENT, st.sampled_from(["reader", "answerer", "nosuch",
                                                                         "../agents/judge.yaml"])), max_size=3),
    "nodes": st.lists(NODE, max_size=4),
    "edges": st.lists(EDGE, max_size=4),
    "policies": st.dictionaries(st.sampled_from(["handoff", "other"]), POLICY, max_size=2),
    "rounds": mapping({"limit": field(POSITIVE), "max_nodes": field(POSITIVE)}),
}


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place inside a nested mapping/list a mutation can touch."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, prefix + (key,))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += _paths(inner, prefix + (index,))
    return found


def _mutate(doc: dict[str, Any], path: tuple, how: int, value: Any) -> None:
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if how == 0 and isinstance(parent, dict):
        del parent[path[-1]]
    elif how == 0:
        parent.pop(path[-1])
    else:
        parent[path[-1]] = value


@st.composite
def near_valid(draw) -> dict[str, Any]:
    """A small valid topology (a reader, maybe a foreach, one state edge into an answer),
    then up to two mutations: a value replaced by anything, or deleted."""
    reader: dict[str, Any] = {"name": "a", "agent": "reader", "generate": draw(st.booleans())}
    if draw(st.booleans()):
        reader.update(foreach="documents", item="document", prompt="Question: {question}\nDocument {index}: {document}")
    else:
        reader["prompt"] = draw(st.sampled_from(["Question: {question}", "{documents[0]} {question}"]))
    final: dict[str, Any] = {"name": "final", "agent": "answerer", "output": True, "prompt": "Answer {question}:"}
    if draw(st.integers(0, 3)) == 0:
        final.update(interrupt=draw(st.sampled_from(["before", "after"])), prompt="Answer {question}: {answer}")
    edge: dict[str, Any] = {"source": "a", "target": "final", "policy": draw(st.fixed_dictionaries({}, optional={
        "mode": st.sampled_from(["state", "full", "text"]), "ratio": st.integers(1, 8),
        "selector": st.sampled_from(["cacheback", "qsnap", "chunkkv", "recent", "random"]),
        "request": st.sampled_from(["{question}", "why {question}"])}))}
    if draw(st.integers(0, 2)) == 0:
        edge["when"] = draw(CONDITIONS)
    doc = {
        "version": 1, "name": "near",
        "inputs": {"question": "str", "documents": {"type": "list[str]", "description": "one per reader"}},
        "models": [{"name": "base", "source": "embedded"}],
        "agents": [{"name": "reader", "model": "base", "max_new_tokens": draw(st.integers(1, 64))},
                   {"name": "answerer", "model": "base"}],
        "nodes": [reader, final],
        "edges": [edge],
    }
    if draw(st.integers(0, 3)) == 0:  # a loop that may stop, or a function node in between
        extra = draw(st.sampled_from(["loop", "function"]))
        if extra == "loop":
            doc["edges"].append({"source": "final", "target": "a", "rounds": draw(st.integers(1, 4)),
                                 "policy": {"mode": "text"}, "until": draw(CONDITIONS)})
        else:
            doc["nodes"].append({"name": "f", "call": "json:dumps"})
            doc["edges"] += [{"source": "a", "target": "f", "policy": {"mode": draw(st.sampled_from(["text", "state"]))}},
                             {"source": "f", "target": "final", "policy": {"mode": "text"}}]
    # sometimes the answerer calls tools, or runs on an API model (the edge must then be text)
    feature = draw(st.sampled_from(["none", "none", "tools", "api"]))
    if feature == "tools":
        doc["agents"][1].update(tools=["shop_tools:lookup_order"], max_tool_calls=draw(st.integers(1, 4)))
    elif feature == "api":
        doc["models"].append({"name": "remote", "backend": "openai", "base_url": "http://127.0.0.1:8000/v1",
                              "model": "smollm2", "api_key_env": "OPENAI_API_KEY"})
        doc["agents"][1]["model"] = "remote"
    for _ in range(draw(st.integers(0, 2))):
        paths = _paths(doc)
        _mutate(doc, draw(st.sampled_from(paths)), draw(st.integers(0, 2)), draw(JSONISH))
    return doc


@st.composite
def free_form(draw) -> dict[str, Any]:
    """Sections assembled from plausible and arbitrary pieces."""
    doc: dict[str, Any] = {"version": draw(field(st.just(1), 3)), "name": draw(field(NODE_NAMES, 5))}
    for key, strategy in SECTIONS.items():
        if draw(GARBAGE_ODDS) < (97 if key in ("inputs", "models", "agents", "nodes", "edges") else 30):
            doc[key] = draw(field(strategy, 3))
    return doc


GOOD_RUN_INPUTS = st.fixed_dictionaries({"question": st.text(min_size=1, max_size=20).filter(str.strip),
                                         "documents": st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=3)})


@st.composite
def documents(draw) -> tuple[dict[str, Any], dict[str, Any]]:
    """A topology mapping near a valid one or assembled freely, and run inputs to plan it for."""
    doc = draw(st.one_of(near_valid(), free_form()))
    return doc, draw(st.one_of(GOOD_RUN_INPUTS, GOOD_RUN_INPUTS, RUN_INPUTS))


# -- the loader -------------------------------------------------------------------------------


def plan_or_refuse(path: Path, inputs: Any, *, trust_code: bool = False) -> Any:
    """plan_file's result, or its error after checking it is a located validation error."""
    try:
        return plan_file(path, inputs, trust_code=trust_code)
    except Exception as error:  # noqa: BLE001 - any other type is the failure under test
        assert_located(error, path)
        return error


def test_structured_documents_are_planned_or_refused_with_file_line_and_field(workdir):
    ran = {"documents": 0, "refused": 0, "planned": 0}
    path = workdir / "structured.yaml"

    @settings(max_examples=STRUCTURED, **FUZZ)
    @given(documents(), st.booleans())
    def check(document, trust_code):
        doc, inputs = document
        path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8")
        outcome = plan_or_refuse(path, inputs, trust_code=trust_code)
        ran["documents"] += 1
        ran["refused" if isinstance(outcome, GraphError) else "planned"] += 1

    check()
    assert ran["documents"] >= STRUCTURED, ran
    assert ran["refused"] > ran["documents"] // 2 and ran["planned"] > 0, ran  # mostly mistakes, some good
    print(f"structured documents: {ran}")


EDITS = st.sampled_from([
    ": ", "- ", "\n", "\n  ", "\t", "{", "}", "[", "]", "&a ", "*a", "<<: *a\n", "!!python/object:os.system ", "!!binary ",
    "'", '"', "#", "|\n", ">\n", "~", "null", "0", "-1", "1e999", ".nan", "---\n", "...\n", "%YAML 1.1\n", "\x00", "\ufeff",
    "name: x\n", "ratio: 0", "budget: -4", "selector: os:system", "rounds: 0", "foreach: question",
    "when: {contains: x}", "when: os:system", "until: {matches: '(a*)*'}", "interrupt: before", "call: os:system",
    "question: why?", "when: {json: {path: a}}", "{answer}",
])


@st.composite
def edited_texts(draw) -> tuple[str, str]:
    """A shipped topology with a few text edits: deletions, insertions, swapped lines."""
    name = draw(st.sampled_from(SHIPPED))
    text = (ROOT / "topologies" / f"{name}.yaml").read_text(encoding="utf-8")
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.integers(0, 3))
        at = draw(st.integers(0, len(text)))
        if kind == 0:
            text = text[:at] + text[at + draw(st.integers(1, 40)):]
        elif kind == 1:
            text = text[:at] + draw(st.one_of(EDITS, st.text(max_size=8))) + text[at:]
        elif kind == 2:
            lines = text.split("\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
        else:
            text = text[:at]  # truncated
    return name, text


def test_edited_shipped_topologies_are_planned_or_refused_with_file_line_and_field(workdir):
    ran = {"documents": 0, "refused": 0}
    path = workdir / "edited.yaml"
    example_inputs = {name: json.loads((ROOT / "examples" / "inputs" / f"{name}.json").read_text()) for name in SHIPPED}

    @settings(max_examples=EDITED, **FUZZ)
    @given(edited_texts())
    def check(edited):
        name, text = edited
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        outcome = plan_or_refuse(path, example_inputs[name])
        ran["documents"] += 1
        ran["refused"] += isinstance(outcome, GraphError)

    check()
    assert ran["documents"] >= EDITED and ran["refused"] > 0, ran
    print(f"edited documents: {ran}")


RAW_BYTES = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.sampled_from(SHIPPED).map(lambda name: (ROOT / "topologies" / f"{name}.yaml").read_text().encode("utf-16")),
    st.tuples(st.sampled_from(SHIPPED), st.binary(min_size=1, max_size=4), st.floats(0, 1)).map(
        lambda t: _splice((ROOT / "topologies" / f"{t[0]}.yaml").read_bytes(), t[1], t[2])),
)


def _splice(data: bytes, insert: bytes, where: float) -> bytes:
    at = int(len(data) * where)
    return data[:at] + insert + data[at:]


def test_raw_bytes_are_planned_or_refused_with_file_line_and_field(workdir):
    ran = {"documents": 0, "refused": 0}
    path = workdir / "raw.yaml"

    @settings(max_examples=RAW, **FUZZ)
    @given(RAW_BYTES)
    def check(data):
        path.write_bytes(data)
        outcome = plan_or_refuse(path, {"question": "q", "documents": ["d"], "chunks": ["c"]})
        ran["documents"] += 1
        ran["refused"] += isinstance(outcome, GraphError)

    check()
    assert ran["documents"] >= RAW and ran["refused"] > RAW // 2, ran
    print(f"raw documents: {ran}")


# -- the builder ------------------------------------------------------------------------------

OPTION_VALUES = field(st.one_of(POSITIVE, st.booleans(), TEXTS))
MODEL_OPTIONS = st.dictionaries(st.sampled_from(["dtype", "device", "backend", "replicas", "resources", "weights"]),
                                OPTION_VALUES, max_size=2)
AGENT_OPTIONS = st.dictionaries(st.sampled_from(["max_new_tokens", "temperature", "top_p", "seed", "context_limit",
                                                 "description", "sytem"]), OPTION_VALUES, max_size=2)
NODE_OPTIONS = st.dictionaries(st.sampled_from(["generate", "output", "foreach", "item", "description", "rounds"]),
                               field(st.one_of(st.booleans(), st.sampled_from(["documents", "question", "document", "x"]))),
                               max_size=3)
POLICY_ARGS = st.fixed_dictionaries({}, optional=POLICY_FIELDS)

CALLS = st.one_of(
    st.tuples(st.just("input"), field(NAMES), field(st.sampled_from(["str", "list[str]", "int"])),
              st.one_of(st.none(), field(st.one_of(TEXTS, st.lists(TEXTS, max_size=2))))),
    st.tuples(st.just("model"), field(NAMES), field(st.just("embedded")), MODEL_OPTIONS),
    st.tuples(st.just("agent"), field(NAMES), field(NAMES), field(TEXTS), AGENT_OPTIONS),
    st.tuples(st.just("node"), field(NAMES), field(NAMES), field(TEXTS), NODE_OPTIONS),
    st.tuples(st.just("edge"), field(NAMES), field(NAMES),
              st.one_of(st.none(), st.sampled_from(["handoff", "nope"]), POLICY_ARGS, JSONISH),
              st.one_of(st.none(), field(POSITIVE))),
    st.tuples(st.just("policy"), field(NAMES), POLICY_ARGS),
    st.tuples(st.just("limits"), st.one_of(st.none(), field(POSITIVE)), st.one_of(st.none(), field(POSITIVE))),
    st.tuples(st.just("reasoning"), st.fixed_dictionaries({}, optional={
        "method": field(st.sampled_from(["latent_mass", "x:y"])), "steps": field(POSITIVE), "budget": field(POSITIVE),
        "context": field(st.sampled_from(["full", "selected"]))})),
    st.tuples(st.just("function"), field(NAMES), st.sampled_from(["callable", "json:dumps", "lambda", 3]),
              st.dictionaries(st.sampled_from(["output", "foreach", "interrupt", "prompt"]),
                              field(st.one_of(st.booleans(), st.sampled_from(["documents", "before", "x"]))),
                              max_size=2)),
    st.tuples(st.just("conditional"), field(NAMES), field(NAMES), CONDITIONS, st.one_of(st.none(), CONDITIONS),
              st.one_of(st.none(), field(POSITIVE))),
)


def _fuzz_function(inputs: Any, senders: Any) -> str:
    return "fuzz"


def _call(graph: Graph, call: tuple) -> None:
    kind, *args = call
    if kind == "input":
        graph.input(args[0], args[1], default=args[2])
    elif kind == "model":
        graph.model(args[0], args[1], **args[2])
    elif kind == "agent":
        graph.agent(args[0], model=args[1], system=args[2], **args[3])
    elif kind == "node":
        graph.node(args[0], agent=args[1], prompt=args[2], **args[3])
    elif kind == "edge":
        policy = Policy(**args[2]) if isinstance(args[2], dict) and all(isinstance(k, str) for k in args[2]) else args[2]
        graph.edge(args[0], args[1], policy, rounds=args[3])
    elif kind == "policy":
        graph.policy(args[0], Policy(**args[1]))
    elif kind == "limits":
        graph.limits(rounds=args[0], max_nodes=args[1])
    elif kind == "function":
        fn = {"callable": _fuzz_function, "lambda": lambda inputs, senders: "x"}.get(args[1], args[1])
        graph.function(args[0], fn, **args[2])
    elif kind == "conditional":
        graph.edge(args[0], args[1], Policy(mode="text"), when=args[2], until=args[3], rounds=args[4])
    else:
        Reasoning(**args[0])


def _start(kind: str, name: Any, description: Any) -> Graph:
    """An empty graph, a small valid one, or a ready-made topology to build on."""
    if kind == "chain":
        return chain_of_agents(2)
    if kind == "fan":
        return fan_out(None, policy=Policy(ratio=2))
    graph = Graph(name, description=description)
    if kind == "basic":
        graph.input("question").model("base").agent("w", model="base", max_new_tokens=8)
        graph.node("a", agent="w", prompt="Question: {question}", generate=False)
        graph.node("final", agent="w", prompt="Answer {question}:", output=True)
        graph.edge("a", "final", Policy(ratio=2))
    return graph


BUILDER_INPUTS = st.one_of(
    st.fixed_dictionaries({"question": st.text(min_size=1, max_size=12).filter(str.strip)}, optional={
        "documents": st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3),
        "chunks": st.lists(st.text(min_size=1, max_size=8), min_size=2, max_size=3)}),
    st.dictionaries(st.sampled_from(["question", "documents", "extra"]),
                    field(st.one_of(st.text(max_size=10), st.lists(st.text(max_size=8), max_size=3))), max_size=3),
)


def test_builder_calls_succeed_or_refuse_naming_the_field_and_change_nothing():
    ran = {"graphs": 0, "calls": 0, "refused calls": 0, "planned": 0}

    @settings(max_examples=BUILDER, **FUZZ)
    @given(st.sampled_from(["empty", "basic", "basic", "chain", "fan"]), field(NAMES), field(TEXTS),
           st.lists(CALLS, max_size=6), BUILDER_INPUTS)
    def check(start, name, description, calls, inputs):
        ran["graphs"] += 1
        try:
            graph = _start(start, name, description)
        except Exception as error:  # noqa: BLE001
            assert start in ("empty", "basic")
            assert_named(error)
            return
        for call in calls:
            before = graph.spec()
            ran["calls"] += 1
            try:
                _call(graph, call)
            except Exception as error:  # noqa: BLE001
                assert_named(error)
                assert graph.spec() == before, f"{call} changed the graph before it was refused"
                ran["refused calls"] += 1
        try:
            plan = graph.plan(inputs)
        except Exception as error:  # noqa: BLE001
            assert_named(error)
            return
        ran["planned"] += 1
        assert load_graph_text(graph.to_yaml()) == graph.spec()  # what plans also round-trips through YAML
        assert plan.outputs

    check()
    assert ran["graphs"] >= BUILDER and ran["refused calls"] > 0 and ran["planned"] > 0, ran
    print(f"builder graphs: {ran}")


# -- hostile input: nesting, size, surrogates, control tokens (issue 16) ---------------------------

NESTED, SIZES, SURROGATES, CONTROLS = 150, 120, 200, 200

BASE_YAML = """\
version: 1
name: fuzz
inputs:
  question: str
  documents: list[str]
models: [{name: base}]
agents: [{name: reader, model: base, max_new_tokens: 8}]
nodes:
  - {name: reader, agent: reader, prompt: "{item}", foreach: documents, generate: false}
  - {name: final, agent: reader, prompt: "{question}", output: true}
edges:
  - {source: reader, target: final, policy: {ratio: 4}}
"""
SLOTS = ["description: VALUE\n", "  - {name: extra, agent: reader, prompt: VALUE}\n", "policies: {p: VALUE}\n"]


def _nested(depth: int, style: int) -> str:
    if style == 0:
        return "[" * depth + "1" + "]" * depth
    if style == 1:
        return "{a: " * depth + "1" + "}" * depth
    return "\n" + "".join("  " * (level + 1) + "- \n" for level in range(depth))  # block style


# issue 16 item 5 (fuzzed): nesting at any depth and place is planned or refused, never a RecursionError
def test_nesting_at_any_depth_is_refused_with_its_line(workdir):
    ran = {"documents": 0, "too deep": 0}
    path = workdir / "nested.yaml"

    @settings(max_examples=NESTED, **FUZZ)
    @given(st.integers(1, 3000), st.integers(0, 2), st.sampled_from(SLOTS), st.booleans())
    def check(depth, style, slot, json_inputs):
        value = _nested(depth, style)
        text = BASE_YAML + slot.replace("VALUE", value) if slot.startswith("policies") or slot.startswith("desc") \
            else BASE_YAML.replace("edges:\n", slot.replace("VALUE", value) + "edges:\n")
        path.write_text(text, encoding="utf-8")
        outcome = plan_or_refuse(path, {"question": "q", "documents": ["d"]})
        ran["documents"] += 1
        if depth > 64 and style != 2:
            assert isinstance(outcome, GraphError) and any(p.code == "E_TOO_DEEP" for p in outcome.problems), outcome
            ran["too deep"] += 1
        if json_inputs:
            from rclc_graph.views.run_inputs import read_inputs

            inputs = workdir / "nested.json"
            inputs.write_text('{"question": ' + "[" * depth + "]" * depth + "}")
            try:
                read_inputs(inputs)
            except ValueError as error:  # a usage error naming the option, never a RecursionError
                assert isinstance(error, UsageError) and "--input" in str(error)

    check()
    assert ran["documents"] >= NESTED and ran["too deep"] > 0, ran
    print(f"nested documents: {ran}")


# issue 16 items 4 and 6 (fuzzed): plan sizes and input sizes are refused arithmetically, before
# anything is built (unrolling a loop beyond the node limit fails the test)
def test_huge_plans_and_inputs_are_refused_before_building(workdir, monkeypatch):
    import importlib

    validation = importlib.import_module("rclc_graph.plan.validate")  # the package exports a function of that name

    unroll = validation.unroll

    def bounded(spec, nodes, loops, loop_of, *implied):
        steps = sum(loops[loop_of[name]].rounds if name in loop_of else 1 for name in nodes)
        assert steps <= spec.rounds.max_nodes, "unrolling a plan larger than its limit"
        return unroll(spec, nodes, loops, loop_of, *implied)

    monkeypatch.setattr(validation, "unroll", bounded)
    ran = {"documents": 0, "refused": 0}
    path = workdir / "sizes.yaml"

    @settings(max_examples=SIZES, **FUZZ)
    @given(st.integers(1, 10**7), st.integers(1, 10**9), st.integers(1, 10**9), st.integers(0, 10**6),
           st.integers(0, 6 << 20))
    def check(rounds, limit, max_nodes, copies, question_bytes):
        text = BASE_YAML.replace("edges:\n", "").replace(
            "  - {source: reader, target: final, policy: {ratio: 4}}\n", "")
        text += (f"rounds: {{limit: {limit}, max_nodes: {max_nodes}}}\n"
                 "edges:\n  - {source: reader, target: final, policy: {ratio: 4}}\n"
                 f"  - {{source: final, target: final, rounds: {rounds}}}\n")
        path.write_text(text, encoding="utf-8")
        outcome = plan_or_refuse(path, {"question": "q" * max(question_bytes, 1), "documents": ["d"] * max(copies, 1)})
        if not isinstance(outcome, GraphError):
            assert len(outcome.nodes) <= min(max_nodes, 65536)
        ran["documents"] += 1
        ran["refused"] += isinstance(outcome, GraphError)

    check()
    assert ran["documents"] >= SIZES and ran["refused"] > SIZES // 2, ran
    print(f"size documents: {ran}")


SURROGATE = st.integers(0xD800, 0xDFFF).map(lambda code: f"\\u{code:04x}")


# issue 16 item 8 (fuzzed): lone surrogates anywhere are refused with their place, never a UnicodeEncodeError
def test_lone_surrogates_are_refused_where_they_are(workdir):
    ran = {"documents": 0, "refused": 0}
    path = workdir / "surrogate.yaml"

    @settings(max_examples=SURROGATES, **FUZZ)
    @given(SURROGATE, st.sampled_from(["description", "prompt", "system", "key", "input", "document"]),
           st.text(alphabet="abc xyzé日-_.", max_size=6))
    def check(escape, where, around):
        value = f'"{around}{escape}{around}"'
        text, inputs = BASE_YAML, {"question": "q", "documents": ["d"]}
        if where == "description":
            text += f"description: {value}\n"
        elif where == "prompt":
            text = text.replace('prompt: "{question}"', f"prompt: {value[:-1]} {{question}}\"")
        elif where == "system":
            text = text.replace("max_new_tokens: 8}", f"max_new_tokens: 8, system: {value}}}")
        elif where == "key":
            text += f"policies: {{{value}: {{ratio: 2}}}}\n"
        elif where == "input":
            inputs["question"] = json.loads(f'"{around}{escape}"')
        else:
            inputs["documents"] = ["fine", json.loads(f'"{escape}"')]
        path.write_text(text, encoding="utf-8")
        outcome = plan_or_refuse(path, inputs)
        ran["documents"] += 1
        assert isinstance(outcome, GraphError), where
        assert any(p.code in ("E_ENCODING", "E_FIELD") for p in outcome.problems), outcome
        ran["refused"] += 1

    check()
    assert ran["refused"] == ran["documents"] >= SURROGATES, ran
    print(f"surrogate documents: {ran}")


CONTROL_TEXT = st.lists(st.one_of(
    st.sampled_from(["<|im_end|>", "<|im_start|>", "system", "user", "assistant", "\n", "<|endoftext|>", "<|im", "_end|>",
                     "<think>", "</think>", "<tool_call>", "<|eot_id|>", "<|start_header_id|>", " ", "Cedar", "é"]),
    st.text(max_size=4),
), max_size=12).map("".join)


# issue 16 item 7 (fuzzed): whatever control-token text a user writes, only the template's turns exist
def test_control_token_text_never_becomes_a_turn():
    import rclc
    from rclc import testing
    from rclc_graph.executors.prompts import render_prompt

    tokenizer = testing.tiny_tokenizer()
    controls = {tokenizer.convert_tokens_to_ids(token) for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")}
    benign = {generation: [t for t in render_prompt(tokenizer, "sys", "x", generation_prompt=generation).ids
                           if t in controls] for generation in (False, True)}
    ran = {"prompts": 0}

    @settings(max_examples=CONTROLS, **FUZZ)
    @given(CONTROL_TEXT, CONTROL_TEXT, st.booleans())
    def check(system, content, generation):
        encoded = render_prompt(tokenizer, system or "sys", content or "x", generation_prompt=generation)
        assert [t for t in encoded.ids if t in controls] == benign[generation]
        assert tokenizer.decode(list(encoded.ids)) == encoded.text
        assert rclc.encode_literal(tokenizer, content).ids == tuple(
            t for t in rclc.encode_literal(tokenizer, content).ids if t not in controls)
        ran["prompts"] += 1

    check()
    assert ran["prompts"] >= CONTROLS, ran
    print(f"control-token prompts: {ran}")
