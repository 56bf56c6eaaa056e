"""End to end without models: run_experiment over the shipped topologies with a simulated
scheduler, resume, torn rows, failures, stale rows, reproduction checks and the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rclc_graph import compile_plan, load_graph
from rclc_graph.errors import PlanError, SpecError
from rclc_graph.experiments import commands, runner
from rclc_graph.experiments.arm_graphs import apply_arm
from rclc_graph.experiments.arms import parse_arm
from rclc_graph.experiments.case_result import CaseResult, case_result_from_run
from rclc_graph.experiments.inputs import resolve_mapping
from rclc_graph.experiments.reproduce import compare_runs
from rclc_graph.experiments.store import RESULTS
from rclc_graph.experiments.synthetic import make_dataset, write_dataset
from tests.helpers.experiment_fakes import FakeRunCase, simulate
from tests.paths import ROOT

CHAIN = ROOT / "topologies" / "chain_of_agents.yaml"
FANOUT = ROOT / "topologies" / "fanout_qa.yaml"
ARMS = ["r4=state:ratio=4", "r2=state:ratio=2,selector=recent", "b24=state:budget=24", "full=full", "text=text",
        "floor=question_only", "single=single_context"]


@pytest.fixture
def data(tmp_path) -> Path:
    path = tmp_path / "data.jsonl"
    write_dataset(path, 6, seed=11, documents=4)
    return path


def test_case_result_from_a_simulated_run():
    spec = load_graph(FANOUT)
    case = make_dataset(1, seed=2, documents=3)[0]
    plan = compile_plan(apply_arm(spec, parse_arm("full=full")), resolve_mapping(spec).inputs(case))
    run = simulate(plan, case)
    result = case_result_from_run(run, plan, case, model_fingerprints={"base": "f"})
    assert result.status == "finished" and result.answer == f"It is {case.answers[0]}."
    assert [hop.source for hop in result.hops] == ["reader[0]", "reader[1]", "reader[2]"]
    assert all(hop.kept_positions == hop.sent_positions for hop in result.hops)
    final_prompt = run.nodes["final"].prompt_text.split()
    assert result.output_positions == sum(hop.kept_positions for hop in result.hops) + len(final_prompt) + len(result.answer.split())
    assert result.model_fingerprints == {"base": "f"}
    assert result.evidence["gold_nodes"] == [f"reader[{case.gold_document}]"]
    assert result.evidence["fraction_at_output"] == 1.0
    assert result.greedy is True and result.plan_fingerprint == plan.fingerprint()
    assert result.selection_s == pytest.approx(0.03) and result.generation_s == pytest.approx(0.1)
    with pytest.raises(ValueError, match="status"):
        CaseResult(answer="x", latency_s=1.0, status="odd")
    with pytest.raises(ValueError, match="answer"):
        CaseResult(answer=None, latency_s=1.0)


@pytest.mark.parametrize("topology", [CHAIN, FANOUT], ids=["chain", "fanout"])
def test_run_experiment_end_to_end(tmp_path, data, topology):
    fake = FakeRunCase()
    steps = []
    summary = runner.run_experiment(topology, data, ARMS, tmp_path / "out", run_case=fake, progress=steps.append)
    assert len(fake.calls) == 6 * len(ARMS) and summary.computed == 6 * len(ARMS) and summary.resumed == 0
    assert [step.done for step in steps] == list(range(1, 6 * len(ARMS) + 1)) and steps[-1].total == 6 * len(ARMS)
    assert [step.arm for step in steps[: len(ARMS)]] == [parse_arm(a).name for a in ARMS]  # arms inner
    out = tmp_path / "out"
    for name in ("results.jsonl", "summary.json", "report.md", "accuracy_vs_compression.png", "accuracy_vs_latency.png"):
        assert (out / name).is_file(), name
    saved = json.loads((out / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary.data))
    arms = saved["arms"]
    assert list(arms) == [parse_arm(a).name for a in ARMS]
    for measures in arms.values():
        assert {"accuracy", "accuracy_ci", "median_latency_s", "positions", "payload_bytes", "evidence_survival"} <= set(measures)
        assert measures["cases"] == 6 and measures["failed"] == 0
    # the simulated answerer is right exactly when the evidence reached it
    assert arms["floor"]["accuracy"] == 0.0 and arms["floor"]["evidence_survival"] is None
    assert arms["single"]["accuracy"] == 1.0 and arms["single"]["evidence_survival"] == 1.0
    assert arms["full"]["accuracy"] == 1.0 and arms["full"]["evidence_survival"] == 1.0 and arms["full"]["compression"] == 1.0
    assert arms["text"]["evidence_survival"] is None  # not measurable over text hops
    assert arms["r2"]["positions"] > arms["r4"]["positions"] and arms["r4"]["compression"] > 1
    assert 0 < arms["r4"]["evidence_survival"] < 1
    assert saved["cases"] == 6 and saved["topology"]["name"] == load_graph(topology).name
    assert saved["model_fingerprints"] == {"base": ["fake-fingerprint"]} and saved["greedy"] is True
    assert saved["seeds"] == {"run": 0} and saved["versions"]["python"]
    assert saved["dataset"]["sha256"] and saved["scorer"] == "containment"
    rows = [json.loads(line) for line in (out / RESULTS).read_text().splitlines()]
    row = rows[0]
    for key in ("answer", "correct", "latency_s", "selection_s", "generation_s", "positions_sent", "positions_kept",
                "payload_bytes", "hops", "evidence", "evidence_at_output", "case_fingerprint", "arm_fingerprint",
                "plan_fingerprint", "model_fingerprints", "greedy", "seed"):
        assert key in row, key
    assert row["hops"][0]["sent_positions"] >= row["hops"][0]["kept_positions"]
    # issue 16 item 20: the first run of the process is the warm-up; the latency median leaves it out
    assert [r["warmup"] for r in rows] == [True] + [False] * (len(rows) - 1)
    assert arms[rows[0]["arm"]]["latency_runs"] == 5 and arms[rows[1]["arm"]]["latency_runs"] == 6
    assert len(saved["paired"]["pairs"]) == len(ARMS) * (len(ARMS) - 1) // 2 and saved["paired"]["reference"] == "r4"
    report = (out / "report.md").read_text()
    assert "accuracy_vs_compression.png" in report and "| single | single_context | 6 |" in report


def test_resume_recomputes_nothing_and_a_torn_row_once(tmp_path, data):
    out = tmp_path / "out"
    runner.run_experiment(FANOUT, data, ARMS[:3], out, run_case=FakeRunCase())
    again = FakeRunCase()
    summary = runner.run_experiment(FANOUT, data, ARMS[:3], out, run_case=again)
    assert again.calls == [] and summary.computed == 0 and summary.resumed == 18
    path = out / RESULTS
    before = path.read_bytes()
    path.write_bytes(before[:-20])  # a crash while writing the last row
    third = FakeRunCase()
    summary = runner.run_experiment(FANOUT, data, ARMS[:3], out, run_case=third)
    assert len(third.calls) == 1 and summary.computed == 1 and summary.recovered_bytes > 0
    assert len(path.read_text().splitlines()) == 18
    assert json.loads(path.read_text().splitlines()[-1])["warmup"] is True  # the resuming process warmed up on it
    # adding an arm computes only that arm; --limit restricts the summary to the first cases
    fourth = FakeRunCase()
    summary = runner.run_experiment(FANOUT, data, ARMS[:4], out, run_case=fourth, limit=2)
    assert len(fourth.calls) == 2 and summary.data["cases"] == 2 and summary.arms["full"]["cases"] == 2


def test_failures_are_rows_counted_wrong_and_retried_on_request(tmp_path, data):
    out = tmp_path / "out"
    first_case = json.loads(data.read_text().splitlines()[0])["id"]
    crashing = FakeRunCase(raise_on=first_case)
    summary = runner.run_experiment(FANOUT, data, ["full=full"], out, run_case=crashing)
    assert summary.arms["full"]["failed"] == 1 and summary.arms["full"]["accuracy"] == pytest.approx(5 / 6)
    row = json.loads((out / RESULTS).read_text().splitlines()[0])
    assert row["status"] == "failed" and row["error"] == "RuntimeError: simulated crash" and row["correct"] is False
    kept = FakeRunCase()
    runner.run_experiment(FANOUT, data, ["full=full"], out, run_case=kept)
    assert kept.calls == []  # failed rows are finished rows unless asked
    retried = FakeRunCase()
    summary = runner.run_experiment(FANOUT, data, ["full=full"], out, run_case=retried, retry_failed=True)
    assert len(retried.calls) == 1 and summary.arms["full"]["failed"] == 0 and summary.arms["full"]["accuracy"] == 1.0
    # a run the scheduler reports as failed (not raised) is recorded the same way
    scheduler_failed = runner.run_experiment(FANOUT, data, ["f2=full"], tmp_path / "o2", run_case=FakeRunCase(fail_on="Answer"))
    assert scheduler_failed.arms["f2"]["failed"] == 6 and scheduler_failed.arms["f2"]["accuracy"] == 0.0


def test_an_import_error_stops_the_experiment_without_rows(tmp_path, data):
    def broken(spec, inputs, case):
        raise ImportError("no module named 'torch'")

    with pytest.raises(ImportError):
        runner.run_experiment(FANOUT, data, ["full=full"], tmp_path / "out", run_case=broken)
    assert (tmp_path / "out" / RESULTS).exists() is False


def test_a_missing_scheduler_is_reported_before_any_run(tmp_path, data, monkeypatch):
    def missing(**kwargs):
        raise ImportError("No module named 'rclc_graph.run.scheduler'")

    monkeypatch.setattr(runner, "scheduler_run_case", missing)
    with pytest.raises(RuntimeError, match="scheduler is not available"):
        runner.run_experiment(FANOUT, data, ["full=full"], tmp_path / "out")
    assert not (tmp_path / "out" / RESULTS).exists()


def test_stale_rows_are_refused(tmp_path, data):
    out = tmp_path / "out"
    runner.run_experiment(FANOUT, data, ["a=state:ratio=4"], out, run_case=FakeRunCase())
    with pytest.raises(ValueError, match="different graph"):
        runner.run_experiment(FANOUT, data, ["a=state:ratio=8"], out, run_case=FakeRunCase())
    lines = data.read_text().splitlines()
    changed = json.loads(lines[0])
    changed["question"] += " Please."
    data.write_text("\n".join([json.dumps(changed)] + lines[1:]) + "\n")
    with pytest.raises(ValueError, match="has changed"):
        runner.run_experiment(FANOUT, data, ["a=state:ratio=4"], out, run_case=FakeRunCase())


def test_problems_are_found_before_any_run(tmp_path):
    three = tmp_path / "three.jsonl"
    write_dataset(three, 3, documents=3)
    fake = FakeRunCase()
    with pytest.raises(PlanError, match="reads 4 items of 'chunks'") as raised:
        runner.run_experiment(CHAIN, three, ["r4=state"], tmp_path / "out", run_case=fake)
    assert len(raised.value.problems) == 3  # every case is named
    with pytest.raises(PlanError, match="E_TRUST_CODE"):
        runner.run_experiment(FANOUT, three, ["mine=state:selector=my.mod:pick"], tmp_path / "out", run_case=fake)
    with pytest.raises(SpecError, match="not valid JSON"):
        bad = tmp_path / "bad.jsonl"
        bad.write_text("{\n")
        runner.run_experiment(FANOUT, bad, ["r4=state"], tmp_path / "out", run_case=fake)
    with pytest.raises(ValueError, match="trust-code"):
        runner.run_experiment(FANOUT, three, ["r4=state"], tmp_path / "out", run_case=fake, scorer="m:f")
    with pytest.raises(ValueError, match="unique"):
        runner.run_experiment(FANOUT, three, [parse_arm("a=full"), parse_arm("a=text")], tmp_path / "out", run_case=fake)
    assert fake.calls == [] and not (tmp_path / "out" / RESULTS).exists()
    # question_only and single_context alone read the whole list: any number of documents works
    summary = runner.run_experiment(CHAIN, three, ["floor=question_only"], tmp_path / "ok", run_case=fake)
    assert summary.arms["floor"]["cases"] == 3


def test_rescoring_with_another_scorer_keeps_the_file(tmp_path, data, monkeypatch):
    import sys
    import types

    out = tmp_path / "out"
    runner.run_experiment(FANOUT, data, ["full=full"], out, run_case=FakeRunCase())
    module = types.ModuleType("exp_never")
    module.never = lambda output, answers: False
    monkeypatch.setitem(sys.modules, "exp_never", module)
    summary = runner.run_experiment(FANOUT, data, ["full=full"], out, run_case=FakeRunCase(), scorer="exp_never:never",
                                    trust_code=True)
    assert summary.arms["full"]["accuracy"] == 0.0 and summary.data["scorer"] == "exp_never:never"
    assert all(json.loads(line)["correct"] for line in (out / RESULTS).read_text().splitlines())


def test_reruns_reproduce(tmp_path, data):
    for name in ("a", "b"):
        runner.run_experiment(FANOUT, data, ARMS[:2], tmp_path / name, run_case=FakeRunCase())
    same = compare_runs(tmp_path / "a", tmp_path / "b")
    assert same.reproduced and same.compared == 12 and same.identical == 12 and not same.not_comparable
    path = tmp_path / "b" / RESULTS
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[0]["answer"] = "something else"
    rows[1]["model_fingerprints"] = {"base": "other weights"}
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    changed = compare_runs(tmp_path / "a", tmp_path / "b")
    assert not changed.reproduced and len(changed.differing) == 1 and changed.compared == 11
    assert changed.not_comparable[0]["reason"] == "model_fingerprints differs"


# issue 16 item 20: compare-runs tests, per arm, whether two runs are right on the same cases
def test_compare_runs_reports_the_paired_test_per_arm(tmp_path, data):
    arms = ["full=full", "r4=state:ratio=4"]
    for name in ("a", "b"):
        runner.run_experiment(FANOUT, data, arms, tmp_path / name, run_case=FakeRunCase())
    path = tmp_path / "b" / RESULTS
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(row["correct"] for row in rows if row["arm"] == "full")
    for row in rows:
        if row["arm"] == "full":
            row["correct"] = False  # the second run got every case of `full` wrong
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = compare_runs(tmp_path / "a", tmp_path / "b")
    assert set(result.paired) == {"full", "r4"}
    full = result.paired["full"]
    assert (full.only_first, full.only_second, full.both_correct, full.both_wrong) == (6, 0, 0, 0)
    assert full.p_value == pytest.approx(2 / 2**6)
    r4 = result.paired["r4"]
    assert r4.only_first == r4.only_second == 0 and r4.p_value == 1.0 and r4.cases == 6
    assert result.to_dict()["paired"]["full"]["only_first"] == 6
    cli = CliRunner().invoke(commands.app, ["compare-runs", str(tmp_path / "a"), str(tmp_path / "b")])
    assert "arm full: right in both 0, only first 6, only second 0, neither 0; exact McNemar p=0.031" in cli.output
    cli = CliRunner().invoke(commands.app, ["compare-runs", str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    assert json.loads(cli.output)["paired"]["r4"]["p_value"] == 1.0


# issue 16 item 17: `compare-runs A A` reported success
def test_compare_runs_refuses_a_directory_compared_with_itself(tmp_path, data):
    runner.run_experiment(FANOUT, data, ARMS[:1], tmp_path / "a", run_case=FakeRunCase())
    with pytest.raises(ValueError, match="same directory"):
        compare_runs(tmp_path / "a", tmp_path / "a")
    (tmp_path / "link").symlink_to(tmp_path / "a")
    result = CliRunner().invoke(commands.app, ["compare-runs", str(tmp_path / "a"), str(tmp_path / "link")])
    assert result.exit_code == 2 and "same directory" in result.output


# issue 16 item 20: --compare-to names the reference arm of the table
def test_compare_to_names_the_reference_arm(tmp_path, data):
    summary = runner.run_experiment(FANOUT, data, ARMS[:3], tmp_path / "out", run_case=FakeRunCase(), compare_to="b24")
    assert summary.data["paired"]["reference"] == "b24"
    assert "vs b24 (McNemar)" in (tmp_path / "out" / "report.md").read_text()
    with pytest.raises(ValueError, match="--compare-to: no arm named 'zz'"):
        runner.run_experiment(FANOUT, data, ARMS[:3], tmp_path / "o2", run_case=FakeRunCase(), compare_to="zz")


def test_cli_data_make_experiment_and_compare(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "scheduler_run_case", lambda **kwargs: FakeRunCase())
    invoke = CliRunner().invoke
    data = tmp_path / "d.jsonl"
    result = invoke(commands.app, ["data", "make", "--size", "4", "--seed", "5", "--out", str(data), "--documents", "4"])
    assert result.exit_code == 0, result.output
    assert "wrote 4 cases" in result.output and len(data.read_text().splitlines()) == 4
    arms_file = tmp_path / "arms.yaml"
    arms_file.write_text("arms:\n  full: full\n  floor: question_only\n")
    args = ["experiment", "--topology", str(CHAIN), "--data", str(data), "--arm", "r4=state:ratio=4", "--arms-file",
            str(arms_file), "--out", str(tmp_path / "out")]
    result = invoke(commands.app, args)
    assert result.exit_code == 0, result.output
    assert "accuracy" in result.output and "r4" in result.output and "12 runs computed" in result.output
    # not a terminal: one progress line per case with the time left (issue 27), the last one says done
    steps = re.findall(r"^\[(\d+)/12\] \S+ / (\w+): (\w+) in [\d.]+ m?s; (.*)$", result.output, re.M)
    assert [int(step[0]) for step in steps] == list(range(1, 13)) and {step[2] for step in steps} == {"finished"}
    assert all("left" in step[3] for step in steps[:-1]) and steps[-1][3].startswith("done in")
    assert "the first run loads the models" in result.output
    result = invoke(commands.app, args + ["--json", "--limit", "2"])
    assert result.exit_code == 0, result.output
    assert "[1/" not in result.output  # silent with --json
    payload = json.loads(result.output)
    assert payload["cases"] == 2 and payload["rows"] == {"computed": 0, "resumed": 6, "recovered_bytes": 0}
    assert list(payload["arms"]) == ["full", "floor", "r4"]
    result = invoke(commands.app, ["experiment", "--topology", str(CHAIN), "--data", str(data), "--arm", "x=stat",
                              "--out", str(tmp_path / "o2"), "--json"])
    assert result.exit_code == 2 and json.loads(result.output)["problems"][0]["path"] == "arms.x.mode"
    result = invoke(commands.app, ["experiment", "--topology", str(CHAIN), "--data", str(data), "--out", str(tmp_path / "o2")])
    assert result.exit_code == 2 and "no arms given" in result.output
    result = invoke(commands.app, ["experiment", "--topology", str(CHAIN), "--data", str(data), "--arm", "full=full",
                              "--arms-file", str(arms_file), "--out", str(tmp_path / "o2")])
    assert result.exit_code == 2 and "given twice" in result.output
    result = invoke(commands.app, args + ["--compare-to", "floor"])
    assert result.exit_code == 0 and "vs floor" in result.output, result.output
    result = invoke(commands.app, args + ["--compare-to", "nope"])
    assert result.exit_code == 2 and "no arm named 'nope'" in result.output
    options = {}
    monkeypatch.setattr(runner, "scheduler_run_case", lambda **kwargs: options.update(kwargs) or FakeRunCase())
    result = invoke(commands.app, args[:-1] + [str(tmp_path / "again"), "--concurrency", "3", "--max-batch", "8"])
    assert result.exit_code == 0, result.output
    assert options["max_batch"] == 8  # handed to the scheduler's pool
    result = invoke(commands.app, ["compare-runs", str(tmp_path / "out"), str(tmp_path / "again")])
    assert result.exit_code == 0 and "12/12 comparable answers identical" in result.output
    result = invoke(commands.app, args + ["--concurrency", "0"])
    assert result.exit_code == 2
    result = invoke(commands.app, ["data", "make", "--size", "4", "--out", str(tmp_path / "x.jsonl"), "--documents", "20"])
    assert result.exit_code == 2 and "distinct entities" in result.output
    long = tmp_path / "long.jsonl"
    result = invoke(commands.app, ["data", "make", "--size", "3", "--out", str(long), "--documents", "4-8",
                                   "--document-tokens", "300-600"])
    assert result.exit_code == 0 and "wrote 3 cases" in result.output, result.output
    assert all(4 <= len(json.loads(line)["documents"]) <= 8 for line in long.read_text().splitlines())
    for bad, message in ((["--documents", "4-8"], "needs document_tokens"), (["--document-tokens", "lots"], "--document-tokens")):
        result = invoke(commands.app, ["data", "make", "--size", "2", "--out", str(tmp_path / "y.jsonl"), *bad])
        assert result.exit_code == 2 and message in result.output, result.output


class _ShuffledRunCase(FakeRunCase):
    """A thread-safe FakeRunCase whose runs take different times, so concurrent runs finish
    out of order; it records how many were in flight at once."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        import threading

        self._lock = threading.Lock()
        self.in_flight = self.most_in_flight = 0

    def __call__(self, spec, inputs, case):
        import time
        import zlib

        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            time.sleep((zlib.crc32(f"{case.id}{spec.name}{len(self.calls)}".encode()) % 7) / 400)
            with self._lock:
                return super().__call__(spec, inputs, case)
        finally:
            with self._lock:
                self.in_flight -= 1


