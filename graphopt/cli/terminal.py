"""What the CLI prints, made safe for a terminal: names come from models and files, which a
hostile one fills with escape sequences (``ESC [2J`` clears the screen, ``ESC ]0;`` retitles)."""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["SafeFormatter", "SafeStream", "terminal_safe"]

# C0 controls but tab and newline, DEL, and C1 controls: a node or file name holding ESC [...
# would otherwise move the cursor, recolour or retitle the user's terminal when printed
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))
            if c not in (0x09, 0x0A)}



def terminal_safe(text: str) -> str:
    """``text`` with its control characters written as ``\\xNN`` escapes."""
    return text.translate(_CONTROL)


class SafeStream:
    """A text stream that escapes control characters in everything written to it: names come
    from models and files, which a hostile one fills with terminal escape sequences."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(terminal_safe(text))

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding...
        return getattr(self._stream, name)


class SafeFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return terminal_safe(super().format(record))
