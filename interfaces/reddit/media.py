"""The images of a Reddit inbox item, described by URL (nothing is downloaded).

An image comment carries its pictures in ``media_metadata`` (when the listing has it)
and as links in its body; a message or comment may link an image (``i.redd.it``,
``preview.redd.it``, ``i.imgur.com``, or any ``.jpg``/``.png``/``.gif``/``.webp`` link).

>>> [a.url for a in images_in("look: https://i.redd.it/abc123.png and https://example.com/x")]
['https://i.redd.it/abc123.png']
"""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import urlsplit

from autoresponse.messages import Attachment

#: Images described per item, at most.
MAX_IMAGES = 10
_LINK = re.compile(r"https?://[^\s)\]>\"']+")
_IMAGE_HOSTS = frozenset({"i.redd.it", "preview.redd.it", "i.imgur.com"})
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".webp")


def _is_image(url: str) -> bool:
    parts = urlsplit(url)
    return (parts.hostname or "") in _IMAGE_HOSTS or parts.path.lower().endswith(_IMAGE_SUFFIXES)


def images_in(body: str, media_metadata: Any = None) -> tuple[Attachment, ...]:
    """Each image ``body`` links or ``media_metadata`` holds, once, as an ``image`` by URL."""
    urls: list[str] = []
    if isinstance(media_metadata, dict):
        for entry in media_metadata.values():
            source = entry.get("s") if isinstance(entry, dict) else None
            if isinstance(source, dict) and entry.get("e") == "Image" and isinstance(source.get("u"), str):
                urls.append(html.unescape(source["u"]))
    urls += [html.unescape(u) for u in _LINK.findall(body or "") if _is_image(html.unescape(u))]
    seen: dict[str, None] = dict.fromkeys(urls)
    return tuple(Attachment(kind="image", url=url) for url in list(seen)[:MAX_IMAGES])
