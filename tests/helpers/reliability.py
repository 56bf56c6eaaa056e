"""Shared pieces of the reliability tests (issue 6): a six-node graph on a tiny model saved to
disk, forward counting per node, and comparing two run directories field by field.

The tiny model is written with `save_pretrained` and the topology's `source` points at
that directory, so the CLI in a subprocess loads it like any local checkpoint (no test-only
model source in the package).
"""

from __future__ import annotations

import collections
import contextvars
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from rclc import testing
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import backbone
from rclc.backends import hf_sequences
from rclc_graph import LocalExecutor, to_yaml
from rclc_graph.run.record import NODES_DIR, RECORD_FILE
from tests.paths import HELPERS, ROOT

PAUSED_CLI = HELPERS / "paused_cli.py"

# Six nodes, two roots. d is a fan-in of a reading sender (a) and a generating sender (b)
# with different policies; e takes a full state edge and a text edge; final fans in a state
# edge (ratio), a text edge and a bounded qsnap edge from a generating node. Its model
# captures each transfer in its own forward (`capture_batch: 1`): the resume tests count
# forwards per node, and a capture forward shared by two nodes' transfers (c and d start
# together when a and b are restored) would count for one of them only.
SIX_YAML = """\
version: 1
name: six
description: two roots, fan-ins of reading and generating senders, state, full and text edges
inputs:
  question: str
  chunks: list[str]
models:
  - {name: base, source: SOURCE, batching: {capture_batch: 1}}
agents:
  - {name: reader, model: base, max_new_tokens: 4}
  - {name: writer, model: base, max_new_tokens: MAXNEW}
nodes:
  - {name: a, agent: reader, generate: false, prompt: "Question: {question} Part one: {chunks[0]}"}
  - {name: b, agent: writer, prompt: "Part two: {chunks[1]} Summarise:"}
  - {name: c, agent: reader, generate: false, prompt: "Part three: {chunks[2]}"}
  - {name: d, agent: writer, prompt: "Question: {question} Notes:"}
  - {name: e, agent: writer, prompt: "Question: {question} Check:"}
  - {name: final, agent: writer, output: true, prompt: "Question: {question} Answer:"}
edges:
  - {source: a, target: c, policy: {ratio: 2}}
  - {source: a, target: d, policy: {budget: 12, request: "{question}"}}
  - {source: b, target: d, policy: {ratio: 2}}
  - {source: c, target: e, policy: {mode: full}}
  - {source: d, target: e, policy: {mode: text}}
  - {source: e, target: final, policy: {ratio: 3}}
  - {source: b, target: final, policy: {mode: text}}
  - {source: d, target: final, policy: {budget: 10, selector: qsnap}}
"""

SIX_INPUTS = {
    "question": "Who owns Cedar, and when did it launch?",
    "chunks": [
        "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo.",
        "The Birch project is owned by Bob and launched on 9 June 2019 in Lima.",
        "Find the owner and launch date. The answer is in the document summary.",
    ],
}

# Ideals of the six-node DAG (sets closed under "my senders are in it"): every state a
# crash can leave, from nothing finished to everything finished but the record unwritten.
SENDERS = {"a": set(), "b": set(), "c": {"a"}, "d": {"a", "b"}, "e": {"c", "d"}, "final": {"b", "d", "e"}}
ORDER = ["a", "b", "c", "d", "e", "final"]


def finished_sets() -> list[frozenset[str]]:
    found: set[frozenset[str]] = set()
    for mask in range(1 << len(ORDER)):
        chosen = {name for bit, name in enumerate(ORDER) if mask >> bit & 1}
        if all(SENDERS[name] <= chosen for name in chosen):
            found.add(frozenset(chosen))
    return sorted(found, key=lambda item: (len(item), sorted(item)))


