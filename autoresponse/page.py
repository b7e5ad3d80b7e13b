"""The status page: GET / on the admin endpoint, kept live over Server-Sent Events.

The page is rendered here, on the server, and the same functions render every
update: GET /events pushes, every ``PUSH_INTERVAL`` seconds and only while a
client listens, the HTML of the parts that changed since its last push. The
little JavaScript in the page swaps those parts in, posts replays, and draws a
request's waterfall from GET /trace/{id}. There is no build step and nothing
is fetched from outside: the Content-Security-Policy allows this origin only,
so the page works offline and injected markup cannot run.

Authentication and cross-site checks are the admin endpoint's (admin.py); this
module only reads the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import re
import secrets
import time
from collections import deque
from collections.abc import Iterator, Mapping
from urllib.parse import quote

from aiohttp import web

from autoresponse.actors.kernel import Runtime
from autoresponse.actors.kernel.deadletters import DeadLetter
from autoresponse.supervisors.status import ActorStatus, Status, snapshot

#: Seconds between two pushes to a listening page.
PUSH_INTERVAL = 0.5
#: Pages listening at once; each costs a snapshot of the tree per push on the event loop.
#: Past it, the oldest page's stream ends (its browser reconnects by itself, in turn).
MAX_STREAMS = 16
#: Snapshots the processed-per-second rate spans (about two seconds): one alone is jumpy.
RATE_WINDOW = 5
LETTERS_SHOWN = 20
REQUESTS_SHOWN = 20


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def trace_link(correlation: str) -> str:
    return f'<a class="id" href="#trace/{esc(quote(correlation, safe=""))}">{esc(correlation)}</a>'


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class Rates:
    """Messages processed per second, per actor, from successive snapshots."""

    def __init__(self, window: int = RATE_WINDOW) -> None:
        self._seen: deque[tuple[float, dict[str, int]]] = deque(maxlen=window)

    def update(self, status: Status) -> dict[str, float]:
        """Add ``status``; the rates since the oldest snapshot kept (none after the first)."""
        now = {node.name: node.processed for root in status.tree for node in root.walk()}
        self._seen.append((status.time, now))
        since, then = self._seen[0]
        elapsed = status.time - since
        if elapsed <= 0:
            return {}
        # A counter that went down (a name reused) counts as no work, not negative work.
        return {name: max(0, count - then.get(name, count)) / elapsed for name, count in now.items()}


# ---------------------------------------------------------------- the parts of the page


def render_summary(status: Status) -> str:
    if status.healthy:
        health = '<span class="badge ok">healthy</span>'
    else:
        badges = [f"down: {', '.join(status.down)}"] if status.down else []
        badges += [f"failing: {name}" for name in status.failing]
        health = "".join(f'<span class="badge bad" title="{esc(status.problem())}">{esc(b)}</span>'
                         for b in badges)
    return (f"{health} <span>{status.in_flight} in flight</span>"
            f" <span>{status.open_items}/{status.intake_capacity} open</span>"
            f" <span>{plural(status.dead_letters_total, 'dead letter')}</span>")


def _ago(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60} min" if seconds < 7200 else f"{seconds // 3600} h"


def _walk(nodes: list[ActorStatus], depth: int = 0) -> Iterator[tuple[ActorStatus, int]]:
    for node in nodes:
        yield node, depth
        yield from _walk(node.children, depth + 1)


def render_tree(status: Status, rates: Mapping[str, float]) -> str:
    rows = []
    for node, depth in _walk(status.tree):
        state = node.state if node.alive else "thread died"
        if node.failing is not None and state == "running":
            state = "failing"
        failure = ""
        if node.failing is not None:  # what fails it now comes before its last crash
            failing = node.failing
            failure = (f'<span class="failing" title="{esc(failing.reason)}">{esc(failing.reason[:120])}</span>'
                       f" <small>since {clock(failing.since)} ({_ago(status.time - failing.since)})</small>")
        elif node.last_failure is not None:
            f = node.last_failure
            failure = (f'<span title="{esc(f.message)}">{esc(f.type)}: {esc(f.message[:80])}</span>'
                       f" <small>{clock(f.time)}</small>")
        rate = rates.get(node.name)
        rows.append(
            f'<tr data-actor="{esc(node.name)}" class="{node.kind}">'
            f'<td class="name d{min(depth, 5)}">{esc(node.name)}</td>'
            f'<td><span class="state {esc(state.replace(" ", "-"))}">{esc(state)}</span></td>'
            f'<td class="n restarts{" warn" if node.restarts else ""}">{node.restarts}</td>'
            f'<td class="failure">{failure}</td>'
            f'<td class="n">{node.mailbox}</td><td class="n">{node.processed}</td>'
            f'<td class="n rate">{"" if rate is None else f"{rate:.1f}"}</td></tr>')
    return ('<table><thead><tr><th>actor</th><th>state</th><th class="n">restarts</th>'
            '<th>last failure</th><th class="n">mailbox</th><th class="n">processed</th>'
            '<th class="n">per s</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table>")


def _request(correlation: str, *, traced: bool) -> str:
    """A request's id: a link to its trace, or plain where the daemon records none."""
    return trace_link(correlation) if traced else f'<span class="id">{esc(correlation)}</span>'


