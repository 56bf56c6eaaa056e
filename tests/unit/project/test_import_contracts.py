"""The import contracts of pyproject.toml ([tool.importlinter]) hold, and the checker really
reads the imports: a contract the code breaks is reported as broken."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tests.paths import ROOT

pytest.importorskip("importlinter")  # the dev extra installs it (make install)
tomllib = pytest.importorskip("tomllib")  # Python 3.11+

LINT_IMPORTS = pathlib.Path(sys.executable).parent / "lint-imports"


def lint_imports(*arguments: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's code, not an installed copy
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", *arguments], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=300)


def test_every_contract_is_kept():
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
    for contract in ("rclc never imports rclc_graph", "spec and plan import no torch", "spec and plan use only rclc's",
                     "imports rclc's public names only", "views and the server use the executors'",
                     "the graph layer's layers", "render imports no other part", "errors sits below",
                     "never imports rclc_graph.testing", "the server is a view over the runtime",
                     "only the server imports the web stack"):
        assert contract in result.stdout, contract


def test_a_contract_the_code_breaks_fails(tmp_path):
    config = tmp_path / "broken.toml"
    config.write_text(
        "[tool.importlinter]\n"
        'root_packages = ["rclc_graph"]\n\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "views never import run (untrue: the CLI runs plans)"\n'
        'type = "forbidden"\n'
        'source_modules = ["rclc_graph.views"]\n'
        'forbidden_modules = ["rclc_graph.run"]\n'
    )
    result = lint_imports(str(config))
    assert result.returncode == 1
    assert "1 broken" in result.stdout and "rclc_graph.views.interactive -> rclc_graph.run" in result.stdout


def test_the_public_names_contract_reads_the_graph_layers_imports_of_rclc(tmp_path):
    # The real contract, minus one public module: the graph's imports of rclc.policy then break it.
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    contract = next(item for item in contracts if "public names only" in item["name"])
    allowed = [line for line in contract["ignore_imports"] if not line.endswith("-> rclc.policy")]
    assert len(allowed) == len(contract["ignore_imports"]) - 1
    config = tmp_path / "public.toml"
    config.write_text(
        "[tool.importlinter]\n"
        'root_packages = ["rclc", "rclc_graph"]\n\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "public names, rclc.policy left out"\n'
        'type = "forbidden"\n'
        f"source_modules = {contract['source_modules']!r}\n"
        f"forbidden_modules = {contract['forbidden_modules']!r}\n"
        "allow_indirect_imports = true\n"
        f"ignore_imports = {allowed!r}\n"
        'unmatched_ignore_imports_alerting = "none"\n'
    )
    result = lint_imports(str(config))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "rclc_graph.plan.policy -> rclc.policy" in result.stdout
