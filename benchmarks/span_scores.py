"""How well does each span score single out the evidence among a fan-in's distractors?

Why: on held-out fan-out cases (issue 26) the graph default kept most of the evidence sentence
yet answered fewer questions than recency: what selection keeps beside the evidence decides
(how a 135M answerer does given the evidence sentence alone is not measured yet on the task
families of docs/experiments.md#task-families). This script scores the
fan-out readers of a dataset exactly as topologies/fanout_qa.yaml binds them and labels every
sentence span (the evidence; another fact of the asked subject; the asked relation of another
subject; another fact; filler; the reader's question copy and instructions, which the
receiver holds already), then reports, for several span scores, where the evidence ranks
among the material spans of all readers (pooled as rclc pools: span mean x positions) and how
far above the best distractor it stands. No answerer runs: it is a screen for which score to
measure end to end.

Scores (per sentence span, from the request's attention over the reader's state):
    cacheback    rclc's score: pool7(votes) x support correction^2, span mean
    votes        the mean attention of all request rows (QSnap), span mean
    every_row    each request row's attention share over the reader's spans, combined by a
                 geometric mean over rows: a span scores high only when every row that looks
                 anywhere in particular finds something there ("both the entity and the
                 relation"); rows whose attention is spread evenly change nothing
    best_rows    the mean over the request's k most concentrated rows of their share

Run: python benchmarks/span_scores.py --data out/dev_fan_profiles.jsonl --cases 30 [--exclude-by span]
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from statistics import mean, median

import torch

import rclc
from rclc.models import load
from rclc.selectors import _pooling
from rclc.selectors._attention_capture import capture
from rclc.selectors._common import SpanOptions
from rclc.selectors._receiver_aware import receiver_grams, sender_reasons
from rclc.selectors._spans import pin_first, span_means
from rclc.selectors._support import SupportFold, composite_score
from rclc_graph.spec.templates import render_spans

from fanout_readers import FINAL_TEMPLATE, SYSTEM, reader_prompt


class RowFold(SupportFold):
    """SupportFold that also keeps each request row's attention over memory (summed over heads and layers)."""

    def __init__(self) -> None:
        super().__init__(moments=True)
        self.per_row: torch.Tensor | None = None

    def __call__(self, query, key, scaling):
        super().__call__(query, key, scaling)
        self._add_rows(query, key, scaling)

    def attend(self, query, key, value, scaling):
        # the capture hands a support fold the layer's output to compute (`SupportFold.attend`,
        # issue 28) instead of calling it: the rows are taken on that path too
        self._add_rows(query, key, scaling)
        return super().attend(query, key, value, scaling)

    def _add_rows(self, query, key, scaling):
        _, heads, rows, _ = query.shape
        kv_heads = key.shape[1]
        memory = key.shape[2] - rows
        keys = key[0].repeat_interleave(heads // kv_heads, dim=0)  # [H, M+R, d]
        logits = torch.einsum("hrd,hmd->hrm", query[0].float(), keys.float()) * scaling
        hidden = torch.ones(rows, rows, dtype=torch.bool).triu(1)
        logits[..., memory:].masked_fill_(hidden, float("-inf"))
        attention = torch.softmax(logits, dim=-1)[..., :memory].sum(0)  # [R, M]
        self.per_row = attention if self.per_row is None else self.per_row + attention


def _label(text: str, case: dict) -> str:
    squashed = " ".join(text.split())
    evidence = case["evidence"] if isinstance(case["evidence"], list) else [case["evidence"]]
    if any(" ".join(e.split())[:-1] in squashed for e in evidence) or any(squashed and squashed in e for e in evidence):
        return "evidence"
    entity = case["meta"]["entity"].split()[1] if "entity" in case["meta"] else None
    relation = case["meta"].get("relation", "").split(">")[0]
    for subject, fact_relation, value, _ in case["meta"].get("facts", []):
        if re.search(rf"\b{re.escape(value)}\b", squashed):
            if subject == entity:
                return "entity_other"
            if fact_relation == relation:
                return "relation_rival"
            return "other_fact"
    return "filler"


def _shares(per_row: torch.Tensor, spans, candidates) -> torch.Tensor:
    """[R, S]: each row's mean attention density per candidate span, normalised over the candidates."""
    density = torch.stack([per_row[:, a:b].mean(dim=1) for a, b in (spans[i] for i in candidates)], dim=1)
    return density / density.sum(dim=1, keepdim=True).clamp_min(1e-12)


def _scores(fold: RowFold, profile, candidates, best_k: int) -> dict[str, list[float]]:
    positions = profile.positions
    composite = span_means(pin_first(profile.scores), profile.spans)
    votes = span_means(pin_first(fold.votes_mean()), profile.spans)
    shares = _shares(fold.per_row, profile.spans, candidates)  # [R, S]
    uniform = 1.0 / len(candidates)
    every = torch.exp(torch.log(shares.clamp_min(1e-9)).mean(dim=0)) / uniform
    concentration = (shares * torch.log(shares.clamp_min(1e-12) / uniform)).sum(dim=1)  # KL to uniform, per row
    top = torch.topk(concentration, min(best_k, shares.shape[0])).indices
    best = shares[top].mean(dim=0) / uniform
    return {
        "cacheback": [float(composite[i]) * positions for i in candidates],
        "votes": [float(votes[i]) * positions for i in candidates],
        "every_row": [float(v) for v in every],
        "best_rows": [float(v) for v in best],
    }


def thresholds(sweep, fractions=(0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)) -> dict:
    """Per relevance fraction, pooled (of the best span of any reader) and per reader (of its
    own best): in how many cases every evidence span passes, and how many other spans pass."""
    table = {}
    for fraction in fractions:
        for mode in ("pooled", "per_reader"):
            whole, others = 0, []
            for spans in sweep:
                best = {}
                for score, _, reader in spans:
                    key = reader if mode == "per_reader" else 0
                    best[key] = max(best.get(key, score), score)
                passed = [(label, score) for score, label, reader in spans
                          if score >= fraction * best[reader if mode == "per_reader" else 0]]
                evidence = [score for score, label, _ in spans if label == "evidence"]
                whole += bool(evidence) and sum(1 for label, _ in passed if label == "evidence") == len(evidence)
                others.append(sum(1 for label, _ in passed if label != "evidence"))
            table[f"{mode}@{fraction}"] = {"evidence_passes": whole, "cases": len(sweep),
                                           "other_spans_pass_mean": round(mean(others), 2)}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--cases", type=int, default=30)
    parser.add_argument("--best-rows", type=int, default=4)
    parser.add_argument("--show", type=int, default=0, help="print the ranked spans of the first N cases")
    parser.add_argument("--exclude-by", choices=("position", "span"), default="position",
                        help="how instruction/known exclusion passes over spans (the edge policy's exclude_by)")
    args = parser.parse_args()
    cases = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()][: args.cases]
    model, tokenizer = load("embedded")
    final_content = render_spans(FINAL_TEMPLATE, {"question": "{question}"})[0]
    results: dict[str, dict[str, list]] = {}
    sweep: list[list[tuple[float, str, int]]] = []  # per case: (cacheback score, label, reader) per material span
    for number, case in enumerate(cases):
        exclusion = rclc.Exclusion(known=(SYSTEM["answerer"], final_content.replace("{question}", case["question"])))
        grams = receiver_grams(exclusion, case["question"], [], tokenizer)  # the receiver's: one per case
        spans_all = []  # (score name -> value, label, text, reader)
        for index in range(len(case["documents"])):
            state, roles, prompt_text, offsets = reader_prompt(model, tokenizer, case, index)
            ids = state.request_ids(case["question"])
            mask = sender_reasons(state, exclusion, roles, grams)
            fold = RowFold()
            with torch.inference_mode():
                capture(state.model, state.past_key_values, fold, state.positions, input_ids=ids)
            spans, flags = SpanOptions(span="sentence", max_span=32, exclude=mask,
                                       exclude_by=args.exclude_by).spans(state)
            profile = _pooling.SpanProfile(composite_score(fold), spans, flags, 0)
            candidates = [i for i, (a, b) in enumerate(spans) if a > 0 and not (flags and flags[a])]
            scores = _scores(fold, profile, candidates, args.best_rows)
            for rank, i in enumerate(candidates):
                a, b = spans[i]
                chars = [offsets[p] for p in range(a, b) if offsets[p][1] > offsets[p][0]] or [(0, 0)]
                text = prompt_text[chars[0][0]:chars[-1][1]]
                spans_all.append(({name: values[rank] for name, values in scores.items()}, _label(text, case), text, index))
        sweep.append([(item[0]["cacheback"], item[1], item[3]) for item in spans_all])
        for name in ("cacheback", "votes", "every_row", "best_rows"):
            ranked = sorted(spans_all, key=lambda item: -item[0][name])
            labels = [label for _, label, _, _ in ranked]
            first_evidence = labels.index("evidence") if "evidence" in labels else None
            best_other = next((item[0][name] for item in ranked if item[1] != "evidence"), None)
            evidence_scores = [item[0][name] for item in ranked if item[1] == "evidence"]
            tally = results.setdefault(name, {"rank": [], "margin": [], "top1": [], "above": []})
            tally["rank"].append(first_evidence)
            tally["top1"].append(first_evidence == 0)
            if evidence_scores and best_other:
                tally["margin"].append(min(evidence_scores) / best_other)
                tally["above"].append(sum(1 for item in ranked if item[1] != "evidence" and item[0][name] >= min(evidence_scores)))
            if number < args.show:
                print(f"\n== case {case['id']} ({name}): {case['question']} -> {case['answers'][0]}")
                for values, label, text, reader in ranked[:8]:
                    print(f"  {values[name]:8.3f} r{reader} {label:14s} {' '.join(text.split())[:90]}")
    summary = {"relevance": thresholds(sweep)}
    summary.update({name: {"cases": len(cases), "evidence_first": sum(t["top1"]),
                      "median_rank": median(r for r in t["rank"] if r is not None),
                      "median_distractors_at_or_above_weakest_evidence": median(t["above"]) if t["above"] else None,
                      "median_margin_weakest_evidence_over_best_distractor": round(median(t["margin"]), 3) if t["margin"] else None,
                      "mean_log_margin": round(mean(math.log(m) for m in t["margin"]), 3) if t["margin"] else None}
               for name, t in results.items()})
    print(json.dumps({"benchmark": "span_scores", "data": str(args.data), "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
