"""The server's guards around the explorer's handlers, beside ``app.py`` (which imports them; they import
:mod:`analysis` and Gradio, never ``app``).

* :mod:`server.guards` — what the queue admits (:class:`Admission`) and how the slow views compute
  (:class:`SlowRuns`; a dropped run's computation stops at its next :func:`check_dropped`);
* :mod:`server.controls` — number boxes and sliders that check what any client sends (:class:`CheckedNumber`,
  :class:`CheckedSlider`; :func:`control` makes one from a field of the view), and user errors shown as messages
  (:func:`user_errors`);
* :mod:`server.wiring` — the page's events as the handlers take them: inputs by name, the view as one value
  (:func:`wire`); a chain's views in as few steps as their inputs allow (:func:`step_groups`, :func:`merge`);
* :mod:`server.openings` — the answers a later opening (a link or a lesson's step, a model or an image picked) has
  made stale, which then change nothing (:class:`Openings`);
* :mod:`server.fairness` — fair turns between visitors in each event group, and a bound on the places one visitor
  holds in the queue (:class:`FairTurns`), whose refusals a flooding client then gets at the door
  (:class:`QueueDoor`);
* :mod:`server.shares` — fair shares of the computing cores: every forward pass of a visitor's request computes in
  one of a few places, given to whoever has computed least (:class:`ComputeShares`);
* :mod:`server.requests` — the request-size ASGI middleware (:class:`RequestSizeLimit`);
* :mod:`server.visitors` — who sent a request: the visitor-token ASGI middleware (:class:`Visitors`), and a request's
  visitor (:func:`visitor`: whose storage share and slow place it uses) and address (:func:`address`: whose ceiling).

Each module that touches a part of Gradio outside its public API lists it in its ``GRADIO_PRIVATE``.
"""

from .controls import CheckedNumber, CheckedSlider, checked_number, control, user_errors
from .fairness import FairTurns, QueueDoor
from .guards import (
    Admission,
    RunDropped,
    SlowRuns,
    check_dropped,
    names_a_web_address,
    queued_events,
    waiting_events,
)
from .openings import Openings
from .requests import RequestSizeLimit
from .shares import ComputeShares
from .visitors import Visitors, address, trusted_networks, visitor
from .wiring import merge, step_groups, wire

__all__ = [
    "Admission",
    "CheckedNumber",
    "CheckedSlider",
    "ComputeShares",
    "FairTurns",
    "Openings",
    "QueueDoor",
    "RequestSizeLimit",
    "RunDropped",
    "SlowRuns",
    "Visitors",
    "address",
    "check_dropped",
    "checked_number",
    "control",
    "merge",
    "names_a_web_address",
    "queued_events",
    "step_groups",
    "trusted_networks",
    "user_errors",
    "visitor",
    "waiting_events",
    "wire",
]