def _id_list(ids: list[str], empty: str, *, traced: bool = True) -> str:
    if not ids:
        return f'<p class="empty">{empty}</p>'
    return '<ul class="ids">' + "".join(f"<li>{_request(i, traced=traced)}</li>" for i in ids) + "</ul>"


def render_requests(in_flight: list[str], recent: list[str], *, traced: bool = True) -> str:
    """``recent`` newest first; those still in flight are listed once, under in flight.
    Untraced (``runtime.trace = false``), no request has a trace to link to or list."""
    going = set(in_flight)
    done = [c for c in recent if c not in going][:REQUESTS_SHOWN]
    return (f"<h3>In flight ({len(in_flight)})</h3>"
            + _id_list(in_flight[:REQUESTS_SHOWN], "Nothing in flight.", traced=traced)
            + "<h3>Recent</h3>"
            + (_id_list(done, "None traced yet.") if traced
               else '<p class="empty">Not traced: runtime.trace = false.</p>'))


def render_dead_letters(letters: list[DeadLetter], counts: Mapping[str, int], *, traced: bool = True) -> str:
    """``letters`` newest first; their requests linked to their traces, when ``traced``."""
    if not letters:
        return '<p class="empty">No dead letters.</p>'
    rows = []
    for d in letters:
        # A letter without an actor (it had no address) cannot be sent again.
        replay = f'<button data-replay="{d.id}">replay</button>' if d.actor else ""
        why = " · ".join(esc(x) for x in (d.detail, d.error) if x)
        rows.append(
            f'<tr data-letter="{d.id}"><td class="n">{d.id}</td><td>{clock(d.time)}</td>'
            f'<td class="reason">{esc(d.reason)}</td><td>{esc(d.actor or "")}</td>'
            f"<td>{_request(d.correlation_id, traced=traced)}</td><td>{replay}</td></tr>"
            f'<tr class="detail"><td></td><td colspan="5">{why}</td></tr>')
    tally = " · ".join(f"{esc(reason)}: {n}" for reason, n in sorted(counts.items()))
    return (f'<p class="tally">{tally}</p><table><thead><tr><th class="n">#</th><th>when</th>'
            '<th>reason</th><th>actor</th><th>request</th><th></th></tr></thead>'
            '<tbody>' + "".join(rows) + "</tbody></table>")


