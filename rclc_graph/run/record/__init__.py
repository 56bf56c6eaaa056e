"""Run records: one package, a module per job.

    format.py     the layout of runs/<run_id>/: names, versions, code and snapshot identities
    reader.py     reading a directory back: record.json, node files, the nodes finished on disk
    writer.py     RunRecorder: writing a directory while a run goes (atomic files, the lock)
    recording.py  running a plan with a writer (the recording executor, record_run, run_recorded)
    shape.py      check_record: a record's fields checked before anything shows or resumes it
    view.py       current_record: what a directory says now (a killed run shown as crashed)

The reading side is re-exported here; recording.py (which imports the scheduler) is imported
from its module.
"""

from .format import NODES_DIR, RECORD_FILE, REPORT_FILE, code_fingerprint, safe_name, snapshot_identity, versions
from .reader import finished_nodes, read_node, read_record
from .shape import check_record
from .view import CRASHED, current_record
from .writer import RunRecorder

__all__ = [
    "CRASHED",
    "NODES_DIR",
    "RECORD_FILE",
    "REPORT_FILE",
    "RunRecorder",
    "check_record",
    "code_fingerprint",
    "current_record",
    "finished_nodes",
    "read_node",
    "read_record",
    "safe_name",
    "snapshot_identity",
    "versions",
]
