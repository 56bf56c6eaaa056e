"""What a user writes: pydantic models of a graph (models, agents, nodes, edges, policies, inputs).

Every model forbids unknown fields (a typo is an error, not a silently ignored key) and is
strict (`ratio: "4"` is refused rather than coerced) and frozen. Checks that need one object
only live here, so YAML and the builder both hit them at once; checks that need the whole
graph (references, cycles, models across edges, template fields) live in `plan/validate.py`.

Mode-specific policy options default to None, meaning "the default for this mode"; the plan
resolves them (`selector` -> cacheback, neither `ratio` nor `budget` -> ratio 4,
`representation` -> embeddings). Keeping None here lets the spec refuse options that make no
sense for a mode (a `selector` on a `text` edge) and keeps dumped YAML minimal.

The closed sets of names (modes, representations, reasoning contexts, backends, built-in
selectors and reasoning methods) are `rclc.policy`'s tuples, the ones the transfer core runs
on, so a spec cannot accept a name the core refuses. `rclc.policy` imports no torch.
"""

from __future__ import annotations

import copy
import re
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Tag,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from rclc.policy import (
    ALLOCATIONS,
    ATTENTION_SELECTORS,
    BACKENDS,
    BASELINE_SELECTORS,
    BUILTIN_REASONING,
    BUILTIN_SELECTORS,
    DEFAULT_MAX_BATCH,
    DEFAULT_WAIT_MS,
    DEFAULT_WORKER_FORWARDS,
    EXCLUSION_REASONS,
    MODES,
    REASONING_CONTEXTS,
    REPRESENTATIONS,
    SPAN_KINDS,
)

from . import templates
from .predicates import Condition
from ..errors import UsageError

SCHEMA_VERSION = 1
RESERVED_VARIABLES = ("index", "round")  # node variables the plan provides
ANSWER_VARIABLE = "answer"  # the human's answer, a variable of nodes with `interrupt: before`
MAX_NODE_TEXT_BYTES = 1 << 20  # UTF-8 bytes of one node's output, and of one answer (records, events, reports)
DEFAULT_FUNCTION_TIMEOUT = 300.0  # seconds a function node's call may take unless its `timeout` says otherwise

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,99}$")  # at most 100 characters: names become file names
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_CALLABLE_REF = re.compile(rf"^{_DOTTED}:{_DOTTED}$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:[0-9]+)?)$")
_PATH_PREFIXES = ("/", "./", "../", "~")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HTTP_URL = re.compile(r"^https?://[^\s/?#]+(?:/[^\s?#]*)?$")

API_BACKEND = "openai"
"""The graph-level backend of models served over an OpenAI-compatible HTTP API: no rclc state."""
MODEL_BACKENDS = (*BACKENDS, API_BACKEND)
_API_FIELDS = ("base_url", "model", "api_key_env", "timeout", "max_retries")
_LOCAL_FIELDS = ("source", "dtype", "device", "batching")
MAX_TOOL_CALLS = 32  # a tool loop is bounded; this caps what a file may ask for


def _error(code: str, message: str, fix: str) -> PydanticCustomError:
    # Our stable code travels as the pydantic error type; load.py maps it back to a Problem.
    return PydanticCustomError(code, message, {"fix": fix})


def _check_name(value: str) -> str:
    if not _NAME.match(value):
        shown = value if len(value) <= 40 else f"{value[:37]}..."
        raise _error(
            "E_FIELD",
            f"name {shown!r} is not allowed" + (f" ({len(value)} characters)" if len(value) > 100 else ""),
            "use at most 100 letters, digits, '_' and '-', starting with a letter or '_' (brackets and '@' are "
            "reserved for expanded nodes such as worker[0] and a@2)",
        )
    return value


def _check_ident(value: str) -> str:
    if not _IDENT.match(value):
        raise _error(
            "E_FIELD",
            f"{value!r} is not usable as a template variable",
            "use letters, digits and '_', starting with a letter or '_'",
        )
    return value


def _check_template(value: str) -> str:
    try:
        templates.fields(value)
    except ValueError as exc:
        raise _error("E_TEMPLATE", str(exc), "fix the braces; literal braces are written {{ and }}") from None
    return value


