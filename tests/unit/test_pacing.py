"""Pacing: at most N starts in any window, slower after push-back, bad rates refused."""

from __future__ import annotations

import pytest

from toolkit.pacing import Pacer, Rate, RateInvalid


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("5/30s", Rate(5, 30)),
        ("10/1m", Rate(10, 60)),
        ("2/10", Rate(2, 10)),
        ("1/0.5s", Rate(1, 0.5)),
    ],
)
def test_rates_parse(text, rate):
    assert Rate.parse(text) == rate


@pytest.mark.parametrize("text", ["", "5", "five/30s", "0/10s", "5/0s", "5/30h", "-1/3"])
def test_bad_rates_are_refused(text):
    with pytest.raises(RateInvalid, match="invalid rate"):
        Rate.parse(text)


def starts(pacer: Pacer, clock: FakeClock, count: int) -> list[float]:
    times = []
    for _ in range(count):
        pacer.acquire()
        times.append(clock.now)
    return times


def test_never_more_than_n_starts_in_any_window():
    clock = FakeClock()
    pacer = Pacer(Rate(3, 10), clock=clock, sleep=clock.sleep)
    times = starts(pacer, clock, 10)
    assert times[:3] == [0, 0, 0]
    for i, start in enumerate(times):
        in_window = [t for t in times[: i + 1] if start - t < 10]
        assert len(in_window) <= 3
    assert times[3] == 10 and times[6] == 20 and times[9] == 30


def test_push_back_widens_the_window_and_recovery_narrows_it():
    clock = FakeClock()
    pacer = Pacer(Rate(1, 5), clock=clock, sleep=clock.sleep)
    pacer.acquire()
    pacer.slow_down()
    pacer.acquire()
    assert clock.now == 10
    for _ in range(10):
        pacer.slow_down()
    assert pacer.window == 5 * Pacer.MAX_SLOWDOWN
    pacer.recover()
    assert pacer.window == 5 * Pacer.MAX_SLOWDOWN / 2


def test_waiting_yields_to_other_greenlets_when_gevent_patched_time_after_import():
    """The CLI patches the standard library for gevent after toolkit.pacing is imported: a pacer
    must sleep with the patched time.sleep, or the hosts that already have a slot stall too."""
    import subprocess
    import sys

    script = (
        "import toolkit.pacing as p, time\n"
        "from gevent import monkey; monkey.patch_all()\n"
        "import gevent\n"
        "pacer = p.Pacer(p.Rate(1, 0.5)); pacer.acquire(); seen = []\n"
        "g = gevent.spawn(lambda: seen.append(time.monotonic()))\n"
        "start = time.monotonic(); pacer.acquire(); g.join()\n"
        "print(seen[0] - start < 0.25)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.stdout.strip() == "True", result.stderr