def _without_timings(row):
    """A row without what depends on timing: its latency, when it finished, and `warmup` (a
    resumed experiment's first computed run is warm-up, whichever row it is)."""
    return {key: value for key, value in row.items() if key not in ("latency_s", "finished_at", "warmup")}


def test_concurrent_runs_write_what_a_sequential_experiment_writes(tmp_path, data):
    """issue 14: --concurrency N keeps rows, progress and the summary in sequential order;
    an interrupted concurrent experiment resumes like a sequential one."""
    arms = ARMS[:4]
    sequential_steps, concurrent_steps = [], []
    runner.run_experiment(FANOUT, data, arms, tmp_path / "seq", run_case=FakeRunCase(),
                          progress=sequential_steps.append)
    shuffled = _ShuffledRunCase()
    summary = runner.run_experiment(FANOUT, data, arms, tmp_path / "conc", run_case=shuffled,
                                    concurrency=4, progress=concurrent_steps.append)
    assert shuffled.most_in_flight > 1 and summary.computed == 6 * len(arms)
    rows = [json.loads(line) for line in (tmp_path / "seq" / RESULTS).read_text().splitlines()]
    again = [json.loads(line) for line in (tmp_path / "conc" / RESULTS).read_text().splitlines()]
    assert [_without_timings(row) for row in again] == [_without_timings(row) for row in rows]
    assert [(s.done, s.case, s.arm) for s in concurrent_steps] == [(s.done, s.case, s.arm) for s in sequential_steps]
    seq_summary = json.loads((tmp_path / "seq" / "summary.json").read_text())
    for arm, measures in summary.data["arms"].items():
        assert measures["accuracy"] == seq_summary["arms"][arm]["accuracy"]
    # resume: drop the last rows (an interruption), rerun concurrently: only they are computed
    path = tmp_path / "conc" / RESULTS
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:-5]))
    resumed = _ShuffledRunCase()
    summary = runner.run_experiment(FANOUT, data, arms, tmp_path / "conc", run_case=resumed,
                                    concurrency=3)
    assert len(resumed.calls) == 5 and summary.computed == 5 and summary.resumed == 6 * len(arms) - 5
    again = [json.loads(line) for line in path.read_text().splitlines()]
    assert [_without_timings(row) for row in again] == [_without_timings(row) for row in rows]


def test_concurrency_is_checked(tmp_path, data):
    with pytest.raises(ValueError, match="concurrency"):
        runner.run_experiment(FANOUT, data, ["full=full"], tmp_path / "out", run_case=FakeRunCase(), concurrency=0)


def test_an_import_error_stops_a_concurrent_experiment(tmp_path, data):
    def broken(spec, inputs, case):
        raise ImportError("no module named 'torch'")

    with pytest.raises(ImportError):
        runner.run_experiment(FANOUT, data, ["full=full"], tmp_path / "out", run_case=broken,
                              concurrency=3)
    assert not (tmp_path / "out" / RESULTS).exists() or (tmp_path / "out" / RESULTS).read_text() == ""