def is_callable_ref(value: str) -> bool:
    """True for "package.module:function" references (user code; needs trust_code)."""
    return bool(_CALLABLE_REF.match(value))


def tool_name(reference: str) -> str:
    """The name a model calls a tool by: its function's own name ("shop:orders.lookup" -> "lookup")."""
    return reference.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


Name = Annotated[str, AfterValidator(_check_name), WithJsonSchema({"type": "string", "pattern": _NAME.pattern})]
Ident = Annotated[str, AfterValidator(_check_ident), WithJsonSchema({"type": "string", "pattern": _IDENT.pattern})]
Template = Annotated[str, AfterValidator(_check_template)]
InputType = Literal["str", "list[str]"]
OptionValue = Union[bool, int, float, str]


def _builtin_or_callable(value: str, what: str, builtins: tuple[str, ...]) -> str:
    """`value` when it names a built-in or a package.module:callable, else E_FIELD."""
    if value not in builtins and not is_callable_ref(value):
        raise _error(
            "E_FIELD",
            f"{what} {value!r} is unknown",
            f"use one of {', '.join(builtins)} or package.module:callable",
        )
    return value


class _Spec(BaseModel):
    # allow_inf_nan=False: `temperature: .inf` is refused here, not after the model loaded
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


def _changed(spec: BaseModel, names: tuple[str, ...]) -> list[str]:
    """The fields of `names` whose value is not their default. (Not `model_fields_set`: a
    record's spec is dumped with every default written out and must validate again.)"""
    fields = type(spec).model_fields
    return [name for name in names if getattr(spec, name) != fields[name].get_default(call_default_factory=True)]


class BatchingSpec(_Spec):
    """How concurrent generations on a model share its forwards (`rclc.Batching`)."""

    enabled: bool = Field(True, description="decode concurrent generations together (false: one at a time)")
    max_batch: PositiveInt = Field(DEFAULT_MAX_BATCH, description="sequences decoded together at most")
    wait_ms: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        DEFAULT_WAIT_MS, description="how long a decode step with room waits for another sequence (ms)"
    )
    worker_forwards: PositiveInt = Field(
        DEFAULT_WORKER_FORWARDS,
        description="prefills, selectors' captures and refreshes the model runs at once, each in its caller's "
        "worker thread (hf models)",
    )


