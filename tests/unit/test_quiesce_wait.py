"""How the coordinator waits for an agent's unit to end after its finish: it asks at once
and then more and more rarely, so a unit that ends within milliseconds is seen within
milliseconds (the system tier runs the same wait against real systemd at every boundary).
The clock here is a fake one that moves only when the wait pauses."""

from __future__ import annotations

import pytest

from cairn.systemd import UnitState, wait_unit_gone


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def pause(self, seconds: float) -> None:
        self.pauses.append(round(seconds, 3))
        self.now += seconds


class Manager:
    """Answers ``unit_state`` as a unit that runs for the first ``running`` questions."""

    def __init__(self, running: int) -> None:
        self.running = running
        self.asked = 0

    def unit_state(self, name: str) -> UnitState | None:
        self.asked += 1
        active = "active" if self.asked <= self.running else "inactive"
        return UnitState(name=name, load_state="loaded", active_state=active,
                         sub_state="dead", job_id=0, result="success", exec_main_code=1,
                         exec_main_status=0, control_group="/x", invocation_id="",
                         main_pid=0)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def wait_gone(manager: Manager, timeout: float, clock: Clock) -> bool:
    return wait_unit_gone(manager, "cairn-agent-x.service", timeout,  # type: ignore[arg-type]
                          clock=clock.monotonic, pause=clock.pause)


def test_a_unit_that_ended_is_seen_at_the_first_question(clock: Clock) -> None:
    manager = Manager(running=0)
    assert wait_gone(manager, 5.0, clock)
    assert (manager.asked, clock.pauses) == (1, [])


def test_a_unit_that_ends_soon_is_seen_after_tens_of_milliseconds(clock: Clock) -> None:
    manager = Manager(running=2)
    assert wait_gone(manager, 5.0, clock)
    assert clock.pauses == [0.01, 0.02]  # seen 30 ms in; a fixed 200 ms pause took 400 ms


def test_the_pause_grows_to_a_fifth_of_a_second_and_the_timeout_holds(clock: Clock) -> None:
    manager = Manager(running=10_000)
    assert not wait_gone(manager, 1.0, clock)
    assert clock.pauses[:7] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.2, 0.2]
    assert clock.now == pytest.approx(1.0)
    assert manager.asked == len(clock.pauses) + 1  # asked once more at the deadline
