"""What a run produces, as plain data: node and run results, the lineage of every held
position and the hop records of handoffs, and the bounded event stream a run publishes into.
"""

import types as _types

from .events import Event, EventStream, StreamStats
from .lineage import Hop, HopRecord, Lineage, Origin, Segment, compose_hop, receiver_lineage
from .run_events import *  # noqa: F403 - the typed events and their readers (run_events.__all__)
from .run_result import NodeResult, RunResult

# every name imported above, the submodules themselves aside (the imports say where each lives)
__all__ = sorted(
    name for name, value in vars().items() if not name.startswith("_") and not isinstance(value, _types.ModuleType)
)
