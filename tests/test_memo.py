"""common/memo.by_identity: answers remembered per object by identity, never across equal objects."""

from __future__ import annotations

from swapdsl.common.memo import by_identity


def _counted(size: int = 2):
    calls: list[tuple] = []

    @by_identity(size)
    def f(obj: list, *args: object) -> int:
        calls.append((id(obj), args))
        return sum(obj) + len(args)
    return f, calls


def test_an_answer_is_remembered_per_object_and_arguments() -> None:
    f, calls = _counted()
    a = [1, 2]
    assert f(a, 1) == f(a, 1) == 4
    assert f(a, 1, 2) == 5
    assert len(calls) == 2


def test_an_equal_object_is_asked_afresh() -> None:
    f, calls = _counted()
    a, b = [1, 2], [1, 2]
    f(a)
    f(b)
    assert len(calls) == 2


def test_the_least_recent_object_is_forgotten_and_its_id_never_reused_while_held() -> None:
    f, calls = _counted(size=2)
    a, b, c = [1], [2], [3]
    f(a), f(b), f(a), f(c)  # (b least recent: forgotten)
    f(a), f(c)
    assert len(calls) == 3
    f(b)
    assert len(calls) == 4


def test_unhashable_arguments_are_asked_every_time() -> None:
    f, calls = _counted()
    a = [1]
    f(a, [0])
    f(a, [0])
    assert len(calls) == 2
