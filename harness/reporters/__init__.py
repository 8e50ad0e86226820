"""Reporters: each a pure function `render(Report) -> str` (no I/O).

github.py is not a --format: its annotations go to stderr beside any format when GITHUB_ACTIONS=true.
"""
from retrylab.reporters import exercism, gradescope, junit, text

FORMATS = {"text": text.render, "exercism": exercism.render, "gradescope": gradescope.render,
           "junit": junit.render}
