"""Discrete-event simulator of disaggregated (encoder / prefill / KV transfer / decode) serving.

Pure: numpy and the standard library only (matplotlib is imported lazily by
`report.plot`). The worker state machines in `disagg.sim.workers` and the
`Cluster` in `disagg.sim.engine` take ``now`` from their caller, so the same
classes run on virtual time (`simulate`) and on the wall clock (the emulator).
"""

from disagg.sim.core import DONE, FAILED, INF, LOST, REJECTED, WAITING, Job, PrefixCache, StageStats
from disagg.sim.engine import PLACEMENTS, Cluster, SimConfig, simulate
from disagg.sim.report import Report, format_table

__all__ = [
    "DONE",
    "FAILED",
    "INF",
    "LOST",
    "PLACEMENTS",
    "REJECTED",
    "WAITING",
    "Cluster",
    "Job",
    "PrefixCache",
    "Report",
    "SimConfig",
    "StageStats",
    "format_table",
    "simulate",
]
