"""What a Telegram message carries besides text, and how its files are fetched.

``attachments_of`` reads a message's photo, voice note, audio, document, sticker, place,
contact or poll into ``Attachment``s by file id (the journal keeps the ids, never the
bytes); ``TelegramFiles.download`` is the platform's downloader for the LLM hop:
``getFile``, then the file from the Bot API's file URL, with a size cap.

>>> attachments_of(message)                                          # doctest: +SKIP
(Attachment(kind='photo', file_id='AgAC...', variants=(...)),)
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import aiohttp
from telegram import Bot, Message
from telegram.error import BadRequest

from autoresponse.actors.llm.media import TooLarge, read_capped
from autoresponse.actors.limits import MEDIA_TIMEOUT_SECONDS
from autoresponse.messages import Attachment, Variant

#: Message contents the runtime cannot read, with the words its notice uses.
UNREADABLE = {"video": "video", "video_note": "video message", "animation": "GIF", "dice": "dice roll",
              "game": "game", "story": "story", "paid_media": "paid post"}


def file_base_url(base_url: str) -> str | None:
    """Where the Bot API at ``base_url`` (``.../bot``) serves files (``.../file/bot``); None to
    keep python-telegram-bot's default."""
    return base_url[: -len("/bot")] + "/file/bot" if base_url.rstrip("/").endswith("/bot") else None


def file_url(base_file_url: str, file_path: str) -> str:
    """The URL of getFile's ``file_path`` under the Bot API's ``base_file_url``.

    python-telegram-bot leaves a path as it came when a file of that name exists on this
    machine (relative to the working directory), so what came back may be a bare path:
    it is joined to the file URL again. Nothing is ever read from this machine's disk: a
    path that would leave the file URL (absolute, ``..``, a scheme) is refused
    (LookupError), so a hostile Bot API cannot make the bot read ``/etc/passwd``.

    >>> file_url("https://api.telegram.org/file/bot1:T", "photos/file_0.jpg")
    'https://api.telegram.org/file/bot1:T/photos/file_0.jpg'
    """
    relative = file_path.removeprefix(base_file_url + "/")
    decoded = unquote(relative)  # as the URL's reader takes it: "%2e%2e" is ".."
    segments = decoded.split("/")
    if (not relative or decoded.startswith("/") or "\\" in decoded or "\x00" in decoded
            or ":" in segments[0] or any(s in (".", "..") for s in segments)):
        raise LookupError("Telegram gave a file path that is not under its file URL (a local or absolute "
                          "path); files are only downloaded by URL")
    return f"{base_file_url}/{relative}"


def _place(latitude: float, longitude: float) -> str:
    return f"{latitude:.5f}, {longitude:.5f}"


def attachments_of(message: Message) -> tuple[Attachment, ...]:
    """The items ``message`` carries besides its text or caption; () when it carries none
    (a text, or a service message: someone joined, a pin)."""
    if message.photo:
        sizes = sorted(message.photo, key=lambda p: (p.file_size or 0, p.width * p.height))
        largest = sizes[-1]
        return (Attachment(kind="photo", file_id=largest.file_id, size=largest.file_size, width=largest.width,
                           height=largest.height,
                           variants=tuple(Variant(file_id=p.file_id, size=p.file_size, width=p.width,
                                                  height=p.height) for p in sizes)),)
    if message.voice:
        voice = message.voice
        return (Attachment(kind="voice", file_id=voice.file_id, size=voice.file_size,
                           duration=_seconds(voice.duration), mime_type=voice.mime_type),)
    if message.audio:
        audio = message.audio
        return (Attachment(kind="audio", file_id=audio.file_id, size=audio.file_size, name=audio.file_name,
                           duration=_seconds(audio.duration), mime_type=audio.mime_type,
                           summary=" - ".join(filter(None, (audio.performer, audio.title))) or None),)
    for attribute, name in UNREADABLE.items():  # before the document: a GIF is a document too
        if getattr(message, attribute, None):
            kind = "video" if attribute == "video" else "other"
            item = getattr(message, attribute)
            return (Attachment(kind=kind, name=name, duration=_seconds(getattr(item, "duration", None)),
                               size=getattr(item, "file_size", None)),)
    if message.document:
        document = message.document
        return (Attachment(kind="document", file_id=document.file_id, name=document.file_name,
                           mime_type=document.mime_type, size=document.file_size),)
    if message.sticker:
        sticker = message.sticker
        return (Attachment(kind="sticker", summary=sticker.emoji or "(no emoji)"),)
    if message.venue:
        venue = message.venue
        where = _place(venue.location.latitude, venue.location.longitude)
        return (Attachment(kind="location", summary=f'"{venue.title}", {venue.address} ({where})'),)
    if message.location:
        return (Attachment(kind="location", summary=_place(message.location.latitude, message.location.longitude)),)
    if message.contact:
        contact = message.contact
        name = " ".join(filter(None, (contact.first_name, contact.last_name)))
        return (Attachment(kind="contact", summary=f"{name}, {contact.phone_number}"),)
    if message.poll:
        poll = message.poll
        options = "; ".join(o.text for o in poll.options)
        return (Attachment(kind="poll", summary=f'"{poll.question}" (options: {options})'),)
    return ()


def _seconds(duration: Any) -> int | None:
    """A duration as whole seconds (python-telegram-bot gives an int or a timedelta)."""
    if duration is None:
        return None
    return int(duration.total_seconds()) if hasattr(duration, "total_seconds") else int(duration)


class TelegramFiles:
    """The LLM hop's way to a Telegram file: ``getFile`` through the bot, then the bytes
    from the file URL (see ``file_url``), or from ``local_files`` (a local Bot API
    server's directory, nothing outside it), at most ``max_bytes`` of them, within
    ``timeout`` seconds (None: the caller's deadline alone, as the LLM hop's
    ``media_timeout``). No error it raises holds the URL (the bot's token is in it)."""

    def __init__(self, bot: Bot, timeout: float | None = MEDIA_TIMEOUT_SECONDS, *,
                 local_files: Path | None = None) -> None:
        self.bot = bot
        self.timeout = timeout
        self.local_files = local_files
        self._session: aiohttp.ClientSession | None = None

    async def download(self, file_id: str, max_bytes: int) -> bytes:
        try:
            file = await self.bot.get_file(file_id)
        except BadRequest as exc:
            if "too big" in str(exc).lower():  # the Bot API serves files up to 20 MB
                raise TooLarge(None, max_bytes) from None
            raise
        if file.file_size is not None and file.file_size > max_bytes:
            raise TooLarge(file.file_size, max_bytes)
        if not file.file_path:
            raise LookupError("Telegram gave no path for the file")
        if self.local_files is not None and Path(file.file_path).is_absolute():
            return await asyncio.to_thread(_read_local, self.local_files, Path(file.file_path), max_bytes)
        url = file_url(self.bot.base_file_url, file.file_path)
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        try:
            async with self._session.get(url) as response:
                if response.status != 200:
                    raise ConnectionError(f"the file download answered HTTP {response.status}")
                return await read_capped(response, max_bytes)
        except aiohttp.ClientError as exc:
            raise ConnectionError(f"the file download failed ({type(exc).__name__})") from None

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


def _read_local(root: Path, path: Path, max_bytes: int) -> bytes:
    """A local Bot API server's file, read only when it lies under ``root`` once every
    link is followed (LookupError otherwise); TooLarge past ``max_bytes``."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise LookupError("Telegram gave a file path outside telegram.local_files; it is not read")
    size = resolved.stat().st_size
    if size > max_bytes:
        raise TooLarge(size, max_bytes)
    return resolved.read_bytes()
