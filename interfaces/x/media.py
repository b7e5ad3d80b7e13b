"""The pictures and videos attached to a post, described by URL (nothing is downloaded).

X gives them through the ``attachments.media_keys`` expansion: each a ``Media`` with its
``type`` (photo, video, animated_gif), and a ``url`` for a photo or a
``preview_image_url`` for a video.
"""

from __future__ import annotations

from typing import Any

from autoresponse.messages import Attachment


def attachments_of(media: Any) -> tuple[Attachment, ...]:
    """A post's media as attachments: a photo is an ``image`` by URL; a video or a GIF is one
    the model cannot watch (named with its preview's URL, when X gives one)."""
    found = []
    for item in media or ():
        kind = getattr(item, "type", None)
        if kind == "photo" and getattr(item, "url", None):
            found.append(Attachment(kind="image", url=item.url, summary=getattr(item, "alt_text", None)))
        elif kind in ("video", "animated_gif"):
            found.append(Attachment(kind="video", url=getattr(item, "preview_image_url", None),
                                    duration=(getattr(item, "duration_ms", None) or 0) // 1000 or None))
    return tuple(found)
