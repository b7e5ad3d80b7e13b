"""Where the mentions timeline has been read up to, kept between runs.

``since_id`` moves past a mention only once that mention is journaled, and is
written to a small file (atomically: a new file, flushed, then renamed over the old
one), so a restart asks X for exactly the mentions it has not taken: none again,
none skipped. Before the first mention, the cursor holds the time of the first start
instead: mentions older than the bot are not answered.

>>> cursor = MentionCursor.open(tmp_path / "x-since-id.json", user_id=1000)   # doctest: +SKIP
>>> cursor.since_id, cursor.start_time                                          # doctest: +SKIP
(None, datetime.datetime(2026, 11, 30, 22, 0, tzinfo=datetime.timezone.utc))
>>> cursor.advance(1800000000000000000)                                         # doctest: +SKIP
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path


class MentionCursor:
    def __init__(self, path: Path, user_id: int, since_id: int | None, start_time: dt.datetime) -> None:
        self.path = path
        self.user_id = user_id
        self.since_id = since_id
        self.start_time = start_time

    @classmethod
    def open(cls, path: Path, *, user_id: int) -> MentionCursor:
        """The cursor kept at ``path`` for this account, or a new one starting now.
        Raises OSError, or ValueError for a file that holds no cursor (JSON or not)."""
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            state = None
        if state is not None and not isinstance(state, dict):
            raise ValueError(f"it holds a JSON {type(state).__name__}, not a cursor (an object)")
        if state is None or state.get("user_id") != user_id:  # first start, or another account
            cursor = cls(path, user_id, None, dt.datetime.now(dt.UTC).replace(microsecond=0))
            cursor._write()
            return cursor
        since_id = state.get("since_id")
        try:
            return cls(path, user_id, None if since_id is None else int(since_id),
                       dt.datetime.fromisoformat(state["start_time"]))
        except KeyError as exc:
            raise ValueError(f"it holds no {exc} (a cursor always does)") from None
        except TypeError as exc:  # a field of a type the cursor never writes
            raise ValueError(f"it holds no cursor: {exc}") from None

    def advance(self, tweet_id: int) -> None:
        """Mentions up to ``tweet_id`` are taken (journaled); durable when this returns."""
        if self.since_id is None or tweet_id > self.since_id:
            self.since_id = tweet_id
            self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = self.path.with_name(self.path.name + ".new")
        state = {"user_id": self.user_id, "since_id": None if self.since_id is None else str(self.since_id),
                 "start_time": self.start_time.isoformat()}
        with open(fresh, "w") as out:
            json.dump(state, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(fresh, self.path)
