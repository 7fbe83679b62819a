"""Answers that a later opening has made stale (:class:`Openings`).

The page runs each change as a chain of steps (``app.REFRESH``), and each step reads the page's values when it is
sent. Gradio sends a step of one event only after the same step of that event before it has been answered
(``always_last``), but the chains of two events (a lesson picked, then Next; Next, then Back) are answered in any
order, and the answer that comes last is shown, however stale: a lesson's step opened slowly (its model loaded cold)
came after the Next pressed meanwhile and put the page back on it, and the table of Next's step came after Back's
step was drawn and left the explorer on Next's model under Back's text. Here an opening (a link or a lesson's step, a
model or an image picked: what sets the view the page then shows) that has been answered makes stale every answer of
its session whose step began before it, of the kinds it supersedes: that step's answer changes nothing (the opening's
own chain runs the same view on what it opened). An opening refused (a model name that is not one) supersedes
nothing.

A run of a step that its session sends again on the same values while the first is in flight is that run's double,
not a later opening: the two are one opening, neither stale after the other. One pick in a dropdown sends the step
twice (Gradio's Dropdown says ``input`` for the pick and again for the blur that closes its list, and its client
sends both before either is pending); the two ran at once and the one answered second was stale after the other,
and its answer, which changes nothing, reached the page before the opening's (whose many outputs Gradio takes a few
hundred ms to send): its chain's next step read the page as it was before the opening, the explorer drew the old
pixel under the step's rule, the page put that pixel back in the query boxes, and the opening's own chain read it
there (a lesson started again after a click stayed on the clicked pixel).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterable

import gradio as gr

from .visitors import visitor

__all__ = ["Openings"]


class Openings:
    """The openings each session's answers have begun before (module docstring), by kind (``"view"``: a link or a
    lesson's step; ``"model"``; ``"image"``). Each handler wrapped by :meth:`wrap` takes a ticket when it begins (a
    double of a run in flight, its ticket); a session's record is kept while any of its wrapped handlers runs, so it
    holds no more than its runs in flight.

    A session is its visitor's (:func:`server.visitor`) and Gradio's session id together: a session id alone, which a
    client names at will, makes nothing of another visitor's stale. A call without a request (the one local
    session, a script) is never stale.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tickets = itertools.count()
        self._opened: dict[tuple, dict[str, int]] = {}  # session → kind → the ticket of its latest opening answered
        self._running: Counter = Counter()  # session → its wrapped handlers begun and not ended
        self._runs: dict[tuple, list[tuple]] = {}  # (session, step) → its runs in flight: (values, ticket)

    def wrap(self, handler: Callable, opens: str | None = None, stale_after: Iterable[str] = ()) -> Callable:
        """``handler`` (a wired step: ``handler(values, request, *rest)``, or ``handler(request, *rest)`` for a step
        without inputs) that opens a view of kind ``opens`` once it has been answered (not when it raises), and that
        changes nothing (``gr.skip()``) when an opening of one of the kinds ``stale_after`` that began after it has
        been answered first; a run on the values (all but the request) of one in flight for its session is that run's
        double, and takes its ticket."""
        stale_after = frozenset(stale_after)
        at = list(inspect.signature(handler).parameters).index("request")  # an example picked: no inputs

        @functools.wraps(handler)
        def step(*args):
            request = args[at]
            if request is None:
                return handler(*args)
            session, values = (visitor(request), request.session_hash), args[:at] + args[at + 1:]
            with self._lock:
                runs = self._runs.setdefault((session, step), [])
                double = next((ticket for other, ticket in runs if same(other, values)), None)
                ticket = next(self._tickets) if double is None else double  # (module docstring)
                run = values, ticket
                runs.append(run)
                self._running[session] += 1
            try:
                result = handler(*args)
                with self._lock:
                    opened = self._opened.setdefault(session, {})
                    if any(opened.get(kind, -1) > ticket for kind in stale_after):
                        return gr.skip()
                    if opens is not None:
                        opened[opens] = max(opened.get(opens, -1), ticket)
                return result
            finally:
                with self._lock:
                    runs[:] = [other for other in runs if other is not run]  # (values that may not compare)
                    if not runs:
                        del self._runs[session, step]
                    self._running[session] -= 1
                    if not self._running[session]:  # no run of it began before a ticket to come
                        del self._running[session]
                        self._opened.pop(session, None)

        return step


def same(these: tuple, those: tuple) -> bool:
    """Whether two runs' values are the same (values that cannot say, an array's, are not)."""
    try:
        return bool(these == those)
    except (TypeError, ValueError):  # an array's comparison: one answer per element
        return False
