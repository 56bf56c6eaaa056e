"""Quickstart: two documents as senders, one question, CacheBack r4, the receiver answers.

Run: `make quickstart` (or `python examples/quickstart.py` in the project's venv).
"""

from __future__ import annotations

import asyncio
import sys
import time

import torch

import rclc
from rclc import HFReceiver, sender_from_hf, transfer
from rclc.models import load

# Each document is long enough (130 and 120 positions) that r4's budget (33 and 30) holds the
# first span of 16 positions (CacheBack ranks it first: the first position is pinned) and the
# whole sentence that answers.
# With two sentences fewer each (97 positions, budget 25) only 9 positions were left beyond that
# span, and the answer was cut to "Alice More" (issue 26).
DOCUMENTS = [
    "Cedar is a logistics company that moves spare parts for ferries along the Norwegian coast. "
    "Its trucks leave the depot in Bergen every morning and reach Oslo by the evening. "
    "The company keeps a small fleet of electric vans for short deliveries inside the city. "
    "The Cedar project is owned by Alice Moreno. "
    "Most of its staff work in two warehouses, one near the harbour and one by the airport. "
    "In winter the company adds extra routes because ferries need more repairs in storms. "
    "Its drivers are paid by the hour, and most of them have worked there for more than five years. "
    "A new depot near Trondheim will open next spring.",
    "Birch is a research group that studies river ecology in the mountains around Lima. "
    "Its scientists sample the water every week and publish the results in an open database. "
    "The group also trains students from three universities during the summer months. "
    "The Birch project is owned by Bruno Okafor. "
    "Its laboratory sits on the second floor of an old textile factory near the river. "
    "Funding comes from a mix of public grants and donations from local fishing cooperatives. "
    "Every autumn the group invites schools to a field day by the river. "
    "Its boat, an old fishing vessel, was bought in 2019.",
]
QUESTION = "Who owns the Cedar project? Answer with the name only."


def progress(message: str) -> None:
    """A progress line on stderr, flushed at once: a log or a pipe sees each step as it starts
    (stdout, which holds the results, is block-buffered there)."""
    print(message, file=sys.stderr, flush=True)


async def main() -> None:
    started = time.monotonic()
    progress("loading the embedded model (the first time it is converted from its GGUF file, about a minute) ...")
    model, tokenizer = load("embedded")
    progress(f"  loaded in {time.monotonic() - started:.1f} s")
    # Documents as rendered text: each sender's state is exactly the document's tokens.
    progress("prefilling two documents as senders, selecting CacheBack r4 for the question ...")
    senders = [sender_from_hf(model, tokenizer, doc) for doc in DOCUMENTS]
    receiver = HFReceiver(
        model,
        tokenizer,
        messages=[{"role": "system", "content": "You answer questions from the context you were given."}],
        max_new_tokens=16,
    )
    await transfer(senders, receiver, QUESTION, ratio=4, record_selection=True)
    report = receiver.peek(0)[0]
    progress("answering from what the senders handed over ...")
    inputs = receiver.pop()
    with torch.no_grad():
        tokens = model.generate(**inputs, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    answer = tokenizer.decode(tokens[0], skip_special_tokens=True).strip()
    print(f"question: {QUESTION}")
    print(f"answer:   {answer}")
    for index, (state, message) in enumerate(zip(senders, report.messages)):
        kept = [span.text for span in message.selection.spans if span.kept and span.text]
        print(f"sender {index}: kept {message.positions}/{state.positions} positions, {message.nbytes} payload bytes")
        print(f"  kept positions: {list(message.selection.indices)}")
        print(f"  kept text: {' | '.join(t.strip() for t in kept)!r}")
    print(f"rclc {rclc.__version__}")


if __name__ == "__main__":
    asyncio.run(main())
