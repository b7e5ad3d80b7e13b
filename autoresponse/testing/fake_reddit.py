"""A fake Reddit API: a real aiohttp server on 127.0.0.1 that real asyncpraw talks to.

For our tests, and anyone testing a Reddit bot: give asyncpraw (or our settings)
``oauth_url=fake.base_url`` and ``reddit_url=fake.base_url``.

>>> with FakeRedditServer(username="synth_bot") as reddit:            # doctest: +SKIP
...     reddit.push_message("run df -h", author="ada")
...     reddit.push_comment("run uptime", author="ada", kind="comment_reply")
...     reddit.fail_next("api/comment", error=("RATELIMIT", "Take a break for 2 seconds.", "ratelimit"))
...     ...
...     reddit.replies()     # every reply posted: what it answers, its fullname, text and time

It serves what the inbox needs: the token endpoint (``/api/v1/access_token``),
``/api/v1/me``, ``/message/unread``, ``/api/read_message`` and ``/api/comment`` (a
reply to a comment or to a private message), with ``X-Ratelimit-*`` headers on every
answer. It records every call with its time, and can be told to fail the next calls
(a Reddit API error such as RATELIMIT inside a 200, or an HTTP status), to report
a spent rate-limit budget, or to refuse the account (``revoke``). Run it alone with
``python -m autoresponse.testing.fake_reddit --port 8082``.
"""

from __future__ import annotations

import argparse
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BasicAuth, web

from autoresponse.actors.kernel.clock import Clock
from autoresponse.actors.loopback import LoopbackServer

#: What the fake says about its rate-limit budget unless told otherwise: plenty left,
#: nothing used, so asyncprawcore never needs to pace.
_AMPLE_BUDGET = {"X-Ratelimit-Remaining": "1000", "X-Ratelimit-Used": "0", "X-Ratelimit-Reset": "600"}


@dataclass(frozen=True)
class Call:
    time: float  # the fake's clock.monotonic() when the call arrived
    method: str
    path: str  # without the leading and trailing slashes: "api/comment"
    params: dict[str, str]
    ok: bool  # False when a scripted failure answered it
    #: The rate-limit budget its answer reported left (``X-Ratelimit-Remaining``).
    remaining: int | None = None


@dataclass(frozen=True)
class Reply:
    """A reply the account posted."""

    time: float  # the fake's clock.monotonic() when it was posted
    thing_id: str  # what it answers
    fullname: str  # what Reddit named it
    text: str


@dataclass(frozen=True)
class Failure:
    status: int = 200
    #: A Reddit API error, [type, message, field], returned inside a 200 answer.
    error: tuple[str, str, str] | None = None


@dataclass
class Item:
    """One thing in the account's inbox."""

    fullname: str
    data: dict[str, Any]
    read: bool = False
    created: float = field(default_factory=time.time)

    @property
    def kind(self) -> str:
        return self.fullname.split("_", 1)[0]


