"""What a user sent besides words, read in the LLM hop just before the model is asked.

A request carries its attachments by reference (``messages.Attachment``: a file id, a
URL), so the journal never holds the bytes. ``MediaReader.read`` turns them into what
the model can use, on the event loop, with a size cap and a timeout:

* a photo: with ``vision`` on, the largest size under ``max_image_bytes`` as a data URL
  (an OpenAI ``image_url`` part) when it is a PNG, JPEG, GIF or WebP, what vision models
  decode (anything else, a HEIC or an error page, is a note); off, the model is told a
  photo came;
* a text file under ``max_file_bytes``: its text (UTF-8, UTF-16 or UTF-32 with a byte-order
  mark, or Windows-1252), up to ``max_document_chars``;
* a voice note: its transcript, when ``transcribe_url`` names an OpenAI-compatible
  ``/audio/transcriptions``; otherwise the model is told a voice note came;
* a sticker, a place, a contact, a poll: their words, already in the attachment;
* anything else: a note the model reads ("you cannot watch videos").

A file above the cap is not downloaded: the user gets a notice, and when the message
held nothing else the model is not asked at all. The items of one message (an album) are
downloaded a few at a time and transcribed, all within one ``timeout``: what is not done
by then is a note ("not read: ..."), and the turn goes on.

Platforms give the downloads: ``Mount.downloader(interface, download)`` registers an
``async download(file_id, max_bytes) -> bytes`` that raises ``TooLarge`` past the cap.

>>> reader = MediaReader(vision=True, downloaders={"telegram": files.download})   # doctest: +SKIP
>>> prompt, notices = await reader.read(prompt)                                    # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp

from autoresponse.actors.limits import (
    MEDIA_CONCURRENT_DOWNLOADS,
    MEDIA_MAX_DOCUMENT_CHARS,
    MEDIA_MAX_FILE_BYTES,
    MEDIA_MAX_IMAGE_BYTES,
    MEDIA_MAX_ITEMS,
    MEDIA_TIMEOUT_SECONDS,
)
from autoresponse.messages import Attachment, PromptRequest, Variant, human_size

log = logging.getLogger("autoresponse.media")

#: ``async download(file_id, max_bytes) -> bytes``: a platform's way to its files.
Downloader = Callable[[str, int], Awaitable[bytes]]

#: File types read as text besides ``text/*``.
TEXT_TYPES = frozenset({"application/json", "application/xml", "application/x-yaml", "application/yaml",
                        "application/toml", "application/x-sh", "application/javascript", "application/sql",
                        "application/csv", "application/x-python", "application/x-ndjson"})
TEXT_SUFFIXES = frozenset({"txt", "md", "markdown", "csv", "tsv", "json", "yaml", "yml", "toml", "ini", "cfg",
                           "conf", "log", "xml", "html", "htm", "py", "js", "ts", "sh", "sql", "rst", "c", "h",
                           "cpp", "go", "rs", "java", "rb", "php", "css", "env", "diff", "patch"})

UNSUPPORTED_NOTICE = ("Sorry, I cannot take {what} yet. Send me text, a photo, a voice note or a text file, "
                      "and I will answer.")
TOO_LARGE_NOTICE = "Sorry, {what} is too large for me to read ({size}; I read files up to {cap})."


class TooLarge(Exception):
    """A file is bigger than the cap; ``size`` is what it has (or read so far)."""

    def __init__(self, size: int | None, cap: int) -> None:
        super().__init__(f"{'unknown size' if size is None else human_size(size)} is over {human_size(cap)}")
        self.size = size
        self.cap = cap


async def read_capped(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body of ``response``, refusing (``TooLarge``) past ``max_bytes``, announced or read."""
    declared = response.content_length
    if declared is not None and declared > max_bytes:
        raise TooLarge(declared, max_bytes)
    body = bytearray()
    async for chunk in response.content.iter_chunked(64 * 1024):
        body += chunk
        if len(body) > max_bytes:
            raise TooLarge(len(body), max_bytes)
    return bytes(body)


