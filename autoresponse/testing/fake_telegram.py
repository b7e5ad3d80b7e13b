"""A fake Telegram Bot API: a real aiohttp server on 127.0.0.1.

For our tests, the benchmark, and anyone testing a bot: point python-telegram-bot
at it with ``base_url=fake.base_url``.

>>> with FakeTelegramServer() as telegram:                        # doctest: +SKIP
...     telegram.push_text("run df -h", chat_id=42, user_id=7)
...     telegram.fail_next("sendMessage", 429, "Too Many Requests: retry after 2",
...                        chat_id=42, parameters={"retry_after": 2})
...     ...
...     telegram.sent(chat_id=42)     # every sendMessage to chat 42, with its time

It answers ``POST /bot{token}/{method}`` for getMe, getUpdates (long polling
over scripted updates), sendMessage, getFile (and ``GET /file/bot{token}/{path}``
serves the file, as Telegram's file URL does), and setWebhook, deleteWebhook and
getWebhookInfo (the webhook is recorded in ``webhook``; while one is set,
getUpdates is a 409, as on Telegram); it records every call with its time, and
can be told to fail the next calls (429 with ``retry_after``, 400s, 403,
``migrate_to_chat_id``, 5xx), or to refuse a revoked token (``revoke``: 401 to every call).

Media come as Telegram sends them, their files served by getFile::

>>> telegram.push_photo([(90, 60, thumb), (1280, 853, big)], caption="what?", chat_id=42, user_id=7)  # doctest: +SKIP
>>> telegram.push_voice(ogg, duration=3, chat_id=42, user_id=7)                      # doctest: +SKIP
>>> telegram.push_album([photo] * 10, caption="our trip", chat_id=42, user_id=7)      # doctest: +SKIP

Buttons: a sendMessage with an inline keyboard (``reply_markup``) is recorded as it came;
``press`` pushes the ``callback_query`` update of pressing one of its buttons (any user,
any data: ``push_callback`` forges one), and answerCallbackQuery and
editMessageReplyMarkup are answered and recorded::

>>> [prompt] = telegram.sent(chat_id=42)                                             # doctest: +SKIP
>>> telegram.press(prompt, "Approve", user_id=7)                                     # doctest: +SKIP
>>> telegram.calls_to("answerCallbackQuery")[0].params["text"]                         # doctest: +SKIP

``webhook_failed`` makes getWebhookInfo report a failed delivery, as Telegram does when
it cannot reach the webhook. ``post_update`` posts an update to a bot's webhook the way
Telegram does::

>>> update = telegram.text_update("run df -h", chat_id=42, user_id=7)   # doctest: +SKIP
>>> post_update("http://127.0.0.1:8443/telegram", update, secret_token="s3cret")  # doctest: +SKIP
200
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from autoresponse.actors.kernel.clock import Clock
from autoresponse.actors.loopback import LoopbackServer

_MENTION = re.compile(r"@\w+")
_COMMAND = re.compile(r"/\w+(?:@\w+)?")


def _utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


BOT_USER = {"id": 1000, "is_bot": True, "first_name": "synth", "username": "synth_bot",
            "can_join_groups": True, "can_read_all_group_messages": False,
            "supports_inline_queries": False}


@dataclass(frozen=True)
class Call:
    time: float  # the fake's clock.monotonic() when the call arrived
    token: str
    method: str
    params: dict[str, Any]
    ok: bool  # False when a scripted failure answered it
    message_id: int | None = None  # the id a sendMessage was answered with


@dataclass(frozen=True)
class Webhook:
    """What the bot gave setWebhook."""

    url: str
    secret_token: str | None
    allowed_updates: list[str] | None


@dataclass(frozen=True)
class Failure:
    status: int
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)


class FakeTelegramServer(LoopbackServer):
    def __init__(self, *, port: int = 0, clock: Clock | None = None) -> None:
        """``clock`` (the bot's, a ManualClock in tests) times the calls."""
        super().__init__(port=port, name="fake-telegram")
        self.clock = clock if clock is not None else Clock()
        self.calls: list[Call] = []
        self._updates: list[dict[str, Any]] = []
        self._update_ids = itertools.count(1)
        self._message_ids = itertools.count(10_000)
        self._callback_ids = itertools.count(1)
        self._failures: dict[tuple[str, Any], deque[Failure]] = {}
        self._lock = threading.Lock()
        self._new_update = asyncio.Event()
        #: The webhook set with setWebhook, None when there is none (long polling).
        self.webhook: Webhook | None = None
        #: Files getFile knows: file_id → (file_path, bytes).
        self.files: dict[str, tuple[str, bytes]] = {}
        self._file_ids = itertools.count(1)
        #: Bot tokens revoked with ``revoke``: every call with one is a 401, as on Telegram.
        self._revoked: set[str] = set()
        #: The last failure to deliver to the webhook (``webhook_failed``): when, and why.
        self._webhook_error: tuple[int, str] | None = None

    @property
    def base_url(self) -> str:
        """What python-telegram-bot calls ``base_url``: the token and method follow it."""
        return f"http://127.0.0.1:{self.port}/bot"

    # ---------------------------------------------------------------- scripting

    def push_text(self, text: str, *, edited: bool = False, **options: Any) -> dict[str, Any]:
        """Queue an update carrying a text message (or an edit of one), made as ``text_update``
        makes it; returns the message."""
        update = self.text_update(text, edited=edited, **options)
        self.push_update(update)
        return update["edited_message" if edited else "message"]

    def text_update(self, text: str, *, chat_id: int, user_id: int, chat_type: str = "private",
                    message_id: int | None = None, thread_id: int | None = None,
                    first_name: str = "Ada", reply_to_bot: bool = False, edited: bool = False,
                    title: str = "a group", username: str | None = None,
                    forum: bool = False) -> dict[str, Any]:
        """An update carrying a text message (or an edit of one), with the next update_id,
        not queued: for ``push_update``, or for ``post_update`` to a webhook."""
        message: dict[str, Any] = {
            "message_id": message_id or next(self._message_ids),
            "date": int(time.time()),
            "chat": {"id": chat_id, "type": chat_type,
                     **({"title": title} if chat_type != "private" else {"first_name": first_name}),
                     **({"username": username} if username and chat_type == "private" else {}),
                     **({"is_forum": True} if forum else {})},
            "from": {"id": user_id, "is_bot": False, "first_name": first_name,
                     **({"username": username} if username else {})},
            "text": text,
        }
        # Telegram marks every @username as a mention entity, in UTF-16 units.
        entities = [{"type": "mention", "offset": _utf16(text[:m.start()]), "length": _utf16(m.group())}
                    for m in _MENTION.finditer(text)]
        command = _COMMAND.match(text)  # and a leading /command (or /command@bot) as a bot_command
        if command:
            entities = [e for e in entities if e["offset"] >= _utf16(command.group())]
            entities.insert(0, {"type": "bot_command", "offset": 0, "length": _utf16(command.group())})
        if entities:
            message["entities"] = entities
        if thread_id is not None:
            message["message_thread_id"] = thread_id
            message["is_topic_message"] = True
        if reply_to_bot:
            message["reply_to_message"] = {"message_id": 1, "date": int(time.time()),
                                           "chat": message["chat"], "from": BOT_USER, "text": "earlier"}
        if edited:
            message["edit_date"] = int(time.time())
        with self._lock:
            update_id = next(self._update_ids)
        return {"update_id": update_id, "edited_message" if edited else "message": message}

    # ---------------------------------------------------------------- media

    def add_file(self, data: bytes, folder: str = "documents", suffix: str = "") -> dict[str, Any]:
        """Store ``data`` to be served by getFile; its file_id, file_unique_id and file_size."""
        with self._lock:
            number = next(self._file_ids)
        file_id = f"{folder[:3].upper()}-file-{number}"
        with self._lock:
            self.files[file_id] = (f"{folder}/file_{number}{suffix}", data)
        return {"file_id": file_id, "file_unique_id": f"u{number}", "file_size": len(data)}

    def media_update(self, content: dict[str, Any], *, caption: str | None = None,
                     media_group_id: str | None = None, **options: Any) -> dict[str, Any]:
        """An update carrying a message with ``content`` (``{"photo": [...]}``, ``{"voice": ...}``)
        and an optional caption (its mentions as caption entities), not queued."""
        update = self.text_update(caption or "", **options)
        message = update["message"]
        del message["text"]
        entities = message.pop("entities", None)
        if caption:
            message["caption"] = caption
            if entities:
                message["caption_entities"] = entities
        if media_group_id is not None:
            message["media_group_id"] = media_group_id
        message.update(content)
        return update

    def push_media(self, content: dict[str, Any], **options: Any) -> dict[str, Any]:
        """Queue an update made by ``media_update``; returns the message."""
        update = self.media_update(content, **options)
        self.push_update(update)
        return update["message"]

    def push_photo(self, sizes: list[tuple[int, int, bytes]], **options: Any) -> dict[str, Any]:
        """A photo in its sizes (width, height, bytes), smallest first, as Telegram sends one."""
        photo = [{**self.add_file(data, "photos", ".jpg"), "width": w, "height": h} for w, h, data in sizes]
        return self.push_media({"photo": photo}, **options)

    def push_album(self, photos: list[bytes], *, caption: str | None = None, **options: Any) -> list[dict[str, Any]]:
        """An album: one message per photo, sharing a media_group_id; the first has the caption."""
        with self._lock:
            group = f"album-{next(self._file_ids)}"
        return [self.push_photo([(800, 600, data)], media_group_id=group,
                                caption=caption if n == 0 else None, **options)
                for n, data in enumerate(photos)]

    def push_voice(self, data: bytes, *, duration: int, mime_type: str = "audio/ogg",
                   **options: Any) -> dict[str, Any]:
        return self.push_media({"voice": {**self.add_file(data, "voice", ".oga"), "duration": duration,
                                          "mime_type": mime_type}}, **options)

    def push_document(self, data: bytes, *, file_name: str, mime_type: str = "text/plain",
                      **options: Any) -> dict[str, Any]:
        return self.push_media({"document": {**self.add_file(data, "documents"), "file_name": file_name,
                                             "mime_type": mime_type}}, **options)

    def push_sticker(self, emoji: str, **options: Any) -> dict[str, Any]:
        sticker = {**self.add_file(b"RIFF\x00\x00\x00\x00WEBP", "stickers", ".webp"), "width": 512,
                   "height": 512, "emoji": emoji, "is_animated": False, "is_video": False, "type": "regular"}
        return self.push_media({"sticker": sticker}, **options)

    def push_location(self, latitude: float, longitude: float, **options: Any) -> dict[str, Any]:
        return self.push_media({"location": {"latitude": latitude, "longitude": longitude}}, **options)

    def push_contact(self, phone_number: str, first_name: str, **options: Any) -> dict[str, Any]:
        return self.push_media({"contact": {"phone_number": phone_number, "first_name": first_name}}, **options)

    def push_poll(self, question: str, options_: list[str], **options: Any) -> dict[str, Any]:
        poll = {"id": "poll-1", "question": question, "total_voter_count": 0, "is_closed": False,
                "is_anonymous": True, "type": "regular", "allows_multiple_answers": False, "allows_revoting": False,
                "members_only": False,
                "options": [{"text": o, "voter_count": 0, "persistent_id": str(n)} for n, o in enumerate(options_)]}
        return self.push_media({"poll": poll}, **options)

    def push_video(self, data: bytes, *, duration: int, **options: Any) -> dict[str, Any]:
        return self.push_media({"video": {**self.add_file(data, "videos", ".mp4"), "width": 640, "height": 360,
                                          "duration": duration}}, **options)

    def push_update(self, update: dict[str, Any], *, update_id: int | None = None) -> int:
        """Queue any update, malformed ones included; it gets the next update_id unless it
        has one (or ``update_id`` says otherwise). Returns its update_id."""
        with self._lock:
            if update_id is not None:
                number = update_id
            else:  # the next id only when it has none (a text_update already took one)
                number = update["update_id"] if "update_id" in update else next(self._update_ids)
            self._updates.append({"update_id": number, **update})
        self.call_soon(self._new_update.set)
        return number

    def callback_update(self, data: str, *, user_id: int, chat_id: int, message_id: int,
                        chat_type: str = "private", first_name: str = "Ada", username: str | None = None,
                        title: str = "a group") -> dict[str, Any]:
        """An update carrying a button press (a ``callback_query``) by ``user_id``, under the
        message ``message_id`` of ``chat_id``, with the next update_id; not queued."""
        chat = {"id": chat_id, "type": chat_type,
                **({"title": title} if chat_type != "private" else {"first_name": first_name})}
        with self._lock:
            update_id = next(self._update_ids)
            query_id = f"cbq-{next(self._callback_ids)}"
        return {"update_id": update_id, "callback_query": {
            "id": query_id, "chat_instance": f"ci-{chat_id}", "data": data,
            "from": {"id": user_id, "is_bot": False, "first_name": first_name,
                     **({"username": username} if username else {})},
            "message": {"message_id": message_id, "date": int(time.time()), "chat": chat, "from": BOT_USER,
                        "text": "(a message with buttons)"}}}

    def push_callback(self, data: str, **options: Any) -> dict[str, Any]:
        """Queue a button press with any ``data`` (a forged one too), made as ``callback_update``
        makes it; returns the callback query."""
        update = self.callback_update(data, **options)
        self.push_update(update)
        return update["callback_query"]

    def press(self, sent: Call, label: str, *, user_id: int, **options: Any) -> dict[str, Any]:
        """Press the button labelled ``label`` under the message ``sent`` (a recorded
        sendMessage with an inline keyboard), as ``user_id``; returns the callback query."""
        rows = (sent.params.get("reply_markup") or {}).get("inline_keyboard") or []
        data = next(b["callback_data"] for row in rows for b in row if b["text"] == label)
        chat_id = int(sent.params["chat_id"])
        options.setdefault("chat_type", "private" if chat_id > 0 else "supergroup")
        assert sent.message_id is not None, "that message was not sent"
        return self.push_callback(data, user_id=user_id, chat_id=chat_id, message_id=sent.message_id, **options)

    def fail_next(self, method: str, status: int, description: str, *, chat_id: Any = None,
                  parameters: dict[str, Any] | None = None, times: int = 1) -> None:
        """Fail the next ``times`` calls of ``method`` (to ``chat_id``, if given)."""
        with self._lock:
            queue = self._failures.setdefault((method, chat_id), deque())
            queue.extend(Failure(status, description, parameters or {}) for _ in range(times))

    def revoke(self, token: str, revoked: bool = True) -> None:
        """Revoke a bot token (@BotFather's /revoke): every call made with it is answered 401
        Unauthorized until ``revoke(token, False)`` makes it work again."""
        with self._lock:
            (self._revoked.add if revoked else self._revoked.discard)(token)

    def webhook_failed(self, message: str) -> None:
        """Telegram failed to deliver to the webhook just now (getWebhookInfo's
        ``last_error_date`` and ``last_error_message``), e.g. "Connection refused"."""
        with self._lock:
            self._webhook_error = (int(self.clock.time()), message)

    def sent(self, chat_id: Any = None) -> list[Call]:
        """Every sendMessage that succeeded, optionally to one chat."""
        with self._lock:
            return [c for c in self.calls if c.method == "sendMessage" and c.ok
                    and (chat_id is None or str(c.params["chat_id"]) == str(chat_id))]

    def calls_to(self, method: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method]

    # ---------------------------------------------------------------- serving

    def _failure_for(self, method: str, chat_id: Any) -> Failure | None:
        with self._lock:
            for key in ((method, chat_id), (method, None)):
                queue = self._failures.get(key)
                if queue:
                    return queue.popleft()
        return None

    @staticmethod
    async def _params(request: web.Request) -> dict[str, Any]:
        if request.content_type == "application/json":
            return await request.json()
        params: dict[str, Any] = {}
        for key, value in (await request.post()).items():
            text = str(value)
            try:
                params[key] = json.loads(text) if text[:1] in "{[" or text.lstrip("-").isdigit() else text
            except ValueError:
                params[key] = text
        return params

    async def _handle(self, request: web.Request) -> web.Response:
        token, method = request.match_info["token"], request.match_info["method"]
        params = await self._params(request)
        chat_id = params.get("chat_id")
        with self._lock:
            revoked = token in self._revoked
        failure = (Failure(401, "Unauthorized") if revoked
                   else self._failure_for(method, None if chat_id is None else int(chat_id)) or self._conflict(method))
        sent = self._message_sent(params) if failure is None and method == "sendMessage" else None
        with self._lock:
            self.calls.append(Call(self.clock.monotonic(), token, method, params, failure is None,
                                   sent["message_id"] if sent else None))
        raw = self.raw_answer(method)  # ``answer_next``: a method's name is its call
        if raw is not None:
            return raw
        if failure is not None:
            body = {"ok": False, "error_code": failure.status, "description": failure.description}
            if failure.parameters:
                body["parameters"] = failure.parameters
            return web.json_response(body, status=failure.status)
        if method == "getMe":
            return web.json_response({"ok": True, "result": BOT_USER})
        if method in ("setWebhook", "deleteWebhook"):
            url = str(params.get("url") or "") if method == "setWebhook" else ""
            with self._lock:  # an empty url removes the webhook, as on Telegram
                self.webhook = Webhook(url, params.get("secret_token"), params.get("allowed_updates")) if url else None
            return web.json_response({"ok": True, "result": True})
        if method == "getWebhookInfo":  # Telegram never shows the secret token
            with self._lock:
                hook, pending, error = self.webhook, len(self._updates), self._webhook_error
            info = {"url": hook.url if hook else "", "has_custom_certificate": False,
                    "pending_update_count": pending}
            if error is not None:
                info["last_error_date"], info["last_error_message"] = error
            if hook is not None and hook.allowed_updates is not None:
                info["allowed_updates"] = hook.allowed_updates
            return web.json_response({"ok": True, "result": info})
        if method == "setMyCommands":
            return web.json_response({"ok": True, "result": True})
        if method == "getUpdates":
            return web.json_response({"ok": True, "result": await self._get_updates(params)})
        if sent is not None:
            return web.json_response({"ok": True, "result": sent})
        if method == "editMessageText":  # the edited message, as Telegram answers
            return web.json_response({"ok": True, "result": {**self._message_sent(params),
                                                             "message_id": int(params["message_id"])}})
        if method == "deleteMessage":
            return web.json_response({"ok": True, "result": True})
        if method == "answerCallbackQuery":
            return web.json_response({"ok": True, "result": True})
        if method == "editMessageReplyMarkup":  # the edited message, as Telegram answers
            return web.json_response({"ok": True, "result": {**self._message_sent(params),
                                                             "message_id": int(params["message_id"])}})
        if method == "getFile":
            with self._lock:
                found = self.files.get(str(params.get("file_id")))
            if found is None:
                return web.json_response({"ok": False, "error_code": 400,
                                          "description": "Bad Request: invalid file_id"}, status=400)
            path, data = found
            return web.json_response({"ok": True, "result": {
                "file_id": params["file_id"], "file_unique_id": f"u-{params['file_id']}",
                "file_size": len(data), "file_path": path}})
        return web.json_response({"ok": False, "error_code": 404, "description": "Not Found"}, status=404)

    async def _get_updates(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        offset = int(params.get("offset") or 0)
        timeout = float(params.get("timeout") or 0)
        until = asyncio.get_running_loop().time() + timeout
        while True:
            with self._lock:
                self._updates = [u for u in self._updates
                                 if not isinstance(u.get("update_id"), int) or u["update_id"] >= offset]
                ready = list(self._updates)[:int(params.get("limit") or 100)]
            left = until - asyncio.get_running_loop().time()
            if ready or left <= 0 or self.stopping.is_set():
                return ready
            self._new_update.clear()
            try:
                await asyncio.wait_for(self._new_update.wait(), left)
            except asyncio.TimeoutError:
                pass

    def _conflict(self, method: str) -> Failure | None:
        """Telegram refuses getUpdates while a webhook is set."""
        with self._lock:
            if method != "getUpdates" or self.webhook is None:
                return None
        return Failure(409, "Conflict: can't use getUpdates method while webhook is active; "
                            "use deleteWebhook to delete the webhook first")

    def _message_sent(self, params: dict[str, Any]) -> dict[str, Any]:
        chat_id = int(params["chat_id"])
        return {"message_id": next(self._message_ids), "date": int(time.time()),
                "chat": {"id": chat_id, "type": "private" if chat_id > 0 else "supergroup"},
                "from": BOT_USER, "text": params.get("text", "")}

    async def _file(self, request: web.Request) -> web.Response:
        """A file by its getFile path, as ``https://api.telegram.org/file/bot<token>/<path>``."""
        path = request.match_info["path"]
        with self._lock:
            found = next((data for p, data in self.files.values() if p == path), None)
            self.calls.append(Call(self.clock.monotonic(), request.match_info["token"], "file",
                                   {"path": path}, found is not None))
        if found is None:
            raise web.HTTPNotFound()
        return web.Response(body=found, content_type="application/octet-stream")

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/bot{token}/{method}", self._handle)
        app.router.add_get("/file/bot{token}/{path:.+}", self._file)

    async def on_stopping(self) -> None:
        self._new_update.set()  # release long polls


#: urllib without the environment's proxies: a webhook on 127.0.0.1 is reached directly.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post_update(url: str, update: dict[str, Any] | bytes, *, secret_token: str | None,
                timeout: float = 30.0) -> int:
    """POST ``update`` to the webhook at ``url`` as Telegram does: JSON, with the secret token
    in ``X-Telegram-Bot-Api-Secret-Token`` (none when None). Bytes are sent as they are (a
    malformed call). Returns the HTTP status."""
    body = update if isinstance(update, bytes) else json.dumps(update).encode()
    headers = {"Content-Type": "application/json"}
    if secret_token is not None:
        headers["X-Telegram-Bot-Api-Secret-Token"] = secret_token
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _DIRECT.open(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code


def main() -> None:
    parser = argparse.ArgumentParser(description="A fake Telegram Bot API on 127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    args = parser.parse_args()
    FakeTelegramServer(port=args.port).serve_forever("fake Telegram Bot API at http://127.0.0.1:{port}/bot")


if __name__ == "__main__":
    main()
