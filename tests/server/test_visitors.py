"""Who sent a request (server/visitors.py): visitor tokens in a signed cookie, minted at a bounded rate per address,
and the address itself, the TCP peer unless a trusted proxy forwards."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import re
import socket

import gradio as gr
import httpx
import pytest
from starlette.requests import Request

import analysis as an
import app_server
import server
from server import visitors
from server.visitors import Visitors
from tests.loops import run_coroutine

SECRET = b"a test's secret, 32 bytes long.."


def visit(middleware: Visitors, client: str = "10.0.0.1", cookie: str | None = None, headers: tuple = (),
          kind: str = "http", method: str = "GET", path: str = "/") -> tuple[str, str, list[str], dict]:
    """One request from ``client`` through ``middleware`` (with the cookie header ``cookie`` and ``headers``): the
    visitor and address the app behind it reads (:func:`server.visitor`, :func:`server.address`), the Set-Cookie
    headers of its response, and the scope the app saw."""
    seen = {}

    async def app(scope, receive, send):
        seen.update(scope=scope, visitor=server.visitor(scope), address=server.address(scope))
        if kind == "http":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"ok"})

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    middleware.app = app
    request_headers = [*headers, *([(b"cookie", cookie.encode("latin-1"))] if cookie is not None else [])]
    scope = {"type": kind, "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"",
             "root_path": "", "headers": request_headers, "client": (client, 5000), "server": ("127.0.0.1", 7860)}
    run_coroutine(middleware(scope, receive, send))
    cookies = [value.decode() for name, value in (sent[0]["headers"] if sent else []) if name == b"set-cookie"]
    return seen["visitor"], seen["address"], cookies, seen["scope"]


def token_of(set_cookie: str) -> tuple[str, str, set[str]]:
    """The name, value and attributes of a Set-Cookie header."""
    pair, *attributes = (part.strip() for part in set_cookie.split(";"))
    name, value = pair.split("=", 1)
    return name, value, set(attributes)


def test_a_request_without_a_token_gets_one_signed_in_an_httponly_samesite_cookie():
    """The visitor was the client's network address: one address was one visitor, and a class behind one NAT was
    one visitor. Now each browser gets a token, an id and its HMAC-SHA256 under the process's secret."""
    middleware = Visitors(None, mint_burst=5, mint_per_hour=0, secret=SECRET)
    who, where, cookies, _ = visit(middleware)
    assert len(cookies) == 1
    name, token, attributes = token_of(cookies[0])
    token_id, mac = token.split(".")
    assert name == "convnn_visitor" and re.fullmatch(r"[0-9a-f]{32}", token_id)
    assert mac == hmac.new(SECRET, token_id.encode(), hashlib.sha256).hexdigest()
    assert attributes == {"Path=/", "HttpOnly", "SameSite=Lax"}
    assert (who, where) == (f"t:{token_id}", "10.0.0.1")  # the request that got it already counts as its visitor
    again = visit(middleware, client="10.0.0.9", cookie=f"theme=dark; convnn_visitor={token}")[:3]
    assert again == (f"t:{token_id}", "10.0.0.9", [])  # brought back (from another address): the same visitor
    other = visit(middleware)[0]
    assert other.startswith("t:") and other != who  # another browser at the same address: another visitor


@pytest.mark.parametrize("forged", ["{id}." + "0" * 64, "{id}.{other_mac}", "{id}", "{id}.{mac}x", "{id_upper}.{mac}",
                                    "é.é", ".", ""],
                         ids=["zeros", "other secret", "no mac", "longer mac", "upper-case id", "latin-1", "dot",
                              "empty"])
def test_a_token_the_server_did_not_sign_is_not_a_visitor(forged):
    middleware = Visitors(None, mint_burst=5, mint_per_hour=0, secret=SECRET)
    token_id = "0123456789abcdef" * 2
    mac = hmac.new(SECRET, token_id.encode(), hashlib.sha256).hexdigest()
    other_mac = hmac.new(b"another secret", token_id.encode(), hashlib.sha256).hexdigest()
    assert visit(middleware, cookie=f"convnn_visitor={token_id}.{mac}")[:3] == (f"t:{token_id}", "10.0.0.1", [])
    cookie = "convnn_visitor=" + forged.format(id=token_id, mac=mac, other_mac=other_mac, id_upper=token_id.upper())
    who, _, cookies, _ = visit(middleware, cookie=cookie)
    assert len(cookies) == 1 and who == f"t:{token_of(cookies[0])[1].split('.')[0]}"  # a new token instead
    assert who != f"t:{token_id}"


