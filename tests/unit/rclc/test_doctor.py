from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import types

import pytest

import rclc.doctor as doctor
from rclc import models, testing
from rclc.doctor import check, declared_range, leading_version
from tests.paths import ROOT



def problems(report):
    return [issue["problem"] for issue in report["issues"]]


def test_report_shape():
    report = check()
    assert set(report) == {
        "ok",
        "scope",
        "backend",
        "allow_unstable",
        "versions",
        "cuda_available",
        "embedded_model",
        "batching",
        "issues",
    }
    assert report["scope"] == "environment" and report["backend"] == "hf"
    assert report["batching"] == {
        "enabled": True, "max_batch": 32, "wait_ms": 1.0, "worker_forwards": 2, "shared_prefixes": True,
        "prefill_batch": 8, "prefix_cache_mib": 128, "capture_batch": 8, "prefill_first_ms": 1000.0,
        "scope": "defaults"}
    assert set(report["versions"]) == {"rclc", "torch", "transformers", "vllm"}
    assert report["versions"]["torch"] == importlib.metadata.version("torch")
    assert isinstance(report["cuda_available"], bool)
    assert report["embedded_model"] == models.embedded_present()
    assert isinstance(report["issues"], list)
    for issue in report["issues"]:
        assert set(issue) == {"problem", "fix"} and issue["problem"] and issue["fix"]
    assert report["ok"] == (not report["issues"])
    json.dumps(report)


def test_doctor_never_converts_or_loads(monkeypatch):
    def refuse(*args, **kwargs):
        pytest.fail("doctor must not convert or load models")

    monkeypatch.setattr(models, "_convert_embedded", refuse)
    monkeypatch.setattr(models, "load", refuse)
    check()


def test_leading_version():
    assert str(leading_version("2.13.0+cpu")) == "2.13.0"
    assert str(leading_version("5.24.0.dev0")) == "5.24.0"
    assert str(leading_version("0.30")) == "0.30.0"
    assert leading_version(None) is None
    assert leading_version("unknown") is None


def fake_versions(monkeypatch, **overrides):
    real = doctor.installed_version

    def version(distribution):
        key = distribution.replace("-", "_")
        return overrides[key] if key in overrides else real(distribution)

    monkeypatch.setattr(doctor, "installed_version", version)


@pytest.mark.parametrize(
    "torch_version,transformers_version,expected",
    [
        ("2.13.0+cpu", "5.24.0", []),
        ("2.4.0", "5.13.0", []),
        ("2.3.1", "5.24.0", ["torch 2.3.1 is older than 2.4.0"]),
        ("2.13.0", "4.57.1", ["transformers 4.57.1 is outside"]),
        ("2.13.0", "5.25.0", ["transformers 5.25.0 is outside"]),
        ("2.13.0", None, ["transformers is not installed"]),
    ],
)
def test_library_versions(monkeypatch, torch_version, transformers_version, expected):
    fake_versions(monkeypatch, torch=torch_version, transformers=transformers_version)
    found = problems(check())
    assert len(found) == len(expected)
    for problem, prefix in zip(found, expected):
        assert problem.startswith(prefix)


def test_transformers_range_comes_from_metadata(monkeypatch):
    assert str(declared_range("rclc-graph", "transformers", "==0")) in (">=5.13,<5.25", "<5.25,>=5.13")

    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "requires", absent)
    assert str(declared_range("rclc-graph", "transformers", ">=1,<2")) in (">=1,<2", "<2,>=1")
    fake_versions(monkeypatch, transformers="5.20.0")
    assert not any("transformers" in p for p in problems(check()))
    fake_versions(monkeypatch, transformers="5.30.0")
    found = [p for p in problems(check()) if "transformers" in p]
    assert len(found) == 1 and "5.13" in found[0] and "5.25" in found[0]


def test_bad_options():
    with pytest.raises(ValueError, match="backend"):
        check(backend="tgi")
    with pytest.raises(ValueError, match="allow_unstable"):
        check(allow_unstable=True)
    with pytest.raises(ValueError, match="allow_unstable"):
        check(backend="vllm", allow_unstable="yes")


@pytest.fixture
def fake_vllm(monkeypatch):
    """Pretend an importable vLLM of a chosen version is installed."""

    def install(version, requirements=()):
        monkeypatch.setattr(doctor, "_vllm_distribution", lambda: "vllm")
        fake_versions(monkeypatch, vllm=version)
        monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
        real_find_spec = importlib.util.find_spec
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a)
        )
        real_requires = importlib.metadata.requires
        monkeypatch.setattr(
            importlib.metadata,
            "requires",
            lambda name: list(requirements) if name == "vllm" else real_requires(name),
        )

    return install