class FakeRedditServer(LoopbackServer):
    def __init__(self, *, port: int = 0, username: str = "synth_bot", client_id: str | None = None,
                 client_secret: str | None = None, password: str | None = None,
                 clock: Clock | None = None) -> None:
        """``clock`` (the bot's, a ManualClock in tests) times the calls and replies."""
        super().__init__(port=port, name="fake-reddit")
        self.clock = clock if clock is not None else Clock()
        self.username = username
        #: When set, the token endpoint checks them (a wrong one gets ``invalid_grant``).
        self._credentials = (client_id, client_secret, password)
        self.calls: list[Call] = []
        self.posted: list[Reply] = []
        #: Called with the fullnames of each ``read_message`` call, before it is answered.
        self.on_read: Callable[[list[str]], None] | None = None
        self._items: dict[str, Item] = {}
        self._ids = itertools.count(1000)
        self._tokens: set[str] = set()
        self._failures: dict[tuple[str, str | None], deque[Failure]] = {}
        self._budget: deque[dict[str, str]] = deque()
        self._revoked = False
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        """Both of asyncpraw's ``oauth_url`` and ``reddit_url``."""
        return f"http://127.0.0.1:{self.port}"

    # ---------------------------------------------------------------- scripting

    def _new_id(self) -> str:
        return format(next(self._ids), "x")

    def push_comment(self, body: str, *, author: str, subreddit: str = "test",
                     kind: str = "comment_reply", link_id: str | None = None,
                     parent_id: str | None = None) -> str:
        """An unread comment in the inbox: ``comment_reply``, ``post_reply`` or
        ``username_mention``. Returns its fullname (``t1_...``)."""
        id_ = self._new_id()
        link_id = link_id or f"t3_{self._new_id()}"
        subject = {"username_mention": "username mention", "post_reply": "post reply"}.get(kind, "comment reply")
        data = {
            "id": id_, "name": f"t1_{id_}", "author": author, "body": body, "subreddit": subreddit,
            "subreddit_name_prefixed": f"r/{subreddit}", "link_id": link_id,
            "parent_id": parent_id or link_id, "link_title": "a post", "subject": subject,
            "context": f"/r/{subreddit}/comments/{link_id[3:]}/_/{id_}/?context=3",
            "was_comment": True, "type": kind, "new": True, "dest": self.username,
            "created_utc": time.time(), "replies": "", "distinguished": None, "likes": None,
        }
        return self._add(Item(f"t1_{id_}", data))

    def push_message(self, body: str, *, author: str, subject: str = "a question") -> str:
        """An unread private message in the inbox. Returns its fullname (``t4_...``)."""
        id_ = self._new_id()
        return self._add(Item(f"t4_{id_}", self._message_data(id_, author, self.username, subject, body)))

    def _add(self, item: Item) -> str:
        with self._lock:
            self._items[item.fullname] = item
        return item.fullname

    def fail_next(self, endpoint: str, *, status: int = 200, error: tuple[str, str, str] | None = None,
                  thing_id: str | None = None, times: int = 1) -> None:
        """Fail the next ``times`` calls to ``endpoint`` ("api/comment", "message/unread", ...),
        only those about ``thing_id`` if given: with a Reddit API ``error`` inside a 200,
        or with the HTTP ``status``."""
        with self._lock:
            queue = self._failures.setdefault((endpoint, thing_id), deque())
            queue.extend(Failure(status, error) for _ in range(times))

    def revoke(self, revoked: bool = True) -> None:
        """Revoke the account's access (a changed password, a removed app): the tokens given
        so far are refused (401) and a new one is ``invalid_grant``, until ``revoke(False)``."""
        with self._lock:
            self._revoked = revoked
            if revoked:
                self._tokens.clear()

    def spend_budget(self, *, reset: int, remaining: int = 0, used: int = 600) -> None:
        """The next answer reports this rate-limit budget (``X-Ratelimit-*``)."""
        with self._lock:
            self._budget.append({"X-Ratelimit-Remaining": str(remaining), "X-Ratelimit-Used": str(used),
                                 "X-Ratelimit-Reset": str(reset)})

    def replies(self, thing_id: str | None = None) -> list[Reply]:
        """Every reply posted, in order, optionally only those answering ``thing_id``."""
        with self._lock:
            return [r for r in self.posted if thing_id is None or r.thing_id == thing_id]

    def calls_to(self, path: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.path == path]

    def is_read(self, fullname: str) -> bool:
        with self._lock:
            return self._items[fullname].read

    # ---------------------------------------------------------------- serving

    def _message_data(self, id_: str, author: str, dest: str, subject: str, body: str) -> dict[str, Any]:
        return {"id": id_, "name": f"t4_{id_}", "author": author, "dest": dest, "subject": subject,
                "body": body, "subreddit": None, "replies": "", "was_comment": False, "new": True,
                "created_utc": time.time(), "parent_id": None, "first_message_name": None,
                "first_message": None, "context": "", "distinguished": None}

    def _headers(self) -> dict[str, str]:
        with self._lock:
            return self._budget.popleft() if self._budget else dict(_AMPLE_BUDGET)

    def _failure_for(self, endpoint: str, thing_id: str | None) -> Failure | None:
        with self._lock:
            for key in ((endpoint, thing_id), (endpoint, None)):
                queue = self._failures.get(key)
                if queue:
                    return queue.popleft()
        return None

    def _record(self, request: web.Request, params: dict[str, str], ok: bool,
                headers: dict[str, str] | None = None) -> None:
        remaining = None if headers is None else int(headers["X-Ratelimit-Remaining"])
        with self._lock:
            self.calls.append(Call(self.clock.monotonic(), request.method, request.path.strip("/"), params, ok,
                                   remaining))

    async def _token(self, request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        self._record(request, {k: v for k, v in form.items() if k != "password"}, True)
        client_id, client_secret, password = self._credentials
        auth = BasicAuth.decode(request.headers.get("Authorization", ""))
        if ((client_id is not None and auth.login != client_id)
                or (client_secret is not None and auth.password != client_secret)):
            return web.json_response({"message": "Unauthorized", "error": 401}, status=401)
        with self._lock:
            revoked = self._revoked
        if revoked or (password is not None and form.get("password") != password):
            return web.json_response({"error": "invalid_grant"})  # Reddit answers a wrong password with a 200
        token = f"fake-access-token-{next(self._ids)}"
        with self._lock:
            self._tokens.add(token)
        return web.json_response({"access_token": token, "token_type": "bearer", "expires_in": 86400,
                                  "scope": "*"})

    async def _api(self, request: web.Request) -> web.Response:
        path = request.path.strip("/")
        params = {**request.query, **{k: str(v) for k, v in (await request.post()).items()}}
        token = request.headers.get("Authorization", "").removeprefix("bearer ")
        with self._lock:
            authorized = token in self._tokens
        if not authorized:
            self._record(request, params, False)
            return web.json_response({"message": "Unauthorized", "error": 401}, status=401)
        failure = self._failure_for(path, params.get("thing_id"))
        headers = self._headers()
        self._record(request, params, failure is None, headers)
        raw = self.raw_answer(path)  # ``answer_next``: a path is its call ("message/unread")
        if raw is not None:
            return raw
        if failure is not None:
            if failure.error is not None:
                return web.json_response({"json": {"errors": [list(failure.error)]}}, headers=headers)
            return web.json_response({"message": "scripted", "error": failure.status},
                                     status=failure.status, headers=headers)
        if path == "api/v1/me":
            body: Any = {"name": self.username, "id": "synth1", "created_utc": 0.0, "comment_karma": 1}
        elif path == "message/unread":
            body = self._unread(int(params.get("limit") or 25))
        elif path == "api/read_message":
            body = self._mark_read(params.get("id", "").split(","))
        elif path == "api/comment":
            body = self._reply(params["thing_id"], params["text"])
        else:
            return web.json_response({"message": "Not Found", "error": 404}, status=404, headers=headers)
        return web.json_response(body, headers=headers)

    def _unread(self, limit: int) -> dict[str, Any]:
        with self._lock:
            unread = sorted((i for i in self._items.values() if not i.read), key=lambda i: -i.created)
        children = [{"kind": i.kind, "data": dict(i.data)} for i in unread[:limit]]
        return {"kind": "Listing", "data": {"after": None, "before": None, "dist": len(children),
                                            "modhash": None, "children": children}}

    def _mark_read(self, fullnames: list[str]) -> dict[str, Any]:
        if self.on_read is not None:
            self.on_read(fullnames)
        with self._lock:
            for name in fullnames:
                if name in self._items:
                    self._items[name].read = True
        return {}

    def _reply(self, thing_id: str, text: str) -> dict[str, Any]:
        id_ = self._new_id()
        if thing_id.startswith("t4_"):
            with self._lock:
                parent = self._items.get(thing_id)
            to = parent.data["author"] if parent else "someone"
            thing = {"kind": "t4", "data": {**self._message_data(id_, self.username, to, "re: a question", text),
                                            "parent_id": thing_id, "first_message_name": thing_id}}
        else:
            thing = {"kind": "t1", "data": {
                "id": id_, "name": f"t1_{id_}", "author": self.username, "body": text,
                "parent_id": thing_id, "link_id": thing_id if thing_id.startswith("t3_") else "t3_0",
                "subreddit": "test", "created_utc": time.time(), "replies": "", "distinguished": None}}
        with self._lock:
            self.posted.append(Reply(self.clock.monotonic(), thing_id, thing["data"]["name"], text))
        return {"json": {"errors": [], "data": {"things": [thing]}}}

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/api/v1/access_token", self._token)
        app.router.add_route("*", "/{path:.*}", self._api)


def main() -> None:
    parser = argparse.ArgumentParser(description="A fake Reddit API on 127.0.0.1")
    parser.add_argument("--port", type=int, default=8082)
    parser.add_argument("--username", default="synth_bot")
    args = parser.parse_args()
    FakeRedditServer(port=args.port, username=args.username).serve_forever(
        "fake Reddit API at http://127.0.0.1:{port} (oauth_url and reddit_url)")


if __name__ == "__main__":
    main()
