"""Reporters: each a pure function `render(Report) -> str`."""
from retrylab.reporters import exercism, text

FORMATS = {"text": text.render, "exercism": exercism.render}
