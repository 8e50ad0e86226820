"""retry-topics' texts: `tr(key, **params)` reads this exercise's locales/ catalogs (one file per language,
and per part: <lang>.<part>.toml) in the grading's current language."""
from __future__ import annotations

from pathlib import Path

from retrylab import i18n

tr = i18n.translator(Path(__file__).resolve().parent / "locales")