class ModelSpec(_Spec):
    """A model, loaded once per process and shared by every node whose agent names it."""

    name: Name
    source: str = Field(
        "embedded",
        description="'embedded' (the bundled SmolLM2-135M-Instruct), a local path (starting with /, ./, ../ "
        "or ~; relative to the YAML file) or a hub id owner/name",
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    device: str = Field("auto", description="auto, cpu, mps, cuda or cuda:N")
    backend: Literal[MODEL_BACKENDS] = "hf"  # type: ignore[valid-type]
    base_url: str | None = Field(
        None, description="backend openai: the server's OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1"
    )
    model: str | None = Field(None, description="backend openai: the model name the server serves")
    api_key_env: str | None = Field(
        None, description="backend openai: the NAME of an environment variable holding the API key (never the key)"
    )
    timeout: PositiveFloat = Field(60.0, description="backend openai: seconds one request may take")
    max_retries: NonNegativeInt = Field(
        2, le=10, description="backend openai: retries (with backoff) after a timeout, 408, 409, 429 or 5xx"
    )
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="what each replica holds on Ray ({CPU: 1} by default, {GPU: 1}, custom resources); unused in-process",
    )
    replicas: PositiveInt = Field(
        1, description="Ray actors holding this model (executor ray); in-process runs use one copy"
    )
    batching: BatchingSpec | None = Field(
        None,
        description="how concurrent generations share this model (enabled, max_batch, wait_ms); "
        "omitted: rclc's defaults, or what the process configured",
    )

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        if source_kind(value) is None:
            raise _error(
                "E_FIELD",
                f"source {value!r} is neither 'embedded', a path nor a hub id",
                "write 'embedded', a path starting with ./, ../, / or ~, or a hub id such as owner/name",
            )
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise _error("E_FIELD", f"device {value!r} is not recognised", "use auto, cpu, mps, cuda or cuda:N")
        return value

    @field_validator("resources")
    @classmethod
    def _resources(cls, value: dict[str, float]) -> dict[str, float]:
        for key, amount in value.items():
            if amount < 0:
                raise _error("E_FIELD", f"resources.{key} is negative ({amount})", "use an amount >= 0")
        return value

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str | None) -> str | None:
        if value is not None and not _HTTP_URL.match(value):
            raise _error("E_FIELD", f"base_url {value!r} is not an http(s) URL", "write e.g. http://127.0.0.1:8000/v1")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _api_key_env(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise _error(
                "E_FIELD",
                f"api_key_env {value!r} is not an environment variable name",
                "name the variable that holds the key (e.g. OPENAI_API_KEY); never write the key itself in a file",
            )
        return value

    @model_validator(mode="after")
    def _backend_fields(self) -> ModelSpec:
        if self.backend == API_BACKEND:
            missing = [name for name in ("base_url", "model") if getattr(self, name) is None]
            if missing:
                raise _error(
                    "E_FIELD",
                    f"backend openai needs {' and '.join(missing)}",
                    "set base_url (e.g. http://127.0.0.1:8000/v1) and model (the name the server serves)",
                )
            local = _changed(self, _LOCAL_FIELDS)
            if local:
                raise _error(
                    "E_FIELD",
                    f"backend openai does not use {', '.join(local)} (the server holds the weights)",
                    f"remove {', '.join(local)}",
                )
        else:
            api = _changed(self, _API_FIELDS)
            if api:
                raise _error(
                    "E_FIELD",
                    f"{', '.join(api)} apply to backend openai only",
                    f"set backend: openai, or remove {', '.join(api)}",
                )
        return self

    @property
    def is_api(self) -> bool:
        """Whether this model is served over an OpenAI-compatible API (no local weights, no state)."""
        return self.backend == API_BACKEND

    @property
    def source_kind(self) -> str:
        """"embedded", "path" or "hub": how the pool finds the weights."""
        return source_kind(self.source) or "hub"


def source_kind(source: str) -> str | None:
    """"embedded", "path", "hub", or None when `source` is none of them."""
    if source == "embedded":
        return "embedded"
    if source.startswith(_PATH_PREFIXES) or re.match(r"^[A-Za-z]:[\\/]", source):
        return "path"
    if _HUB_ID.match(source):
        return "hub"
    return None


class AgentSpec(_Spec):
    """An agent profile: which model, what system prompt, how it generates.

    Generation is greedy unless `temperature` is set; `top_p` needs a temperature.
    """

    name: Name
    model: Name
    description: str = ""
    system: str = Field("", description="system prompt; empty means none")
    max_new_tokens: PositiveInt = 128
    temperature: float | None = Field(None, gt=0, description="set to sample; absent means greedy")
    top_p: float | None = Field(None, gt=0, le=1)
    seed: NonNegativeInt | None = Field(None, le=2**64 - 1, description="sampling seed (torch takes up to 2**64 - 1)")
    context_limit: PositiveInt | None = Field(None, description="positions; default: the model's own limit")
    tools: list[str] = Field(
        default_factory=list,
        description="package.module:callable functions the agent may call (needs trust_code); see max_tool_calls",
    )
    max_tool_calls: PositiveInt = Field(
        4, le=MAX_TOOL_CALLS, description="the most tool calls one node makes before its answer (needs tools)"
    )
    tool_timeout: PositiveFloat = Field(
        30.0, description="seconds one tool call may take; a slower call becomes an error result (needs tools)"
    )

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[str]) -> list[str]:
        for reference in value:
            if not is_callable_ref(reference):
                raise _error(
                    "E_FIELD",
                    f"tool {reference!r} is not a package.module:callable reference",
                    "name an importable function, e.g. shop_tools:lookup_order",
                )
        if len(set(value)) != len(value):
            raise _error("E_FIELD", "a tool is listed twice", "list each tool once")
        names = [tool_name(reference) for reference in value]
        if len(set(names)) != len(names):
            raise _error(
                "E_FIELD",
                "two tools share a function name (the model calls tools by name)",
                "give each tool function its own name",
            )
        return value

    @model_validator(mode="after")
    def _sampling(self) -> AgentSpec:
        if self.top_p is not None and self.temperature is None:
            raise _error("E_FIELD", "top_p is set but generation is greedy", "set temperature as well, or drop top_p")
        loop = _changed(self, ("max_tool_calls", "tool_timeout"))
        if loop and not self.tools:
            raise _error("E_FIELD", f"{', '.join(loop)} set without tools", f"add tools, or remove {', '.join(loop)}")
        return self

    @property
    def greedy(self) -> bool:
        """Whether the agent decodes greedily (no temperature): reruns give the same text."""
        return self.temperature is None


