"""Handoff policy: budgets, fitting, and the names and defaults both packages share.

Pure integers and strings, no tensors and no torch: graph planning (which must not import
torch) reads the same constants and labels the transfer core runs on, instead of keeping
copies of them, and the budget arithmetic is property-tested directly.

Relative rX keeps `I + ceil((L - I) / r)`: inherited rows stay affordable and new rows are
compressed r-fold, so chain memory grows by one compressed chunk per hop. Bounded B keeps
`min(B, L)`, so chain memory stops growing once the cap binds. `L = T + reserve`, where
`reserve` are rows reserved for post-selection reasoning (see docs/api.md#budgets-and-chains).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._arguments import require_int
from .errors import ContextLimitError, RclcError

__all__ = [
    "ALLOCATIONS",
    "ATTENTION_SELECTORS",
    "BACKENDS",
    "BASELINE_SELECTORS",
    "BUILTIN_REASONING",
    "BUILTIN_SELECTORS",
    "BudgetPolicy",
    "BuiltinSelector",
    "DEFAULT_MAX_BATCH",
    "DEFAULT_PREFILL_BATCH",
    "DEFAULT_PREFILL_FIRST_MS",
    "DEFAULT_PREFIX_CACHE_MIB",
    "DEFAULT_RATIO",
    "DEFAULT_REPRESENTATION",
    "DEFAULT_SELECTOR",
    "DEFAULT_WAIT_MS",
    "DEFAULT_WORKER_FORWARDS",
    "DEFAULT_EXCLUSION_REASONS",
    "EXCLUSION_REASONS",
    "EXCLUSION_UNITS",
    "MODES",
    "POSITION_ROLES",
    "REASONING_CONTEXTS",
    "REPRESENTATIONS",
    "SELECTORS",
    "SELECTOR_OPTIONS",
    "SPAN_KINDS",
    "check_caps",
    "fit",
    "floor",
    "policy_label",
    "selector_option_problems",
]

DEFAULT_RATIO = 4
"""The relative budget when a transfer names neither `ratio` nor `budget` (r4)."""

SPAN_KINDS = ("fixed", "sentence", "paragraph", "line")
"""How the attention selectors cut a sender into the spans they keep whole: the fixed
`span_size` grid, or the sender's own sentences, paragraphs or lines."""

EXCLUSION_REASONS = ("template", "instruction", "known", "duplicate")
"""Why a selection may pass over a sender position (`rclc.Exclusion`): a chat-template
marker, the sender's own instructions (system prompt, prompt-template text), text the
receiver already holds, or text an earlier sender of the same transfer also holds (a fan-in's
readers' shared prompt: one copy is enough). Listed in the order a position's reason is
reported."""
DEFAULT_EXCLUSION_REASONS = ("template", "instruction", "known")
"""What `rclc.Exclusion()` passes over when no reasons are named (`duplicate` is opt-in: it
was added later, and a default that changed under existing callers would change their
selections)."""
POSITION_ROLES = ("material", "instruction", "template")
"""What a sender position holds, as a caller who built the prompt knows it: material the
sender read or wrote, its instructions, or chat-template markup."""

EXCLUSION_UNITS = ("position", "span")
"""How `instruction` and `known` exclusion pass over a sender's spans (`exclude_by`): position
by position, cutting a span where its flags change (the seed's keep step), or a whole span when
they cover more than half of it (none of it otherwise), so a partly known sentence is never cut
into fragments. Chat markup (`template`) is always passed over position by position."""

ALLOCATIONS = ("per_sender", "pooled")
"""How a transfer with several senders spends its budget: each sender its own fitted count,
or the senders' total where the scores are highest across them."""

_SPANS = {"span": "span", "max_span": "positive_int", "exclude": "edge_field", "span_starts": "from_lineage",
          "relevance": "fraction", "exclude_by": "exclusion_unit"}
