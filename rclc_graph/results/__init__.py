"""What a run produces, as plain data: node and run results, the lineage of every held
position and the hop records of handoffs, and the bounded event stream a run publishes into.
"""

from .events import Event, EventStream, StreamStats
from .lineage import Hop, HopRecord, Lineage, Origin, Segment, compose_hop, receiver_lineage
from .run_events import (
    EVENT_TYPES,
    EdgeDecided,
    HopDelivered,
    NodeFailure,
    NodeFinished,
    NodeSkipped,
    NodeStarted,
    NodeWaiting,
    RunCancelled,
    RunEvent,
    RunFailed,
    RunFinished,
    RunStarted,
    RunWaiting,
    TokenGenerated,
    ToolCalled,
    ToolReturned,
    event_from_dict,
    typed,
)
from .run_result import NodeResult, RunResult

__all__ = [
    # results
    "NodeResult",
    "RunResult",
    # lineage
    "Hop",
    "HopRecord",
    "Lineage",
    "Origin",
    "Segment",
    "compose_hop",
    "receiver_lineage",
    # events
    "Event",
    "EventStream",
    "StreamStats",
    # typed events (run_events.py)
    "EVENT_TYPES",
    "EdgeDecided",
    "HopDelivered",
    "NodeFailure",
    "NodeFinished",
    "NodeSkipped",
    "NodeStarted",
    "NodeWaiting",
    "RunCancelled",
    "RunEvent",
    "RunFailed",
    "RunFinished",
    "RunStarted",
    "RunWaiting",
    "TokenGenerated",
    "ToolCalled",
    "ToolReturned",
    "event_from_dict",
    "typed",
]
