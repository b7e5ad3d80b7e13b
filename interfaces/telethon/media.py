"""What a message to the userbot carries besides text, and how its files are fetched.

``attachments_of`` reads a Telethon ``Message``'s photo, voice note, audio, document,
sticker, place, contact or poll into ``Attachment``s. MTProto has no file ids a journal
could keep, so a file is named by its message: ``"<chat>:<message>"``, and a photo's size
by its type too (``"<chat>:<message>:x"``). ``UserbotFiles.download`` is the platform's
downloader for the LLM hop: the message again, then its media, through the adapter
boundary (``UserbotClient.download_media``).
"""

from __future__ import annotations

from typing import Any

from telethon.tl import types

from autoresponse.actors.llm.media import TooLarge
from autoresponse.messages import Attachment, Variant

#: Message contents the runtime cannot read, with the words its notice uses.
UNREADABLE = (("video_note", "video message"), ("gif", "GIF"), ("video", "video"), ("dice", "dice roll"),
              ("game", "game"))


def _place(geo: Any) -> str:
    if not isinstance(geo, types.GeoPoint):  # GeoPointEmpty: a venue with no point
        return "no coordinates"
    return f"{geo.lat:.5f}, {geo.long:.5f}"


def _text(value: Any) -> str:
    """A poll's question or answer: a ``TextWithEntities`` in newer layers, text in older."""
    return str(getattr(value, "text", value))


def _photo_sizes(photo: types.Photo) -> list[tuple[str, int, int, int]]:
    """A photo's downloadable sizes as (type, width, height, bytes), smallest first."""
    found = []
    for size in photo.sizes:
        if isinstance(size, types.PhotoSize):
            found.append((size.type, size.w, size.h, size.size))
        elif isinstance(size, types.PhotoSizeProgressive) and size.sizes:
            found.append((size.type, size.w, size.h, max(size.sizes)))
    return sorted(found, key=lambda s: (s[3], s[1] * s[2]))


def attachments_of(message: Any, chat_id: int) -> tuple[Attachment, ...]:
    """The items a Telethon ``Message`` carries besides its text; () when none (a text)."""
    ref = f"{chat_id}:{message.id}"
    file = message.file
    if isinstance(message.photo, types.Photo):
        sizes = _photo_sizes(message.photo)
        variants = tuple(Variant(file_id=f"{ref}:{kind}", size=size, width=w, height=h) for kind, w, h, size in sizes)
        largest = variants[-1] if variants else None
        return (Attachment(kind="photo", file_id=largest.file_id if largest else ref,
                           size=largest.size if largest else None, width=largest.width if largest else None,
                           height=largest.height if largest else None, variants=variants),)
    if message.voice is not None:
        return (Attachment(kind="voice", file_id=ref, size=file.size, duration=_seconds(file.duration),
                           mime_type=file.mime_type),)
    if message.audio is not None:
        summary = " - ".join(filter(None, (file.performer, file.title))) or None
        return (Attachment(kind="audio", file_id=ref, size=file.size, name=file.name, mime_type=file.mime_type,
                           duration=_seconds(file.duration), summary=summary),)
    if message.sticker is not None:
        return (Attachment(kind="sticker", summary=file.emoji or "(no emoji)"),)
    for attribute, name in UNREADABLE:  # before the document: a video or a GIF is a document too
        if getattr(message, attribute, None) is not None:
            return (Attachment(kind="video" if attribute == "video" else "other", name=name,
                               size=file.size if file else None),)
    if message.document is not None:
        return (Attachment(kind="document", file_id=ref, name=file.name, mime_type=file.mime_type, size=file.size),)
    venue = message.venue
    if venue is not None:
        return (Attachment(kind="location", summary=f'"{venue.title}", {venue.address} ({_place(venue.geo)})'),)
    if isinstance(message.geo, types.GeoPoint):
        return (Attachment(kind="location", summary=_place(message.geo)),)
    contact = message.contact
    if contact is not None:
        name = " ".join(filter(None, (contact.first_name, contact.last_name)))
        return (Attachment(kind="contact", summary=f"{name}, {contact.phone_number}"),)
    poll = message.poll
    if poll is not None:
        options = "; ".join(_text(a.text) for a in poll.poll.answers)
        return (Attachment(kind="poll", summary=f'"{_text(poll.poll.question)}" (options: {options})'),)
    return ()


def _seconds(duration: Any) -> int | None:
    return None if duration is None else int(duration)


class UserbotFiles:
    """The LLM hop's way to a userbot message's media, through the adapter boundary."""

    def __init__(self, userbot: Any) -> None:
        self.userbot = userbot

    async def download(self, file_id: str, max_bytes: int) -> bytes:
        chat, message, *thumb = file_id.split(":")
        data = await self.userbot.download_media(int(chat), int(message), thumb=thumb[0] if thumb else None)
        if len(data) > max_bytes:  # the size was said before; this is what came
            raise TooLarge(len(data), max_bytes)
        return bytes(data)
