"""Running a plan: the scheduler, run records (the record/ package: format, reader, writer,
recording, shape, view), resuming from one, the settings a view's runs share (settings.py), and the checks that run
before any model loads (preflight.py).
"""

import types as _types

from .record.reader import finished_nodes, read_node, read_record
from .record.recording import RecordingExecutor, record_run, record_with, run_recorded, run_recorded_sync
from .record.shape import check_record
from .record.view import current_record
from .record.writer import RunRecorder
from .resume import ResumePoint, read_resume_point, resume_run, resume_run_sync
from .scheduler import RunObserver, new_run_id, run_plan, run_plan_sync, run_with
from .settings import RunSettings, preflight, prepare_run
from .streaming import RunStream, SyncRunStream, astream, astream_resume, stream, stream_resume

# every name imported above, the submodules themselves aside (the imports say where each lives)
__all__ = sorted(name for name, value in vars().items() if not name.startswith("_") and not isinstance(value, _types.ModuleType))