"""The span options every attention selector takes."""
_REQUEST = {"bridge": "count"}
"""The options of the selectors that score a request (ChunkKV scores the sender's own last rows)."""


@dataclass(frozen=True)
class BuiltinSelector:
    """One built-in selector as every layer knows it, without torch.

    `function` is its name in `rclc.selectors` (`rclc.selectors.builtin` resolves it);
    `attention`: it scores with the model's attention, keeps whole spans and reserves protected
    positions (a baseline does none of these, and budget fitting treats it as custom code);
    `seeded`: `function(seed)` makes the selector. `options` are the keyword options it takes
    and what each must be (`selector_option_problems` checks them without torch, so a graph
    refuses `span_size: 0` before any model loads; tests/unit/rclc/test_policy.py checks them against
    the selectors' signatures). `exclude` and `span_starts` are keywords the transfer fills in
    (from the edge's `exclude:` field and from lineage), so a graph may not set them."""

    function: str
    attention: bool
    options: dict[str, str]
    seeded: bool = False


SELECTORS: dict[str, BuiltinSelector] = {
    "cacheback": BuiltinSelector("cacheback", True, {"span_size": "positive_int", **_SPANS, **_REQUEST}),
    "qsnap": BuiltinSelector("qsnap", True, {"span_size": "positive_int", **_SPANS, **_REQUEST}),
    "chunkkv": BuiltinSelector(
        "chunkkv", True, {"chunk_size": "positive_int", "window_size": "positive_int", "kernel_size": "odd_int", **_SPANS}
    ),
    "recent": BuiltinSelector("recent", False, {"exclude": "edge_field"}),
    "random": BuiltinSelector("random_selector", False, {"seed": "seed"}, seeded=True),
}
"""The built-in selectors by the name a graph or `rclc.transfer` caller uses: the one place
their names are kept (the tuples below, `rclc.selectors.BUILTIN` and the graph's checks are
derived from it)."""

ATTENTION_SELECTORS = tuple(name for name, selector in SELECTORS.items() if selector.attention)
"""Built-in selectors that score with the model's attention and reserve protected positions."""
BASELINE_SELECTORS = tuple(name for name, selector in SELECTORS.items() if not selector.attention)
"""Built-in baselines for experiments; budget fitting treats them as custom selectors."""
BUILTIN_SELECTORS = ATTENTION_SELECTORS + BASELINE_SELECTORS
"""Every selector name a graph may use without importing code."""
DEFAULT_SELECTOR = "cacheback"
SELECTOR_OPTIONS: dict[str, dict[str, str]] = {name: selector.options for name, selector in SELECTORS.items()}
"""The keyword options each built-in selector takes (`BuiltinSelector.options`), by name."""

_OPTION_KINDS = {
    "positive_int": ("a whole number >= 1", lambda v: type(v) is int and v >= 1),
    "count": ("a whole number >= 0", lambda v: type(v) is int and v >= 0),
    "odd_int": ("an odd whole number >= 1", lambda v: type(v) is int and v >= 1 and v % 2 == 1),
    "span": ("one of " + ", ".join(repr(kind) for kind in SPAN_KINDS), lambda v: v in SPAN_KINDS),
    "seed": ("a whole number in [0, 2**64 - 1]", lambda v: type(v) is int and 0 <= v <= 2**64 - 1),
    "fraction": ("a number in [0, 1]", lambda v: isinstance(v, (int, float)) and 0 <= v <= 1),
    "exclusion_unit": ("one of " + ", ".join(repr(unit) for unit in EXCLUSION_UNITS), lambda v: v in EXCLUSION_UNITS),
}
_SET_BY_THE_TRANSFER = {
    "edge_field": "write it as the edge policy's `exclude:` field (a list of template, instruction, known)",
    "from_lineage": "remove it: the graph passes each sender's run starts from lineage",
}


