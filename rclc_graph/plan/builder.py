"""The Python builder: the same `GraphSpec` as a YAML file, written as code.

    g = Graph("qa")
    g.input("question").input("documents", "list[str]")
    g.model("base", "embedded")
    g.agent("reader", model="base", max_new_tokens=64)
    g.node("worker", agent="reader", prompt="{item}", foreach="documents", generate=False)
    g.node("final", agent="reader", prompt="{question}", output=True)
    g.edge("worker", "final", Policy(ratio=8, request="{question}"))
    plan = g.plan({"question": "...", "documents": [...]})

Function nodes take the callable itself (`g.function("lookup", find_order)`): it is not
imported, so it needs no trust_code; the spec names it by `module:qualname`, which is how a
YAML file (with trust_code) or a resume (`functions=graph.functions`) finds it again.
A subgraph node runs another topology whole (`g.subgraph("research", research_graph,
inputs={"topic": "{question}"})`): a `Graph` (its function callables come along), a
`GraphSpec` or a topology file; `to_yaml()` writes it inline.

Each call validates its own object at once (a bad field raises SpecError naming it);
whole-graph checks run in `validate()`/`plan()`. `to_yaml()` writes a file that loads back
into an equal spec. `chain_of_agents`, `fan_out`, `hierarchical` and `debate` return
ready-made builders that can still be edited.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Mapping, Sequence

import yaml
from pydantic import BaseModel, ValidationError

from ..errors import FieldPath, Problem, SpecError, UsageError
from ..spec.load import load_graph, problems_from_validation
from ..spec.models import (
    AgentSpec,
    EdgeSpec,
    GraphSpec,
    InputSpec,
    McpServerSpec,
    ModelSpec,
    NodeSpec,
    ReasoningSpec,
    RoundsSpec,
    TransferPolicy,
    is_callable_ref,
)
from .compile import compile_plan
from .dag import Plan
from .validate import Blueprint, validate


def Policy(**fields: Any) -> TransferPolicy:  # noqa: N802 - reads like the class it builds
    """A TransferPolicy; bad fields raise SpecError (with the code, path and fix) at once."""
    return _build(TransferPolicy, (), fields, whole=("policy",))


def Reasoning(**fields: Any) -> ReasoningSpec:  # noqa: N802
    """A ReasoningSpec for `Policy(reasoning=...)`; bad fields raise SpecError at once."""
    return _build(ReasoningSpec, (), fields, whole=("reasoning",))



def _build(model: type[BaseModel], path: FieldPath, data: dict[str, Any], *, whole: FieldPath = ()):
    """`model` from `data`, or SpecError with every problem's field path under `path`; a
    problem of the object as a whole (a check across its fields) is placed at `path`, or
    at `whole` when that is empty, so every refusal names a field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = problems_from_validation(exc, data, {}, model)
        raise SpecError(Problem(p.code, p.message, p.fix, path + (p.path or (() if path else whole)))
                        for p in problems) from None


def _check_key(kind: str, name: Any) -> None:
    """Names that become mapping keys must be text before they reach a dict (a list there
    is a TypeError, not a validation error)."""
    if not isinstance(name, str):
        raise SpecError.one("E_FIELD", f"{kind} name must be text, got {type(name).__name__} {name!r}",
                            "pass the name as a string", (kind,))