def test_tokens_are_minted_at_a_bounded_rate_per_address_then_the_address_is_the_visitor(monkeypatch):
    """Without a budget, one address could make itself any number of visitors, each with a storage share and a slow
    place. Each address has a token bucket: a burst, then a rate; past it a request without a token is the address,
    one visitor for everyone there; another address has its own budget."""
    now = [1000.0]
    monkeypatch.setattr(visitors, "monotonic", lambda: now[0])
    middleware = Visitors(None, mint_burst=3, mint_per_hour=2, secret=SECRET)  # one token regained per 1800 s
    first = [visit(middleware) for _ in range(4)]
    assert [len(cookies) for _, _, cookies, _ in first] == [1, 1, 1, 0]
    assert len({who for who, *_ in first[:3]}) == 3 and first[3][0] == "a:10.0.0.1"
    assert visit(middleware, client="10.0.0.2")[0].startswith("t:")  # another address: a budget of its own
    now[0] += 1799
    assert visit(middleware)[:3] == ("a:10.0.0.1", "10.0.0.1", [])
    now[0] += 1
    assert visit(middleware)[0].startswith("t:")  # one more, after 1800 s
    assert visit(middleware)[0] == "a:10.0.0.1"
    assert visit(middleware, kind="websocket")[0] == "a:10.0.0.1"  # a WebSocket is placed, never given a token
    now[0] += 3 * 1800
    assert [len(visit(middleware)[2]) for _ in range(4)] == [1, 1, 1, 0]  # back to the burst, no more


def test_only_the_page_and_posts_spend_a_mint(monkeypatch):
    """A browser fetches dozens of assets at once before its first cookie arrives: each spent one of its address's
    mints, and a busy class (or a test session) drained the budget, after which everyone there was one visitor.
    The page itself and POSTs (joins, uploads, calls) are given a token; assets, config and streams are not."""
    middleware = Visitors(None, mint_burst=2, mint_per_hour=0, secret=SECRET)
    for path in ("/assets/index.js", "/config", "/gradio_api/queue/data", "/favicon.ico"):
        assert visit(middleware, path=path)[::2] == ("a:10.0.0.1", [])  # no token, no mint spent
    assert visit(middleware, method="POST", path="/gradio_api/queue/join")[0].startswith("t:")
    assert visit(middleware)[0].startswith("t:")  # the page: the second of the two mints
    assert visit(middleware)[0] == "a:10.0.0.1"


@pytest.mark.parametrize(("proxies", "peer", "forwarded", "expected"), [
    ((), "127.0.0.1", ["6.6.6.6"], "127.0.0.1"),  # no trusted proxy: the header is the client's word, ignored
    (("10.0.0.5",), "10.0.0.5", ["6.6.6.6, 1.2.3.4"], "1.2.3.4"),  # the proxy appended the right-most entry
    (("10.0.0.0/24",), "10.0.0.5", ["6.6.6.6, 1.2.3.4", "10.0.0.7"], "1.2.3.4"),  # two proxies, two headers
    (("10.0.0.5",), "10.0.0.6", ["1.2.3.4"], "10.0.0.6"),  # a peer that is not the proxy
    (("10.0.0.5",), "10.0.0.5", [], "10.0.0.5"),  # the proxy's own request
    (("10.0.0.5",), "10.0.0.5", ["10.0.0.5"], "10.0.0.5"),  # a chain of trusted proxies only
    (("10.0.0.5",), "10.0.0.5", ["[2001:db8:1:2:3:4:5:6]:443"], "2001:db8:1:2::/64"),  # IPv6: its /64
    ((), "2001:db8:1:2::9", [], "2001:db8:1:2::/64"),
    ((), "::ffff:192.0.2.1", [], "192.0.2.1"),  # IPv4-mapped (a dual-stack socket)
    (("2001:db8::/32",), "2001:db8::1", ["1.2.3.4:5678"], "1.2.3.4"),  # an entry with a port
], ids=["no proxy", "proxy", "proxy chain", "not the proxy", "proxy itself", "only proxies", "ipv6 forwarded",
        "ipv6 peer", "ipv4-mapped", "ipv6 proxy"])
