"""Which replica hosts which node: pure bookkeeping, no hosts, no Ray.

Every model declaration (`models:` entry) becomes a replica group of `replicas` hosts, each
holding `resources` (`{CPU: 1}`, `{GPU: 1}`, custom Ray resources). Two declarations that load
the same weights the same way (source, dtype, device, backend) with the same resources share
one group, as they share one model in-process.

A run takes one replica of each group it uses, the one with the fewest active runs (lowest
index on ties), and keeps it for all its nodes, so most handoffs stay on one host. A pin
(`pins={"final": 1}`, keyed by plan node name such as `reader[0]` or by the declared name
`reader` for all its copies) puts a node on a given replica of its model's group instead;
that is how a run spreads its nodes and why handoffs then cross hosts. `replicas={"base": 2}`
(a run option) overrides the replica count a topology declares, so a topology written for one
machine scales out unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..plan.dag import Plan
from ..spec.models import ModelSpec
from .loaded_model import model_key
from ..errors import UsageError

RESOURCE_DEFAULT: dict[str, float] = {"CPU": 1.0}


def group_key(spec: ModelSpec, base_dir: Path | None) -> tuple[Any, ...]:
    return (model_key(spec, base_dir), tuple(sorted(resources_of(spec).items())))


def resources_of(spec: ModelSpec) -> dict[str, float]:
    """The resources each replica holds; `{CPU: 1}` when the model declares none."""
    return dict(spec.resources) if spec.resources else dict(RESOURCE_DEFAULT)


def group_label(spec: ModelSpec, index: int) -> str:
    return f"{spec.name}#{index}"


@dataclass
class ReplicaGroup:
    """The replicas of one model and how many runs each is serving now."""

    key: tuple[Any, ...]
    spec: ModelSpec
    base_dir: Path | None
    replicas: int | None = None  # a run option overriding spec.replicas
    active: list[int] = field(default_factory=list)  # active runs per replica index

    def __post_init__(self) -> None:
        self.grow(self.replicas if self.replicas is not None else self.spec.replicas)

    @property
    def size(self) -> int:
        return len(self.active)

    def grow(self, replicas: int) -> None:
        """A later declaration of the same model may ask for more replicas; never fewer."""
        while len(self.active) < replicas:
            self.active.append(0)

    def choose(self) -> int:
        """The replica serving the fewest runs (the lowest index among equals)."""
        return min(range(len(self.active)), key=lambda index: (self.active[index], index))


def pinned(node_name: str, declared: str, pins: Mapping[str, int]) -> int | None:
    """The replica index a node is pinned to, by plan name first, then by declared name."""
    if node_name in pins:
        return pins[node_name]
    return pins.get(declared)


def check_pins(pins: Mapping[str, int], plan: Plan, sizes: Mapping[str, int]) -> None:
    """ValueError naming the pin and the fix when a pin names no node or a missing replica.
    `sizes` maps model name -> replicas of its group."""
    names = {node.name for node in plan.nodes} | {node.declared for node in plan.nodes}
    for name, index in pins.items():
        if name not in names:
            raise UsageError(f"pins: {name!r} is not a node of plan {plan.name!r}; known: {', '.join(sorted(names))}")
        if type(index) is not int or index < 0:
            raise UsageError(f"pins: {name}={index!r} is not a replica index; use an int >= 0")
        for node in plan.nodes:
            if name in (node.name, node.declared) and node.model is None:
                raise UsageError(f"pins: {name!r} is a function node, which runs where the scheduler runs; drop the pin")
            if name in (node.name, node.declared) and index >= sizes[node.model.name]:
                raise UsageError(
                    f"pins: {name}={index} but model {node.model.name!r} has {sizes[node.model.name]} replica(s) "
                    f"(indices 0..{sizes[node.model.name] - 1}); raise its replicas or pin to an existing one"
                )


def parse_assignments(items: list[str] | tuple[str, ...], option: str, example: str) -> dict[str, int]:
    """`["final=1", "reader=0"]` (the CLI's --pin, --replicas) -> {"final": 1, "reader": 0}."""
    values: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip().isdigit():
            raise UsageError(f"{option}: {item!r} is not NAME=NUMBER; write e.g. {option} {example}")
        values[name.strip()] = int(value)
    return values


def parse_pins(items: list[str] | tuple[str, ...]) -> dict[str, int]:
    return parse_assignments(items, "--pin", "final=1")


def parse_replicas(items: list[str] | tuple[str, ...]) -> dict[str, int]:
    return parse_assignments(items, "--replicas", "base=2")
