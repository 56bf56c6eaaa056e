"""The library logs through `logging` and prints nothing (issue 15, item 4): output to a
terminal is the views' job (the CLI, `python -m rclc doctor`), never a library module's."""

from __future__ import annotations

import ast

from tests.paths import ROOT

VIEWS = ("rclc_graph/views/", "rclc_graph/server/commands.py", "rclc_graph/experiments/commands.py", "rclc/__main__.py",
         "rclc_graph/__main__.py")


def test_no_library_module_prints_or_writes_to_the_terminal():
    found = []
    for package in ("rclc", "rclc_graph"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith(VIEWS):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    function = node.func
                    if isinstance(function, ast.Name) and function.id == "print":
                        found.append(f"{relative}:{node.lineno} print()")
                    if (isinstance(function, ast.Attribute) and function.attr == "write"
                            and isinstance(function.value, ast.Attribute) and function.value.attr in ("stdout", "stderr")):
                        found.append(f"{relative}:{node.lineno} sys.{function.value.attr}.write()")
    assert found == []


def test_modules_that_report_progress_have_module_loggers():
    for relative in ("rclc_graph/run/scheduler.py", "rclc_graph/run/record/writer.py", "rclc_graph/run/resume.py",
                     "rclc_graph/executors/pool.py", "rclc_graph/server/runs.py", "rclc_graph/run/tracing.py"):
        assert "logger = logging.getLogger(__name__)" in (ROOT / relative).read_text(encoding="utf-8"), relative
