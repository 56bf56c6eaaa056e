"""Peak resident set size of this process over a block: the one method every benchmark uses.

Why one module: concurrent_runs.py read the kernel's high-water mark while scaling.py and
reader_memory.py sampled /proc every 5 ms, so their memory figures came from two methods (a
sampler misses a peak shorter than its interval). They now share `PeakRss`. Linux only (it
reads /proc), as the benchmarks that report memory are.
"""

from __future__ import annotations

import os
import threading


def rss() -> int:
    """This process's resident set size now, in bytes."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Peak resident set size of this process over a phase.

    Where Linux lets the process reset its high-water mark (writing 5 to
    /proc/self/clear_refs, Linux 4.0+), the kernel keeps the exact peak and nothing runs
    beside the phase. Why not a sampling thread everywhere: it misses a peak that lasts less
    than its interval, and it is one more thread asking for the GIL beside the runs it
    measures (side by side on fanout_qa's concurrent phase its cost was within the machine's
    spread: docs/performance.md). On a Linux kernel that refuses the write, a thread samples
    /proc/self/statm every 10 ms instead, and `method` says which was used. Both read /proc:
    the benchmark measures peak RSS on Linux only."""

    def __init__(self) -> None:
        self.peak = 0
        self.method = "kernel_high_water_mark"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def high_water_mark() -> int:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # reported in kB
        raise OSError("/proc/self/status has no VmHWM line")

    @staticmethod
    def _reset_high_water_mark() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
            PeakRss.high_water_mark()
        except OSError:
            return False
        return True

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            self._stop.wait(0.01)

    def __enter__(self) -> PeakRss:
        if self._reset_high_water_mark():
            return self
        self.method = "sampled_every_10_ms"
        self.peak = rss()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is None:
            self.peak = self.high_water_mark()
            return
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())
