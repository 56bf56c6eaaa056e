"""Running a plan: the scheduler, run records (the record/ package: format, reader, writer,
recording, shape, view), resuming from one, the settings a view's runs share (settings.py), and the checks that run
before any model loads (preflight.py).
"""

from .record.reader import finished_nodes, read_node, read_record
from .record.recording import RecordingExecutor, record_run, record_with, run_recorded, run_recorded_sync
from .record.shape import check_record
from .record.view import current_record
from .record.writer import RunRecorder
from .resume import ResumePoint, read_resume_point, resume_run, resume_run_sync
from .scheduler import RunObserver, new_run_id, run_plan, run_plan_sync, run_with
from .settings import RunSettings, preflight, prepare_run
from .streaming import RunStream, SyncRunStream, astream, astream_resume, stream, stream_resume

__all__ = [
    # the scheduler
    "RunObserver",
    "new_run_id",
    "run_plan",
    "run_plan_sync",
    "run_with",
    # what a view's runs share, and preparing a run once
    "RunSettings",
    "preflight",
    "prepare_run",
    # records
    "RecordingExecutor",
    "RunRecorder",
    "check_record",
    "current_record",
    "finished_nodes",
    "read_node",
    "read_record",
    "record_run",
    "record_with",
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
    "stream_resume",
]
