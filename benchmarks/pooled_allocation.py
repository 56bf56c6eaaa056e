"""How pooled fan-in budgets should make scores comparable across senders.

Why: `allocation: pooled` ranks the spans of several senders together, but each sender's
scores come from its own attention softmax, so they need a common unit. This script scores
the fan-out readers of a dataset once (CacheBack, receiver-aware exclusion, the span mode
given) and compares, at r2/r4/r8, per-sender budgets with pooled budgets under several
normalisations: how much of the total the gold reader (the one holding the answer) gets,
and in how many cases the evidence sentence is kept whole.

    raw      span means as they are
    length   multiplied by the sender's positions (attention relative to a uniform spread;
             what rclc does since this comparison)
    lift     divided by the mean score of the sender's candidate positions (rclc's first choice)
    sum      divided by the sum of those scores (each sender's candidates share 1)
    max      divided by the best candidate score
    zscore   (mean - candidates' mean) / candidates' standard deviation
    rank     per-sender percentile of the span (no sender stands out by construction)

Readers are bound exactly as topologies/fanout_qa.yaml runs them (reader profile's system
prompt, "Question: ...\\nDocument i:\\n..."), positions labelled as the graph labels them
(executors/roles.py). Prints JSON.

Run: python benchmarks/pooled_allocation.py --data data.jsonl --cases 30 --span sentence
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from statistics import mean

import torch

import rclc
from rclc.selectors._receiver_aware import receiver_grams, sender_reasons
from rclc.models import load
from rclc.policy import BudgetPolicy
from rclc.selectors import _pooling
from rclc_graph.spec.templates import render_spans

from fanout_readers import FINAL_TEMPLATE, SYSTEM, reader_prompt


def _normalisers() -> dict:
    def stats(profile):
        return _pooling.candidate_scores(profile)

    def lift(profile):
        values = stats(profile)
        return 0.0, float(values.mean()) if values.numel() and values.mean() > 0 else 1.0

    def total(profile):
        values = stats(profile)
        return 0.0, float(values.sum()) if values.numel() and values.sum() > 0 else 1.0

    def best(profile):
        values = stats(profile)
        return 0.0, float(values.max()) if values.numel() and values.max() > 0 else 1.0

    def zscore(profile):
        values = stats(profile)
        if values.numel() < 2 or float(values.std()) == 0:
            return 0.0, 1.0
        return float(values.mean()), float(values.std())

    def length(profile):
        return 0.0, 1.0 / profile.positions

    return {"raw": lambda profile: (0.0, 1.0), "length": length, "lift": lift, "sum": total, "max": best,
            "zscore": zscore}


def _rank_counts(profiles, counts):
    """Pooled counts when spans rank by their percentile within their own sender."""
    ranked = []
    for profile in profiles:
        pinned = _pooling.pin_first(profile.scores)
        order = _pooling.span_order(pinned, profile.spans, profile.excluded)
        percentile = torch.zeros_like(profile.scores)
        for rank, index in enumerate(order):
            start, stop = profile.spans[index]
            percentile[start:stop] = 1.0 - rank / max(len(order), 1)
        ranked.append(_pooling.SpanProfile(percentile, profile.spans, profile.excluded, profile.latent_steps))
    saved = _pooling.comparable
    _pooling.comparable = lambda profile: (0.0, 1.0)
    try:
        return _pooling.pooled_counts(ranked, counts)
    finally:
        _pooling.comparable = saved


def _reader(model, tokenizer, case, index):
    state, roles, prompt_text, offsets = reader_prompt(model, tokenizer, case, index)
    if state.positions != len(roles):
        raise RuntimeError(f"reader {index}: {state.positions} positions, {len(roles)} labels")
    evidence = []
    if index == case["gold_document"]:
        start = prompt_text.find(case["evidence"])
        stop = start + len(case["evidence"])
        evidence = [i for i, (a, b) in enumerate(offsets) if a < stop and b > start]
    return state, roles, evidence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--cases", type=int, default=30)
    parser.add_argument("--ratios", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--span", default="sentence")
    parser.add_argument("--max-span", type=int, default=None)
    parser.add_argument("--methods", nargs="+", default=None, help="allocations to compare (default: all)")
    args = parser.parse_args()
    cases = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()][: args.cases]
    model, tokenizer = load("embedded")
    selector = functools.partial(rclc.selectors.cacheback, span=args.span, max_span=args.max_span)
    normalisers = _normalisers()
    methods = args.methods or ["per_sender", *normalisers, "rank"]
    tallies = {(ratio, method): {"gold_share": [], "evidence_whole": 0} for ratio in args.ratios for method in methods}
    for case in cases:
        readers = [_reader(model, tokenizer, case, i) for i in range(len(case["documents"]))]
        final_content = render_spans(FINAL_TEMPLATE, {"question": case["question"]})[0]
        exclusion = rclc.Exclusion(known=(SYSTEM["answerer"], final_content))
        profiles, evidence = [], None
        for i, (state, roles, gold_tokens) in enumerate(readers):
            ids = state.request_ids(case["question"])
            grams = receiver_grams(exclusion, case["question"], [], tokenizer)
            mask = sender_reasons(state, exclusion, roles, grams)
            profiles.append(_pooling.profile_of(selector, state, ids, mask))
            if gold_tokens:
                evidence = set(gold_tokens)
        gold = case["gold_document"]
        for ratio in args.ratios:
            policy = BudgetPolicy(ratio=ratio)
            counts = [policy.cap(profile.positions) for profile in profiles]
            for method in methods:
                if method == "per_sender":
                    pooled = counts
                elif method == "rank":
                    pooled = _rank_counts(profiles, counts)
                else:
                    saved = _pooling.comparable
                    _pooling.comparable = normalisers[method]
                    try:
                        pooled = _pooling.pooled_counts(profiles, counts)
                    finally:
                        _pooling.comparable = saved
                kept = set(profiles[gold].keep(pooled[gold]))
                tally = tallies[(ratio, method)]
                tally["gold_share"].append(pooled[gold] / sum(pooled))
                tally["evidence_whole"] += evidence <= kept
    rows = [
        {"ratio": ratio, "allocation": method, "cases": len(cases),
         "gold_share_of_budget": round(mean(tally["gold_share"]), 3), "evidence_kept_whole": tally["evidence_whole"]}
        for (ratio, method), tally in tallies.items()
    ]
    print(json.dumps({"benchmark": "pooled_allocation", "data": str(args.data), "span": args.span,
                      "max_span": args.max_span, "rows": rows}, indent=2))


if __name__ == "__main__":
    with torch.inference_mode():
        main()