def test_vllm_backend_without_vllm(monkeypatch):
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setattr(doctor, "_vllm_distribution", lambda: None)
    report = check(backend="vllm")
    assert not report["ok"] and report["backend"] == "vllm"
    found = problems(report)
    assert any("VLLM_ENABLE_V1_MULTIPROCESSING" in p for p in found)
    assert any(p == "vLLM is not installed" for p in found)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    assert not any("MULTIPROCESSING" in p for p in problems(check(backend="vllm")))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "false")
    assert any("MULTIPROCESSING" in p for p in problems(check(backend="vllm")))


def test_vllm_tested_release_passes(monkeypatch, fake_vllm):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    fake_vllm(doctor.TESTED_VLLM_VERSIONS[0])
    report = check(backend="vllm")
    assert report["versions"]["vllm"] == doctor.TESTED_VLLM_VERSIONS[0]
    expected_ok = sys.platform.startswith("linux")
    assert report["ok"] == expected_ok, report["issues"]


def test_vllm_untested_and_unstable_releases(monkeypatch, fake_vllm):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    fake_vllm("0.11.1")
    assert any("not a tested release" in p for p in problems(check(backend="vllm")))
    monkeypatch.setattr(doctor, "UNSTABLE_VLLM_VERSIONS", ("0.11.1",))
    assert any("unstable opt-in" in p for p in problems(check(backend="vllm")))
    assert not any("vLLM 0.11.1" in p for p in problems(check(backend="vllm", allow_unstable=True)))


def test_vllm_pinned_pair(monkeypatch, fake_vllm):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    fake_vllm(doctor.TESTED_VLLM_VERSIONS[0], ["torch==2.9.0", "transformers>=4.56", "numpy"])
    fake_versions(monkeypatch, vllm=doctor.TESTED_VLLM_VERSIONS[0], torch="2.9.0+cpu", transformers="5.20.0")
    assert not any("requirement" in p for p in problems(check(backend="vllm")))
    fake_versions(monkeypatch, vllm=doctor.TESTED_VLLM_VERSIONS[0], torch="2.13.0+cpu", transformers="5.20.0")
    found = [p for p in problems(check(backend="vllm")) if "requirement" in p]
    assert len(found) == 1 and found[0].startswith("torch 2.13.0+cpu")


def test_vllm_that_does_not_import(monkeypatch, fake_vllm):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    fake_vllm(doctor.TESTED_VLLM_VERSIONS[0])
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    assert any("does not import" in p for p in problems(check(backend="vllm")))


def agent(model, backend="hf", allow_unstable=False):
    return types.SimpleNamespace(model=model, backend=backend, allow_unstable=allow_unstable)


def test_bound_agent(tiny_qwen3):
    model, _ = tiny_qwen3
    report = check(agent(model))
    assert report["scope"] == "bound_agent" and report["backend"] == "hf"
    assert not any(p.startswith("model:") for p in problems(report))
    batching = report["batching"]
    assert batching["scope"] == "model" and batching["backend"] == "hf" and batching["max_batch"] == 32
    assert {"batch_sizes", "decode_steps", "mean_batch", "sequences"} <= set(batching)
    assert check(agent(model), backend="hf", allow_unstable=False)["scope"] == "bound_agent"


def test_bound_agent_conflicts(tiny_qwen3):
    model, _ = tiny_qwen3
    with pytest.raises(ValueError, match="bound agent"):
        check(agent(model), backend="vllm")
    with pytest.raises(ValueError, match="bound agent"):
        check(agent(model), allow_unstable=True)
    with pytest.raises(ValueError, match="bound agent"):
        check(agent(model, backend="vllm", allow_unstable=True), allow_unstable=False)


def test_bound_agent_model_problems(tiny_tokenizer):
    model, _ = testing.tiny_model("llama", tokenizer=tiny_tokenizer)
    model.train()
    report = check(agent(model))
    assert not report["ok"]
    assert any("training mode" in p for p in problems(report))
    foreign = types.SimpleNamespace(config=types.SimpleNamespace(model_type="gpt2"))
    assert any("'gpt2' is not supported" in p for p in problems(check(agent(foreign))))


def run_cli(*arguments, env=None):
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    environment.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    return subprocess.run(
        [sys.executable, "-m", "rclc", *arguments],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environment,
        timeout=120,
    )


def test_cli_doctor():
    done = run_cli("doctor")
    report = json.loads(done.stdout)
    assert done.stdout.startswith("{\n  ")  # indented JSON
    assert report["backend"] == "hf"
    assert done.returncode == (0 if report["ok"] else 1)
    assert report["ok"] == check()["ok"]

    done = run_cli("doctor", "--backend", "vllm")
    report = json.loads(done.stdout)
    assert report["backend"] == "vllm" and not report["ok"]
    assert done.returncode == 1

    done = run_cli("doctor", "--allow-unstable")
    assert done.returncode == 2 and "allow_unstable" in done.stderr

    assert run_cli("doctor", "--backend", "tgi").returncode == 2
    assert run_cli().returncode == 2
