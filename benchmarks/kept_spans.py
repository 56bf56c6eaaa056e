"""What CacheBack spends its budget on in the fan-out readers' prompts.

Why: in the measured fanout_qa grid (docs/experiments.md) CacheBack with fixed 16-wide spans
loses the evidence at r4/r8 while sentence-aligned spans keep it at r4. This script checks the
explanation on the same data: the reader's prompt repeats the question, the request is the
question, so the span holding the reader's copy of the question scores highest and takes a
large share of a small budget.

For each case it binds a reader exactly as topologies/fanout_qa.yaml does (reader profile's
system prompt, "Question: ...\\nDocument i:\\n..." over the gold document), transfers to an
answerer with the question as request, and records which spans were kept. It prints JSON:
per ratio and span mode, how many cases kept the reader's copy of the question and how many
kept the gold evidence sentence whole.

Run: python benchmarks/kept_spans.py --data out/data_fanout.jsonl --cases 20
(`rclc-graph data make --size 40 --seed 0 --documents 3 --out out/data_fanout.jsonl`).
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import anyio
import yaml

import rclc
from rclc.models import load

ROOT = Path(__file__).resolve().parents[1]


def _squash(text: str) -> str:
    return " ".join(text.split())


async def _kept_spans(model, tokenizer, system: str, case: dict, ratio: int, span: str | None) -> list[str]:
    gold = case.get("gold_document", 0)
    prompt = f"Question: {case['question']}\nDocument {gold}:\n{case['documents'][gold]}"
    reader = rclc.bind(model, tokenizer, messages=[{"role": "system", "content": system},
                                                   {"role": "user", "content": prompt}])
    answerer = rclc.bind(model, tokenizer, messages=[{"role": "user", "content": f"Question: {case['question']}\nAnswer:"}],
                         max_new_tokens=8)
    selector = rclc.selectors.cacheback if span is None else functools.partial(rclc.selectors.cacheback, span=span)
    await rclc.transfer(reader, answerer, case["question"], ratio=ratio, record_selection=True, selector=selector)
    record = answerer.inspect(selection=True)["deliveries"][-1]["selection"][0]
    return [piece["text"] for piece in record["spans"] if piece["kept"]]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="JSONL with question, documents, gold_document, evidence")
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--ratios", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args()

    cases = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()][: args.cases]
    system = yaml.safe_load((ROOT / "agents" / "reader.yaml").read_text())["system"]
    model, tokenizer = load("embedded")
    rows = []
    for ratio in args.ratios:
        for span in (None, "sentence"):
            question_kept = evidence_kept = 0
            for case in cases:
                kept = await _kept_spans(model, tokenizer, system, case, ratio, span)
                question_kept += any(case["question"][:20] in piece for piece in kept)
                evidence_kept += _squash(case["evidence"]) in _squash("".join(kept))
            rows.append({"ratio": ratio, "span": span or "fixed16", "cases": len(cases),
                         "question_copy_kept": question_kept, "evidence_sentence_kept_whole": evidence_kept})
    print(json.dumps({"benchmark": "kept_spans", "data": str(args.data), "rows": rows}, indent=2))


if __name__ == "__main__":
    anyio.run(main)