def save_tiny(directory: Path, family: str = "qwen3", **options: Any) -> Path:
    """A tiny random model and its tokenizer as a local checkpoint directory (`options`: those
    of `rclc.testing.tiny_model`, e.g. max_positions)."""
    model, tokenizer = testing.tiny_model(family, **options)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_six(directory: Path, source: Path, *, max_new_tokens: int = 8) -> tuple[Path, Path]:
    """The six-node topology (pointing at `source`) and its inputs, as files."""
    topology = directory / "six.yaml"
    topology.write_text(SIX_YAML.replace("SOURCE", str(source)).replace("MAXNEW", str(max_new_tokens)))
    inputs = directory / "six.json"
    inputs.write_text(json.dumps(SIX_INPUTS))
    return topology, inputs


# -- a CLI run stopped at an exact point -------------------------------------------------------


def cli_environment() -> dict[str, str]:
    """The environment `rclc-graph` subprocesses run in: this checkout first on the path."""
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")


def only_run_dir(out: Path) -> Path:
    (run_dir,) = [path for path in out.iterdir() if path.is_dir()]
    return run_dir


def write_topology(directory: Path, name: str, spec: Any, inputs: Any) -> tuple[Path, Path]:
    """`spec` (a GraphSpec) as `name`.yaml, subgraphs inline so the run needs no other file, and
    `inputs` as JSON, both in `directory`: (topology, inputs file)."""
    topology = directory / f"{name}.yaml"
    topology.write_text(to_yaml(spec))
    inputs_file = directory / "inputs.json"
    inputs_file.write_text(json.dumps(inputs))
    return topology, inputs_file


def reference_run(topology: Path, inputs: Path, out: Path, *options: str) -> Path:
    """The uninterrupted `rclc-graph run` (in a subprocess, `options` added) that a crashed and
    resumed run must equal: its run directory, the only one under `out`."""
    reference = subprocess.run(
        [sys.executable, "-m", "rclc_graph", "run", str(topology), "--input", str(inputs), "--out", str(out), "--json",
         *options],
        cwd=ROOT, env=cli_environment(), capture_output=True, text=True, timeout=300,
    )
    assert reference.returncode == 0, reference.stderr
    return only_run_dir(out)


