"""What a user sent besides words: a photo, a voice note, a file, a sticker, a place,
a contact, a poll. A request carries them as ``Attachment``s, by reference only (the
platform's file id, or a public URL): the journal never holds the bytes.

The LLM hop (``actors.media``) reads what the model can use, just before it asks:
``text`` (a document's text, a voice note's transcript), ``image`` (a data URL) or
``note`` (why it was not read). Those three are set only on the copy sent to the model.

>>> Attachment(kind="document", file_id="BQAC", name="notes.txt", size=2048).label()
'document "notes.txt" (2.0 KB)'
>>> Attachment(kind="location", summary="52.52, 13.40").label()
'location 52.52, 13.40'
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

#: What an attachment is. "image" is a picture given by URL (Reddit, X); "other" is
#: anything the runtime cannot read (a video, a dice), named in ``name``.
AttachmentKind = Literal["photo", "image", "voice", "audio", "document", "sticker", "location",
                         "contact", "poll", "video", "other"]


class Variant(BaseModel):
    """One size of a photo: the platform's file id, its bytes and its pixels."""

    model_config = ConfigDict(frozen=True)

    file_id: str
    size: int | None = None
    width: int | None = None
    height: int | None = None


def human_size(size: int) -> str:
    """``2048`` → ``'2.0 KB'``; ``5_000_000`` → ``'4.8 MB'``."""
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


class Attachment(BaseModel):
    """One item a message carried, by reference."""

    model_config = ConfigDict(frozen=True)

    kind: AttachmentKind
    #: How the platform's downloader finds it (a Telegram file id); None when nothing is
    #: downloaded (a location, an image given by URL).
    file_id: str | None = None
    #: A public link to it (Reddit and X images).
    url: str | None = None
    name: str | None = None
    mime_type: str | None = None
    #: Bytes, as the platform said.
    size: int | None = None
    #: Seconds (voice, audio, video).
    duration: int | None = None
    width: int | None = None
    height: int | None = None
    #: A photo's sizes, smallest first: the LLM hop picks the largest under its cap.
    variants: tuple[Variant, ...] = ()
    #: What it says in words: a sticker's emoji, a place, a contact, a poll's question and options.
    summary: str | None = None
    # -- set by the LLM hop on the copy sent to the model, never journaled --
    #: A document's text or a voice note's transcript.
    text: str | None = None
    #: The picture, as a data URL (only with vision on).
    image: str | None = None
    #: Why it was not read (too large, the download failed, no transcription configured).
    note: str | None = None

    def label(self) -> str:
        """A few words naming it: ``photo``, ``voice note (7 s)``, ``document "a.txt" (2.0 KB)``."""
        kind = {"voice": "voice note", "other": self.name or "message"}.get(self.kind, self.kind)
        if self.kind in ("sticker", "location", "contact", "poll") and self.summary:
            return f"{kind} {self.summary}"
        if self.kind == "image" and self.url:
            return f"image {self.url}" + (f' (described as "{self.summary}")' if self.summary else "")
        details = []
        if self.duration is not None:
            details.append(f"{self.duration} s")
        if self.width and self.height:
            details.append(f"{self.width}x{self.height}")
        if self.size is not None:
            details.append(human_size(self.size))
        name = f' "{self.name}"' if self.name and self.kind != "other" else ""
        return f"{kind}{name}" + (f" ({', '.join(details)})" if details else "")


def attachments_label(attachments: tuple[Attachment, ...] | list[Attachment]) -> str:
    """What a message carried, for memory and notices: ``[photo] [photo]``."""
    return " ".join(f"[{a.label()}]" for a in attachments)
