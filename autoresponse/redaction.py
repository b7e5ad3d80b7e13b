"""Redaction: every configured secret is replaced wherever text leaves the process.

>>> redact = Redactor(["s3cr3t-token"])
>>> redact("GET https://api.example/bots3cr3t-token/getMe")
'GET https://api.example/bot[secret]/getMe'
"""

from __future__ import annotations

from collections.abc import Iterable

#: Secrets shorter than this are not searched for: they would match ordinary text.
MIN_SECRET_CHARS = 4


class Redactor:
    """Replaces each secret (longest first) with ``[secret]``."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, "[secret]")
        return text
