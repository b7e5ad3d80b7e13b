"""Chat memory in JetStream key-value buckets: any daemon of a cluster continues any chat.

The same interface as ``ConversationStore`` (SQLite, one daemon). A chat's memory is
one value, its entries in order, bounded by the token budget like the SQLite store's;
writes are compare-and-set on the value's revision, so two daemons appending to one
chat at once both land (the loser reads again and retries). One entry longer than the
whole budget is cut to fit it. An entry older than the retention is never read back, and
goes at the chat's next write; a chat not written for the retention goes whole with the
bucket's TTL. Known chats (to find one by name) are one value per chat.

With a ``JetStreamJournal`` (on a NATS server, so these are not run)::

    >>> store = SharedConversationStore(journal, max_tokens=2000)       # doctest: +SKIP
    >>> store.append("telegram:42:", "user", "how full is the disk?")  # doctest: +SKIP
    1
    >>> store.recent("telegram:42:")                                   # doctest: +SKIP
    [Turn(role='user', content='how full is the disk?', tool_calls=(), tool_call_id=None)]
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from autoresponse.actors.journal.jetstream import compare_and_set, kv_key
from autoresponse.actors.limits import MEMORY_MAX_TOKENS, MEMORY_RETENTION_SECONDS
from autoresponse.actors.memory import (
    Entry,
    Kind,
    KnownChat,
    Role,
    estimate_tokens,
    matching_chats,
    newest_within,
    within_budget,
)
from autoresponse.messages import OriginalContext, Turn

if TYPE_CHECKING:
    from autoresponse.actors.journal.jetstream import JetStreamJournal

MEMORY_BUCKET = "autoresponse_memory"
CHATS_BUCKET = "autoresponse_chats"


def _expired(raw: Any, since: float) -> bool:
    """Whether the stored entry ``raw`` was written before ``since`` (a damaged one is
    not: ``newest_within`` leaves it out, saying so)."""
    written = raw.get("time") if isinstance(raw, dict) else None
    return isinstance(written, (int, float)) and written < since


def _at_or_after(raw: Any, first: int) -> bool:
    """Whether the stored entry ``raw`` is ``first`` or came after it (a damaged one is
    not: ``newest_within`` leaves it out, saying so)."""
    written = raw.get("id") if isinstance(raw, dict) else None
    return isinstance(written, int) and written >= first


class SharedConversationStore:
    """Thread-safe (every call runs on the journal's loop thread).

    Its times are the wall clock's (``time.time()``), as the SQLite store's: the bucket's
    TTL forgets only a chat nobody wrote for the retention, and an active chat's value
    holds its old entries until a write drops them, so reads leave them out too."""

    def __init__(self, journal: JetStreamJournal, *, max_tokens: int = MEMORY_MAX_TOKENS,
                 retention_seconds: float = MEMORY_RETENTION_SECONDS) -> None:
        self.max_tokens = max_tokens
        self.retention_seconds = retention_seconds
        self._journal = journal
        self._memory = journal.bucket(MEMORY_BUCKET, ttl=retention_seconds)
        self._chats = journal.bucket(CHATS_BUCKET, ttl=retention_seconds)

    def close(self) -> None:
        """Nothing of its own to close: the journal owns the connection."""

    # ---------------------------------------------------------------- memory

    async def _read(self, chat: str) -> tuple[dict[str, Any], int | None]:
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        try:
            entry = await self._memory.get(kv_key(chat))
        except (KeyNotFoundError, KeyDeletedError):
            return {"chat": chat, "entries": []}, None
        return json.loads(entry.value or b"{}") or {"chat": chat, "entries": []}, entry.revision

    def append(self, chat: str, role: Role, content: str, kind: Kind = "message",
               correlation: str | None = None) -> int | None:
        """Remember one message (cut to fit the whole budget, were it longer); the chat's
        oldest entries go once it is over its budget, and those past the retention.
        ``correlation``: the turn a user's message starts (``stored_for``). Its id (for
        ``forget_turn``)."""
        content = within_budget(content, self.max_tokens)
        return self._journal.run(self._append(chat, role, kind, content, correlation))

    def stored_for(self, chat: str, correlation: str) -> int | None:
        """The id of the user's message that started the turn ``correlation``, if the chat
        holds it, as ``ConversationStore.stored_for``."""
        value, _ = self._journal.run(self._read(chat))
        return next((raw["id"] for raw in value["entries"]
                     if isinstance(raw, dict) and raw.get("correlation") == correlation
                     and isinstance(raw.get("id"), int)), None)

    async def _append(self, chat: str, role: Role, kind: Kind, content: str, correlation: str | None) -> int:
        added = 0  # the id of the entry written: the last attempt's

        def add(data: bytes | None) -> bytes:
            nonlocal added
            value = json.loads(data) if data else {"chat": chat, "entries": []}
            entries, now = value["entries"], time.time()
            added = (entries[-1]["id"] + 1) if entries else 1
            newest = {"id": added, "role": role, "kind": kind, "content": content,
                      "tokens": estimate_tokens(content), "time": now, "correlation": correlation}
            since = self._retained_since(now)
            value["entries"] = self._trimmed([*(raw for raw in entries if not _expired(raw, since)), newest])
            return json.dumps(value).encode()
        await compare_and_set(self._memory, kv_key(chat), add)
        return added

    def _trimmed(self, entries: list[Any]) -> list[Any]:
        """The newest of ``entries`` that fit the budget, and always the newest one (just
        remembered: a budget below the framing alone would otherwise take it too)."""
        total = 0
        for index in range(len(entries) - 1, -1, -1):
            total += entries[index]["tokens"]
            if total > self.max_tokens:
                return entries[min(index + 1, len(entries) - 1):]
        return entries

    def _retained_since(self, now: float) -> float:
        """The time of the oldest entry still within the retention at ``now``."""
        return now - self.retention_seconds

    def recent(self, chat: str, budget: int | None = None) -> list[Turn]:
        return [Turn(role=e.role, content=e.content) for e in self.history(chat, budget)]

    def history(self, chat: str, budget: int | None = None) -> list[Entry]:
        """The newest entries within the retention that fit ``budget`` tokens, oldest first."""
        limit = self.max_tokens if budget is None else budget
        value, _ = self._journal.run(self._read(chat))
        since = self._retained_since(time.time())
        return newest_within(({**raw, "chat": chat} if isinstance(raw, dict) else raw
                              for raw in reversed(value["entries"]) if not _expired(raw, since)), limit, chat)

    def forget(self, chat: str) -> int:
        """Forget a chat's memory (a user's ``/forget``); how many entries went."""
        async def forget() -> int:
            value, revision = await self._read(chat)
            if revision is not None:
                await self._memory.purge(kv_key(chat))
            return len(value["entries"])
        return self._journal.run(forget())

    def forget_turn(self, chat: str, first: int) -> None:
        """Forget a turn its user cancelled: the chat's entries from ``first`` (its message)
        on, as ``ConversationStore.forget_turn``."""
        def drop(data: bytes | None) -> bytes | None:
            value = json.loads(data) if data else None
            if value is None:
                return None  # nothing remembered (a /forget came between)
            kept = [raw for raw in value["entries"] if not _at_or_after(raw, first)]
            if len(kept) == len(value["entries"]):
                return None
            value["entries"] = kept
            return json.dumps(value).encode()
        self._journal.run(compare_and_set(self._memory, kv_key(chat), drop))

    def compact(self, now: float | None = None) -> int:
        """Nothing to do: the bucket's TTL forgets a chat not written for the retention, a
        chat's next write its entries past the retention (never read back meanwhile)."""
        return 0

    def chats_with_memory(self) -> list[tuple[str, int]]:
        """Every chat key with memory within the retention, and its number of entries."""
        async def listing() -> list[tuple[str, int]]:
            out, since = [], self._retained_since(time.time())
            for _, data in await self._journal.entries(self._memory, MEMORY_BUCKET):
                value = json.loads(data or b"{}")
                if kept := [raw for raw in value.get("entries") or [] if not _expired(raw, since)]:
                    out.append((value["chat"], len(kept)))
            return sorted(out)
        return self._journal.run(listing(), timeout=60)

    # ---------------------------------------------------------------- known chats

    def seen(self, context: OriginalContext) -> None:
        """Remember the chat a message came from, with its names (the newest names win)."""
        username = context.user_name if context.chat_type in (None, "private") else None

        async def put() -> None:
            from nats.js.errors import KeyDeletedError, KeyNotFoundError

            key = kv_key(f"{context.interface_name}:{context.chat_id}")
            try:
                old = KnownChat.model_validate_json((await self._chats.get(key)).value or b"{}")
            except (KeyNotFoundError, KeyDeletedError, ValueError):
                old = KnownChat(interface=context.interface_name, chat_id=str(context.chat_id))
            known = old.model_copy(update={"title": context.chat_title or old.title,
                                           "username": username or old.username})
            await self._chats.put(key, known.model_dump_json().encode())
        self._journal.run(put())

    def find_chats(self, interface: str, name: str) -> list[KnownChat]:
        """As ``ConversationStore.find_chats`` (every known chat is read: names are rare)."""
        async def everything() -> list[KnownChat]:
            return [KnownChat.model_validate_json(data or b"{}")
                    for _, data in await self._journal.entries(self._chats, CHATS_BUCKET)]
        known = [c for c in self._journal.run(everything(), timeout=60) if c.interface == interface]
        return matching_chats(known, name)

