"""How often a handoff keeps the one sentence that answers the request, on the embedded model.

Each case is one raw-text document (seeded, `rclc_graph.experiments.synthetic`, one
document of ~130-170 tokens: the asked entity's fact once, several distractor facts
about other entities with the same relations, filler sentences). The document is the
sender (`sender_from_hf(model, tokenizer, text)`), the question is the request. For each
selector and relative ratio the same budget (`BudgetPolicy(ratio=r).cap(T)`) is given to
every selector, and we record:

- `whole`: the fraction of cases whose evidence sentence survives whole (every token
  overlapping it, located by the tokenizer's offsets, is kept);
- `kept_fraction`: the mean fraction of evidence tokens kept.

For CacheBack (each span variant) the receiver (`HFReceiver` with a short system message)
also answers greedily from the kept rows; `answers` holds the accuracy (the answer string
appears in the output, case-insensitive), with the whole document (`full`) as the
reference and the question alone (`question_only`) as the floor.

Selectors: cacheback, qsnap, chunkkv (each over every `--spans` variant: a fixed grid
width W, or `sentence`), recent, and random (seed = case index). Prints one JSON object.

    PYTHONPATH=$PWD python benchmarks/evidence_survival.py --cases 60
    PYTHONPATH=$PWD python benchmarks/evidence_survival.py --spans 16,8,4,sentence
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from typing import Any

import torch

from rclc import HFReceiver, models, sender_from_hf
from rclc.policy import BudgetPolicy
from rclc.selectors import cacheback, chunkkv, qsnap, random_selector, recent
from rclc.state import Delivery, Message, SenderState
from rclc_graph.experiments.evidence_tokens import evidence_positions
from rclc_graph.experiments.synthetic import Case, make_dataset

SYSTEM = "You answer questions from the context you were given."
SPAN_SELECTORS = {"cacheback": cacheback, "qsnap": qsnap, "chunkkv": chunkkv}


def span_variants(text: str) -> list[str]:
    variants = [item.strip() for item in text.split(",") if item.strip()]
    for item in variants:
        if item != "sentence" and not (item.isdigit() and int(item) >= 1):
            raise SystemExit(f"--spans: {item!r} is neither a width >= 1 nor 'sentence'")
    return variants


def span_selector(name: str, variant: str) -> Any:
    """The built-in with this span variant; ChunkKV names its grid width `chunk_size`."""
    function = SPAN_SELECTORS[name]
    if variant == "sentence":
        return functools.partial(function, span="sentence")
    width_field = "chunk_size" if name == "chunkkv" else "span_size"
    return functools.partial(function, **{width_field: int(variant)})


def selector_key(name: str, variant: str, variants: list[str]) -> str:
    return name if variants == ["16"] else f"{name}[{variant}]"


def evidence_kept(kept: list[int], evidence: list[int]) -> tuple[bool, float]:
    hits = len(set(kept) & set(evidence))
    return hits == len(evidence), hits / len(evidence)


def answer(model: Any, tokenizer: Any, question: str, rows: torch.Tensor | None, max_new_tokens: int) -> str:
    """The receiver's greedy answer to `question` after `rows` (None: the question alone)."""
    system = [{"role": "system", "content": SYSTEM}]
    receiver = HFReceiver(model, tokenizer, messages=system, max_new_tokens=max_new_tokens)
    if rows is None:
        prompt = receiver.prepare_request(question).input_ids
        inputs = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt), "max_new_tokens": max_new_tokens}
    else:
        receiver(Delivery(question, (Message(rows),)))
        inputs = receiver.pop()
    with torch.no_grad():
        tokens = model.generate(**inputs, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    if "input_ids" in inputs:
        tokens = tokens[:, inputs["input_ids"].shape[1] :]
    return tokenizer.decode(tokens[0], skip_special_tokens=True).strip()


def correct(output: str, case: Case) -> bool:
    return any(expected.lower() in output.lower() for expected in case.answers)


def kept_rows(sender: SenderState, kept: list[int]) -> torch.Tensor:
    return sender.input_embeds.index_select(0, torch.tensor(kept, dtype=torch.int64)).detach()


def run_case(
    model: Any,
    tokenizer: Any,
    case: Case,
    index: int,
    ratios: list[int],
    variants: list[str],
    answer_variants: list[str] | None,
    max_new_tokens: int,
) -> dict[str, Any]:
    """Selections of every selector at every ratio; answers for the CacheBack span variants
    in `answer_variants` plus full and question-only (None: no generation at all)."""
    document = case.documents[case.gold_document]
    sender = sender_from_hf(model, tokenizer, document)
    request = sender.request_ids(case.question)
    evidence = evidence_positions(tokenizer, document, case.evidence)
    selectors = {
        selector_key(name, variant, variants): span_selector(name, variant)
        for name in SPAN_SELECTORS
        for variant in variants
    }
    selectors["recent"] = recent
    selectors["random"] = random_selector(index)
    answer_keys = {selector_key("cacheback", variant, variants) for variant in answer_variants or []}
    record: dict[str, Any] = {
        "positions": sender.positions,
        "evidence_tokens": len(evidence),
        "budgets": {},
        "kept": {},
        "answers": {},
    }
    for ratio in ratios:
        budget = BudgetPolicy(ratio=ratio).cap(sender.positions)
        record["budgets"][f"r{ratio}"] = budget
        for key, selector in selectors.items():
            kept = list(selector(sender, request, budget))
            if len(kept) != budget:
                raise RuntimeError(f"{key} kept {len(kept)} positions at budget {budget}")
            record["kept"].setdefault(key, {})[f"r{ratio}"] = evidence_kept(kept, evidence)
            if key in answer_keys:
                output = answer(model, tokenizer, case.question, kept_rows(sender, kept), max_new_tokens)
                record["answers"].setdefault(key, {})[f"r{ratio}"] = correct(output, case)
    if answer_variants is not None:
        full = answer(model, tokenizer, case.question, kept_rows(sender, list(range(sender.positions))), max_new_tokens)
        alone = answer(model, tokenizer, case.question, None, max_new_tokens)
        record["answers"]["full"] = correct(full, case)
        record["answers"]["question_only"] = correct(alone, case)
    return record


def summarize(records: list[dict[str, Any]], ratios: list[int]) -> dict[str, Any]:
    count = len(records)
    labels = [f"r{ratio}" for ratio in ratios]
    selectors: dict[str, Any] = {}
    for key in records[0]["kept"]:
        selectors[key] = {}
        for label in labels:
            outcomes = [record["kept"][key][label] for record in records]
            whole = sum(1 for survived, _ in outcomes if survived)
            selectors[key][label] = {
                "whole": round(whole / count, 4),
                "whole_cases": whole,
                "kept_fraction": round(sum(fraction for _, fraction in outcomes) / count, 4),
            }
    answers: dict[str, Any] = {}
    for key, value in records[0]["answers"].items():
        if isinstance(value, dict):
            answers[key] = {
                label: round(sum(record["answers"][key][label] for record in records) / count, 4) for label in labels
            }
        else:
            answers[key] = round(sum(record["answers"][key] for record in records) / count, 4)
    positions = [record["positions"] for record in records]
    return {
        "cases": count,
        "positions": {"min": min(positions), "mean": round(sum(positions) / count, 1), "max": max(positions)},
        "evidence_tokens_mean": round(sum(record["evidence_tokens"] for record in records) / count, 2),
        "budget_mean": {label: round(sum(r["budgets"][label] for r in records) / count, 1) for label in labels},
        "selectors": selectors,
        "answers": answers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ratios", default="2,4,8")
    parser.add_argument("--spans", default="16", help="span variants of the built-ins: widths and/or 'sentence'")
    parser.add_argument("--facts", type=int, default=7, help="facts per document (the asked one + distractors)")
    parser.add_argument("--filler", type=int, default=7, help="filler sentences per document")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--no-answers", action="store_true", help="skip receiver generation (selection only)")
    parser.add_argument(
        "--answer-spans", default=None, help="CacheBack span variants the receiver answers from (default: all of --spans)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 leaves torch's default)")
    parser.add_argument("--per-case", action="store_true", help="also print every case's record")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ratios = [int(item) for item in args.ratios.split(",") if item.strip()]
    variants = span_variants(args.spans)
    answer_variants = None if args.no_answers else span_variants(args.answer_spans or args.spans)
    if answer_variants and not set(answer_variants) <= set(variants):
        raise SystemExit("--answer-spans: every variant must also be in --spans")
    model, tokenizer = models.load("embedded")
    cases = make_dataset(
        args.cases, seed=args.seed, documents=1, facts_per_document=args.facts, filler_per_document=args.filler
    )
    started = time.perf_counter()
    records = []
    for index, case in enumerate(cases):
        records.append(run_case(model, tokenizer, case, index, ratios, variants, answer_variants, args.max_new_tokens))
        print(f"case {index + 1}/{len(cases)} done", file=sys.stderr, flush=True)
    result = {
        "model": models.EMBEDDED_CHECKPOINT,
        "dataset": {"seed": args.seed, "facts_per_document": args.facts, "filler_per_document": args.filler},
        "ratios": ratios,
        "spans": variants,
        **summarize(records, ratios),
        "seconds": round(time.perf_counter() - started, 1),
    }
    if args.per_case:
        result["per_case"] = [{"id": case.id, **record} for case, record in zip(cases, records)]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