def image_type(data: bytes) -> str | None:
    """The MIME type of an image a vision model decodes (PNG, JPEG, GIF, WebP), from its
    first bytes; None for anything else (a HEIC, a TIFF, an HTML error page): sent as an
    image, the server would refuse the whole request."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    return None


def is_text_file(item: Attachment) -> bool:
    mime = (item.mime_type or "").split(";")[0].strip().lower()
    suffix = (item.name or "").rpartition(".")[2].lower() if "." in (item.name or "") else ""
    return mime.startswith("text/") or mime in TEXT_TYPES or suffix in TEXT_SUFFIXES


#: Byte-order marks and their encodings; UTF-32's before UTF-16's, whose marks they start with.
BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"),
        (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))


def as_text(data: bytes) -> str | None:
    """``data`` as text, or None when it is not (binary).

    A byte-order mark names the encoding (PowerShell writes UTF-16 with one); without one,
    UTF-8, else Windows-1252 (a CSV from Excel), which decodes all but five bytes: so data
    with a NUL byte is taken for binary first.
    """
    for bom, encoding in BOMS:
        if data.startswith(bom):
            try:
                text = data[len(bom):].decode(encoding)
            except UnicodeDecodeError:
                return None
            return None if "\x00" in text else text
    if b"\x00" in data:
        return None
    for encoding in ("utf-8", "cp1252"):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            pass
    return None


def unsupported(attachments: tuple[Attachment, ...]) -> bool:
    """Every item is one the runtime cannot read at all (a video, a dice)."""
    return bool(attachments) and all(a.kind in ("video", "other") for a in attachments)


def unsupported_notice(attachments: tuple[Attachment, ...]) -> str:
    kinds = sorted({"a video" if a.kind == "video" else f"a {a.name}" if a.name else "this kind of message"
                    for a in attachments})
    return UNSUPPORTED_NOTICE.format(what=" or ".join(kinds))


@dataclass
class MediaReader:
    """Reads attachments for the model (see the module's docstring)."""

    vision: bool = False
    max_image_bytes: int = MEDIA_MAX_IMAGE_BYTES
    max_file_bytes: int = MEDIA_MAX_FILE_BYTES
    max_document_chars: int = MEDIA_MAX_DOCUMENT_CHARS
    timeout: float = MEDIA_TIMEOUT_SECONDS
    transcribe_url: str | None = None
    transcribe_model: str = "whisper-1"
    transcribe_key: str | None = None
    #: interface name → its platform's downloader.
    downloaders: dict[str, Downloader] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, llm: object, downloaders: Mapping[str, Downloader] | None = None) -> MediaReader:
        """From ``LLMSettings``: the transcription key is the LLM's only on the LLM's own server."""
        key = getattr(llm, "transcribe_api_key", None)
        url = getattr(llm, "transcribe_url", None)
        base, api_key = getattr(llm, "base_url", None), getattr(llm, "api_key", None)
        if key is None and api_key is not None and url and base and _origin(url) == _origin(base):
            key = api_key
        return cls(vision=getattr(llm, "vision", False),
                   max_image_bytes=getattr(llm, "max_image_bytes", MEDIA_MAX_IMAGE_BYTES),
                   max_file_bytes=getattr(llm, "max_file_bytes", MEDIA_MAX_FILE_BYTES),
                   max_document_chars=getattr(llm, "max_document_chars", MEDIA_MAX_DOCUMENT_CHARS),
                   timeout=getattr(llm, "media_timeout", MEDIA_TIMEOUT_SECONDS),
                   transcribe_url=url, transcribe_model=getattr(llm, "transcribe_model", "whisper-1"),
                   transcribe_key=None if key is None else key.get_secret_value(),
                   downloaders=dict(downloaders or {}))

    def register(self, interface: str, download: Downloader) -> None:
        self.downloaders[interface] = download

    async def read(self, prompt: PromptRequest) -> tuple[PromptRequest, list[str], bool]:
        """The prompt as the model should see it (each attachment read, or noted why not),
        the notices for the user (a file too large), and whether anything is left to ask
        (False: the message was only files too large to read)."""
        items = list(prompt.attachments)
        deadline = asyncio.get_running_loop().time() + self.timeout  # the message's, not each item's
        download = self._bounded(self.downloaders.get(prompt.original_context.interface_name), deadline)
        outcomes = await asyncio.gather(*(self._outcome(item, download, deadline)
                                          for item in items[:MEDIA_MAX_ITEMS]))
        read = [attachment for attachment, _ in outcomes]
        read += [item.model_copy(update={"note": f"not read: at most {MEDIA_MAX_ITEMS} items a message"})
                 for item in items[MEDIA_MAX_ITEMS:]]
        notices = [notice for _, notice in outcomes if notice is not None]
        left = bool(prompt.current_text.strip()) or len(notices) < len(items)  # a notice per file too large
        return prompt.model_copy(update={"attachments": tuple(read)}), notices, left

    def _bounded(self, download: Downloader | None, deadline: float) -> Downloader | None:
        """``download`` for the items of one message: MEDIA_CONCURRENT_DOWNLOADS at a time,
        all of them (waiting their turn too) by the message's ``deadline`` (loop time)."""
        if download is None:
            return None
        gate = asyncio.Semaphore(MEDIA_CONCURRENT_DOWNLOADS)

        async def bounded(file_id: str, max_bytes: int) -> bytes:
            async with asyncio.timeout_at(deadline), gate:
                return await download(file_id, max_bytes)
        return bounded

    async def _outcome(self, item: Attachment, download: Downloader | None,
                       deadline: float) -> tuple[Attachment, str | None]:
        """``item`` read, or noted why not; the user's notice when it was too large."""
        try:
            return await self._read_one(item, download, deadline), None
        except TooLarge as exc:
            size = item.size if exc.size is None else exc.size
            notice = TOO_LARGE_NOTICE.format(what=_named(item), cap=human_size(exc.cap),
                                             size=human_size(size) if size else "its size unknown")
            return item.model_copy(update={"note": f"not read: larger than {human_size(exc.cap)}; "
                                                   "the user was told"}), notice
        except Exception as exc:  # a failed download: the model says so, the turn goes on
            log.warning("reading a %s failed: %s: %s", item.kind, type(exc).__name__, exc)
            return item.model_copy(update={"note": "not read: its download failed"}), None

    async def _read_one(self, item: Attachment, download: Downloader | None, deadline: float) -> Attachment:
        if item.kind == "photo" or (item.kind == "document" and (item.mime_type or "").startswith("image/")
                                    and self.vision):
            return await self._photo(item, download)
        if item.kind == "document":
            return await self._document(item, download)
        if item.kind in ("voice", "audio"):
            return await self._voice(item, download, deadline)
        if item.kind == "video":
            return item.model_copy(update={"note": "you cannot watch videos"})
        if item.kind == "other":
            return item.model_copy(update={"note": "you cannot read this kind of message"})
        return item  # a sticker, a place, a contact, a poll, an image by URL: its words are in it

    async def _fetch(self, download: Downloader | None, file_id: str | None, size: int | None, cap: int) -> bytes:
        if size is not None and size > cap:
            raise TooLarge(size, cap)  # said before any download
        if download is None or file_id is None:
            raise LookupError("this platform gives no downloads")
        return await download(file_id, cap)  # within the message's deadline (``_bounded``)

    async def _photo(self, item: Attachment, download: Downloader | None) -> Attachment:
        if not self.vision:
            return item.model_copy(update={"note": "you cannot see images here; say so if it matters"})
        variants = item.variants or (Variant(file_id=item.file_id or "", size=item.size,
                                             width=item.width, height=item.height),)
        fitting = [v for v in variants if v.size is None or v.size <= self.max_image_bytes]
        if not fitting:
            raise TooLarge(min(v.size or 0 for v in variants), self.max_image_bytes)
        chosen = max(fitting, key=lambda v: (v.size or 0, (v.width or 0) * (v.height or 0)))
        data = await self._fetch(download, chosen.file_id or None, chosen.size, self.max_image_bytes)
        mime = image_type(data)
        if mime is None:  # never sent as an image: the server would refuse the whole turn
            return item.model_copy(update={"note": "not read: not an image the model can see"})
        url = f"data:{mime};base64,{base64.b64encode(data).decode()}"
        return item.model_copy(update={"image": url, "width": chosen.width or item.width,
                                       "height": chosen.height or item.height, "size": len(data)})

    async def _document(self, item: Attachment, download: Downloader | None) -> Attachment:
        if not is_text_file(item):
            return item.model_copy(update={"note": "you cannot read this kind of file, only text files"})
        data = await self._fetch(download, item.file_id, item.size, self.max_file_bytes)
        text = as_text(data)
        if text is None:
            return item.model_copy(update={"note": "not read: it is not text"})
        if len(text) > self.max_document_chars:
            cut = text[:self.max_document_chars]
            return item.model_copy(update={"text": cut, "note": f"cut: its first {len(cut)} of {len(text)} characters"})
        return item.model_copy(update={"text": text})

    async def _voice(self, item: Attachment, download: Downloader | None, deadline: float) -> Attachment:
        if self.transcribe_url is None:
            return item.model_copy(update={"note": "you cannot hear it: no transcription is configured"})
        data = await self._fetch(download, item.file_id, item.size, self.max_file_bytes)
        try:
            async with asyncio.timeout_at(deadline):  # what the downloads left of the message's time
                return item.model_copy(update={"text": await self.transcribe(data, item)})
        except TimeoutError:
            log.warning("transcribing a %s was not done within the message's %gs", item.kind, self.timeout)
            return item.model_copy(update={"note": "not read: not transcribed in time"})
        except Exception as exc:  # the model says it could not listen, the turn goes on
            log.warning("transcribing a %s failed: %s: %s", item.kind, type(exc).__name__, exc)
            return item.model_copy(update={"note": "not transcribed: the transcription failed"})

    async def transcribe(self, data: bytes, item: Attachment) -> str:
        """The words of an audio file, from the OpenAI-compatible ``transcribe_url``; no time
        limit of its own (``read`` gives it what is left of the message's)."""
        assert self.transcribe_url is not None
        form = aiohttp.FormData()
        mime = item.mime_type or "audio/ogg"
        name = item.name or ("voice.ogg" if mime == "audio/ogg" else "audio")
        form.add_field("file", data, filename=name, content_type=mime)
        form.add_field("model", self.transcribe_model)
        headers = {"Authorization": f"Bearer {self.transcribe_key}"} if self.transcribe_key else {}
        async with aiohttp.ClientSession() as session, \
                session.post(self.transcribe_url, data=form, headers=headers) as response:
            if response.status != 200:
                raise RuntimeError(f"transcription failed: HTTP {response.status}")
            body = await response.json(content_type=None)
        text = body.get("text") if isinstance(body, dict) else None
        if not isinstance(text, str):
            raise RuntimeError("transcription answered without text")
        return text.strip()


def _named(item: Attachment) -> str:
    """How a notice names an item: its file name, or what it is."""
    if item.name and item.kind in ("document", "audio"):
        return f'"{item.name}"'
    return {"voice": "this voice note", "photo": "this photo", "audio": "this audio file"}.get(item.kind, "this file")


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port
