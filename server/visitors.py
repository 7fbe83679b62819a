"""Who sent a request: the one place the server decides it, so that storage shares (:class:`analysis.Workspace`)
and the slow views' places (:class:`server.Admission`) belong to a visitor, not to a session id, which a client
makes up at will.

A visitor is identified by something the server issues: a token in an HttpOnly, SameSite=Lax cookie
(:data:`VISITOR_COOKIE`), a random id and its HMAC-SHA256 under a secret of the process, given by the ASGI
middleware :class:`Visitors` to a request for the page or a POST that comes without a valid one. Tokens are
minted at a bounded rate per network address (a token bucket); a request without a valid token from an address
past its budget counts as that address, one visitor shared by everyone there. The middleware records its answer in
the request's scope (``scope["state"]``, what Starlette's ``Request.state`` reads); :func:`visitor` and
:func:`address` read it from an ASGI scope, a Starlette ``Request`` or a ``gr.Request`` (Gradio's queue events keep
the request that joined the queue, so they read the same).

The address is the TCP peer, except when the peer is a trusted proxy (``--trusted-proxy``): then the right-most
``X-Forwarded-For`` entry that is not a trusted proxy (entries to its left are whatever the client sent). An IPv6
address counts as its /64 network, which one subscriber or host holds whole.

Gradio's private parts this module touches are listed in :data:`GRADIO_PRIVATE`, right below the imports
(``tests/server/test_gradio_private.py`` checks each on the installed Gradio).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import ipaddress
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from time import monotonic

from starlette.requests import cookie_parser

__all__ = ["GRADIO_PRIVATE", "VISITOR_COOKIE", "Visitors", "address", "trusted_networks", "visitor"]

GRADIO_PRIVATE = {
    "Request.state": "gr.Request passes attribute reads to the Starlette request it wraps: its state, where the "
                     "Visitors middleware recorded the visitor and address (a pickled gr.Request loses it)",
}

VISITOR_COOKIE = "convnn_visitor"  # the cookie that holds a visitor's token: "<id>.<HMAC-SHA256 of id, hex>"
MAX_TRACKED_ADDRESSES = 100_000  # mint budgets kept at most (≈ 150 bytes each); past it the least recently used
#                                  address's goes, which gives that address a full budget again
_TOKEN_ID = re.compile(r"[0-9a-f]{32}")  # what secrets.token_hex(16) makes
_VISITOR, _ADDRESS = "convnn_visitor", "convnn_address"  # where the middleware records them in scope["state"]
_IPV6_SUBSCRIBER_PREFIX = 64  # an IPv6 address counts as its /64: the smallest network handed to one subscriber

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_networks(proxies: Iterable[str]) -> tuple[Network, ...]:
    """The trusted proxies as networks: each an IP address (``10.0.0.5``) or a network (``10.0.0.0/24``).

    Raises:
        ValueError: an entry that is neither; the message names it.
    """
    networks = []
    for proxy in proxies:
        try:
            networks.append(ipaddress.ip_network(str(proxy).strip(), strict=False))
        except ValueError:
            raise ValueError(f"a trusted proxy must be an IP address or a network such as 10.0.0.0/24, got "
                             f"{proxy!r}") from None
    return tuple(networks)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address in ``host`` (``1.2.3.4``, ``1.2.3.4:80``, ``2001:db8::1``, ``[2001:db8::1]:80``), an IPv4 one
    for an IPv4-mapped IPv6 address; None if it holds none."""
    host = host.strip()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return getattr(ip, "ipv4_mapped", None) or ip