class ReasoningSpec(_Spec):
    """Latent reasoning rows a sender appends before it transmits (see the core's `reasoning`)."""

    method: str = Field("latent_mass", description="'latent_mass' or module:callable (needs trust_code)")
    steps: NonNegativeInt = 40
    context: Literal[REASONING_CONTEXTS] = "full"  # type: ignore[valid-type]
    budget: PositiveInt | None = Field(None, description="rows reserved; required for selected contexts")

    @field_validator("method")
    @classmethod
    def _method(cls, value: str) -> str:
        return _builtin_or_callable(value, "reasoning method", BUILTIN_REASONING)

    @model_validator(mode="after")
    def _budget(self) -> ReasoningSpec:
        if self.context.startswith("selected") and self.budget is None:
            raise _error(
                "E_POLICY",
                f"reasoning context {self.context!r} runs after selection and needs a budget",
                "set reasoning.budget to the rows to reserve (e.g. the number of steps)",
            )
        return self


_STATE_ONLY = ("ratio", "budget", "selector", "selector_options", "span", "max_span", "relevance", "exclude", "allocation")
_SPAN_FIELDS = ("span", "max_span", "relevance")
_NOT_TEXT = _STATE_ONLY + ("reasoning", "representation", "request")


class TransferPolicy(_Spec):
    """How state moves along an edge.

    mode `state`: the core's receiver-conditioned compressed handoff (ratio xor budget,
    selector, reasoning, representation, request). `full`: the sender's whole state
    (reasoning and representation apply). `text`: the sender generates text that the
    receiver reads in its prompt (no state options).
    """

    mode: Literal[MODES] = "state"  # type: ignore[valid-type]
    ratio: PositiveInt | None = Field(None, description="relative budget rX: keep I + ceil((T - I) / X)")
    budget: PositiveInt | None = Field(None, description="bounded budget B: keep min(B, T)")
    selector: str | None = Field(None, description=f"{', '.join(BUILTIN_SELECTORS)} or module:callable")
    selector_options: dict[str, OptionValue] = Field(default_factory=dict, description="e.g. span_size: 4")
    span: Literal[SPAN_KINDS] | None = Field(  # type: ignore[valid-type]
        None,
        description="how cacheback, qsnap and chunkkv cut the sender into spans they keep whole: fixed (the "
        "span_size grid), sentence, paragraph or line; default: the graph's default (docs/yaml_reference.md)",
    )
    max_span: PositiveInt | None = Field(
        None, description="split spans longer than this many positions into near-equal pieces; default: the graph's"
    )
    relevance: float | None = Field(
        None, ge=0, le=1,
        description="keep only spans scoring at least this fraction of the best one (pooled: of the best across the "
        "group's senders), so a sender holding little that is relevant sends little; 0 keeps the whole budget; "
        "default: the graph's",
    )
    exclude: list[Literal[EXCLUSION_REASONS]] | None = Field(  # type: ignore[valid-type]
        None,
        description="what selection passes over: template (chat markup), instruction (the sender's system prompt and "
        "template text), known (text the receiver holds); [] passes nothing over; default: the graph's default",
    )
    allocation: Literal[ALLOCATIONS] | None = Field(  # type: ignore[valid-type]
        None,
        description="per_sender: each sender keeps its own budget; pooled: a transfer group's total goes to the best "
        "spans across its senders (cacheback, qsnap, chunkkv); default: the graph's default",
    )
    reasoning: ReasoningSpec | None = None
    representation: Literal[REPRESENTATIONS] | None = None  # type: ignore[valid-type]
    request: Template | None = Field(
        None, description="what the receiver needs (conditions selection); default: the receiver's prompt"
    )

    @field_validator("selector")
    @classmethod
    def _selector(cls, value: str | None) -> str | None:
        return None if value is None else _builtin_or_callable(value, "selector", BUILTIN_SELECTORS)

    @field_validator("exclude")
    @classmethod
    def _exclude(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise _error("E_FIELD", f"exclude lists a reason twice: {value}", "name each reason once")
        return value

    @model_validator(mode="after")
    def _options_fit_mode(self) -> TransferPolicy:
        if self.ratio is not None and self.budget is not None:
            raise _error(
                "E_POLICY",
                "ratio and budget are both set",
                "keep one: ratio is relative (rX), budget is bounded (B positions)",
            )
        refused = _NOT_TEXT if self.mode == "text" else _STATE_ONLY if self.mode == "full" else ()
        present = [name for name in refused if getattr(self, name) not in (None, {})]
        if present:
            raise _error(
                "E_POLICY",
                f"mode {self.mode!r} does not use {', '.join(present)}",
                f"remove {', '.join(present)}, or use mode: state",
            )
        self._check_selection_fields()
        return self

    def _check_selection_fields(self) -> None:
        """span, max_span, relevance and allocation need a selector that has spans and scores."""
        twice = [name for name in _SPAN_FIELDS if getattr(self, name) is not None and name in self.selector_options]
        if twice:
            raise _error(
                "E_POLICY",
                f"{', '.join(twice)} is set both as a policy field and in selector_options",
                f"keep one: the policy field {twice[0]}: ..., or selector_options.{twice[0]}",
            )
        selector = self.selector
        if selector in BASELINE_SELECTORS:
            spans = [name for name in _SPAN_FIELDS if getattr(self, name) is not None]
            if spans:
                raise _error(
                    "E_POLICY",
                    f"selector {selector!r} keeps no spans, so {', '.join(spans)} does not apply",
                    f"remove {', '.join(spans)}, or use one of {', '.join(ATTENTION_SELECTORS)}",
                )
        if self.allocation == "pooled" and selector is not None and selector not in ATTENTION_SELECTORS:
            raise _error(
                "E_POLICY",
                f"allocation 'pooled' ranks every sender's positions by the selector's scores; selector {selector!r} has none",
                f"use one of {', '.join(ATTENTION_SELECTORS)}, or allocation: per_sender",
            )


def _policy_kind(value: Any) -> str:
    return "named" if isinstance(value, str) else "inline"


PolicyRef = Annotated[
    Union[Annotated[TransferPolicy, Tag("inline")], Annotated[Name, Tag("named")]],
    Discriminator(_policy_kind),
]


class NodeSpec(_Spec):
    """One step of the graph: an agent reading a prompt (rendered from the run's inputs) plus
    whatever its senders hand over, or a Python function (`call`) reading the run's inputs
    and its senders' texts.

    `foreach: documents` repeats the node once per item of the list input `documents`
    (nodes `name[0]`, `name[1]`, ...); inside, `{item}` (or the name set by `item`) is that
    item and `{index}` its position. Nodes in a bounded loop also see `{round}` (1-based).
    `interrupt` stops the run for a person (`before` the node runs, or `after` it ran) and
    asks `question`; their answer continues it (docs/graphs.md#human-in-the-loop).
    """

    name: Name
    # `call` is declared before `agent` so that `agent`'s check can see it (pydantic validates in order)
    call: str | None = Field(
        None, description="package.module:callable: a function node instead of an agent (needs trust_code)"
    )
    agent: Name | None = Field(None, validate_default=True, description="the agent that runs this node (or give call)")
    description: str = ""
    prompt: Template = ""
    generate: bool = Field(True, description="false: only read and pass state on (no decoding)")
    output: bool = Field(False, description="true: an answer node of the run")
    foreach: Ident | None = Field(None, description="a list[str] input: one copy of the node per item")
    item: Ident = Field("item", description="the template variable holding the current foreach item")
    interrupt: Literal["before", "after"] | None = Field(
        None, description="stop the run for a person's answer before this node runs, or after it ran"
    )
    question: Template | None = Field(None, description="what the person is asked (with interrupt)")
    timeout: PositiveFloat | None = Field(
        None, description=f"function nodes: seconds the call may take (default {DEFAULT_FUNCTION_TIMEOUT:g}); "
        "a slower call fails the node"
    )

    @field_validator("call")
    @classmethod
    def _call(cls, value: str | None) -> str | None:
        if value is not None and not is_callable_ref(value):
            raise _error("E_FIELD", f"call {value!r} is not a package.module:callable reference",
                         "write the function's module and name, e.g. mypackage.lookups:find_order")
        return value

    @field_validator("agent")
    @classmethod
    def _agent_or_call(cls, value: str | None, info: ValidationInfo) -> str | None:
        call = info.data.get("call")
        if value is None and call is None and "call" in info.data:
            # type "missing", so the error's path names the absent field (spec/load.py)
            raise PydanticCustomError("missing", "required field 'agent' is missing",
                                      {"fix": "add agent: NAME, or call: package.module:function for a function node"})
        if value is not None and call is not None:
            raise _error("E_FIELD", f"node has both agent {value!r} and call {call!r}",
                         "keep agent for a model node, or call for a function node")
        return value

    @model_validator(mode="after")
    def _item_needs_foreach(self) -> NodeSpec:
        if self.foreach is None and self.item != "item":
            raise _error("E_FIELD", f"item {self.item!r} is set without foreach", "add foreach: <list input>, or drop item")
        if self.item in RESERVED_VARIABLES + (ANSWER_VARIABLE,):
            raise _error("E_FIELD", f"item {self.item!r} is a reserved variable", "choose another item name")
        return self

    @model_validator(mode="after")
    def _function_fields(self) -> NodeSpec:
        if self.call is not None:
            used = [name for name in ("prompt", "generate") if name in self.model_fields_set
                    and getattr(self, name) != type(self).model_fields[name].default]
            if used:
                raise _error("E_FUNCTION", f"function node {self.name!r} sets {', '.join(used)}, which only agents use",
                             f"remove {', '.join(used)}: a function receives the run's inputs and its senders' texts")
        if self.timeout is not None and self.call is None:
            raise _error("E_FIELD", f"node {self.name!r} sets timeout, which only function nodes use",
                         "remove timeout (an agent's generation is bounded by max_new_tokens), or add call:")
        if self.question is not None and self.interrupt is None:
            raise _error("E_INTERRUPT", f"node {self.name!r} has a question but no interrupt",
                         "add interrupt: before (or after), or remove question")
        return self

    @property
    def is_function(self) -> bool:
        """Whether a Python callable runs this node (`call`) instead of an agent."""
        return self.call is not None


class EdgeSpec(_Spec):
    """A handoff from `source` to `target`. `policy` is inline or the name of a graph policy.

    `rounds: k` marks a loop edge: it feeds round r of its loop into round r + 1, and the
    loop is unrolled k times at compile time. Every cycle must pass through a loop edge.
    `when` makes the edge conditional on the sender's output; `until` (on a loop edge)
    stops the loop after the first round whose sender output satisfies it
    (spec/predicates.py is the condition language).
    """

    source: Name
    target: Name
    description: str = ""
    policy: PolicyRef = Field(default_factory=TransferPolicy)
    rounds: PositiveInt | None = None
    when: Condition | None = Field(None, description="fire only when the sender's output satisfies this condition")
    until: Condition | None = Field(
        None, description="on a loop edge: stop the loop after the first round whose sender output satisfies this"
    )

    @model_validator(mode="after")
    def _until_needs_rounds(self) -> EdgeSpec:
        if self.until is not None and self.rounds is None:
            raise _error("E_LOOP", "until is set on an edge without rounds",
                         "put until on the loop edge that leads back (the one with rounds: k)")
        return self


class InputSpec(_Spec):
    """A declared run input: `str` or `list[str]`, optionally with a default."""

    type: InputType = "str"
    default: str | list[str] | None = None
    description: str = ""

    @model_validator(mode="after")
    def _default_matches(self) -> InputSpec:
        if self.default is None:
            return self
        is_list = isinstance(self.default, list)
        if is_list != (self.type == "list[str]"):
            raise _error(
                "E_FIELD",
                f"default is a {'list' if is_list else 'string'} but type is {self.type}",
                "make the default match the type",
            )
        return self


InputRef = Annotated[
    Union[Annotated[InputSpec, Tag("full")], Annotated[InputType, Tag("short")]],
    Discriminator(lambda value: "short" if isinstance(value, str) else "full"),
]


MAX_ROUNDS_LIMIT = 1024  # the most a file may raise rounds.limit to
MAX_NODES_LIMIT = 65_536  # ... and rounds.max_nodes to: no file can ask for an unbounded plan


class RoundsSpec(_Spec):
    """Guards on plan size: loops and foreach expansion are unrolled before a run starts.

    A file may lower them, and raise them only up to hard caps (plan/size.py checks the size
    arithmetically before anything is unrolled)."""

    limit: PositiveInt = Field(32, le=MAX_ROUNDS_LIMIT, description="the most rounds any loop edge may declare")
    max_nodes: PositiveInt = Field(4096, le=MAX_NODES_LIMIT, description="the most nodes a compiled plan may hold")


class GraphSpec(_Spec):
    """A whole topology: declared inputs, models, agents, nodes, edges and named policies."""

    version: Literal[1] = SCHEMA_VERSION
    name: Name
    description: str = ""
    inputs: dict[Ident, InputRef] = Field(
        default_factory=dict, description="run inputs; `question: str` is short for `question: {type: str}`"
    )
    models: list[ModelSpec] = Field(default_factory=list)
    agents: list[AgentSpec] = Field(default_factory=list)
    nodes: list[NodeSpec] = Field(default_factory=list)
    edges: list[EdgeSpec] = Field(default_factory=list)
    policies: dict[Name, TransferPolicy] = Field(default_factory=dict, description="named edge policies")
    rounds: RoundsSpec = Field(default_factory=RoundsSpec)

    @field_validator("inputs")
    @classmethod
    def _normalise_inputs(cls, value: dict[str, Any]) -> dict[str, InputSpec]:
        for key in value:
            if key in RESERVED_VARIABLES:
                raise _error("E_FIELD", f"input {key!r} is a reserved variable", "rename the input")
        return {key: InputSpec(type=spec) if isinstance(spec, str) else spec for key, spec in value.items()}

    def input_specs(self) -> dict[str, InputSpec]:
        """Each declared input as an InputSpec (short forms like `question: str` expanded)."""
        return dict(self.inputs)  # type: ignore[arg-type]  # normalised by _normalise_inputs


def json_schema(kind: Literal["topology", "agent", "model"] = "topology") -> dict[str, Any]:
    """JSON Schema of a topology file (or an agent/model profile file), for editors.

    Files differ from the in-memory spec in two ways the schema allows: `agents` and `models`
    entries may be a string naming a profile file, and a profile file may omit `name` (it
    defaults to the file's stem).
    """
    if kind == "topology":
        schema = GraphSpec.model_json_schema()
        for field, ref in (("agents", "AgentSpec"), ("models", "ModelSpec")):
            schema["properties"][field]["items"] = {
                "anyOf": [{"$ref": f"#/$defs/{ref}"}, {"type": "string", "description": "profile name or path"}]
            }
        title = "rclc-graph topology"
    elif kind in ("agent", "model"):
        model = AgentSpec if kind == "agent" else ModelSpec
        schema = copy.deepcopy(model.model_json_schema())
        schema["required"] = [name for name in schema.get("required", []) if name != "name"]
        title = f"rclc-graph {kind} profile"
    else:
        raise UsageError(f"kind: expected 'topology', 'agent' or 'model', got {kind!r}")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema, "title": title}
