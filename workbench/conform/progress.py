"""Progress lines for a long check: how far, how long so far, and about how long is left.

A full-size pair costs seconds per cycle and a real run has thousands of cycles (docs/conformance.md, "Cost"),
so a check that prints nothing for an hour looks hung. A check of a few cycles finishes before a line would
help, and prints none.
"""
from __future__ import annotations

import time

FEW = 8  # a check of at most this many cycles prints no progress lines
EVERY_CYCLES = 16  # a line at least this often ...
EVERY_SECONDS = 10.0  # ... or once this long has passed since the last, whichever comes first


def duration(seconds: float) -> str:
    """'42 s', '3.5 min', '2.1 h'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """``say`` (a callable taking one line) gets a line when the check starts and then every ``EVERY_CYCLES``
    cycles or ``EVERY_SECONDS`` seconds, each with the cycles checked, the time so far and an estimate of
    the time left (the mean per cycle so far, times the cycles left)."""

    def __init__(self, say, total: int, clock=time.perf_counter):
        self.say, self.total, self.clock = say, total, clock
        self.done = 0
        self.start_s = self.last_s = clock()
        self.last_done = 0
        self.on = total > FEW

    def start(self, what: str = "") -> None:
        if self.on:
            self.say(f"checking {self.total} cycles{what}")
        self.start_s = self.last_s = self.clock()  # the estimate counts the replay, not the load before it

    def tick(self) -> None:
        """One cycle checked."""
        self.done += 1
        if not self.on:
            return
        now = self.clock()
        if self.done - self.last_done < EVERY_CYCLES and now - self.last_s < EVERY_SECONDS and self.done < self.total:
            return
        spent = now - self.start_s
        left = spent / self.done * (self.total - self.done)
        self.say(f"{self.done}/{self.total} cycles checked in {duration(spent)}"
                 + (f", about {duration(left)} left" if self.done < self.total else ""))
        self.last_s, self.last_done = now, self.done