class Feed:
    """One page's view of the runtime: each call to ``changes`` is one push, holding only
    the parts that differ from what this page was last sent."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.rates = Rates()
        self._sent: dict[str, str] = {}
        self._counts: dict[str, int] | None = None
        self._letters = ""

    def changes(self) -> dict[str, str]:
        status = snapshot(self.runtime, details=False)  # the page shows no cluster: no wait for NATS
        # Listing letters may read the journal; a new letter always changes the counts.
        if status.dead_letters != self._counts:
            self._counts = status.dead_letters
            newest = self.runtime.dead_letters.letters(limit=LETTERS_SHOWN)
            self._letters = render_dead_letters(newest[::-1], status.dead_letters, traced=status.traced)
        tracer = self.runtime.tracer
        recent = tracer.correlations()[-2 * REQUESTS_SHOWN:][::-1] if tracer is not None else []
        parts = {
            "summary": render_summary(status),
            "tree": render_tree(status, self.rates.update(status)),
            "requests": render_requests(self.runtime.inflight.correlations(), recent, traced=status.traced),
            "deadletters": self._letters,
        }
        changed = {name: text for name, text in parts.items() if self._sent.get(name) != text}
        self._sent.update(changed)
        return changed


class StatusPage:
    """The handlers of GET / and GET /events; ``close`` ends every event stream."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        # Set at shutdown, before aiohttp's cleanup, which would otherwise wait for every
        # open stream (they never end by themselves) until its shutdown timeout.
        self._closing = asyncio.Event()
        self._streams: deque[asyncio.Event] = deque()  # each open stream's "make room", oldest first

    @property
    def listening(self) -> int:
        """Event streams open now."""
        return len(self._streams)

    def close(self) -> None:
        """Ends every event stream at its next tick; called on the event loop."""
        self._closing.set()

    async def page(self, request: web.Request) -> web.Response:
        nonce = secrets.token_urlsafe(16)
        parts = {"nonce": nonce, **Feed(self.runtime).changes()}
        # One pass, so that text inside a part is never taken for a placeholder.
        body = re.sub(r"\{\{(\w+)\}\}", lambda m: parts.get(m[1], ""), PAGE)
        return web.Response(text=body, content_type="text/html", headers={
            # This origin only: nothing from outside, no inline code but ours, never framed.
            "Content-Security-Policy": (
                f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
                "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'self'; "
                "frame-ancestors 'none'"),
            "Cache-Control": "no-store",
            "Referrer-Policy": "no-referrer",
            "X-Content-Type-Options": "nosniff",
        })

    async def events(self, request: web.Request) -> web.StreamResponse:
        """text/event-stream: a push of what changed every PUSH_INTERVAL seconds, until the
        client goes away, the endpoint stops, or MAX_STREAMS newer pages listen: a page
        left open (or a client that never reads) never locks a new one out."""
        if len(self._streams) >= MAX_STREAMS:
            self._streams.popleft().set()
        make_room = asyncio.Event()
        self._streams.append(make_room)
        try:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                   "Cache-Control": "no-store"})
            await response.prepare(request)
            await response.write(b"retry: 2000\n\n")  # how soon the browser reconnects
            feed = Feed(self.runtime)
            while not self._closing.is_set() and not make_room.is_set():
                await response.write(b"data: " + json.dumps(feed.changes()).encode() + b"\n\n")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), PUSH_INTERVAL)
        except ConnectionResetError:  # the client went away: a write noticed
            pass
        finally:
            with contextlib.suppress(ValueError):  # gone already, if it made room
                self._streams.remove(make_room)
        return response


PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>autoresponse status</title>
<link rel="icon" href="data:,">
<style nonce="{{nonce}}">
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2430; background: #f4f6f9; }
  header { display: flex; flex-wrap: wrap; gap: .5em 1.5em; align-items: center; padding: .7em 1.2em;
           background: #1d2430; color: #fff; }
  h1 { font-size: 1.15em; margin: 0; }
  h2 { font-size: 1em; margin: 0 0 .5em; }
  h3 { font-size: .85em; margin: .8em 0 .3em; color: #5b6575; }
  main { display: grid; gap: 1em; padding: 1em 1.2em; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); }
  section { background: #fff; border-radius: 6px; padding: .8em 1em; box-shadow: 0 1px 2px #0002; }
  #trace { grid-column: 1 / -1; }
  main > div { display: grid; gap: 1em; align-content: start; }
  h2 small, h2 a { font-weight: normal; margin-left: .5em; }
  @media (max-width: 1000px) { main { grid-template-columns: minmax(0, 1fr); } }
  #summary span { margin-right: .8em; }
  #live { margin-left: auto; font-size: .85em; opacity: .8; }
  #live.off { color: #ffb4a8; opacity: 1; }
  form { display: flex; gap: .4em; }
  input { font: inherit; padding: .25em .5em; width: 22em; border: 1px solid #c5ccd6; border-radius: 4px; }
  button { font: inherit; padding: .2em .7em; border: 1px solid #8d99ab; border-radius: 4px;
           background: #fff; cursor: pointer; }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: .2em .5em; border-bottom: 1px solid #eef0f3; vertical-align: top; }
  th { font-size: .8em; color: #5b6575; font-weight: 600; }
  .n { text-align: right; font-variant-numeric: tabular-nums; }
  .supervisor .name { font-weight: 600; }
  .d1 { padding-left: 1.5em; } .d2 { padding-left: 3em; } .d3 { padding-left: 4.5em; }
  .d4, .d5 { padding-left: 6em; }
  .state, .badge { padding: 0 .45em; border-radius: 9px; font-size: .85em;
                   background: #dff3e4; color: #185c2b; }
  .state.restarting, .state.stopped, .state.thread-died, .state.failing, .badge.bad {
    background: #fde2dd; color: #8a1c0c; }
  .badge + .badge { margin-left: .3em; }
  .failing { font-weight: 600; }
  .warn { color: #b3261e; font-weight: 600; }
  .failure { color: #8a1c0c; font-size: .9em; }
  small, .tally, .empty, .detail td { color: #6b7585; font-size: .85em; }
  .detail td { border-bottom: 1px solid #dde1e7; padding-top: 0; }
  .id { font-family: ui-monospace, monospace; font-size: .85em; }
  ul.ids { margin: 0; padding-left: 1.2em; }
  #flash:empty { display: none; }
  #flash { padding: .3em .6em; border-radius: 4px; background: #dff3e4; }
  #flash.bad { background: #fde2dd; }
  .hop { display: grid; grid-template-columns: 19em minmax(0, 1fr) 11em; gap: .8em; align-items: center;
         font-size: .85em; padding: 1px 0; }
  .track { position: relative; height: 12px; background: #f0f2f5; }
  .track span { position: absolute; top: 0; bottom: 0; min-width: 1px; }
  .wait { background: #c9d3e3; }
  .work { background: #2f6fd6; }
  .bad .work, .work.bad { background: #d2402a; }
  .open .work, .work.open { background: #e3a008; }
  .axis { position: relative; height: 1.3em; color: #6b7585; }
  .axis span { position: absolute; transform: translateX(-50%); white-space: nowrap; }
  .axis span:first-child { transform: none; }
  .axis span:last-child { transform: translateX(-100%); }
  .key span { display: inline-block; width: 1.5em; height: .8em; margin: 0 .3em 0 1em; }
</style>
</head>
<body>
<header>
  <h1>autoresponse</h1>
  <div id="summary">{{summary}}</div>
  <form id="search"><input id="correlation" placeholder="correlation id" aria-label="correlation id" required>
    <button>trace</button></form>
  <span id="live">connecting…</span>
</header>
<main>
  <section id="trace" hidden>
    <h2>Trace <span class="id" id="trace-id"></span> <small id="trace-note"></small>
      <a href="#">close</a></h2>
    <p class="key"><span class="wait"></span>queued <span class="work"></span>handled
      <span class="work bad"></span>failed <span class="open work"></span>running</p>
    <div id="waterfall"></div>
  </section>
  <section><h2>Supervision tree</h2><div id="tree">{{tree}}</div></section>
  <div>
    <section><h2>Requests</h2><div id="requests">{{requests}}</div></section>
    <section><h2>Dead letters</h2><p id="flash" role="status"></p>
      <div id="deadletters">{{deadletters}}</div></section>
  </div>
</main>
<script nonce="{{nonce}}">
"use strict";
const $ = (id) => document.getElementById(id);
const ms = (seconds) => (1000 * seconds).toFixed(1) + " ms";

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// Live: the server pushes the HTML of the parts that changed (escaped there).
const events = new EventSource("/events");
events.onmessage = (event) => {
  for (const [id, part] of Object.entries(JSON.parse(event.data))) $(id).innerHTML = part;
  $("live").className = "";
  $("live").textContent = "live · " + new Date().toLocaleTimeString();
};
events.onerror = () => {
  $("live").className = "off";
  $("live").textContent = events.readyState === EventSource.CLOSED ? "disconnected: reload the page"
                                                                   : "reconnecting…";
};

// Replay: a POST from this page (same origin; the endpoint refuses cross-site ones).
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-replay]");
  if (!button) return;
  const id = button.dataset.replay;
  button.disabled = true;
  try {
    const response = await fetch("/deadletters/" + id + "/replay", {method: "POST"});
    const answer = await response.json();
    $("flash").className = response.ok ? "" : "bad";
    $("flash").textContent = response.ok ? "#" + id + " sent again, as attempt " + answer.attempt
                                         : "#" + id + ": " + answer.error;
  } finally {
    button.disabled = false;
  }
});

// Traces: #trace/<correlation id>, from a link or the search box.
$("search").addEventListener("submit", (event) => {
  event.preventDefault();
  location.hash = "#trace/" + encodeURIComponent($("correlation").value.trim());
});

function wanted() {
  try {
    return location.hash.startsWith("#trace/") ? decodeURIComponent(location.hash.slice(7)) : "";
  } catch {
    return "";  // a malformed %-escape typed by hand
  }
}

let follow = null;
async function showTrace() {
  clearTimeout(follow);
  const id = wanted();
  $("trace").hidden = !id;
  if (!id) return;
  $("trace-id").textContent = id;
  const response = await fetch("/trace/" + encodeURIComponent(id));
  const answer = await response.json();
  if (wanted() !== id) return;  // another trace was asked for meanwhile
  if (!response.ok) {
    $("trace-note").textContent = answer.error;
    $("waterfall").replaceChildren();
    return;
  }
  const running = drawWaterfall(answer.hops);
  if (running) follow = setTimeout(showTrace, 1000);  // still in flight: keep drawing it
}

// One row per hop on a common time axis: queued → started (waiting), started → ended (handling).
function drawWaterfall(hops) {
  const now = Date.now() / 1000;
  const start = Math.min(...hops.map((h) => h.queued));
  const end = Math.max(...hops.map((h) => h.ended ?? now));
  const span = Math.max(end - start, 1e-3);
  const at = (t) => (100 * (t - start) / span) + "%";
  const bar = (className, from, to) => {
    const part = el("span", className);
    part.style.left = at(from);
    part.style.width = (100 * (to - from) / span) + "%";
    return part;
  };
  const axis = el("div", "axis");
  for (const share of [0, .25, .5, .75, 1]) {
    const tick = el("span", "", ms(share * span));
    tick.style.left = 100 * share + "%";
    axis.append(tick);
  }
  const rows = [el("div", "hop")];
  rows[0].append(el("span", "", hops.length + " hops"), axis, el("span", "", "outcome"));
  let running = false;
  for (const h of hops) {
    const began = h.started ?? now, done = h.ended ?? now;
    running ||= h.ended === null;
    const row = el("div", "hop " + (h.ended === null ? "open" : h.outcome === "handled" ? "ok" : "bad"));
    row.title = "queued at +" + ms(h.queued - start) + ", waited " + ms(began - h.queued) +
                ", handled in " + ms(done - began);
    const track = el("span", "track");
    track.append(bar("wait", h.queued, began), bar("work", began, done));
    const name = h.actor + " · " + h.type + (h.attempt > 1 ? " (attempt " + h.attempt + ")" : "");
    const outcome = (h.outcome ?? "running") + " · " + ms(done - h.queued);
    row.append(el("span", "", name), track, el("span", "", outcome));
    rows.push(row);
  }
  $("trace-note").textContent = ms(end - start) + (running ? " so far" : "");
  $("waterfall").replaceChildren(...rows);
  return running;
}
window.addEventListener("hashchange", showTrace);
showTrace();
</script>
</body>
</html>
"""
