"""Answers remembered per object, by identity: for questions asked again and again of one immutable value
too large to hash (a training graph: ``--host-updates auto`` and ``--bucket-mib auto`` plan one graph
under a dozen host choices, each asking its scratch, op times and splits afresh)."""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def by_identity(size: int = 8) -> Callable[[F], F]:
    """``f(obj, *args)`` remembered for the last ``size`` objects ``obj`` asked of, each by a weak reference
    (so nothing is kept alive for it, and an id a dead object leaves behind is not taken for it); ``args``
    are hashed (an unhashable one is asked afresh). Only for objects nothing changes (frozen), and answers
    nobody changes (immutable)."""
    def wrap(f: F) -> F:
        held: OrderedDict[int, tuple[weakref.ref, dict[tuple, Any]]] = OrderedDict()
        lock = threading.Lock()

        @functools.wraps(f)
        def call(obj: object, *args: Any) -> Any:
            try:
                hash(args)
            except TypeError:
                return f(obj, *args)
            with lock:
                entry = held.get(id(obj))
                if entry is not None and entry[0]() is obj and args in entry[1]:
                    held.move_to_end(id(obj))
                    return entry[1][args]
            answer = f(obj, *args)
            with lock:
                entry = held.get(id(obj))
                if entry is None or entry[0]() is not obj:
                    entry = held[id(obj)] = (weakref.ref(obj), {})
                held.move_to_end(id(obj))
                entry[1][args] = answer
                while len(held) > size:
                    held.popitem(last=False)
            return answer
        return call  # type: ignore[return-value]
    return wrap