def selector_option_problems(selector: str, options: dict[str, object]) -> list[tuple[str, str, str]]:
    """(option, problem, fix) for every option a built-in selector does not take or cannot use."""
    allowed = SELECTOR_OPTIONS.get(selector)
    if allowed is None:
        return []  # user code: its own signature decides (checked where it is imported)
    problems = []
    for name, value in options.items():
        kind = allowed.get(name)
        if kind is None:
            takes = ", ".join(allowed) if allowed else "no options"
            problems.append((name, f"selector {selector!r} has no option {name!r}", f"{selector} takes {takes}"))
            continue
        if kind in _SET_BY_THE_TRANSFER:
            problems.append((name, f"{name} of selector {selector!r} is set by the transfer, not as a selector option",
                             _SET_BY_THE_TRANSFER[kind]))
            continue
        wanted, accepts = _OPTION_KINDS[kind]
        if isinstance(value, bool) or not accepts(value):
            problems.append((name, f"{name} of selector {selector!r} must be {wanted}, got {value!r}", f"write {wanted}"))
    return problems


BUILTIN_REASONING = ("latent_mass",)
"""Reasoning methods known by name (`rclc.latent_mass`)."""
REASONING_CONTEXTS = ("full", "full_with_request", "selected", "selected_with_request")
"""What a reasoning method sees: before selection (`full*`) or after it (`selected*`)."""

REPRESENTATIONS = ("embeddings", "token_ids+continuous")
"""How a message carries its rows: all as embeddings, or token IDs plus continuous rows."""
DEFAULT_REPRESENTATION = "embeddings"

MODES = ("state", "full", "text")
"""Edge modes: selected state, the whole state, or the sender's text."""

BACKENDS = ("hf", "vllm")
"""Where an agent's model runs: a Hugging Face model in this process, or an in-process vLLM engine."""

DEFAULT_MAX_BATCH = 32
"""Sequences one model decodes together at most (`rclc.Batching.max_batch`)."""
DEFAULT_WAIT_MS = 1.0
"""How long a decode step with room in its batch waits for another sequence to join (ms)."""
DEFAULT_PREFILL_FIRST_MS = 1000.0
"""How long a decode step of an HF model's batching engine waits, at most, while prompts
waiting for or under prefill would at least double its batch and it has room for them
(`rclc.Batching.prefill_first_ms`; 0: decode steps never wait for them, and the engine runs
no second forward on a spare core). Measured side by side on the idle 2-core machine
(docs/performance.md, "Prefills first"): the concurrent phase of 32 fanout_qa runs (answers
arriving in a burst) took 6-15% less time and 8-14% less CPU than with 0, and that of 32
chain_notes runs (notes arriving one by one) 1-2% more time and 4-5% less CPU, on the inputs
the rule was chosen on and on held-out ones, outputs identical. An earlier rule that held
for any prompt cost chain_notes 16% (4.51x the sequential runs/minute against 5.38x)."""
DEFAULT_WORKER_FORWARDS = 2
"""Worker-side forwards (prefills, captures, refreshes) one HF model runs at once
(`rclc.Batching.worker_forwards`). Two, measured: on this project's 2-core CPU, 32 concurrent
fanout_qa runs went from 1.69x to 2.11x the sequential runs/minute when one became two
(docs/performance.md); each extra forward holds its own activations, so more is not free."""
DEFAULT_PREFILL_BATCH = 8
"""Token prompts waiting together that one forward prefills at most (`rclc.Batching.prefill_batch`;
1: each alone). docs/performance.md has the measurement behind it."""
DEFAULT_CAPTURE_BATCH = 8
"""Transfers whose request captures one forward folds at most when they wait for a model
together (`rclc.Batching.capture_batch`; 1: each transfer's captures in their own forward).
Eight, like `DEFAULT_PREFILL_BATCH`: docs/performance.md has the measurement behind it."""
DEFAULT_PREFIX_CACHE_MIB = 128
"""Memory one HF model's store of prompt prefixes may hold (`rclc.Batching.prefix_cache_mib`):
about 2,800 positions of the embedded model. Entries share the tensors of the states that
made them, so they cost memory only once those states are gone."""


