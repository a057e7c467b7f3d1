"""The files a command reads (``inputs``) and writes (``outputs``: one checked set, written whole
or not at all, never over an input)."""
