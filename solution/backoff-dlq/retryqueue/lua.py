"""Lua scripts: how the queue makes a move that touches two keys atomic.

Redis runs a script start to finish with nothing else in between, so a message can be taken out
of one key and put into another with no moment where it is in neither (lost) or both (doubled).
"""


def script(r, text):
    """`text` as a callable script. Loaded now, so every call is one EVALSHA (the SHA1, not the
    text, goes over the wire) and the first call does not fail NOSCRIPT and go round again. If
    the server restarts and forgets it, redis-py loads it again by itself."""
    r.script_load(text)
    return r.register_script(text)
