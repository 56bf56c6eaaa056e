"""Running a plan: the scheduler, the run-record format (record.py) with its writer
(recorder.py), runs that leave a record (recorded.py), resuming from one, and the checks that
run before any model loads (preflight.py).
"""

from .record import finished_nodes, read_node, read_record
from .record_shape import check_record
from .record_view import current_record
from .recorded import RecordingExecutor, prepare_models, record_run, run_recorded, run_recorded_sync
from .recorder import RunRecorder
from .resume import ResumePoint, read_resume_point, resume_run, resume_run_sync
from .scheduler import RunObserver, new_run_id, run_plan, run_plan_sync
from .streaming import RunStream, SyncRunStream, astream, astream_resume, stream

__all__ = [
    # the scheduler
    "RunObserver",
    "new_run_id",
    "run_plan",
    "run_plan_sync",
    # records
    "RecordingExecutor",
    "RunRecorder",
    "check_record",
    "current_record",
    "finished_nodes",
    "prepare_models",
    "read_node",
    "read_record",
    "record_run",
    "run_recorded",
    "run_recorded_sync",
    # resume
    "ResumePoint",
    "read_resume_point",
    "resume_run",
    "resume_run_sync",
    # watching a run
    "RunStream",
    "SyncRunStream",
    "astream",
    "astream_resume",
    "stream",
]
