"""The controller's bounded command intake (`_tasks.intake.Intake`), without processes: bounds, FIFO
order across waiting and immediate producers, cancellation, and a property test of all three.

Producers are asyncio tasks on one loop. `settle()` runs the loop until every ready callback has
run (a task woken by a granted place resumes within one turn); it synchronises on loop turns,
which are deterministic here, not on time.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpvisor._tasks.intake import Intake

pytestmark = pytest.mark.unit

TURNS = 3  # loop turns for a woken producer to resume and append (it needs one; margin for two)


async def settle() -> None:
    for _ in range(TURNS):
        await asyncio.sleep(0)


def drain(intake: Intake[int]) -> list[int]:
    return [intake.take() for _ in range(len(intake))]


def test_offer_fills_to_capacity_and_take_is_fifo() -> None:
    """Offers enter up to the capacity and wake the consumer once each; take() is FIFO."""
    wakes: list[None] = []
    intake: Intake[int] = Intake(3, lambda: wakes.append(None))
    assert [intake.offer(i) for i in range(4)] == [True, True, True, False]
    assert len(intake) == 3 and len(wakes) == 3  # woken once per item that entered
    assert drain(intake) == [0, 1, 2]
    with pytest.raises(IndexError):
        intake.take()


def test_waiting_producers_enter_in_order_and_are_never_overtaken() -> None:
    """A freed place goes to the first waiting producer; an offer cannot take it."""
    async def main() -> None:
        intake: Intake[int] = Intake(2, lambda: None)
        assert intake.offer(0) and intake.offer(1)
        waiting = [asyncio.create_task(intake.put(i)) for i in (2, 3)]
        await settle()
        assert not any(task.done() for task in waiting)
        assert intake.take() == 0  # frees one place: granted to producer 2, not to an offer
        assert not intake.offer(99)
        await settle()
        assert waiting[0].done() and not waiting[1].done()
        assert not intake.offer(99)  # full again, and producer 3 still waits
        assert drain(intake) == [1, 2]
        await settle()
        assert waiting[1].done()
        assert intake.offer(4)  # nobody waits and there is room
        assert drain(intake) == [3, 4]

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_canceled_waiting_producer_leaves_the_line_without_entering() -> None:
    """A producer canceled while waiting never enters; the next one gets the place."""
    async def main() -> None:
        intake: Intake[int] = Intake(1, lambda: None)
        assert intake.offer(0)
        first, second = asyncio.create_task(intake.put(1)), asyncio.create_task(intake.put(2))
        await settle()
        first.cancel()
        await settle()
        assert first.cancelled()
        assert intake.take() == 0
        await settle()
        assert second.done()
        assert drain(intake) == [2]

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_place_granted_to_a_producer_canceled_before_it_resumed_passes_on() -> None:
    """A place granted to a producer that is canceled before it resumes goes to the next one."""
    async def main() -> None:
        intake: Intake[int] = Intake(1, lambda: None)
        assert intake.offer(0)
        first, second = asyncio.create_task(intake.put(1)), asyncio.create_task(intake.put(2))
        await settle()
        assert intake.take() == 0  # grants the place to `first`...
        assert len(intake) == 0 and not intake.drained()  # empty, but a place is promised
        first.cancel()  # ...which is canceled before it could use it
        await settle()
        assert first.cancelled() and second.done()
        assert drain(intake) == [2]
        assert intake.drained()
        assert intake.offer(3)

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_producer_canceled_just_before_a_take_leaves_cleanly() -> None:
    """A canceled producer whose future a take() skips before it runs still ends canceled."""

    async def main() -> None:
        intake: Intake[int] = Intake(1, lambda: None)
        assert intake.offer(0)
        first, second = asyncio.create_task(intake.put(1)), asyncio.create_task(intake.put(2))
        await settle()
        first.cancel()  # cancels its future at once; its handler runs only on the next loop turn
        assert intake.take() == 0  # before that: skips the canceled future, grants `second`
        await settle()
        assert first.cancelled() and second.done() and second.exception() is None
        assert drain(intake) == [2] and intake.drained()

    asyncio.run(asyncio.wait_for(main(), 10))


OPS = st.lists(
    st.one_of(
        st.just(("offer",)),
        st.just(("put",)),
        st.just(("take",)),
        st.tuples(st.just("cancel"), st.integers(0, 7)),
        st.tuples(st.just("cancel_then_take"), st.integers(0, 7)),  # no loop turn in between
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(1, 4), ops=OPS)
def test_random_producers_and_takes_keep_bounds_order_and_lose_nothing(capacity: int, ops: list[tuple[object, ...]]) -> None:
    """After every step: at most `capacity` held; no producer waits while there is room; what was
    taken plus what is held is exactly the requests in order, minus producers canceled before
    entering."""

    async def main() -> None:
        intake: Intake[int] = Intake(capacity, lambda: None)
        requested: list[int] = []  # in the order they asked: offers that succeeded, and puts
        putters: dict[int, asyncio.Task[None]] = {}
        taken: list[int] = []
        canceled: set[int] = set()
        for n, op in enumerate(ops):
            match op:
                case ("offer",):
                    if intake.offer(n):
                        requested.append(n)
                    else:
                        waiting = [i for i, task in putters.items() if not task.done()]
                        assert waiting or len(intake) == capacity
                case ("put",):
                    requested.append(n)
                    putters[n] = asyncio.create_task(intake.put(n))
                case ("take",):
                    if len(intake):
                        taken.append(intake.take())
                case ("cancel", k) | ("cancel_then_take", k):
                    waiting = [i for i, task in putters.items() if not task.done()]
                    if waiting:
                        victim = waiting[int(str(k)) % len(waiting)]
                        putters[victim].cancel()
                        canceled.add(victim)
                    if op[0] == "cancel_then_take" and len(intake):
                        taken.append(intake.take())
            await settle()
            held = list(intake._items)
            assert len(held) <= capacity
            if len(held) < capacity:
                assert all(task.done() for task in putters.values()), "a producer waits while there is room"
            entered = taken + held
            still_waiting = {i for i, task in putters.items() if not task.done()}
            expected = [i for i in requested if i not in canceled and i not in still_waiting]
            assert entered == expected
            assert not still_waiting or not entered or min(still_waiting) > max(entered), "a waiting producer was overtaken"
            assert intake.drained() == (not held and not still_waiting)
            for i, task in putters.items():  # a canceled producer ends canceled, the others cleanly
                if task.done():
                    assert task.cancelled() if i in canceled else task.exception() is None, (i, task)
        for task in putters.values():
            task.cancel()
        await asyncio.gather(*putters.values(), return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_waiting_producer_that_gives_up_wakes_the_consumer() -> None:
    """A producer canceled while it waits for room leaves the intake drained once the rest is
    taken: the consumer is woken, so that whatever waits for the intake to drain (the
    controller's close of intake) looks again instead of waiting for a step that never comes."""
    async def main() -> None:
        wakes: list[None] = []
        intake: Intake[int] = Intake(1, lambda: wakes.append(None))
        assert intake.offer(0)
        waiting = asyncio.create_task(intake.put(1))
        await settle()
        assert drain(intake) == [0]  # its place is granted to the waiting producer...
        waiting.cancel()  # ...which gives up before it appends
        await settle()
        woken = len(wakes)
        assert intake.drained() and woken == 2, (intake, woken)

        assert intake.offer(2)
        late = asyncio.create_task(intake.put(3))
        await settle()
        late.cancel()  # gives up while still waiting, with no place granted
        await settle()
        assert len(wakes) == woken + 2 and not intake.drained() and drain(intake) == [2] and intake.drained()

    asyncio.run(main())
