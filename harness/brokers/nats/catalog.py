"""The nats broker's own texts, in the grading's language (locales/ beside this module)."""
from __future__ import annotations

from functools import cache
from pathlib import Path

from retrylab import i18n


@cache
def _catalog() -> i18n.Catalog:
    return i18n.catalog(Path(__file__).resolve().parent / "locales")


def text(key: str, lang: str | None = None, /, **params) -> str:
    """The message `key` in `lang` (default: the current language)."""
    return _catalog().text(key, lang, **params)