def policy_label(mode: str, ratio: int | None = None, budget: int | None = None) -> str:
    """The short tag tables and records use: `r4`, `b128`, `full` or `text`.

    A `state` policy is labelled by its budget (exactly one of `ratio`/`budget`); the other
    modes are labelled by name.
    """
    if mode not in MODES:
        raise RclcError(f"mode: {mode!r} is not one of {MODES}")
    if mode != "state":
        return mode
    if (ratio is None) == (budget is None):
        raise RclcError("ratio, budget: a state policy has exactly one of them")
    return f"r{ratio}" if ratio is not None else f"b{budget}"


@dataclass(frozen=True)
class BudgetPolicy:
    """Either relative (`ratio`) or bounded (`budget`), never both."""

    ratio: int | None = None
    budget: int | None = None

    @classmethod
    def from_options(cls, ratio: object = None, budget: object = None) -> BudgetPolicy:
        """The policy of a transfer's `ratio=`/`budget=` arguments (neither: r4)."""
        if ratio is not None and budget is not None:
            raise RclcError("ratio, budget: pass one of them, not both (ratio is relative rX, budget is bounded)")
        if budget is not None:
            return cls(budget=require_int("budget", budget, minimum=1))
        if ratio is not None:
            return cls(ratio=require_int("ratio", ratio, minimum=1))
        return cls(ratio=DEFAULT_RATIO)

    @property
    def label(self) -> str:
        """`r4` or `b128` (see `policy_label`)."""
        if self.budget is not None:
            return policy_label("state", budget=self.budget)
        return policy_label("state", ratio=self.ratio if self.ratio is not None else DEFAULT_RATIO)

    def cap(self, total: int, inherited: int = 0, reserve: int = 0) -> int:
        """Positions transmitted for a sender of `total` rows, `inherited` of them carried."""
        length = total + reserve
        if self.budget is not None:
            return min(self.budget, length)
        ratio = self.ratio if self.ratio is not None else DEFAULT_RATIO
        return inherited + (length - inherited + ratio - 1) // ratio


def floor(*, builtin: bool, latent_steps: int, reserve: int) -> int:
    """The least a cap may be: built-ins must keep position 0 and the latent tail."""
    return latent_steps + reserve + 1 if builtin else reserve + 1


def check_caps(caps: list[int], floors: list[int]) -> None:
    """Refuse a sender whose cap is below its floor (the budget cannot hold what it must keep)."""
    for index, (cap, least) in enumerate(zip(caps, floors)):
        if cap < least:
            raise RclcError(
                f"budget: sender {index} may send {cap} positions but needs at least {least} "
                "(its first position, latent tail and reserved reasoning rows); raise budget or lower ratio"
            )


def fit(caps: list[int], floors: list[int], available: int | None) -> list[int]:
    """Share `available` receiver positions among senders without exceeding any cap.

    If every cap fits, caps stand. Otherwise each sender starts at its floor and the rest
    is water-filled in equal shares; what short senders cannot use goes to the others and
    the last few positions go one each to the earliest senders.
    """
    check_caps(caps, floors)
    total = sum(caps)
    if available is None or total <= available:
        return list(caps)
    counts = list(floors)
    if sum(counts) > available:
        raise ContextLimitError(
            f"receiver: it has {max(available, 0)} handoff positions but the senders need at least {sum(counts)}; "
            "shorten its history, reserve fewer output tokens, use fewer senders or less reasoning"
        )
    remaining = available - sum(counts)
    active = [i for i, (count, cap) in enumerate(zip(counts, caps)) if count < cap]
    while remaining > 0 and active:
        share = max(1, remaining // len(active))
        for index in active:
            grant = min(share, caps[index] - counts[index], remaining)
            counts[index] += grant
            remaining -= grant
        active = [i for i in active if counts[i] < caps[i]]
    return counts
