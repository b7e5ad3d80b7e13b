"""The journal on NATS JetStream: several daemons serve one bot as one.

Same protocol as ``SqliteJournal``, plus what a cluster needs (``Coordination``):

* work is *published* to a work-queue stream, with ``Nats-Msg-Id`` set to its
  correlation (``telegram-<bot>-<update>``): a second poller, a re-poll or a second
  webhook call within the duplicate window creates nothing new;
* every daemon is a worker: it takes items from one durable pull consumer (never
  more than its intake has room for), reports progress while they run, and acks an
  item only when it finished. A worker that dies stops reporting, so its items go
  to another worker after the ack wait;
* per-chat order: each chat has its own subject. Acked items are deleted from a
  work-queue stream, so the items left on a chat's subject are exactly its
  unfinished ones; an item runs only when it is the first of them, and until then it
  waits with the worker that took it. The stream is the lock, so there is no lock to
  leak, and none to fence when a worker dies (its items simply come back);
* send keys and traces live in key-value buckets (any worker may finish any
  item), for the retention; the send keys of an item that is not finished also in a
  bucket without one, until it is (resumed after a long downtime, it must not send
  again what it sent); dead letters in their own stream;
* leases (``lease``) let exactly one daemon poll a platform account, and small
  state (``load``/``save``: the Telegram offset) is shared.

On a NATS server with JetStream (these need one, so they are not run). ``start_feed``:
this daemon now works on the cluster's items; ``lease``: one poller for the account::

    >>> journal = JetStreamJournal("nats://127.0.0.1:4222", node="host-a")  # doctest: +SKIP
    >>> journal.start_feed(take, room)                                      # doctest: +SKIP
    >>> lease = journal.lease("telegram-42")                                # doctest: +SKIP
    >>> await lease.held()                                                  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hashlib
import json
import logging
import re
import threading
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from autoresponse.actors.journal.journal import (
    WRITE_RETRY_FIRST_SECONDS,
    WRITE_RETRY_MAX_SECONDS,
    JournalItem,
    Unreadable,
    Written,
    read_stored,
)
from autoresponse.actors.jsonbody import dump_json
from autoresponse.actors.limits import (
    DEAD_LETTERS_KEPT,
    JOURNAL_RETENTION_SECONDS,
    NATS_ACK_WAIT_SECONDS,
    NATS_CONNECT_TIMEOUT_SECONDS,
    NATS_DUPLICATE_WINDOW_SECONDS,
    NATS_FETCH_BATCH,
    NATS_LEASE_SECONDS,
    NATS_MAX_DELIVERIES,
    NATS_ORDER_RETRY_SECONDS,
)
from autoresponse.messages import OriginalContext
from autoresponse.messages.envelope import Envelope

log = logging.getLogger("autoresponse.journal.nats")

T = TypeVar("T")

WORK_STREAM = "AUTORESPONSE_WORK"
DEAD_STREAM = "AUTORESPONSE_DEAD"
WORK_SUBJECT = "autoresponse.work"
DEAD_SUBJECT = "autoresponse.dead"
WORKERS = "workers"
SENT_BUCKET = "autoresponse_sent"
#: The send keys of the items not finished yet, by item: kept until it is finished.
OPEN_SENT_BUCKET = "autoresponse_sent_open"
TRACES_BUCKET = "autoresponse_traces"
LEASES_BUCKET = "autoresponse_leases"
STATE_BUCKET = "autoresponse_state"
#: The header of a work item that carries its publisher's W3C trace context.
TRACEPARENT = "traceparent"


class JournalUnavailable(Exception):
    """The NATS server cannot be reached, or refuses what the journal needs."""


_PLAIN_KEY = re.compile(r"[-_A-Za-z0-9]{1,100}")


def kv_key(text: str, *, hashed: bool = False) -> str:
    """A key-value key (or subject token) for any text: itself when it is plain, else
    (or when ``hashed``) a hash, since keys allow only a few characters."""
    if not hashed and _PLAIN_KEY.fullmatch(text):
        return text
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


#: Where the platforms' inbound items say which chat they belong to (Telegram and the
#: userbot: ``chat_id``; Reddit: ``conversation``; X: ``conversation_id``).
_CHAT_FIELDS = ("chat_id", "conversation", "conversation_id")


def chat_subject(envelope: Envelope, actor: str) -> str:
    """The subject of a work item: one per chat, so a chat's items keep their order.
    An item with no chat (a command from the admin endpoint) has a subject of its own."""
    body = envelope.body
    chat = next((value for name in _CHAT_FIELDS if (value := getattr(body, name, None)) is not None), None)
    thread = getattr(body, "thread_id", None)
    context = getattr(body, "context", None)
    if chat is None and isinstance(context, OriginalContext):  # a request injected whole
        chat, thread, actor = context.chat_id, context.thread_id, context.interface_name
    if chat is None:
        return f"{WORK_SUBJECT}.{kv_key('item:' + envelope.correlation_id)}"
    return f"{WORK_SUBJECT}.{kv_key(f'{actor}:{chat}:{thread}', hashed=True)}"


#: Compare-and-set attempts of one change before it gives up (a value written that
#: often at once by other daemons is not a chat or a reminder).
CAS_ATTEMPTS = 20


async def compare_and_set(kv: Any, key: str, change: Callable[[bytes | None], bytes | None]) -> None:
    """Change one value of a key-value bucket, when other daemons may write it too:
    read it (None: no value), ``change`` it (None: leave it), write it only if nobody
    wrote in between, else read again."""
    from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError

    for _ in range(CAS_ATTEMPTS):
        try:
            entry = await kv.get(key)
            value, revision = entry.value, entry.revision
        except (KeyNotFoundError, KeyDeletedError):
            value, revision = None, None
        changed = change(value)
        if changed is None:
            return
        try:
            if revision is None:
                await kv.create(key, changed)
            else:
                await kv.update(key, changed, last=revision)
            return
        except KeyWrongLastSequenceError:
            continue  # another daemon wrote it meanwhile
    raise RuntimeError(f"{key} changed {CAS_ATTEMPTS} times during one update")


class Lease:
    """One holder at a time for ``name`` across the cluster, while it renews.

    The holder's key lives in a bucket whose entries expire ``ttl`` seconds after their
    last write: a holder that dies stops renewing, and its lease is free within ``ttl``.
    Renewals are conditional on the revision the holder last wrote, so a holder that
    lost the lease (stalled past ``ttl``) learns it (``lost``) and must stop.
    ``release`` (by the task that asked for it, when it ends) frees it at once.
    """

    def __init__(self, journal: JetStreamJournal, name: str) -> None:
        self.name = name
        self._journal = journal
        self._revision: int | None = None
        self._acquired = threading.Event()
        self.lost = threading.Event()
        #: Why the lease cannot be taken or renewed now (the server out of reach), or None.
        self.trouble: str | None = None
        self._watchers: list[Callable[[str | None], None]] = []
        self._task: concurrent.futures.Future[None] = journal._submit(self._hold())

    @property
    def holding(self) -> bool:
        """This daemon holds the lease now (it got it, and has not lost it)."""
        return self._acquired.is_set() and not self.lost.is_set()

    def watch(self, listener: Callable[[str | None], None]) -> None:
        """Call ``listener`` with ``trouble`` now and whenever it changes (in the journal's
        thread): a poller shows itself failing while its lease cannot be renewed."""
        self._watchers.append(listener)
        listener(self.trouble)

    def _troubled(self, trouble: str | None) -> None:
        if trouble == self.trouble:
            return
        self.trouble = trouble
        for listener in list(self._watchers):
            try:
                listener(trouble)
            except Exception:  # a listener's bug never stops the renewals
                log.exception("a listener of lease %s failed", self.name)

    async def held(self) -> None:
        """Wait, on any event loop, until this daemon holds the lease."""
        while not self._acquired.is_set():
            await asyncio.sleep(0.05)

    def release(self) -> None:
        """Stop renewing and free the lease (from any thread; never blocks)."""
        self._task.cancel()
        self._journal._leases_held.discard(self)
        if not self._journal._closed:
            self._journal._submit(self._release())

    async def _hold(self) -> None:
        from nats.js.errors import KeyWrongLastSequenceError

        kv, node, ttl = self._journal._leases, self._journal.node.encode(), self._journal.lease_seconds
        while self._revision is None:
            try:
                self._revision = await kv.create(self.name, node)
            except KeyWrongLastSequenceError:
                self._troubled(None)
                await asyncio.sleep(ttl / 5)  # someone holds it: look again
            except Exception as exc:  # the server is away: keep trying
                log.warning("lease %s: %s", self.name, exc)
                self._troubled(f"cannot take it: {type(exc).__name__}: {exc}")
                await asyncio.sleep(ttl / 5)
        log.info("holding the lease %s", self.name)
        self._troubled(None)
        self._acquired.set()
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                self._revision = await kv.update(self.name, node, last=self._revision)
                self._troubled(None)
            except KeyWrongLastSequenceError:
                log.error("lost the lease %s: it lapsed (no renewal within its TTL), and another "
                          "daemon may hold it now", self.name)
                self.lost.set()
                return
            except Exception as exc:  # not lost yet: it lapses only after ttl
                log.warning("lease %s not renewed: %s", self.name, exc)
                self._troubled(f"cannot renew it (it lapses {ttl:g}s after the last renewal): "
                               f"{type(exc).__name__}: {exc}")

    async def _release(self) -> None:
        if self._revision is not None and not self.lost.is_set():
            try:
                await self._journal._leases.delete(self.name, last=self._revision)
            except Exception as exc:  # it lapses on its own
                log.debug("lease %s not released: %s", self.name, exc)
            self._revision = None


def _tell(published: concurrent.futures.Future[bool], then: Written) -> None:
    """Tell ``then`` how a publish ended (cancelled when the journal closed under it)."""
    if published.cancelled():
        then(False, RuntimeError("the journal closed before the item was published"))
    elif (error := published.exception()) is not None:
        then(False, error)
    else:
        then(published.result(), None)


class JetStreamJournal:
    """The delivery journal and the cluster's coordination on one NATS connection.

    It owns a thread with its own event loop (so its blocking reads may be called
    from any thread, the runtime's loop included); ``close`` stops both.
    """

    #: Work is taken by the cluster's workers from the stream, not started by the
    #: daemon that accepted it.
    distributed = True
    #: Its server away shows on the pollers, whose leases cannot be renewed: no mark of its own.
    failing: tuple[str, float] | None = None

    def __init__(self, url: str, *, node: str, retention_seconds: float = JOURNAL_RETENTION_SECONDS,
                 ack_wait: float = NATS_ACK_WAIT_SECONDS, lease_seconds: float = NATS_LEASE_SECONDS,
                 max_held: int = NATS_FETCH_BATCH,
                 connect_timeout: float = NATS_CONNECT_TIMEOUT_SECONDS) -> None:
        self.node = node
        #: Items this worker runs at once, at most: about what it can really work on (twice
        #: its LLM calls in flight: an item holds its place through its sends too), so
        #: that idle workers get the rest rather than a queue here.
        self.max_held = max_held
        self.ack_wait = ack_wait
        self.lease_seconds = lease_seconds
        self.retention_seconds = retention_seconds
        self._held: dict[str, Any] = {}  # correlation -> the message this worker is running
        #: Taken from the stream, waiting for an earlier item of their chat, or for room.
        self._waiting: dict[str, tuple[JournalItem, Any]] = {}
        self._unreadable: Unreadable | None = None  # told of a message on the stream that is no item
        self._leases_held: set[Lease] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Send keys asked to be marked and not yet on the server: sent, though no other
        #: daemon can read them yet (``was_sent`` here says so).
        self._marking: set[str] = set()
        self._retrying: set[asyncio.Task[Any]] = set()  # writes the server failed, tried again
        self._closed = False
        self._redelivered = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="nats-journal", daemon=True)
        self._thread.start()
        try:
            self.run(self._connect(url, connect_timeout), connect_timeout * 4)
        except BaseException:
            self._stop_loop()
            raise

    # ---------------------------------------------------------------- plumbing

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        """Run ``coro`` on the journal's loop and wait for its result (from any other thread)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking journal read on the journal's own thread")
        return self._submit(coro).result(timeout)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Start a task this journal owns (cancelled by ``close``)."""
        def start() -> None:
            task = self._loop.create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._loop.call_soon_threadsafe(start)

    async def _connect(self, url: str, timeout: float) -> None:
        import nats
        from nats.js import api
        from nats.js.errors import NotFoundError

        try:
            # Once connected it reconnects for ever; the first connection gets ``timeout``.
            self._nc = await asyncio.wait_for(
                nats.connect(url, name=self.node, connect_timeout=timeout, max_reconnect_attempts=-1,
                             allow_reconnect=True, error_cb=self._nats_error), timeout * 2)
        except asyncio.TimeoutError:
            raise JournalUnavailable(f"cannot reach NATS at {url}: no answer in {timeout * 2:g}s") from None
        except Exception as exc:
            raise JournalUnavailable(f"cannot reach NATS at {url}: {exc or type(exc).__name__}") from None
        js = self._js = self._nc.jetstream()
        streams = (
            api.StreamConfig(name=WORK_STREAM, subjects=[f"{WORK_SUBJECT}.>"], storage=api.StorageType.FILE,
                             retention=api.RetentionPolicy.WORK_QUEUE,
                             duplicate_window=NATS_DUPLICATE_WINDOW_SECONDS),
            api.StreamConfig(name=DEAD_STREAM, subjects=[DEAD_SUBJECT], storage=api.StorageType.FILE,
                             max_msgs=DEAD_LETTERS_KEPT, max_age=self.retention_seconds or None),
        )
        try:
            for config in streams:
                try:
                    await js.stream_info(config.name)
                except NotFoundError:
                    await js.add_stream(config)
            self._work = await js.pull_subscribe(
                f"{WORK_SUBJECT}.>", durable=WORKERS, stream=WORK_STREAM,
                config=api.ConsumerConfig(ack_policy=api.AckPolicy.EXPLICIT, ack_wait=self.ack_wait,
                                          max_deliver=NATS_MAX_DELIVERIES, max_ack_pending=-1))
            self._sent = await self._bucket(SENT_BUCKET, self.retention_seconds)
            self._open_sent = await self._bucket(OPEN_SENT_BUCKET, None)
            self._traces = await self._bucket(TRACES_BUCKET, self.retention_seconds)
            self._leases = await self._bucket(LEASES_BUCKET, self.lease_seconds)
            self._state = await self._bucket(STATE_BUCKET, None)
            # The first daemon made the bucket: its TTL is the cluster's lease TTL.
            self.lease_seconds = (await self._leases.status()).ttl or self.lease_seconds
        except Exception as exc:
            await self._nc.close()
            raise JournalUnavailable(f"NATS at {url} refused the journal's streams ({exc}); "
                                     "is JetStream enabled (nats-server -js)?") from None
        log.info("journal on NATS JetStream at %s as %s", url, self.node)

    async def _bucket(self, name: str, ttl: float | None) -> Any:
        """A key-value bucket: the one already there (made by the first daemon, with its
        settings), or a new one with ``ttl``."""
        from nats.js.api import KeyValueConfig
        from nats.js.errors import BucketNotFoundError

        try:
            return await self._js.key_value(name)
        except BucketNotFoundError:
            return await self._js.create_key_value(KeyValueConfig(bucket=name, ttl=ttl or None))

    async def entries(self, bucket: Any, name: str) -> list[tuple[str, bytes]]:
        """Every live key of the key-value bucket ``name`` (``bucket``) with its value, on
        the journal's loop.

        Listed from the bucket's stream in one request, not with ``KeyValue.keys()``: its
        watcher may say "no more" before handling what it has already received, and then
        answers no keys (nats-io/nats.py#842; a chat looked up by name was not found). At
        most the server's 100,000 subjects per answer.
        """
        from nats.js.errors import KeyNotFoundError

        prefix = f"$KV.{name}."
        info = await self._js.stream_info(f"KV_{name}", subjects_filter=f"{prefix}>")
        found = []
        for subject in sorted(info.state.subjects or {}):
            key = subject[len(prefix):]
            try:
                entry = await bucket.get(key)
            except KeyNotFoundError:  # deleted or purged since (KeyDeletedError is one)
                continue
            found.append((key, entry.value or b""))
        return found

    async def _nats_error(self, exc: Exception) -> None:
        log.warning("NATS: %r", exc)

    # ---------------------------------------------------------------- journal

    def accept(self, envelope: Envelope, *, actor: str, then: Written | None = None
               ) -> concurrent.futures.Future[bool] | None:
        """Publish the item; resolves with False when the cluster already had it (with
        ``then``, that callback is told instead, and nothing is returned)."""
        body = envelope.body
        data = dump_json({"correlation": envelope.correlation_id, "actor": actor,
                          "type": type(body).__name__, "payload": body.model_dump_json()})
        if len(data) > self._nc.max_payload:  # refused at the door, like what SQLite cannot store
            raise ValueError(f"it is larger than the NATS server takes ({self._nc.max_payload} bytes)")
        headers = {"Nats-Msg-Id": envelope.correlation_id}
        if envelope.traceparent is not None:  # OpenTelemetry: the worker's spans continue it
            headers[TRACEPARENT] = envelope.traceparent
        published = self._submit(self._publish(chat_subject(envelope, actor), data, headers))
        if then is None:
            return published
        published.add_done_callback(lambda done: _tell(done, then))
        return None

    async def _publish(self, subject: str, data: bytes, headers: dict[str, str]) -> bool:
        ack = await self._js.publish(subject, data, headers=headers)
        return not ack.duplicate

    def start_feed(self, take: Callable[[JournalItem], bool], room: Callable[[], int],
                   unreadable: Unreadable | None = None) -> None:
        """Work on the cluster's items: ``take`` starts one here (False: it cannot run
        here, hand it back); ``room`` is how many more this daemon may run now;
        ``unreadable`` is told of a message on the stream that is no item at all (its
        name, its data as text, and why), which is then taken off the stream."""
        self._unreadable = unreadable
        self._spawn(self._feed(take, room))
        self._spawn(self._report_progress())

    async def _feed(self, take: Callable[[JournalItem], bool], room: Callable[[], int]) -> None:
        from nats.errors import TimeoutError as FetchTimeout

        while True:
            await self._start_waiting(take)
            places = min(room(), self.max_held - len(self._held)) - len(self._waiting)
            if places <= 0:
                await asyncio.sleep(NATS_ORDER_RETRY_SECONDS)
                continue
            try:
                msgs = await self._work.fetch(min(places, NATS_FETCH_BATCH),
                                              timeout=NATS_ORDER_RETRY_SECONDS if self._waiting else 1.0)
            except FetchTimeout:
                continue
            except Exception as exc:  # the server is away: the client reconnects
                if self._closed:
                    return
                log.warning("taking work from NATS failed: %r", exc)  # %r: some say nothing but their type
                await asyncio.sleep(1.0)
                continue
            for msg in msgs:
                await self._taken(msg)

    async def _taken(self, msg: Any) -> None:
        """A message fetched from the stream waits here for its chat's turn and for room."""
        try:
            item = JournalItem.model_validate_json(msg.data)
        except ValueError as exc:  # nothing can run it: not ours, or corrupt
            seq = msg.metadata.sequence.stream
            first = str(exc).split("\n", 1)[0]  # its name, not the data it quotes after
            why = f"it is no work item ({type(exc).__name__}: {first})"
            if self._unreadable is not None:
                self._unreadable(f"nats-{seq}", msg.data.decode("utf-8", errors="replace"), why)
            else:
                log.error("dropped an unreadable work item (stream seq %s): %s", seq, why)
            await msg.term()
            return
        if msg.metadata.num_delivered > 1:
            self._redelivered += 1
        traceparent = (msg.headers or {}).get(TRACEPARENT)
        if traceparent:
            item.traceparent = traceparent
        if item.correlation in self._held:  # delivered again (a late progress report): ack the new one
            self._held[item.correlation] = msg
            return
        self._waiting[item.correlation] = (item, msg)

    async def _start_waiting(self, take: Callable[[JournalItem], bool]) -> None:
        """Start, oldest first, the waiting items that are first in their chat, while
        ``take`` has room. A waiting item is held, not handed back, so that waiting for
        an earlier one never counts as a delivery (the server stops redelivering an
        item after NATS_MAX_DELIVERIES: that count is for workers that die)."""
        for correlation, (item, msg) in list(self._waiting.items()):
            if not await self._first_of_chat(msg):
                continue
            if not take(item):
                return  # no room: try again later
            del self._waiting[correlation]
            self._held[correlation] = msg

    async def _first_of_chat(self, msg: Any) -> bool:
        """Is ``msg`` the oldest unfinished item of its chat? (Finished ones are gone.)"""
        from nats.js.errors import NotFoundError

        try:
            first = await self._js.get_msg(WORK_STREAM, seq=1, subject=msg.subject, next=True)
        except NotFoundError:
            return True
        return first.seq == msg.metadata.sequence.stream

    async def _report_progress(self) -> None:
        """Tell the server, well within the ack wait, that the items held here still run."""
        while True:
            await asyncio.sleep(self.ack_wait / 3)
            for msg in [*self._held.values(), *(msg for _, msg in self._waiting.values())]:
                try:
                    await msg.in_progress()
                except Exception as exc:
                    log.debug("progress not reported: %r", exc)

    def finish(self, correlation: str, state: str = "done", trace: Any = None) -> None:
        """The item ended here (``done`` or ``dead``): ack it, which deletes it; its
        ``trace`` is kept where every trace is."""
        if trace is not None:
            self.record_trace(correlation, trace)
        if not self._closed:  # after close, what was held went back to the cluster
            self._loop.call_soon_threadsafe(self._ack, correlation)

    def _ack(self, correlation: str) -> None:
        msg = self._held.pop(correlation, None)
        if msg is not None:
            task = self._loop.create_task(self._finished(msg, correlation))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _finished(self, msg: Any, correlation: str) -> None:
        """Ack ``msg``, whose item ended here, and forget the send keys kept for it while it
        was open: those with the retention answer for it from now on."""
        await msg.ack()
        await self._until_written(
            lambda: self._js.purge_stream(f"KV_{OPEN_SENT_BUCKET}",
                                          subject=f"$KV.{OPEN_SENT_BUCKET}.{kv_key(correlation)}.>"),
            f"forgetting the open send keys of {correlation}")

    def unfinished(self) -> list[JournalItem]:
        """Nothing to resume by hand: unacked items come back to some worker by themselves."""
        return []

    def was_sent(self, key: str, correlation: str | None = None) -> bool:
        """Asked of the cluster every time: any daemon may have sent it (a work item moves to
        another daemon when its own dies); in the retention's bucket, and in the open item's
        keys when ``correlation`` runs here (sent before a downtime longer than the
        retention). A key this daemon marked that the server has not taken yet is sent."""
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        if key in self._marking:
            return True
        open_key = self._open_send_key(key, correlation)

        async def has(bucket: Any, name: str) -> bool:
            try:
                await bucket.get(name)
            except (KeyNotFoundError, KeyDeletedError):
                return False
            return True

        async def get() -> bool:
            asked = [has(self._sent, kv_key(key))]
            if open_key is not None:
                asked.append(has(self._open_sent, open_key))
            return any(await asyncio.gather(*asked))
        return self.run(get())

    def mark_sent(self, key: str, correlation: str | None = None) -> concurrent.futures.Future[bool]:
        """Record the send ``key`` for the cluster, for the retention, and also until its
        item is finished when that item (``correlation``) runs here; resolves once the
        server has it. A write the server fails is tried again (``_until_written``) until
        it lands or the journal closes: dropped, the chunk would go out again from whoever
        runs its item next."""
        open_key = self._open_send_key(key, correlation)
        self._marking.add(key)
        return self._submit(self._mark(key, open_key))

    async def _mark(self, key: str, open_key: str | None) -> bool:
        async def put() -> None:
            puts = [self._sent.put(kv_key(key), b"1")]
            if open_key is not None:
                puts.append(self._open_sent.put(open_key, b"1"))
            await asyncio.gather(*puts)
        try:
            await self._until_written(put, f"the send key {key}")
            return True
        finally:
            self._marking.discard(key)

    def _open_send_key(self, key: str, correlation: str | None) -> str | None:
        """Where ``key`` is kept while its item, ``correlation`` running here, is open (None:
        no item of that name runs here): under the item's name, for ``_finished`` to forget."""
        if correlation is None or correlation not in self._held:
            return None
        return f"{kv_key(correlation)}.{kv_key(key)}"

    async def _until_written(self, write: Callable[[], Awaitable[Any]], what: str) -> None:
        """``write``, again while the server fails it (its store full, JetStream away): after
        ``WRITE_RETRY_FIRST_SECONDS``, then twice as long each time up to
        ``WRITE_RETRY_MAX_SECONDS``, until it lands or the journal closes."""
        from nats.errors import Error as NatsError

        wait, task = 0.0, asyncio.current_task()
        try:
            while True:
                try:
                    await write()
                    return
                except NatsError as exc:
                    if self._closed:
                        raise
                    if not wait:
                        log.warning("journal: %s was not written (%r); it is tried again until it is", what, exc)
                    if task is not None:
                        self._retrying.add(task)  # ``close`` ends its tries
                    wait = min(max(2 * wait, WRITE_RETRY_FIRST_SECONDS), WRITE_RETRY_MAX_SECONDS)
                    await asyncio.sleep(wait)
        finally:
            if task is not None:
                self._retrying.discard(task)

    # ---------------------------------------------------------------- traces, dead letters

    def record_trace(self, correlation: str, trace: Any) -> concurrent.futures.Future[bool]:
        async def put() -> bool:
            await self._traces.put(kv_key(correlation), dump_json(trace))
            return True
        return self._submit(put())

    def trace(self, correlation: str) -> Any:
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        async def get() -> Any:
            try:
                entry = await self._traces.get(kv_key(correlation))
            except (KeyNotFoundError, KeyDeletedError):
                return None
            return read_stored(entry.value or b"null", f"trace of {correlation}")
        return self.run(get())

    @functools.cached_property
    def _stored_dead_letters(self) -> tuple[int, dict[str, int]]:
        """This node's last dead-letter id and the cluster's counts by reason, read once
        (when the dead-letter office attaches; it counts on from there). Each node numbers
        in a range of its own (from a hash of its name), so two daemons do not reuse ids."""
        letters = self.dead_letters(DEAD_LETTERS_KEPT)
        mine = [d["id"] for d in letters if d.get("node") == self.node]
        return (max(mine, default=(zlib.crc32(self.node.encode()) % 1000) * 1_000_000),
                dict(Counter(d.get("reason", "?") for d in letters)))

    def record_dead_letter(self, summary: dict[str, Any]) -> concurrent.futures.Future[bool]:
        data = json.dumps({**summary, "node": self.node}, default=str).encode()

        async def publish() -> bool:
            await self._js.publish(DEAD_SUBJECT, data)
            return True
        return self._submit(publish())

    def dead_letters(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` dead letters of the cluster, oldest first."""
        async def read() -> list[dict[str, Any]]:
            info = await self._js.stream_info(DEAD_STREAM)
            last, first = info.state.last_seq, info.state.first_seq
            out: list[dict[str, Any]] = []
            seq = last
            while seq >= max(first, 1) and len(out) < limit:
                try:
                    msg = await self._js.get_msg(DEAD_STREAM, seq=seq)
                except Exception:  # removed (retention): skip
                    msg = None
                letter = None if msg is None else read_stored(msg.data or b"{}", "a dead letter")
                if isinstance(letter, dict):  # a damaged one is left out, as in SQLite
                    out.append(letter)
                seq -= 1
            return out[::-1]
        return self.run(read(), timeout=60)

    def dead_letter(self, letter_id: int) -> dict[str, Any] | None:
        return next((d for d in reversed(self.dead_letters(DEAD_LETTERS_KEPT)) if d.get("id") == letter_id), None)

    def last_dead_letter_id(self) -> int:
        return self._stored_dead_letters[0]

    def dead_letter_counts(self) -> dict[str, int]:
        return self._stored_dead_letters[1]

    def compact(self, older_than: float, *, dead_letters_older_than: float | None = None,
                keep_dead_letters: int = DEAD_LETTERS_KEPT) -> int:
        """Nothing to do: buckets and the dead-letter stream expire on the server."""
        return 0

    # ---------------------------------------------------------------- coordination

    def bucket(self, name: str, *, ttl: float | None = None) -> Any:
        """A key-value bucket on this connection (made if missing, with ``ttl``), for stores
        that the cluster shares (chat memory, reminders); use it through ``run``."""
        return self.run(self._bucket(name, ttl))

    def lease(self, name: str) -> Lease:
        """Start asking for ``name`` (see ``Lease``); release it when done (``close``
        releases what is still held)."""
        lease = Lease(self, kv_key(name))
        self._leases_held.add(lease)
        return lease

    def load(self, name: str) -> bytes | None:
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        async def get() -> bytes | None:
            try:
                return (await self._state.get(kv_key(name))).value
            except (KeyNotFoundError, KeyDeletedError):
                return None
        return self.run(get())

    def save(self, name: str, value: bytes) -> concurrent.futures.Future[int]:
        return self._submit(self._state.put(kv_key(name), value))

    def status(self, timeout: float = 10.0) -> dict[str, Any]:
        """The cluster as this daemon sees it: who holds which lease, and the work stream."""
        async def read() -> dict[str, Any]:
            info = await self._js.consumer_info(WORK_STREAM, WORKERS)
            leases = {key: value.decode() for key, value in await self.entries(self._leases, LEASES_BUCKET)}
            return {"node": self.node, "leases": leases, "pending": info.num_pending,
                    "in_progress": info.num_ack_pending, "redelivered": info.num_redelivered,
                    "held_here": len(self._held), "redelivered_here": self._redelivered}
        return self.run(read(), timeout)

    # ---------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Hand back what runs here (another worker takes it at once), release the
        leases, close the connection, stop the thread."""
        if self._closed:
            return
        self._closed = True

        async def shut() -> None:
            if self._retrying:
                log.error("journal closed with %d writes the server failed (a send key's chunk may go out "
                          "again when its item runs)", len(self._retrying))
            for task in [*self._tasks, *self._retrying]:
                task.cancel()
            for msg in [*self._held.values(), *(msg for _, msg in self._waiting.values())]:
                try:
                    await msg.nak()
                except Exception:
                    pass
            self._held.clear()
            self._waiting.clear()
            for lease in list(self._leases_held):
                lease._task.cancel()
                await lease._release()
            await self._nc.close()
        try:
            self.run(shut(), timeout=15)
        except Exception as exc:
            log.warning("closing the NATS journal: %r", exc)
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()


def default_node() -> str:
    """This daemon's name in the cluster: host and process."""
    import os
    import socket

    return f"{socket.gethostname()}-{os.getpid()}-{int(time.time()) % 100_000}"
