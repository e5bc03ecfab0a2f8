"""CPU time per operation, per process, for the benches: on a shared machine wall-clock
figures move with the neighbours' load, CPU seconds spent per operation much less.

Reads utime + stime of each process from /proc/<pid>/stat (Linux), before and after a
phase; PostgreSQL's share is the sum over the backends serving the bench's database.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After "pid (comm)": state is field 3, utime 14 and stime 15 (1-based).
    return (int(fields[11]) + int(fields[12])) / _TICKS


@dataclass
class CpuMeter:
    """CPU spent by named groups of processes between :meth:`start` and :meth:`per_op`.
    ``groups`` maps a name to a function giving that group's pids now."""

    groups: Mapping[str, Callable[[], list[int]]]

    def __post_init__(self) -> None:
        self._before: dict[str, dict[int, float]] = {}

    def _now(self) -> dict[str, dict[int, float]]:
        return {
            name: {pid: cpu_seconds(pid) for pid in pids()} for name, pids in self.groups.items()
        }

    def start(self) -> None:
        self._before = self._now()

    def per_op(self, operations: int) -> dict[str, float]:
        """Milliseconds of CPU per operation for each group since :meth:`start` (a pid
        that appeared meanwhile counts from zero)."""
        after = self._now()
        spent = {}
        for name, pids in after.items():
            before = self._before.get(name, {})
            seconds = sum(max(0.0, cpu - before.get(pid, 0.0)) for pid, cpu in pids.items())
            spent[name] = seconds * 1000 / operations
        return spent


def format_per_op(spent: Mapping[str, float]) -> str:
    parts = [f"{name} {ms:.2f}" for name, ms in spent.items()]
    return f"CPU ms/op: {', '.join(parts)} (total {sum(spent.values()):.2f})"