class Graph:
    """A topology written as code: each method adds one declaration (checked at once) and
    returns the graph, so calls chain; `spec()`, `validate()`, `plan()` and `to_yaml()` turn
    it into what a YAML file would give."""

    def __init__(self, name: str, *, description: str = "") -> None:
        _build(GraphSpec, (), {"name": name, "description": description})
        self.name = name
        self.description = description
        self._inputs: dict[str, InputSpec] = {}
        self._models: list[ModelSpec] = []
        self._mcp_servers: dict[str, McpServerSpec] = {}
        self._agents: list[AgentSpec] = []
        self._nodes: list[NodeSpec] = []
        self._edges: list[EdgeSpec] = []
        self._policies: dict[str, TransferPolicy] = {}
        self._rounds = RoundsSpec()
        self._functions: dict[str, Callable[..., Any]] = {}  # call reference -> the callable handed over

    @classmethod
    def from_spec(cls, spec: GraphSpec) -> Graph:
        """A builder holding everything `spec` declares, to edit a loaded topology in code."""
        graph = cls(spec.name, description=spec.description)
        graph._inputs = spec.input_specs()
        graph._models = list(spec.models)
        graph._mcp_servers = dict(spec.mcp_servers)
        graph._agents = list(spec.agents)
        graph._nodes = list(spec.nodes)
        graph._edges = list(spec.edges)
        graph._policies = dict(spec.policies)
        graph._rounds = spec.rounds
        return graph

    def input(self, name: str, type: str = "str", *, default: str | Sequence[str] | None = None, description: str = "") -> Graph:
        """Declare a run input (`type` "str" or "list[str]"), optionally with a default."""
        _check_key("inputs", name)
        data: dict[str, Any] = {"type": type, "description": description}
        if default is not None:
            data["default"] = list(default) if isinstance(default, (list, tuple)) else default  # else: validation refuses it
        spec = _build(InputSpec, ("inputs", name), data)
        _build(GraphSpec, (), {"name": self.name, "inputs": {name: spec}})  # checks the input name
        self._inputs[name] = spec
        return self

    def model(self, name: str, source: str = "embedded", **options: Any) -> Graph:
        """Declare a model (`source`: "embedded", a local path or a hub id; `options`: the
        other ModelSpec fields such as dtype, device, backend, replicas)."""
        self._add(self._models, "models", ModelSpec, {"name": name, "source": source, **options})
        return self

    def mcp_server(self, name: str, **fields: Any) -> Graph:
        """Declare an MCP server agents may take tools from (`tools=["mcp:<name>"]`): `command`
        (and `args`, `env`, `cwd`) to run it over stdio, or `url` to reach one on this machine;
        `tools` (an allowlist) and `startup_timeout` as in YAML (docs/yaml_reference.md)."""
        _check_key("mcp_servers", name)
        spec = _build(McpServerSpec, ("mcp_servers", name), fields)
        _build(GraphSpec, (), {"name": self.name, "mcp_servers": {name: spec}})  # checks the server name
        if name in self._mcp_servers:
            raise SpecError.one("E_DUPLICATE_NAME", f"MCP server {name!r} is declared twice",
                                "declare each server once", ("mcp_servers", name))
        self._mcp_servers[name] = spec
        return self

    def agent(self, name: str, *, model: str, system: str = "", **options: Any) -> Graph:
        """Declare an agent profile on a declared model (`options`: the other AgentSpec fields
        such as max_new_tokens, greedy, temperature, seed, context_limit, and `tools`: functions
        or "module:callable" references, see `tool_reference`)."""
        if isinstance(options.get("tools"), (list, tuple)):
            options["tools"] = [tool_reference(tool, ("agents", len(self._agents), "tools", index))
                                for index, tool in enumerate(options["tools"])]
        self._add(self._agents, "agents", AgentSpec, {"name": name, "model": model, "system": system, **options})
        return self

    def node(self, name: str, *, agent: str, prompt: str = "", **options: Any) -> Graph:
        """Declare a node run by `agent` with a prompt template (`options`: the other NodeSpec
        fields such as output, generate, foreach, item)."""
        self._add(self._nodes, "nodes", NodeSpec, {"name": name, "agent": agent, "prompt": prompt, **options})
        return self

    def function(
        self,
        name: str,
        fn: Callable[..., Any] | str,
        *,
        output: bool = False,
        description: str = "",
        **options: Any,
    ) -> Graph:
        """Declare a function node: `fn(inputs, senders)` runs instead of an agent (see
        executors/function_node.py for its contract). `fn` is a callable, defined at module
        level so records can name it (`module:qualname`), or such a reference as text (then
        importing it needs trust_code). `options`: foreach, item, interrupt, question, timeout
        (seconds the call may take; default 300)."""
        if isinstance(fn, str):
            reference = fn
        elif callable(fn):
            reference = f"{getattr(fn, '__module__', '')}:{getattr(fn, '__qualname__', '')}"
            if not is_callable_ref(reference):
                raise SpecError.one(
                    "E_FUNCTION", f"function {fn!r} has no importable name ({reference!r}): a lambda or a function "
                    "defined inside another one", "define the function at module level, so records and resumes can name it",
                    ("nodes", len(self._nodes), "call"))
            known = self._functions.get(reference)
            if known is not None and known is not fn:
                raise SpecError.one(
                    "E_FUNCTION", f"two different callables are both named {reference!r}",
                    "give one of them another name", ("nodes", len(self._nodes), "call"))
        else:
            raise SpecError.one("E_FIELD", f"fn must be a callable or a 'module:callable' text, got {type(fn).__name__}",
                                "pass the function itself", ("nodes", len(self._nodes), "call"))
        self._add(self._nodes, "nodes", NodeSpec,
                  {"name": name, "call": reference, "output": output, "description": description, **options})
        if not isinstance(fn, str):
            self._functions[reference] = fn
        return self

    def subgraph(
        self,
        name: str,
        graph: Graph | GraphSpec | str | os.PathLike[str],
        *,
        inputs: Mapping[str, str | Sequence[str]] | None = None,
        returns: str | None = None,
        output: bool = False,
        description: str = "",
        **options: Any,
    ) -> Graph:
        """Declare a subgraph node: `graph` runs whole as this one node (docs/graphs.md#subgraphs).
        `graph` is a builder (taken as it stands now, with its function callables), a GraphSpec,
        or a topology file's path (loaded at once). `inputs` maps the subgraph's inputs to
        templates over this node's variables; `returns` names the subgraph's output node whose
        output is this node's (default: its only one). `options`: foreach, item."""
        path = ("nodes", len(self._nodes), "graph")
        if isinstance(graph, Graph):
            for reference, function in graph._functions.items():
                known = self._functions.get(reference)
                if known is not None and known is not function:
                    raise SpecError.one("E_FUNCTION", f"two different callables are both named {reference!r}",
                                        "give one of them another name", path)
            child: Any = graph.spec()
        elif isinstance(graph, (str, os.PathLike)):
            child = load_graph(graph)
        else:
            child = graph
        data: dict[str, Any] = {"name": name, "graph": child, "output": output, "description": description, **options}
        if inputs is not None:
            data["inputs"] = {key: list(value) if isinstance(value, (list, tuple)) else value for key, value in inputs.items()}
        if returns is not None:
            data["returns"] = returns
        self._add(self._nodes, "nodes", NodeSpec, data)
        if isinstance(graph, Graph):
            self._functions.update(graph._functions)
        return self

    @property
    def functions(self) -> dict[str, Callable[..., Any]]:
        """The callables of function nodes, by `call` reference (pass to `resume_run(functions=...)`)."""
        return dict(self._functions)

    def edge(
        self,
        source: str,
        target: str,
        policy: TransferPolicy | str | None = None,
        *,
        rounds: int | None = None,
        when: Any = None,
        until: Any = None,
        description: str = "",
    ) -> Graph:
        """Declare an edge: `policy` is a TransferPolicy (`Policy(...)`), a mapping of its
        fields, or the name of a declared policy (None: state between two agents, text
        into or out of a function node); `rounds`
        makes it the closing edge of a bounded loop. `when` (a condition mapping such as
        {"contains": "billing"}, or a "module:callable" router) makes it fire only when the
        sender's output satisfies it; `until` on a loop edge stops the loop after the first
        round whose sender output satisfies it."""
        data: dict[str, Any] = {"source": source, "target": target, "description": description, "rounds": rounds}
        if policy is not None:
            data["policy"] = policy
        for key, value in (("when", when), ("until", until)):
            if value is not None:
                data[key] = value
        self._edges.append(_build(EdgeSpec, ("edges", len(self._edges)), data))
        return self

    def policy(self, name: str, policy: TransferPolicy) -> Graph:
        """A named policy edges can refer to by name (change it once, every edge follows)."""
        _check_key("policies", name)
        _build(GraphSpec, (), {"name": self.name, "policies": {name: policy}})
        self._policies[name] = policy
        return self

    def limits(self, *, rounds: int | None = None, max_nodes: int | None = None) -> Graph:
        """Set the graph's bounds: the most loop rounds and the most plan nodes."""
        data = self._rounds.model_dump()
        data.update({key: value for key, value in (("limit", rounds), ("max_nodes", max_nodes)) if value is not None})
        self._rounds = _build(RoundsSpec, ("rounds",), data)
        return self

    def spec(self) -> GraphSpec:
        """The GraphSpec of everything declared so far (what loading a YAML file gives)."""
        return GraphSpec(
            name=self.name,
            description=self.description,
            inputs=dict(self._inputs),
            models=list(self._models),
            mcp_servers=dict(self._mcp_servers),
            agents=list(self._agents),
            nodes=list(self._nodes),
            edges=list(self._edges),
            policies=dict(self._policies),
            rounds=self._rounds,
        )

    def validate(self, *, trust_code: bool = False) -> Blueprint:
        """Whole-graph checks without inputs; PlanError listing every problem."""
        return validate(self.spec(), trust_code=trust_code, functions=self._functions)

    def plan(
        self, inputs: Mapping[str, Any], *, trust_code: bool = False, answers: Mapping[str, str] | None = None
    ) -> Plan:
        """Validate and compile the graph for one run's inputs (and people's answers to its
        interrupts, by plan node name)."""
        return compile_plan(self.spec(), inputs, trust_code=trust_code, answers=answers, functions=self._functions)

    def to_yaml(self) -> str:
        """The topology as YAML text that loads back into an equal spec."""
        return to_yaml(self.spec())

    def _add(self, items: list, kind: str, model: type[BaseModel], data: dict[str, Any]) -> None:
        built = _build(model, (kind, len(items)), data)
        for index, existing in enumerate(items):
            if existing.name == built.name:
                raise SpecError.one(
                    "E_DUPLICATE_NAME",
                    f"{kind[:-1]} {built.name!r} is already declared (as {kind}[{index}])",
                    "choose another name",
                    (kind, len(items), "name"),
                )
        items.append(built)


