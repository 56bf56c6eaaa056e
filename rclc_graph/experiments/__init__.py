"""Experiments: datasets, arms, scoring, tables and plots comparing handoff policies.

    run_experiment(topology, data, arms, out_dir)     the loop (runner.py)
    read_dataset / write_jsonl / make_dataset         JSONL datasets, synthetic data
    parse_arm / load_arms / apply_arm                 arms (arms.py) and the graphs they run (arm_graphs.py)
    compare_runs                                      did a rerun reproduce the answers?

The CLI pieces (`experiment`, `data make`, `compare-runs`) are the typer app in `commands.py`;
plots and report.md are `figures.py`. Nothing here imports torch until a case runs a model.
"""

from .arm_graphs import apply_arm, validate_arms
from .arms import Arm, load_arms, parse_arm, parse_arms
from .case_result import CaseResult, HopFigures, case_result_from_run, scheduler_run_case
from .datasets import Case, make_case, read_dataset, write_jsonl
from .evidence import EvidenceSurvival, evidence_survival
from .inputs import InputMapping, resolve_mapping
from .reproduce import Reproduction, compare_runs
from .runner import Progress, Summary, run_experiment
from .scoring import containment, load_scorer, normalise
from .store import ResultStore, StoreError
from .synthetic import make_dataset, write_dataset

__all__ = [
    "Arm",
    "Case",
    "CaseResult",
    "EvidenceSurvival",
    "HopFigures",
    "InputMapping",
    "Progress",
    "Reproduction",
    "ResultStore",
    "StoreError",
    "Summary",
    "apply_arm",
    "case_result_from_run",
    "compare_runs",
    "containment",
    "evidence_survival",
    "load_arms",
    "load_scorer",
    "make_case",
    "make_dataset",
    "normalise",
    "parse_arm",
    "parse_arms",
    "read_dataset",
    "resolve_mapping",
    "run_experiment",
    "scheduler_run_case",
    "validate_arms",
    "write_dataset",
    "write_jsonl",
]
