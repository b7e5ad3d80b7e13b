"""A fake X API v2: a real aiohttp server on 127.0.0.1, reached by real, unpatched tweepy.

tweepy builds every URL on ``https://api.twitter.com``. The fake answers there: it
serves HTTPS with a certificate for api.twitter.com issued by a throwaway certificate
authority (trustme), and our X client connects to it because its resolver maps
api.twitter.com to the fake's address (``XSettings.api_address``) and trusts that
authority (``XSettings.ca_file``). The URL, the TLS name and the OAuth 1.0a signature
stay exactly what tweepy makes for X, so the fake checks the signature too.

>>> with FakeXServer(user_id=1000, username="synth") as x:           # doctest: +SKIP
...     settings = {"bearer_token": "t", "api_address": x.api_address,
...                 "ca_file": x.write_ca(tmp_path / "x-ca.pem")}
...     x.push_mention("@synth run df -h", author_id=7, username="ada")
...     x.fail_next("POST /2/tweets", 429, reset_in=2)
...     ...
...     x.posts()          # every post made: its id, text, what it answers, and when

It serves ``GET /2/users/me``, ``GET /2/users/:id/mentions`` (``since_id``,
``start_time``, ``max_results``, ``pagination_token``, the ``author_id`` expansion) and
``POST /2/tweets`` (with ``reply.in_reply_to_tweet_id``), records every call with its
time, and can be told to fail the next calls (a 429 with ``x-rate-limit-reset``, 403s,
5xx) or to refuse revoked credentials (``revoke``: 401 to every call). The same routes answer on a plain-HTTP port too, for curl. Run it alone with
``python -m autoresponse.testing.fake_x --ca-file x-ca.pem``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import re
import ssl
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme
from aiohttp import web
from oauthlib.oauth1 import Client as OAuth1Client
from oauthlib.oauth1.rfc5849.utils import parse_authorization_header

from autoresponse.actors.kernel.clock import Clock
from autoresponse.actors.loopback import LoopbackServer

#: The names the fake's certificate is valid for: X's API hosts.
X_API_HOSTS = ("api.twitter.com", "api.x.com")
_MENTIONS = re.compile(r"^/2/users/(\d+)/mentions$")


@dataclass(frozen=True)
class Call:
    time: float  # the fake's clock.monotonic() when the call arrived
    method: str
    path: str
    params: dict[str, str]
    #: "oauth1" (a valid signature for api.twitter.com), "bearer", or "none".
    auth: str
    ok: bool  # False when a scripted failure answered it


@dataclass(frozen=True)
class Post:
    """A post the account made."""

    time: float
    id: str
    text: str
    in_reply_to: str | None


@dataclass(frozen=True)
class Failure:
    status: int
    #: Seconds from now to the ``x-rate-limit-reset`` the answer names.
    reset_in: float | None = None


@dataclass
class Mention:
    data: dict[str, Any]
    author: dict[str, Any]
    created: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    #: Its pictures and videos, served in ``includes.media`` (the attachments.media_keys expansion).
    media: list[dict[str, Any]] = field(default_factory=list)


def _iso(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


class FakeXServer(LoopbackServer):
    def __init__(self, *, port: int = 0, tls_port: int = 0, user_id: int = 1000, username: str = "synth",
                 bearer_token: str | None = None,
                 oauth1: tuple[str, str, str, str] | None = None, clock: Clock | None = None) -> None:
        """``bearer_token`` or ``oauth1`` (consumer key and secret, access token and
        secret), when given, are the only credentials the fake accepts. ``clock`` (the
        bot's, a ManualClock in tests) times the calls and posts and names 429 resets."""
        super().__init__(port=port, name="fake-x")
        self.clock = clock if clock is not None else Clock()
        self.user = {"id": str(user_id), "name": username, "username": username}
        self._bearer = bearer_token
        self._oauth1 = oauth1
        self.ca = trustme.CA()
        self._cert = self.ca.issue_cert(*X_API_HOSTS)
        self.tls_port = tls_port
        self.calls: list[Call] = []
        self._posts: list[Post] = []
        self._mentions: list[Mention] = []
        self._ids = itertools.count(1_800_000_000_000_000_000)
        self._failures: dict[str, deque[Failure]] = {}
        self._revoked = False
        self._lock = threading.Lock()
        self._tls_handler: web.Server | None = None
        self._tls_server: asyncio.AbstractServer | None = None

    @property
    def api_address(self) -> str:
        """Where api.twitter.com is served: ``XSettings.api_address``."""
        return f"127.0.0.1:{self.tls_port}"

    def write_ca(self, path: Path) -> Path:
        """Write the certificate authority to trust (``XSettings.ca_file``) to ``path``."""
        self.ca.cert_pem.write_to_path(str(path))
        return path

    # ---------------------------------------------------------------- scripting

    def push_mention(self, text: str, *, author_id: int, username: str,
                     conversation_id: str | None = None, ago: float = 0.0,
                     media: list[dict[str, Any]] | None = None) -> str:
        """A new post by ``username`` that mentions the account, made ``ago`` seconds
        before now, with ``media`` attached (``{"type": "photo", "url": ...}``). Returns its id."""
        id_ = str(next(self._ids))
        attached = [{"media_key": f"3_{id_}{n}", **m} for n, m in enumerate(media or [])]
        mention = Mention(
            created=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=ago),
            data={"id": id_, "text": text, "author_id": str(author_id),
                  "conversation_id": conversation_id or id_, "in_reply_to_user_id": self.user["id"],
                  "edit_history_tweet_ids": [id_]},
            author={"id": str(author_id), "name": username.title(), "username": username}, media=attached)
        mention.data["created_at"] = _iso(mention.created)
        if attached:
            mention.data["attachments"] = {"media_keys": [m["media_key"] for m in attached]}
        with self._lock:
            self._mentions.append(mention)
        return id_

    def fail_next(self, call: str, status: int, *, reset_in: float | None = None, times: int = 1) -> None:
        """Fail the next ``times`` calls to ``call`` ("POST /2/tweets", "GET mentions")
        with ``status``; a 429 names a reset ``reset_in`` seconds from now."""
        with self._lock:
            self._failures.setdefault(call, deque()).extend(Failure(status, reset_in) for _ in range(times))

    def revoke(self, revoked: bool = True) -> None:
        """Revoke the account's credentials (the app's keys regenerated, access withdrawn):
        every call is a 401 until ``revoke(False)``."""
        with self._lock:
            self._revoked = revoked

    def posts(self, in_reply_to: str | None = None) -> list[Post]:
        """Every post made, in order, optionally only those answering ``in_reply_to``."""
        with self._lock:
            return [p for p in self._posts if in_reply_to is None or p.in_reply_to == in_reply_to]

    def calls_to(self, call: str) -> list[Call]:
        """Every call of ``call`` ("POST /2/tweets", "GET mentions", "GET /2/users/me")."""
        with self._lock:
            return [c for c in self.calls if self._call_name(c.method, c.path) == call]

    # ---------------------------------------------------------------- serving

    @staticmethod
    def _call_name(method: str, path: str) -> str:
        return f"{method} mentions" if _MENTIONS.match(path) else f"{method} {path}"

    def _auth(self, request: web.BaseRequest) -> str:
        """Which credentials signed the request, if they are ones the fake accepts."""
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            return "bearer" if self._bearer in (None, header.removeprefix("Bearer ")) else "none"
        if header.startswith("OAuth "):
            if self._oauth1 is None:
                return "oauth1"
            given = dict(parse_authorization_header(header))
            consumer_key, consumer_secret, token, token_secret = self._oauth1
            if given.get("oauth_consumer_key") != consumer_key or given.get("oauth_token") != token:
                return "none"
            # Sign the same request again, for X's own URL: the signatures must agree.
            _, headers, _ = OAuth1Client(
                consumer_key, consumer_secret, token, token_secret,
                nonce=given.get("oauth_nonce"), timestamp=given.get("oauth_timestamp"),
            ).sign(f"https://{request.host}{request.path_qs}", request.method)
            expected = dict(parse_authorization_header(headers["Authorization"]))
            return "oauth1" if expected["oauth_signature"] == given.get("oauth_signature") else "none"
        return "none"

    def _failure_for(self, call: str) -> Failure | None:
        with self._lock:
            queue = self._failures.get(call)
            return queue.popleft() if queue else None

    async def _dispatch(self, request: web.BaseRequest) -> web.Response:
        params = dict(request.query)
        call = self._call_name(request.method, request.path)
        with self._lock:
            revoked = self._revoked
        auth = "none" if revoked else self._auth(request)
        failure = None if auth == "none" else self._failure_for(call)
        body = await request.json() if request.method == "POST" and request.can_read_body else None
        if body is not None:
            params["json"] = json.dumps(body)
        with self._lock:
            self.calls.append(Call(self.clock.monotonic(), request.method, request.path, params, auth,
                                   auth != "none" and failure is None))
        if auth == "none":
            return self._problem(401, "Unauthorized")
        raw = self.raw_answer(call) if failure is None else None  # ``answer_next``: "GET mentions", ...
        if raw is not None:
            return raw
        if failure is not None:
            headers = {}
            if failure.reset_in is not None:
                headers["x-rate-limit-reset"] = str(int(self.clock.time() + failure.reset_in))
                headers["x-rate-limit-remaining"] = "0"
            return self._problem(failure.status, "Too Many Requests" if failure.status == 429 else "scripted",
                                 headers)
        if call == "GET /2/users/me":
            return web.json_response({"data": self.user})
        if call == "GET mentions":
            return web.json_response(self._mentions_page(params))
        if call == "POST /2/tweets" and body is not None:
            return web.json_response({"data": self._post(body)}, status=201)
        return self._problem(404, "Not Found")

    @staticmethod
    def _problem(status: int, title: str, headers: dict[str, str] | None = None) -> web.Response:
        return web.json_response({"title": title, "detail": title, "type": "about:blank", "status": status},
                                 status=status, headers=headers)

    def _mentions_page(self, params: dict[str, str]) -> dict[str, Any]:
        since_id = int(params.get("since_id") or 0)
        start = params.get("start_time")
        start_time = dt.datetime.fromisoformat(start.replace("Z", "+00:00")) if start else None
        size = int(params.get("max_results") or 10)
        offset = int(params.get("pagination_token") or 0)
        with self._lock:
            found = [m for m in reversed(self._mentions)  # newest first
                     if int(m.data["id"]) > since_id
                     and (start_time is None or m.created >= start_time.replace(microsecond=0))]
        page = found[offset:offset + size]
        if not page:
            return {"meta": {"result_count": 0}}
        meta: dict[str, Any] = {"result_count": len(page), "newest_id": page[0].data["id"],
                                "oldest_id": page[-1].data["id"]}
        if offset + size < len(found):
            meta["next_token"] = str(offset + size)
        authors = {m.author["id"]: m.author for m in page}
        includes: dict[str, Any] = {"users": list(authors.values())}
        if "attachments.media_keys" in params.get("expansions", "") and any(m.media for m in page):
            includes["media"] = [media for m in page for media in m.media]
        return {"data": [m.data for m in page], "includes": includes, "meta": meta}

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        id_ = str(next(self._ids))
        reply_to = (body.get("reply") or {}).get("in_reply_to_tweet_id")
        with self._lock:
            self._posts.append(Post(self.clock.monotonic(), id_, body.get("text", ""), reply_to))
        return {"id": id_, "text": body.get("text", ""), "edit_history_tweet_ids": [id_]}

    # ---------------------------------------------------------------- the HTTPS listener

    async def _open_tls(self, app: web.Application) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._cert.configure_cert(context)
        self._tls_handler = web.Server(self._dispatch, access_log=None)
        self._tls_server = await asyncio.get_running_loop().create_server(
            self._tls_handler, "127.0.0.1", self.tls_port, ssl=context)
        self.tls_port = self._tls_server.sockets[0].getsockname()[1]

    async def on_stopping(self) -> None:
        if self._tls_server is not None and self._tls_handler is not None:
            self._tls_server.close()
            await self._tls_handler.shutdown(1.0)
            await self._tls_server.wait_closed()

    def routes(self, app: web.Application) -> None:
        app.on_startup.append(self._open_tls)
        app.router.add_route("*", "/{path:.*}", self._dispatch)


def main() -> None:
    parser = argparse.ArgumentParser(description="A fake X API v2 on 127.0.0.1")
    parser.add_argument("--port", type=int, default=8083, help="plain HTTP")
    parser.add_argument("--tls-port", type=int, default=8443, help="HTTPS, as api.twitter.com")
    parser.add_argument("--ca-file", type=Path, required=True, help="where to write the CA to trust")
    args = parser.parse_args()
    server = FakeXServer(port=args.port, tls_port=args.tls_port)
    server.write_ca(args.ca_file)
    server.serve_forever("fake X API at http://127.0.0.1:{port}; api.twitter.com at "
                         f"127.0.0.1:{args.tls_port} (CA in {args.ca_file})")


if __name__ == "__main__":
    main()