def tool_reference(tool: Any, path: tuple[Any, ...] = ("tools",)) -> Any:
    """A tool as the topology names it: "module:qualified.name" for a function, a string as is.

    A topology holds references, not objects, so it writes out as YAML and every process (a
    Ray actor too) imports the same function. So a tool must be reachable by import: a
    function defined at the top level of an importable module. Lambdas, nested functions and
    functions of the script being run (`__main__`) are refused with that fix.
    """
    if isinstance(tool, str) or not callable(tool):
        return tool  # a reference (checked by AgentSpec), or a value AgentSpec refuses
    module = getattr(tool, "__module__", None)
    qualname = getattr(tool, "__qualname__", None)
    fix = ("define the tool with def at the top level of a module (a .py file your script imports) and pass that "
           "function, or pass 'module:function'")
    if not module or not qualname or "<" in qualname or module == "__main__":
        raise SpecError.one("E_FIELD", f"tool {tool!r} cannot be named by import (module {module!r}, "
                            f"name {qualname!r})", fix, path)
    target: Any = sys.modules.get(module)
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if target is not tool:
        raise SpecError.one("E_FIELD", f"tool {module}:{qualname} does not import back as the function given", fix, path)
    return f"{module}:{qualname}"


# -- YAML output -----------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    pass