def run_until(topology: Path, inputs: Path, point: str, out: Path, marker: Path, *, hold: float | None = None,
              extra: tuple[str, ...] = (), env: dict[str, str] | None = None, script: Path = PAUSED_CLI,
              within: float = 300) -> subprocess.Popen:
    """`rclc-graph run` in a subprocess that pauses at `point` (see tests/helpers/paused_cli.py) and writes
    `marker` there; returns once the marker exists, so a signal lands exactly at that point.
    `env`: the subprocess's environment (default `cli_environment()`); `script`: a script taking
    paused_cli.py's arguments (scripted_cli.py also scripts tool calls); `within`: the seconds
    the run may take to get there."""
    command = [sys.executable, str(script)] + ([] if hold is None else ["--hold", str(hold)])
    command += [point, str(marker), "--", "run", str(topology), "--input", str(inputs), "--out", str(out), "--json",
                *extra]
    process = subprocess.Popen(command, cwd=ROOT, env=env or cli_environment(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + within
    while not marker.exists():
        if process.poll() is not None:
            raise AssertionError(f"the run ended before reaching {point}: {process.communicate()}")
        if time.monotonic() > deadline:
            process.kill()
            process.communicate()
            raise AssertionError(f"the run never reached {point}")
        time.sleep(0.01)
    return process


def communicate_or_kill(process: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """`process.communicate(timeout)`, but a process that does not end in time is killed and
    reaped before the test fails: left running, it would fail whichever test runs next in
    this pytest worker (an unraisable "subprocess is still running" warning)."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        raise AssertionError(f"the process did not end within {timeout} s; stderr:\n{stderr[-4000:]}") from None


# -- counting model work per node --------------------------------------------------------------

CURRENT_NODE_DEFAULT = "(outside nodes)"
CURRENT_NODE: contextvars.ContextVar[str] = contextvars.ContextVar("current_node", default=CURRENT_NODE_DEFAULT)


class CountingExecutor(LocalExecutor):
    """The local executor, naming the node it runs in a context variable that worker threads
    inherit, so a forward hook can say which node each forward belongs to."""

    async def run_node(self, ctx, node, inbound):
        token = CURRENT_NODE.set(node.name)
        try:
            return await super().run_node(ctx, node, inbound)
        finally:
            CURRENT_NODE.reset(token)


class ForwardCounter:
    """Counts decoder forwards (prefills, selections, generation steps) per node.

    Worker-side forwards and a generation's prefill run in the node's context; a decode step
    of the batching engine serves every sequence in its batch, so it counts once for each
    of them (one per token after the first, the token that step produced for it).
    """

    def __init__(self, model: Any) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.handle = backbone(model).register_forward_pre_hook(self._hook)
        self._add = hf_sequences.Sequence.add
        counts, add = self.counts, self._add

        def counting_add(sequence: Any, token: int) -> bool:
            if sequence.tokens:  # not the first token: a decode step produced it
                counts[sequence.context.get(CURRENT_NODE)] += 1
            return add(sequence, token)

        hf_sequences.Sequence.add = counting_add

    def _hook(self, module: Any, args: Any) -> None:
        if not threading.current_thread().name.startswith("rclc-batching") or CURRENT_NODE.get() != CURRENT_NODE_DEFAULT:
            self.counts[CURRENT_NODE.get()] += 1

    def remove(self) -> None:
        self.handle.remove()
        hf_sequences.Sequence.add = self._add

    def __enter__(self) -> ForwardCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


# -- comparing runs ----------------------------------------------------------------------------

_TIMING_KEYS = {"generation_seconds", "started_at", "finished_at", "selection_seconds", "seconds"}


def _without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_timings(item) for key, item in value.items() if key not in _TIMING_KEYS}
    if isinstance(value, list):
        return [_without_timings(item) for item in value]
    return value


def node_contents(run_dir: Path) -> dict[str, Any]:
    """Every node file's content except timings and the run id."""
    contents = {}
    for path in sorted((run_dir / NODES_DIR).glob("*.json")):
        data = json.loads(path.read_text())
        data.pop("run_id", None)
        snapshot = data.pop("snapshot", None) or {}
        data["snapshot_positions"] = snapshot.get("positions")
        contents[data["node"]] = _without_timings(data)
    return contents


def snapshot_tensors(run_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {
        path.stem: safetensors.torch.load_file(str(path)) for path in sorted((run_dir / NODES_DIR).glob("*.safetensors"))
    }


def assert_same_runs(reference: Path, resumed: Path) -> None:
    """Outputs, every node's text, lineage, hops and prompt, and every snapshot's rows and
    IDs bit for bit: the resumed run produced exactly what the uninterrupted one did."""
    first, second = json.loads((reference / RECORD_FILE).read_text()), json.loads((resumed / RECORD_FILE).read_text())
    assert second["status"] == "finished", second["error"]
    assert second["outputs"] == first["outputs"]
    assert _without_timings(second["hops"]) == _without_timings(first["hops"])
    assert second["lineage"] == first["lineage"]
    assert node_contents(resumed) == node_contents(reference)
    ours, theirs = snapshot_tensors(resumed), snapshot_tensors(reference)
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert ours[name].keys() == theirs[name].keys()
        for key in theirs[name]:
            assert torch.equal(ours[name][key], theirs[name][key]), (name, key)


def crash_copy(reference: Path, target: Path, finished: frozenset[str], *, orphan: str | None = None) -> Path:
    """The directory a crash leaves after exactly `finished` nodes: their node files and
    snapshots, record.json still saying "running", no report. With `orphan`, that node's
    snapshot is there without its node file (a crash between the two writes)."""
    shutil.copytree(reference, target)
    record = json.loads((target / RECORD_FILE).read_text())
    for path in (target / NODES_DIR).iterdir():
        stem = path.name.split(".")[0]
        if stem in finished or (orphan == stem and path.suffix == ".safetensors"):
            continue
        path.unlink()
    (target / "report.html").unlink()
    record.update(status="running", outputs={}, error=None, failed_node=None)
    record["attempts"][-1].update(status="running", finished_at=None)
    (target / RECORD_FILE).write_text(json.dumps(record))
    return target
