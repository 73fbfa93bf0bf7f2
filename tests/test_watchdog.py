"""The ranks' watchdog (runtime/watchdog.py) on a stand-in communicator: who reports, when, and when not."""

from __future__ import annotations

import time

import pytest

from swapdsl.runtime import watchdog as W

pytest.importorskip("mpi4py")


class Sent:
    def Test(self) -> bool:  # noqa: N802
        return True


class Comm:
    """Rank ``rank`` of ``size``, whose peers said nothing (or what ``said`` holds) and who records an abort."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size, self.aborted = rank, size, None

    def Dup(self) -> Comm:  # noqa: N802
        return self

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def Isend(self, buf, dest: int, tag: int) -> Sent:  # noqa: ANN001, N802
        return Sent()

    def Iprobe(self, source: int, tag: int, status) -> bool:  # noqa: ANN001, N802
        return False

    def Abort(self, code: int) -> None:  # noqa: N802
        self.aborted = code


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(W, "GRACE_S", 0.4)
    monkeypatch.setattr(W, "POLL_S", 0.01)


def test_a_collective_that_never_completes_is_reported_by_the_lowest_waiting_rank(capsys) -> None:  # noqa: ANN001
    comm = Comm(0, 3)
    dog = W.Watchdog(comm, 0.2)
    dog.at_step(7)
    dog.seen[2] = 1  # rank 2 said it waits in the same one
    with dog.collective("gradient all-reduce 1"):
        deadline = time.monotonic() + 5
        while comm.aborted is None and time.monotonic() < deadline:
            time.sleep(0.01)
    err = capsys.readouterr().err
    assert comm.aborted == 2
    assert "error: rank 1 did not reach the gradient all-reduce 1 of step 7 within 0.2 s, where ranks 0, 2" in err


def test_a_collective_that_completes_after_the_timeout_ends_nothing(capsys) -> None:  # noqa: ANN001
    """(A late rank arrived while this one settled its news: no abort, and nothing said.)"""
    comm = Comm(2, 3)
    dog = W.Watchdog(comm, 0.2)
    dog.seen[0] = 1
    with dog.collective("end"):
        time.sleep(0.22)
    time.sleep(1.0)
    assert comm.aborted is None and capsys.readouterr().err == ""


def test_a_rank_whose_lowest_fellow_says_nothing_reports_itself(capsys) -> None:  # noqa: ANN001
    comm = Comm(2, 3)
    dog = W.Watchdog(comm, 0.2)
    dog.seen[0] = 1  # rank 0 waits too, and should have reported: it did not (it hung after saying so)
    with dog.collective("start check"):
        deadline = time.monotonic() + 5
        while comm.aborted is None and time.monotonic() < deadline:
            time.sleep(0.01)
    assert comm.aborted == 2
    assert "rank 1 did not reach the start check before the first step" in capsys.readouterr().err