class Visitors:
    """ASGI middleware: decides who sent each HTTP (or WebSocket) request, records it for :func:`visitor` and
    :func:`address`, and gives a request for the page or a POST that brings no valid token one, in a cookie set on
    its response.

    A token is ``<id>.<mac>``: ``id`` 32 random hex digits, ``mac`` the hex HMAC-SHA256 of ``id`` under ``secret``
    (checked with :func:`hmac.compare_digest`), in the cookie :data:`VISITOR_COOKIE` (``Path=/; HttpOnly;
    SameSite=Lax``, kept until the browser closes; a new process's secret makes every token invalid, and browsers
    get new ones). Each address may have ``mint_burst`` tokens made at once and ``mint_per_hour`` more an hour (a
    token bucket); past that, a request without a valid token is the visitor ``"a:<address>"``.

    Args:
        app: the ASGI application it wraps.
        mint_burst (int): tokens one address may have made at once, ≥ 0.
        mint_per_hour (float): tokens an address's budget regains per hour, up to ``mint_burst``, ≥ 0.
        trusted_proxies (Iterable[str]): addresses or networks of reverse proxies whose ``X-Forwarded-For`` is
            believed (:func:`trusted_networks`). Default: none
        secret (bytes, optional): the HMAC key. Default: 32 random bytes of :func:`secrets.token_bytes`, new in each
            process
    Raises:
        ValueError: a negative budget, or a trusted proxy that is not an address or a network.
    """

    def __init__(self, app: Callable, mint_burst: int, mint_per_hour: float, trusted_proxies: Iterable[str] = (),
                 secret: bytes | None = None) -> None:
        if mint_burst < 0 or mint_per_hour < 0:
            raise ValueError(f"mint_burst and mint_per_hour must be ≥ 0, got {mint_burst} and {mint_per_hour}")
        self.app = app
        self.mint_burst = int(mint_burst)
        self.mint_per_hour = float(mint_per_hour)
        self.trusted = trusted_networks(trusted_proxies)
        self._secret = secret or secrets.token_bytes(32)
        self._budgets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()  # address →
        #   (tokens left, monotonic time then), least recently used first

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        where = self._address_of(scope)
        token_id = self._token_id(_cookie(scope["headers"]))
        minted = None
        if token_id is None and _asks_for_work(scope) and self._take_mint(where, monotonic()):
            token_id = secrets.token_hex(16)
            minted = (f"{VISITOR_COOKIE}={token_id}.{self._sign(token_id)}; Path=/; HttpOnly; "
                      "SameSite=Lax").encode()
        scope.setdefault("state", {}).update({_VISITOR: f"t:{token_id}" if token_id else f"a:{where}",
                                              _ADDRESS: where})
        if minted is None:
            await self.app(scope, receive, send)
            return

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", minted)]}
            await send(message)

        await self.app(scope, receive, sending)

    def _sign(self, token_id: str) -> str:
        """The hex HMAC-SHA256 of ``token_id`` under this middleware's secret."""
        return hmac.new(self._secret, token_id.encode(), hashlib.sha256).hexdigest()

    def _token_id(self, token: str | None) -> str | None:
        """The id of ``token`` (a cookie's value) if it is one this middleware signed, else None."""
        token_id, _, mac = (token or "").partition(".")
        if _TOKEN_ID.fullmatch(token_id) and hmac.compare_digest(mac.encode(), self._sign(token_id).encode()):
            return token_id
        return None

    def _address_of(self, scope: dict) -> str:
        """The address a request comes from: the TCP peer, or behind a trusted proxy the right-most
        ``X-Forwarded-For`` entry that is not one (the peer if there is none); an IPv4 address as written, an IPv6
        one as its /64 network (``2001:db8:1:2::/64``), anything else as it is (``""`` for no peer)."""
        client = scope.get("client")
        host = str(client[0]) if client else ""
        if self._trusted(host):
            hops = [hop for name, value in scope["headers"] if name == b"x-forwarded-for"
                    for hop in value.decode("latin-1").split(",")]
            host = next((hop.strip() for hop in reversed(hops) if hop.strip() and not self._trusted(hop)), host)
        ip = _ip(host)
        if ip is None:
            return host
        if ip.version == 6:
            return str(ipaddress.ip_network(f"{ip}/{_IPV6_SUBSCRIBER_PREFIX}", strict=False))
        return str(ip)

    def _trusted(self, host: str) -> bool:
        ip = _ip(host)
        return ip is not None and any(ip in network for network in self.trusted)

    def _take_mint(self, where: str, now: float) -> bool:
        """Take one token from ``where``'s budget if it has one, ``now`` in seconds; budgets back at full are
        forgotten (as good as new), and the least recently used past :data:`MAX_TRACKED_ADDRESSES`."""
        left = self._budget(where, now)
        taken = left >= 1
        self._budgets.pop(where, None)
        self._budgets[where] = (left - taken, now)
        while self._budgets:
            oldest = next(iter(self._budgets))
            if self._budget(oldest, now) < self.mint_burst and len(self._budgets) <= MAX_TRACKED_ADDRESSES:
                break
            del self._budgets[oldest]
        return taken

    def _budget(self, where: str, now: float) -> float:
        """The tokens ``where`` may have made at ``now``: what it had left, regained at ``mint_per_hour`` since."""
        left, then = self._budgets.get(where, (self.mint_burst, now))
        return min(self.mint_burst, left + (now - then) * self.mint_per_hour / 3600)


def _cookie(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The value of the :data:`VISITOR_COOKIE` cookie among a request's headers, or None."""
    cookies = {}
    for name, value in headers:
        if name == b"cookie":
            cookies.update(cookie_parser(value.decode("latin-1")))
    return cookies.get(VISITOR_COOKIE)


def _recorded(source: Mapping | object | None, key: str) -> str:
    """What :class:`Visitors` recorded under ``key`` for a request (an ASGI scope, or a request with a ``state``)."""
    if isinstance(source, Mapping):
        return str((source.get("state") or {}).get(key, ""))
    return str(getattr(getattr(source, "state", None), key, ""))  # a gr.Request without a request has no state


def _asks_for_work(scope: dict) -> bool:
    """Whether a request without a token is given one: the page itself (a GET of ``/``) and every POST (a queue
    join, an upload, an API call), not the page's assets, its config or its event streams: a browser fetches dozens
    of those at once before its first cookie arrives, and each would spend one of its address's mints."""
    return scope["type"] == "http" and (scope.get("method") == "POST" or scope.get("path") in ("/", ""))


def visitor(source: Mapping | object | None) -> str:
    """The visitor a request comes from, as :class:`Visitors` decided it.

    Args:
        source: an ASGI scope (a mapping), or a request with a ``state`` (Starlette's ``Request``, Gradio's
            ``gr.Request``), or None (a direct Python call).

    Returns:
        str: ``"t:<id>"`` for a visitor with a token, ``"a:<address>"`` for one known by its address only
        (:func:`address`), ``""`` for a request that did not pass the middleware (a direct call).
    """
    return _recorded(source, _VISITOR)


def address(source: Mapping | object | None) -> str:
    """The address a request comes from, as :class:`Visitors` recorded it (the TCP peer, or the client a trusted
    proxy names): for ceilings per address, which every visitor there shares.

    Args:
        source: as for :func:`visitor`.

    Returns:
        str: the address (an IPv6 one as its /64 network); ``""`` for a request that did not pass the middleware.
    """
    return _recorded(source, _ADDRESS)