def test_the_address_is_the_peer_unless_a_trusted_proxy_forwards_it(proxies, peer, forwarded, expected):
    """uvicorn believed X-Forwarded-For from 127.0.0.1, so any local client could claim any address."""
    middleware = Visitors(None, mint_burst=0, mint_per_hour=0, trusted_proxies=proxies, secret=SECRET)
    headers = tuple((b"x-forwarded-for", value.encode()) for value in forwarded)
    assert visit(middleware, client=peer, headers=headers)[:2] == (f"a:{expected}", expected)


def test_a_trusted_proxy_must_be_an_address_or_a_network():
    assert [str(network) for network in server.trusted_networks([" 10.0.0.5", "10.0.0.0/24", "::1"])] == [
        "10.0.0.5/32", "10.0.0.0/24", "::1/128"]
    with pytest.raises(ValueError, match=re.escape("a trusted proxy must be an IP address or a network such as "
                                                   "10.0.0.0/24, got 'proxy.example.org'")):
        Visitors(None, mint_burst=1, mint_per_hour=1, trusted_proxies=["10.0.0.5", "proxy.example.org"])


def test_the_visitor_reads_the_same_from_a_scope_a_starlette_request_and_a_gr_request():
    """Handlers get a gr.Request (Gradio's queue keeps the request that joined it), the admission the Starlette
    request, the upload limit the ASGI scope: each reads the visitor the middleware decided."""
    who, where, cookies, scope = visit(Visitors(None, mint_burst=1, mint_per_hour=0, secret=SECRET))
    assert who == f"t:{token_of(cookies[0])[1].split('.')[0]}" and where == "10.0.0.1"
    starlette_request = Request(scope)
    gr_request = gr.Request(request=starlette_request, session_hash="s0")
    for source in (scope, starlette_request, gr_request):
        assert (server.visitor(source), server.address(source)) == (who, where)
    for unplaced in (None, gr.Request(session_hash="s0"), {"type": "http"}, Request({"type": "http"})):
        assert (server.visitor(unplaced), server.address(unplaced)) == ("", "")  # a direct call: nobody


@contextlib.contextmanager
def whoami_server(tmp_path, trusted_proxies=()):
    """A served app (app_server.launch, as app.py serves) whose /whoami endpoint answers its request's visitor and
    address; yields a function posting to it with extra headers."""
    def whoami(request: gr.Request) -> str:
        return json.dumps({"visitor": server.visitor(request), "address": server.address(request)})

    with gr.Blocks() as demo:
        gr.api(whoami, api_name="whoami")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    workspace = an.Workspace(tmp_path / "work", max_bytes=2**20, max_age_s=60)
    _, url, _ = app_server.launch(demo, port, prevent_thread_lock=True, workspace=workspace,
                                  trusted_proxies=trusted_proxies)

    def ask(headers: dict[str, str]) -> dict:
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            event = client.post("gradio_api/call/whoami", json={"data": []}).json()["event_id"]
            lines = client.get(f"gradio_api/call/whoami/{event}").text.strip().splitlines()
        return json.loads(json.loads(lines[-1].removeprefix("data: "))[0])
    try:
        yield ask
    finally:
        demo.close()


def test_a_local_client_cannot_name_its_address_with_x_forwarded_for(tmp_path, monkeypatch):
    """uvicorn (0.55) rewrites the client address from X-Forwarded-For when the peer is in FORWARDED_ALLOW_IPS,
    127.0.0.1 by default: a script on the server's machine (or a proxy that passes the header on) could be any
    address. The served app turns that off and reads the header only from a trusted proxy."""
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)  # uvicorn's default, whatever ran before
    with whoami_server(tmp_path) as ask:
        answer = ask({"X-Forwarded-For": "6.6.6.6"})
    assert answer["address"] == "127.0.0.1" and re.fullmatch(r"t:[0-9a-f]{32}", answer["visitor"])
    with whoami_server(tmp_path, trusted_proxies=["127.0.0.1"]) as ask:  # now the local peer is the proxy
        assert ask({"X-Forwarded-For": "6.6.6.6, 203.0.113.7"})["address"] == "203.0.113.7"
