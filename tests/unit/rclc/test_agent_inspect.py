"""inspect(), recorded selections, the selection page (also rendered in headless Chromium) and check()."""

from __future__ import annotations

import html.parser
import json
import shutil
import subprocess

import pytest
import torch

import rclc
from rclc import sender_from_hf, transfer_sync
from rclc.state import Delivery, Message
from tests.helpers.agents import DOC, HISTORY_A, HISTORY_B, QUESTION, counted_forwards, generate, history

SECOND = "When did Birch launch?"


def _two_senders_two_requests(model, tokenizer, **options):
    a = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    plain = sender_from_hf(model, tokenizer, DOC)
    b = rclc.bind(model, tokenizer, messages=history(HISTORY_B))
    transfer_sync([a, plain], b, [QUESTION, SECOND], **options)
    return a, plain, b


def test_inspect_reports_the_queue_without_forwarding(tiny):
    model, tokenizer = tiny
    a, plain, b = _two_senders_two_requests(model, tokenizer, record_selection=True)
    with counted_forwards(model) as calls:
        report = b.inspect()
        detailed = b.inspect(selection=True)
    assert calls == [], "inspect runs no forward pass"
    assert json.loads(json.dumps(detailed)) == detailed
    assert len(b) == 2 and not report["pending_generation"], "inspect consumes nothing"
    assert report["backend"] == "hf" and report["queued_requests"] == 2
    assert report["state_source"] == "messages" and report["cached_positions"] == 0
    hidden = model.config.hidden_size
    for index, entry in enumerate(report["deliveries"]):
        delivery, prepared = b.peek(index)
        assert "selection" not in entry
        assert entry["senders"] == 2
        assert entry["retained_positions"] == [message.positions for message in delivery.messages]
        assert entry["payload_bytes"] == sum(message.nbytes for message in delivery.messages)
        # fp32 rows, and the sender's token ID of each row beside it (8 bytes)
        assert entry["payload_bytes"] == sum(entry["retained_positions"]) * (hidden * 4 + 8)
        assert entry["prompt_positions"] == prepared.input_ids.shape[1]
        assert entry["reserved_output_positions"] == 128
        assert entry["remaining_positions"] == (
            b.context_limit - entry["prompt_positions"] - 128 - sum(entry["retained_positions"])
        )
    # Per-sender positions follow each sender's own relative budget (r4 default).
    assert report["deliveries"][0]["retained_positions"] == [
        -(-a.sender_state().positions // 4),
        -(-plain.positions // 4),
    ]


def test_inspect_tracks_the_lifecycle(tiny):
    model, tokenizer = tiny
    _, _, b = _two_senders_two_requests(model, tokenizer)
    inputs = b.pop(max_new_tokens=3)
    assert b.inspect()["pending_generation"] and b.inspect()["queued_requests"] == 1
    b.update(inputs=inputs, generation=generate(model, tokenizer, inputs))
    report = b.inspect()
    state = b.sender_state()
    assert report["state_source"] == "retained" and not report["pending_generation"]
    assert report["cached_positions"] == state.positions
    assert report["inherited_positions"] == state.inherited_positions == inputs["inputs_embeds"].shape[1] - (
        b.prepare_request(QUESTION).input_ids.shape[1]
    )


def test_negative_remaining_space_and_unrecorded_selection(tiny):
    model, tokenizer = tiny
    agent = rclc.bind(model, tokenizer, messages=history(HISTORY_B), context_limit=200)
    rows = torch.zeros(150, model.config.hidden_size)
    agent(Delivery(QUESTION, (Message(rows),)))
    entry = agent.inspect(selection=True)["deliveries"][0]
    assert entry["remaining_positions"] == 200 - entry["prompt_positions"] - 128 - 150 < 0
    assert entry["selection"] == [None]
    with pytest.raises(ValueError, match="context space"):
        agent.pop()
    assert len(agent) == 1
    with pytest.raises(ValueError, match="record_selection=True"):
        agent.selection_html()


def _check_record(record, state, message, tokenizer):
    indices, spans = record["indices"], record["spans"]
    assert indices == sorted(set(indices)) and len(indices) == message.positions - record["added_latent_positions"]
    assert record["source_positions"] == state.positions
    assert spans[0]["start"] == 0 and spans[-1]["stop"] == state.positions
    assert all(left["stop"] == right["start"] for left, right in zip(spans, spans[1:]))
    kept = {position for span in spans if span["kept"] for position in range(span["start"], span["stop"])}
    assert kept == set(indices)
    return spans


def test_recorded_selection_details(tiny):
    model, tokenizer = tiny
    a, plain, b = _two_senders_two_requests(model, tokenizer, record_selection=True)
    delivery = b.peek(0)[0]
    records = b.inspect(selection=True)["deliveries"][0]["selection"]
    for record, state, message in zip(records, [a.sender_state(), plain], delivery.messages):
        spans = _check_record(record, state, message, tokenizer)
        assert {span["kind"] for span in spans} == {"token"}
        assert "".join(span["text"] for span in spans) == tokenizer.decode(state.token_ids.tolist())

    # A continued agent sends its received rows as the tokens the senders named them, then its
    # own tokens: the whole record is text.
    inputs = b.pop(max_new_tokens=3)
    b.update(inputs=inputs, generation=generate(model, tokenizer, inputs))
    sink = []
    transfer_sync(b, sink.append, QUESTION, record_selection=True)
    state = b.sender_state()
    assert state.inherited_positions > 0 and bool((state.token_ids >= 0).all())
    record = sink[0].messages[0].selection.inspect()
    spans = _check_record(record, state, sink[0].messages[0], tokenizer)
    assert {span["kind"] for span in spans} == {"token"}
    assert "".join(span["text"] for span in spans) == tokenizer.decode(state.token_ids.tolist())


def test_selection_html_per_request(tiny):
    model, tokenizer = tiny
    _, _, b = _two_senders_two_requests(model, tokenizer, record_selection=True)
    first, second = b.selection_html(), b.selection_html(request_index=1)
    assert QUESTION in first and SECOND in second and SECOND not in first
    assert second.count("<mark class=\"kept\"") == sum(
        1 for record in b.inspect(selection=True)["deliveries"][1]["selection"] for s in record["spans"] if s["kept"]
    )
    for bad in (2, -1, True, "1"):
        with pytest.raises(ValueError, match="request_index"):
            b.selection_html(request_index=bad)
    assert len(b) == 2


SCRIPT_DOC = "Cedar notes <script>document.title='pwned'</script> owned by Alice & Bob."


def _script_page(model, tokenizer, ratio=1):
    sender = rclc.bind(model, tokenizer, prompt=SCRIPT_DOC)
    receiver = rclc.bind(model, tokenizer, messages=history(HISTORY_B))
    transfer_sync(sender, receiver, "Who owns <b>Cedar</b>?", ratio=ratio, record_selection=True)
    return receiver


def test_markup_in_documents_and_requests_is_escaped(tiny):
    model, tokenizer = tiny
    page = _script_page(model, tokenizer).selection_html()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<b>Cedar</b>" not in page and "&lt;b&gt;Cedar&lt;/b&gt;" in page
    assert "&amp; Bob" in page


# ---------------------------------------------------------------------------------------
# The page as a user sees it: headless Chromium


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium is not installed (Debian: apt-get install -y chromium)")


def _run_chromium(binary, profile, *arguments):
    command = [
        binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--hide-scrollbars", f"--user-data-dir={profile}", *arguments,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


class _Marks(html.parser.HTMLParser):
    """Collects <mark> titles and text, <title>, visible selection text and any <script> elements."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.marks, self.title, self.scripts, self.body_text = [], "", 0, ""
        self._open = []

    def handle_starttag(self, tag, attrs):
        self._open.append(tag)
        if tag == "mark":
            self.marks.append([dict(attrs).get("title"), ""])
        if tag == "script":
            self.scripts += 1

    def handle_endtag(self, tag):
        while self._open and self._open.pop() != tag:
            pass

    def handle_data(self, data):
        if "mark" in self._open:
            self.marks[-1][1] += data
        if "pre" in self._open:
            self.body_text += data
        if self._open and self._open[-1] == "title":
            self.title += data


def _green_pixels(path) -> int:
    import numpy
    from PIL import Image

    with Image.open(path) as image:
        pixels = numpy.asarray(image.convert("RGB"), dtype=numpy.int32)
    # mark.kept is #b7f0b1 (183, 240, 177); allow anti-aliasing at glyph edges.
    close = numpy.abs(pixels - numpy.array([183, 240, 177])) < 12
    return int(close.all(axis=-1).sum())


def test_selection_page_in_headless_chromium(tiny, tmp_path):
    binary = _chromium()
    model, tokenizer = tiny
    receiver = _script_page(model, tokenizer, ratio=2)
    everything = _script_page(model, tokenizer, ratio=1)
    record = receiver.inspect(selection=True)["deliveries"][0]["selection"][0]
    page = tmp_path / "selection.html"
    page.write_text(receiver.selection_html(), encoding="utf-8")
    full_page = tmp_path / "everything.html"
    full_page.write_text(everything.selection_html(), encoding="utf-8")

    dom = _run_chromium(binary, tmp_path / "profile", "--dump-dom", page.as_uri()).stdout
    parsed = _Marks()
    parsed.feed(dom)
    assert parsed.title == "rclc transfer selection", "no script from the document ran"
    assert parsed.scripts == 0
    kept_spans = [span for span in record["spans"] if span["kept"]]
    assert len(parsed.marks) == len(kept_spans) > 0
    for (title, text), span in zip(parsed.marks, kept_spans):
        assert title == f"kept: positions [{span['start']}, {span['stop']})"
        assert text == span["text"]
    assert "<script>document.title='pwned'</script>" in parsed.body_text, "the markup shows as text"

    shots = {}
    for name, source in (("partial", page), ("full", full_page)):
        shot = tmp_path / f"{name}.png"
        _run_chromium(binary, tmp_path / f"profile-{name}", f"--screenshot={shot}", "--window-size=1000,800",
                      source.as_uri())
        shots[name] = _green_pixels(shot)
    assert shots["partial"] > 500, "kept spans are highlighted in green"
    assert shots["full"] > shots["partial"], "keeping more text paints more green"


# ---------------------------------------------------------------------------------------
# Diagnostics with a bound agent


def test_check_with_a_bound_agent(tiny):
    model, tokenizer = tiny
    agent = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    report = rclc.check(agent)
    assert report["scope"] == "bound_agent" and report["backend"] == "hf"
    assert json.loads(json.dumps(report)) == report
    assert rclc.check(agent, backend="hf", allow_unstable=False)["scope"] == "bound_agent"
    with pytest.raises(ValueError, match="bound agent"):
        rclc.check(agent, backend="vllm")
    with pytest.raises(ValueError, match="bound agent"):
        rclc.check(agent, allow_unstable=True)
    with pytest.raises(ValueError, match="backend"):
        rclc.check(backend="tpu")
    assert rclc.check()["scope"] == "environment"
