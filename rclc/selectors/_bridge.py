"""Bridging: a request extended with what a first scoring found, then scored again.

Why: a question that needs two facts ("in which year was the owner of the Lynx agency
born?") names only the first one's entity. Scored against the question, the sender holding
"The Lynx agency belongs to Jonas Moreno." finds its evidence, but the sender holding
"Jonas Moreno was born in 1964." holds several "was born in" sentences of several people,
and nothing in the question says which one is wanted. Multi-hop retrieval answers this by
retrieving again with what the first retrieval found. Here the best `bridge` spans of a first
scoring give the bridge: their distinctive tokens, in source order, go in front of the
request; the senders are scored again with that longer request, whose rows attend to "Jonas
Moreno" wherever it occurs; and spans rank by the mean of the two scorings (`mixed`).

Distinctive tokens: those found in at most two candidate spans (`BRIDGE_DISTINCT`), so
"The Lynx agency belongs to Jonas Moreno." bridges as "Lynx agency belongs Jonas Moreno".
The whole sentence also carries its relation words, and where documents state one relation
for many entities ("X is owned by Y") those pull up every sentence shaped like the bridge:
a single-fact question whose best span already was its answer then spent its budget on other
entities' owners (on 80 single-fact dev cases the whole-sentence bridge answered 49% against
71% without bridging). The mean of the two scorings keeps what the question found first at
half weight for the same reason. Measured in docs/experiments.md (issue 26).

The bridge is chosen on the first scoring less a neutral request's ("Answer the question.",
`lifted`): any request attends to the rows right before it, so a document's last sentence
("Fireworks close the festival at midnight.") ranked first for where it sits, not for what it
says, and bridged the fan-out example's question away from its answer.

Which spans may bridge: candidate spans (not excluded, not only protected positions) whose
rows carry token IDs (a latent row has no token to put in a request), that hold a word (a
line break, where attention sinks collect, says nothing), and that the request does not
already say: a span with at least half of its tokens in runs of 4 tokens the request also
holds adds nothing to it (a fan-out reader's prompt repeats the question, which the
question's own rows attend to most; single shared words do not count). Spans rank by their
mean score over their unprotected positions (the first position is an attention sink) times
the sender's positions, the units in which pooled allocation compares senders
(rclc.selectors._pooling), so in a fan-in the bridge is the best span of all senders
together.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from ..errors import RclcError
from ..state import SenderState

if TYPE_CHECKING:  # _common imports this module
    from ._common import SpanProfile

BRIDGE_OVERLAP = 0.5
"""A span with at least this share of its tokens inside runs the request also holds does not bridge."""
BRIDGE_RUN = 4
"""The run length (in tokens) a span and the request must share for a token to count as said:
single tokens and pairs ("the", "was born") are shared by unrelated sentences."""


BRIDGE_DISTINCT = 2
"""A bridge token must occur in at most this many candidate spans: the name a bridge introduces
occurs where the bridge found it and where the second fact uses it, while relation words and
function words ("is owned by", "the") occur in many spans and would pull in every sentence
shaped like the bridge (module docstring)."""
BRIDGE_WORD = 2
_WORD = re.compile(rf"[^\W_]{{{BRIDGE_WORD},}}")


def _runs(tokens: Sequence[int], length: int) -> set[tuple[int, ...]]:
    return {tuple(tokens[i:i + length]) for i in range(len(tokens) - length + 1)}


def _said(tokens: Sequence[int], request: Sequence[int]) -> bool:
    """Whether at least BRIDGE_OVERLAP of `tokens` lie in runs of BRIDGE_RUN tokens (the whole
    span, when shorter) that `request` holds too."""
    length = min(BRIDGE_RUN, len(tokens))
    known = _runs(request, length)
    covered = [False] * len(tokens)
    for start in range(len(tokens) - length + 1):
        if tuple(tokens[start:start + length]) in known:
            covered[start:start + length] = [True] * length
    return sum(covered) >= BRIDGE_OVERLAP * len(tokens)


def _has_words(state: SenderState, tokens: Sequence[int]) -> bool:
    """Whether the span's text holds a word (a run of BRIDGE_WORD letters or digits): a line
    break or a lone marker, where attention sinks collect, says nothing a request can use."""
    if state.tokenizer is None:
        return True
    return _WORD.search(state.tokenizer.decode(list(tokens))) is not None


def _candidates(sender: int, state: SenderState, profile: SpanProfile, request: list[int],
                passed_over: Sequence[bool] | None) -> list[tuple[float, int, int, list[int]]]:
    """(-comparable score, sender, start, token IDs) of each span of one sender that may bridge."""
    if state.token_ids is None:
        return []
    ids = state.token_ids.detach().to("cpu").tolist()
    scores = profile.scores.detach().float().cpu()
    protected = set(profile.protected)
    found = []
    for start, stop in profile.spans:
        if profile.excluded is not None and profile.excluded[start]:
            continue
        positions = [p for p in range(start, stop) if p not in protected and ids[p] >= 0
                     and not (passed_over is not None and passed_over[p])]
        if 2 * len(positions) <= stop - start:  # mostly protected, latent or not the sender's material
            continue
        tokens = [ids[p] for p in positions]
        if _said(tokens, request) or not _has_words(state, tokens):
            continue
        mean = float(scores[positions].mean()) * profile.positions
        found.append((-mean, sender, start, tokens))
    return found


def bridge_tokens(states: Sequence[SenderState], profiles: Sequence[SpanProfile], requests: Sequence[torch.Tensor],
                  count: int, passed_over: Sequence[Sequence[bool] | None] | None = None) -> list[int]:
    """The token IDs of the `count` best spans across `states`, in source order (sender, then
    position); empty when no span may bridge. `passed_over` (per sender: None, or one flag per
    position) marks rows that are not the sender's material (chat markup, its instructions,
    text the receiver holds): a span made mostly of them never bridges."""
    flags = passed_over if passed_over is not None else [None] * len(states)
    candidates = []
    for sender, (state, profile, request, own) in enumerate(zip(states, profiles, requests, flags)):
        candidates.extend(_candidates(sender, state, profile, request.detach().to("cpu").view(-1).tolist(), own))
    best = sorted(candidates)[:count]
    spans_holding = Counter(token for entry in candidates for token in set(entry[3]))
    tokens: list[int] = []
    for _score, _sender, _start, span_tokens in sorted(best, key=lambda entry: (entry[1], entry[2])):
        tokens.extend(token for token in span_tokens if spans_holding[token] <= BRIDGE_DISTINCT)
    return tokens


def bridged(request: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
    """`request` with `tokens` in front (the request itself when there are none)."""
    if not tokens:
        return request
    front = torch.tensor([list(tokens)], dtype=request.dtype, device=request.device)
    return torch.cat([front, request], dim=1)


NEUTRAL_REQUEST = "Answer the question."
"""A request that asks nothing in particular: what it attends to is where any request's
attention goes whatever it says (the attention sink, the rows right before the request)."""


def neutral_ids(states: Sequence[SenderState]) -> list[torch.Tensor] | None:
    """`NEUTRAL_REQUEST` tokenized for every sender, or None when a sender has no tokenizer
    (then no sender's first scoring is lifted, so the senders stay comparable)."""
    if any(state.tokenizer is None for state in states):
        return None
    return [state.request_ids(NEUTRAL_REQUEST) for state in states]


def lifted(first: SpanProfile, neutral: SpanProfile) -> SpanProfile:
    """The first scoring less a neutral request's: what the request attends to for what it
    asks. Only the bridge is chosen on it (the selection ranks by `mixed`)."""
    return replace(first, scores=first.scores.float() - neutral.scores.float())


def mixed(first: SpanProfile, second: SpanProfile) -> SpanProfile:
    """The profile under the mean of a sender's two scorings (the question alone, then with the
    bridge in front). The bridged scoring alone pulls in sentences shaped like the bridge: when
    the bridge is itself the answer ("The Opal group has existed since 1962."), the bridge's
    rows attend to every "has existed since" of other entities, and a 135M answerer then names
    a distractor. The question's own scoring at half weight keeps what it found first. Both are
    attention over the same sender, so they are on one scale."""
    return replace(second, scores=(first.scores.float() + second.scores.float()) / 2)


def bridge_profiles(
    states: Sequence[SenderState],
    requests: Sequence[torch.Tensor],
    count: int,
    score: Callable[[Sequence[torch.Tensor]], list[SpanProfile]],
    passed_over: Sequence[Sequence[bool] | None] | None = None,
) -> tuple[list[int], list[SpanProfile]]:
    """(the bridge's tokens, every sender's profile to select from): the one bridging routine
    of a transfer's senders and of a selector called on one sender. `score(requests)` gives
    a profile per request, the senders' requests in order, then (for the neutral scoring)
    again in the same order: sender i's requests are `requests[i::len(states)]`. The
    question's and the neutral request's scorings do not depend on each other, so they are
    asked for at once (a fan-in's captures of both share one forward). Without a bridge the
    profiles are the first scoring's; with one, the mean of both (`mixed`)."""
    count_states = len(states)
    neutral = neutral_ids(states)
    if neutral is None:
        first = score(requests)
        chooses = first
    else:
        both = score([*requests, *neutral])
        first = both[:count_states]
        chooses = [lifted(one, zero) for one, zero in zip(first, both[count_states:])]
    tokens = bridge_tokens(states, chooses, requests, count, passed_over)
    if not tokens:
        return [], first
    second = score([bridged(request, tokens) for request in requests])
    return tokens, [mixed(one, two) for one, two in zip(first, second)]


def check_shared_vocabulary(states: Sequence[SenderState]) -> None:
    """Bridge tokens come from one sender and extend every sender's request: the senders of
    one bridged transfer must share one model (one vocabulary)."""
    models = {id(state.model) for state in states}
    if len(models) > 1:
        raise RclcError("bridge: the senders of one transfer use different models, so one sender's tokens cannot "
                        "extend another's request; set bridge=0 or transfer from one model's senders")
