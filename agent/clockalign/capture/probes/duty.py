"""--cuda-duty (and --gpu-activity-duty): the CUDA probes (CUPTI's activity) armed for a
share of every period, detached for the rest.

A uprobe's cost is its trap, paid on every call of a probed function while its link exists;
an always-on agent that may only take a set share of a serving loop's time can keep the
links for a share of each period and none for the rest.  What it costs in what is seen:
CUDA calls are recorded only inside the armed windows (a call that enters in one and
returns outside it is not recorded); counts cover the armed time, so rates are counts over
armed seconds; durations and their quantiles are a sample of the calls, unbiased as long as
the load does not follow the period.  The windows go into the run file's trailer, so every
output can say which time was watched.

The same cycle, with ``step(pause, resume)``, switches GPU activity of --pid targets
(capture/gpu/gpuactivity.py): CUPTI detached and attached again each period.
"""
import time

from ...errors import ClockalignError


def _now():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class Duty:
    def __init__(self, share: float, period_s: float, option: str = "--cuda-duty",
                 min_period_s: float = 0.1):
        if not 0 < share <= 1:
            raise ClockalignError(f"{option} must be a share above 0 and at most 1 "
                                  f"(got {share})")
        if not period_s >= min_period_s:
            raise ClockalignError(f"{option}-period must be at least {min_period_s:g} s "
                                  f"(got {period_s})")
        self.share, self.period_ns = share, int(period_s * 1e9)
        self._next = None           # MONOTONIC ns of the next switch; None before start()
        self.windows = []           # [start_ns, end_ns] MONOTONIC of each armed window
        self.armed_from = None

    @property
    def active(self) -> bool:
        return self.share < 1

    def start(self):
        """The probes are being armed: the first window opens."""
        self.armed_from = _now()
        self._next = self.armed_from + int(self.share * self.period_ns)

    def tick(self, probes):
        """Detach or re-arm the CUDA links when the current half is over (called every
        ~50 ms; a late call makes that half longer, never the next one shorter)."""
        self.step(probes.pause_cuda, probes.resume_cuda)

    def step(self, pause, resume):
        """pause() or resume() when the current half is over."""
        if not self.active or self._next is None:
            return
        now = _now()
        if now < self._next:
            return
        if self.armed_from is not None:
            pause()
            end = _now()
            self.windows.append([self.armed_from, end])
            self.armed_from = None
            self._next = end + int((1 - self.share) * self.period_ns)
        else:
            self.armed_from = _now()        # before the links: a window holds all it saw
            resume()
            self._next = self.armed_from + int(self.share * self.period_ns)

    def close(self):
        if self.armed_from is not None:
            self.windows.append([self.armed_from, _now()])
            self.armed_from = None

    def meta(self) -> dict:
        return {"share": self.share, "period_s": self.period_ns / 1e9}

    def trailer(self) -> dict:
        armed = sum(b - a for a, b in self.windows)
        return {**self.meta(), "armed_ns": int(armed), "windows": self.windows}
