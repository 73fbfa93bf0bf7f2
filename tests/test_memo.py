"""common/memo.by_identity: answers remembered per object by identity, never across equal objects."""

from __future__ import annotations

from swapdsl.common.memo import by_identity


class Box(list):  # (a list cannot be weakly referred to; a subclass can)
    pass


def _counted(size: int = 2):
    calls: list[tuple] = []

    @by_identity(size)
    def f(obj: list, *args: object) -> int:
        calls.append((id(obj), args))
        return sum(obj) + len(args)
    return f, calls


def test_an_answer_is_remembered_per_object_and_arguments() -> None:
    f, calls = _counted()
    a = Box([1, 2])
    assert f(a, 1) == f(a, 1) == 4
    assert f(a, 1, 2) == 5
    assert len(calls) == 2


def test_an_equal_object_is_asked_afresh() -> None:
    f, calls = _counted()
    a, b = Box([1, 2]), Box([1, 2])
    f(a)
    f(b)
    assert len(calls) == 2


def test_the_least_recent_object_is_forgotten() -> None:
    f, calls = _counted(size=2)
    a, b, c = Box([1]), Box([2]), Box([3])
    f(a), f(b), f(a), f(c)  # (b least recent: forgotten)
    f(a), f(c)
    assert len(calls) == 3
    f(b)
    assert len(calls) == 4


def test_unhashable_arguments_are_asked_every_time() -> None:
    f, calls = _counted()
    a = Box([1])
    f(a, [0])
    f(a, [0])
    assert len(calls) == 2


def test_nothing_is_kept_alive_and_a_dead_object_s_id_is_not_taken_for_another() -> None:
    import gc
    import weakref

    f, calls = _counted()
    a = Box([1])
    f(a)
    gone = weakref.ref(a)
    del a
    gc.collect()
    assert gone() is None
    for _ in range(50):  # (CPython soon gives a new object a dead one's id)
        b = Box([2])
        assert f(b) == 2
        del b
    assert len(calls) == 51
