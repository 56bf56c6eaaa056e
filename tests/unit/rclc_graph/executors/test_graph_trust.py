"""Trust (issue 6, item 5): a topology cannot import code unless the caller opts in
(trust_code=True / --trust-code), at the API and the CLI, for runs and resumes; the files
of a run directory hold data only (JSON, safetensors, an HTML page without scripts: no
pickle, nothing executable); report.html escapes every string a model generated, a
document carried or user code raised.

The model here really generates the markup: a hook on the tiny model's output layer
forces its greedy choice through the tokens of a script tag, so the text reaches the
record and the report by the ordinary path."""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rclc import testing
from rclc_graph import GraphError, ModelPool, ModelSpec, compile_plan, load_graph_text, plan_file, run_recorded_sync
from rclc_graph.views.cli import app
from rclc_graph.errors import ResumeError
from rclc_graph.run.resume import read_resume_point, resume_run_sync

runner = CliRunner()
MARKUP = "<script>alert('x')</script>"
PLUGIN = f'''
import pathlib
pathlib.Path(__file__).with_name("imported.txt").write_text("imported")  # any import leaves a trace
CALLS = []

def keep_recent(sender, request_ids, budget):
    from rclc.selectors import recent
    CALLS.append(budget)
    return recent(sender, request_ids, budget)

def hostile(sender, request_ids, budget):
    raise RuntimeError("<img src=x onerror=alert(1)> {MARKUP}")
'''
TOPOLOGY = """\
version: 1
name: trusted
inputs:
  question: str
  document: str
models:
  - {name: base, source: embedded}
agents:
  - {name: w, model: base, max_new_tokens: MAXNEW}
nodes:
  - {name: a, agent: w, prompt: "Question: {question} Document: {document}"}
  - {name: b, agent: w, prompt: "Repeat: {document}"}
  - {name: final, agent: w, output: true, prompt: "Question: {question} Answer:"}
edges:
  - {source: a, target: final, policy: {budget: 6, selector: "SELECTOR"}}
  - {source: b, target: final, policy: {mode: text}}
"""
INPUTS = {"question": f"Is {MARKUP} safe?", "document": f"The page says {MARKUP} & \"quotes\" 'too'."}


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A module on sys.path whose import writes imported.txt next to itself."""
    directory = tmp_path / "plugins"
    directory.mkdir()
    (directory / "trust_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(directory))
    monkeypatch.delitem(sys.modules, "trust_plugin", raising=False)
    yield directory
    sys.modules.pop("trust_plugin", None)


def imported(plugin: Path) -> bool:
    return (plugin / "imported.txt").exists() or "trust_plugin" in sys.modules


def topology(selector: str = "trust_plugin:keep_recent", max_new_tokens: int = 72) -> str:
    return TOPOLOGY.replace("SELECTOR", selector).replace("MAXNEW", str(max_new_tokens))


@pytest.fixture(scope="module")
def tiny_scripted():
    """(model, tokenizer, pool) where every greedy step picks the next token of MARKUP repeated."""
    model, tokenizer = testing.tiny_model("qwen3")
    script = tokenizer(MARKUP + " ", add_special_tokens=False)["input_ids"]
    step = [0]

    def force(module, args, output):
        forced = output.new_full(output.shape, -1e4)
        forced[..., script[step[0] % len(script)]] = 1e4
        step[0] += 1
        return forced

    handle = model.lm_head.register_forward_hook(force)
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    yield model, tokenizer, pool
    handle.remove()


# -- code needs an opt-in ------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["selector", "reasoning.method"])
def test_the_api_refuses_code_without_trust_code_and_imports_nothing(plugin, tmp_path, field):
    text = topology() if field == "selector" else topology("cacheback").replace(
        "selector: \"cacheback\"}", "selector: cacheback, reasoning: {method: \"trust_plugin:keep_recent\"}}")
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(GraphError) as caught:
        plan_file(path, INPUTS)
    assert caught.value.code == "E_TRUST_CODE" and caught.value.location.line == 15
    assert "trust_code" in caught.value.fix
    with pytest.raises(GraphError, match="E_TRUST_CODE"):
        compile_plan(load_graph_text(text), INPUTS)
    assert not imported(plugin)
    plan = plan_file(path, INPUTS, trust_code=True)  # the opt-in: planned (imported when used)
    assert plan.trust_code


def test_the_cli_refuses_code_without_trust_code_and_imports_nothing(plugin, tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(topology())
    (tmp_path / "in.json").write_text(json.dumps(INPUTS))
    result = runner.invoke(app, ["run", str(path), "--input", str(tmp_path / "in.json"), "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2 and "E_TRUST_CODE" in result.output and "--trust-code" in result.output
    assert "Traceback" not in result.output
    assert not imported(plugin) and not (tmp_path / "runs").exists()
    # validate runs nothing: valid without --trust-code, saying which field names code, importing nothing
    for extra in ([], ["--input", str(tmp_path / "in.json")], ["--trust-code"]):
        result = runner.invoke(app, ["validate", str(path), *extra])
        assert result.exit_code == 0, result.output
        assert not imported(plugin)
    note = runner.invoke(app, ["validate", str(path)]).output
    assert "it names code (edges[0].policy.selector)" in note and "`run` needs --trust-code" in note
    data = json.loads(runner.invoke(app, ["validate", str(path), "--json"]).stdout)
    assert data["needs_trust_code"] and data["code_fields"] == ["edges[0].policy.selector"]
    assert not data["imports_checked"] and not imported(plugin)
    for extra in ([], ["--input", str(tmp_path / "in.json")]):  # draw runs nothing either
        drawn = runner.invoke(app, ["draw", str(path), *extra])
        assert drawn.exit_code == 0 and "flowchart" in drawn.stdout, drawn.output
    assert not imported(plugin)
    refused = runner.invoke(app, ["validate", str(path), "--check-imports"])
    assert refused.exit_code == 2 and "add --trust-code" in refused.output and not imported(plugin)
    result = runner.invoke(app, ["validate", str(path), "--check-imports", "--trust-code"])
    assert result.exit_code == 0 and "every module:function it names imports" in result.output and imported(plugin)


@pytest.mark.parametrize("with_input", [False, True])
def test_validate_answers_the_same_with_or_without_input(tmp_path, with_input):
    """A module that cannot be imported: valid without --check-imports, refused with it, either way."""
    path = tmp_path / "t.yaml"
    path.write_text(topology("trust_plugin_absent:keep"))
    (tmp_path / "in.json").write_text(json.dumps(INPUTS))
    extra = ["--input", str(tmp_path / "in.json")] if with_input else []
    assert runner.invoke(app, ["validate", str(path), *extra]).exit_code == 0
    assert runner.invoke(app, ["validate", str(path), "--trust-code", *extra]).exit_code == 0
    checked = runner.invoke(app, ["validate", str(path), "--trust-code", "--check-imports", *extra])
    assert checked.exit_code == 1 and "E_UNKNOWN_REF" in checked.output and f"{path}:15" in checked.output.replace("\n", "")


def test_a_module_beside_the_topology_imports_with_trust_code(tmp_path, monkeypatch):
    """No PYTHONPATH: the file next to the topology is found (still only with --trust-code)."""
    beside = tmp_path / "project"
    beside.mkdir()
    (beside / "beside_selector.py").write_text(PLUGIN)
    path = beside / "t.yaml"
    path.write_text(topology("beside_selector:keep_recent"))
    monkeypatch.delitem(sys.modules, "beside_selector", raising=False)
    result = runner.invoke(app, ["validate", str(path), "--check-imports", "--trust-code"])
    assert result.exit_code == 0, result.output
    assert (beside / "imported.txt").exists()
    sys.modules.pop("beside_selector", None)


def test_yaml_tags_cannot_build_objects(tmp_path, plugin):
    path = tmp_path / "t.yaml"
    path.write_text(topology().replace("name: trusted", "name: !!python/object/apply:trust_plugin.hostile [1, 2, 3]"))
    result = runner.invoke(app, ["validate", str(path), "--trust-code"])  # not even with trust
    assert result.exit_code != 0 and "E_YAML_TAG" in result.output and not imported(plugin)


def test_trusted_code_that_cannot_import_is_refused_before_any_weights_load(tmp_path, monkeypatch):
    def refuse(self, spec, base_dir=None):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(ModelPool, "get", refuse)
    plan = compile_plan(load_graph_text(topology("no_such_module_here:keep")), INPUTS, trust_code=True)
    with pytest.raises(GraphError) as caught:
        run_recorded_sync(plan, tmp_path / "runs", pool=ModelPool())
    assert caught.value.code == "E_UNKNOWN_REF" and "no_such_module_here" in caught.value.message
    assert caught.value.path == ("edges", 0, "policy", "selector")
    path = tmp_path / "t.yaml"
    path.write_text(topology("trust_plugin_missing:keep"))
    (tmp_path / "in.json").write_text(json.dumps(INPUTS))
    result = runner.invoke(app, ["run", str(path), "--input", str(tmp_path / "in.json"), "--out", str(tmp_path / "r"),
                                 "--trust-code"])
    assert result.exit_code == 2 and "E_UNKNOWN_REF" in result.output and f"{path}:15" in result.output.replace("\n", "")


def test_trusted_code_runs_and_only_a_sealed_run_resumes_without_the_opt_in(plugin, tmp_path, tiny_scripted,
                                                                              monkeypatch):
    _, _, pool = tiny_scripted
    plan = compile_plan(load_graph_text(topology(max_new_tokens=4)), INPUTS, trust_code=True)
    result, record, run_dir = run_recorded_sync(plan, tmp_path / "runs", pool=pool)
    assert result.status == "finished" and imported(plugin)
    assert sys.modules["trust_plugin"].CALLS  # the trusted selector chose the rows
    assert record["plan"]["trust_seal"]
    # started with trust_code by this user here: resumes without being told again
    assert read_resume_point(run_dir).plan.trust_code
    monkeypatch.setattr("rclc_graph.views.cli.default_pool", lambda: pool)
    result = runner.invoke(app, ["resume", str(run_dir), "--json"])
    assert result.exit_code == 0, result.output
    # the same directory for another user (another key), or with its seal edited: --trust-code again
    original = (run_dir / "record.json").read_text()
    edited = json.loads(original)
    edited["plan"]["trust_seal"] = "0" * 64
    (run_dir / "record.json").write_text(json.dumps(edited))
    with pytest.raises(ResumeError, match="does not carry this user's seal"):
        read_resume_point(run_dir)
    moved = json.loads(original)  # modules would be imported from another directory: not what was sealed
    moved["topology"]["base_dir"] = str(tmp_path / "elsewhere")
    (run_dir / "record.json").write_text(json.dumps(moved))
    with pytest.raises(ResumeError, match="does not carry this user's seal"):
        read_resume_point(run_dir)
    (run_dir / "record.json").write_text(original)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "another-user"))
    with pytest.raises(ResumeError, match="trust"):
        read_resume_point(run_dir)
    result = runner.invoke(app, ["resume", str(run_dir), "--json"])
    assert result.exit_code == 2 and "--trust-code" in result.output
    resumed, _, _ = resume_run_sync(run_dir, pool=pool, trust_code=True)  # nothing left to run
    assert resumed.status == "finished"


# -- the files of a run hold data only -----------------------------------------------------------

SAFE_DTYPES = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"}


def assert_plain_safetensors(path: Path) -> None:
    """The header is JSON naming tensors whose byte ranges tile the rest of the file exactly."""
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size].decode("utf-8"))
    body = len(data) - 8 - size
    ranges = []
    for name, entry in header.items():
        if name == "__metadata__":
            assert all(isinstance(value, str) for value in entry.values())
            for value in entry.values():  # metadata values are JSON or plain text
                if value.startswith("{"):
                    json.loads(value)
            continue
        assert entry["dtype"] in SAFE_DTYPES, (path, name, entry)
        ranges.append(tuple(entry["data_offsets"]))
    ranges.sort()
    assert ranges[0][0] == 0 and ranges[-1][1] == body
    assert all(left[1] == right[0] for left, right in zip(ranges, ranges[1:]))


def assert_data_only(run_dir: Path) -> int:
    files = [path for path in run_dir.rglob("*") if path.is_file()]
    for path in files:
        data = path.read_bytes()
        assert not data.startswith((b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")), path  # pickle/zip
        assert b"__reduce__" not in data and b"cbuiltins" not in data and b"c__builtin__" not in data, path
        if path.suffix == ".json":
            json.loads(data.decode("utf-8"))
        elif path.suffix == ".safetensors":
            assert_plain_safetensors(path)
        elif path.suffix == ".html":
            page = data.decode("utf-8")
            assert not re.search(r"<(script|iframe|object|embed|link|img)\b", page, re.I), path
            assert not re.search(r"<[^>]*\son[a-z]+\s*=", page, re.I), path  # no event handler attributes
            assert "javascript:" not in page.lower(), path
        elif path.name == ".lock":
            assert data == b"", path  # the directory lock (rclc_graph.run.directory_lock.DirectoryLock) holds nothing
        else:
            raise AssertionError(f"unexpected file in a run directory: {path}")
    return len(files)


def test_run_files_hold_data_only_and_the_report_escapes_what_the_model_wrote(plugin, tmp_path, tiny_scripted):
    _, _, pool = tiny_scripted
    plan = compile_plan(load_graph_text(topology()), INPUTS, trust_code=True)
    result, record, run_dir = run_recorded_sync(plan, tmp_path / "runs", pool=pool)
    assert result.status == "finished", result.error
    assert MARKUP in record["outputs"]["final"] and MARKUP in result.nodes["a"].text  # the model wrote it
    assert assert_data_only(run_dir) >= 8  # record, report, three nodes with a snapshot each
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "<script" not in page.lower()
    assert page.count("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;") >= 4, page.count("&lt;script&gt;")


def test_an_error_raised_by_user_code_is_escaped_in_the_report(plugin, tmp_path, tiny_scripted):
    _, _, pool = tiny_scripted
    plan = compile_plan(load_graph_text(topology("trust_plugin:hostile", max_new_tokens=4)), INPUTS, trust_code=True)
    result, record, run_dir = run_recorded_sync(plan, tmp_path / "runs", pool=pool)
    assert result.status == "failed" and "<img src=x onerror=alert(1)>" in record["error"]
    assert_data_only(run_dir)
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "<img" not in page
