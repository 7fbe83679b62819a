"""Who sent a request: the one place the server decides it (:func:`visitor`), so that storage shares
(:class:`analysis.Workspace`) are charged to a visitor, not to a session, which a client renews at will.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["visitor"]


def visitor(source: Mapping | object | None) -> str:
    """The visitor a request comes from: for now the client's network address, which is what the server has for
    every request, Gradio's uploads included (they carry no session); a server-issued token will replace it.

    Args:
        source: an ASGI scope (a mapping with ``"client"``), or a request with a ``client`` attribute (Gradio's
            ``gr.Request``, Starlette's ``Request``), or None (a direct Python call).

    Returns:
        str: the visitor's key; ``""`` for a call that came from no client.
    """
    if source is None:
        return ""
    if isinstance(source, Mapping):
        client = source.get("client")
    else:
        try:
            client = getattr(source, "client", None)
        except Exception:  # a gr.Request made without a request (a direct call) may raise on attribute access
            client = None
    host = client[0] if client else None
    return str(host) if host else ""