# Characters YAML reads as line breaks (NEL, LS, PS) or strips (BOM): written raw, as allow_unicode
# writes them in plain, quoted and block styles, they load back as spaces or not at all.
_UNSAFE_RAW = frozenset("\x85\u2028\u2029\ufeff")


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if _UNSAFE_RAW.intersection(value):
        style: str | None = '"'  # double quotes escape them (\N, \L, \P, \uFEFF)
    else:
        style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def _short_inputs(data: dict[str, Any]) -> None:
    """Inputs in the `question: str` shorthand where nothing else is set, subgraphs' too."""
    inputs = data.get("inputs", {})
    for name, value in inputs.items():
        if set(value) <= {"type"}:
            inputs[name] = value.get("type", "str")
    for node in data.get("nodes", []):
        if isinstance(node.get("graph"), dict):
            _short_inputs(node["graph"])


def to_yaml(spec: GraphSpec) -> str:
    """The spec as a minimal YAML topology (defaults left out) that loads back equal."""
    data = spec.model_dump(mode="json", exclude_defaults=True)
    _short_inputs(data)
    ordered = {"version": spec.version, **data}
    return yaml.dump(ordered, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


# -- ready-made topologies ---------------------------------------------------------------------

WORKER_SYSTEM = "You read one part of a long text for a colleague. Keep what helps answer the question."
FINAL_SYSTEM = "You answer the question from what your colleagues read. Answer briefly."


def _base(name: str, source: str, description: str) -> Graph:
    graph = Graph(name, description=description)
    graph.input("question", description="what the final agent must answer")
    graph.model("base", source)
    return graph


def _generate(policy: TransferPolicy, generate: bool | None) -> bool:
    return policy.mode == "text" if generate is None else generate


def chain_of_agents(
    n: int,
    *,
    policy: TransferPolicy | None = None,
    source: str = "embedded",
    worker_generate: bool | None = None,
    max_new_tokens: int = 64,
    name: str = "chain_of_agents",
) -> Graph:
    """n workers read chunks[0..n-1] in turn, each inheriting what the previous one passed on,
    and a final agent answers. Workers only read (no decoding) unless the policy is text."""
    policy = policy or Policy()
    if n < 1:
        raise UsageError("n: expected at least 1 worker")
    graph = _base(name, source, f"chain of {n} workers reading one chunk each, then a final answer")
    graph.input("chunks", "list[str]", description=f"the long text cut into {n} parts")
    graph.agent("worker", model="base", system=WORKER_SYSTEM, max_new_tokens=max_new_tokens)
    graph.agent("final", model="base", system=FINAL_SYSTEM, max_new_tokens=max_new_tokens)
    graph.policy("handoff", policy)
    generate = _generate(policy, worker_generate)
    for index in range(n):
        graph.node(
            f"worker_{index + 1}",
            agent="worker",
            prompt=f"Question: {{question}}\nPart {index + 1} of {n}:\n{{chunks[{index}]}}",
            generate=generate,
        )
    graph.node("final", agent="final", prompt="Question: {question}\nAnswer:", output=True)
    for index in range(1, n):
        graph.edge(f"worker_{index}", f"worker_{index + 1}", "handoff")
    graph.edge(f"worker_{n}", "final", "handoff")
    return graph


def fan_out(
    n: int | None = None,
    *,
    policy: TransferPolicy | None = None,
    source: str = "embedded",
    worker_generate: bool | None = None,
    max_new_tokens: int = 64,
    name: str = "fanout_qa",
) -> Graph:
    """Workers read one document each in parallel; a final agent answers from all of them.
    `n` fixes the number of workers (documents[0..n-1]); None makes one worker per document."""
    policy = policy or Policy()
    graph = _base(name, source, "parallel workers over documents, one aggregating answer")
    graph.input("documents", "list[str]", description="one document per worker")
    graph.agent("worker", model="base", system=WORKER_SYSTEM, max_new_tokens=max_new_tokens)
    graph.agent("final", model="base", system=FINAL_SYSTEM, max_new_tokens=max_new_tokens)
    graph.policy("handoff", policy)
    generate = _generate(policy, worker_generate)
    workers: list[str] = []
    if n is None:
        graph.node("worker", agent="worker", prompt="Question: {question}\nDocument:\n{document}",
                   foreach="documents", item="document", generate=generate)
        workers.append("worker")
    else:
        if n < 1:
            raise UsageError("n: expected at least 1 worker, or None for one per document")
        for index in range(n):
            workers.append(f"worker_{index + 1}")
            graph.node(workers[-1], agent="worker", prompt=f"Question: {{question}}\nDocument:\n{{documents[{index}]}}",
                       generate=generate)
    graph.node("final", agent="final", prompt="Question: {question}\nAnswer:", output=True)
    for worker in workers:
        graph.edge(worker, "final", "handoff")
    return graph


def hierarchical(
    groups: int,
    per_group: int,
    *,
    policy: TransferPolicy | None = None,
    manager_policy: TransferPolicy | None = None,
    source: str = "embedded",
    max_new_tokens: int = 64,
    name: str = "hierarchical",
) -> Graph:
    """groups x per_group workers (one document each) report to their group's manager;
    managers report to one final agent. Managers only read unless manager_policy is text."""
    policy = policy or Policy()
    manager_policy = manager_policy or policy
    if groups < 1 or per_group < 1:
        raise UsageError("groups, per_group: expected at least 1 each")
    graph = _base(name, source, f"{groups} groups of {per_group} workers, group managers, one final answer")
    graph.input("documents", "list[str]", description=f"{groups * per_group} documents, group by group")
    graph.agent("worker", model="base", system=WORKER_SYSTEM, max_new_tokens=max_new_tokens)
    graph.agent("manager", model="base", system="You combine what your workers found.", max_new_tokens=max_new_tokens)
    graph.agent("final", model="base", system=FINAL_SYSTEM, max_new_tokens=max_new_tokens)
    graph.node("final", agent="final", prompt="Question: {question}\nAnswer:", output=True)
    graph.policy("handoff", policy).policy("report", manager_policy)
    for group in range(1, groups + 1):
        manager = f"manager_{group}"
        graph.node(manager, agent="manager", prompt="Question: {question}\nWhat did your group find?",
                   generate=_generate(manager_policy, None))
        for member in range(1, per_group + 1):
            index = (group - 1) * per_group + member - 1
            worker = f"worker_{group}_{member}"
            graph.node(worker, agent="worker", prompt=f"Question: {{question}}\nDocument:\n{{documents[{index}]}}",
                       generate=_generate(policy, None))
            graph.edge(worker, manager, "handoff")
        graph.edge(manager, "final", "report")
    return graph


def debate(
    agents: Sequence[str] | int,
    rounds: int,
    *,
    policy: TransferPolicy | None = None,
    source: str = "embedded",
    memory: bool = True,
    max_new_tokens: int = 64,
    name: str = "debate",
) -> Graph:
    """Debaters answer in turn for `rounds` rounds (a1 -> b1 -> a2 -> b2 ...), each reading the
    others' latest turns (and, with memory, its own previous turn); a judge decides.
    Defaults to text edges, since debaters must write their arguments."""
    policy = policy or Policy(mode="text")
    names = [f"debater_{index + 1}" for index in range(agents)] if isinstance(agents, int) else list(agents)
    if len(names) < 2:
        raise UsageError("agents: a debate needs at least 2 debaters")
    graph = _base(name, source, f"{len(names)} debaters for {rounds} rounds, then a judge")
    for debater in names:
        graph.agent(debater, model="base", system=f"You are {debater} in a debate. Argue briefly and honestly.",
                    max_new_tokens=max_new_tokens)
        graph.node(debater, agent=debater, prompt="Round {round}. Question: {question}\nYour answer and one reason:")
    graph.agent("judge", model="base", system="You judge a debate and give the final answer.", max_new_tokens=max_new_tokens)
    graph.node("judge", agent="judge", prompt="Question: {question}\nFinal answer:", output=True)
    graph.policy("turn", policy)
    for i, speaker in enumerate(names):
        for j, listener in enumerate(names):
            if i < j:
                graph.edge(speaker, listener, "turn")
            elif i > j or memory:
                graph.edge(speaker, listener, "turn", rounds=rounds)
    for debater in names:
        graph.edge(debater, "judge", "turn")
    return graph
