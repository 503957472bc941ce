"""How does a captured byte stream become `ATTEMPT_OUTPUT` lines?

Pure: bytes in, text lines out. Lines split at `\\n` (the newline is dropped); a line longer than
`MAX_PIECE` bytes is cut into pieces of at most that size; each piece is decoded as UTF-8 with
`errors="replace"`. A multi-byte character cut by a piece boundary decodes as U+FFFD, like any
other invalid byte.

| input | lines |
|---|---|
| `b"a\\nb\\n"` | `"a"`, `"b"` |
| `b"abc"` then end of stream | `"abc"` |
| 200 KiB without a newline | pieces of 64, 64, 64 and 8 KiB |
| 64 KiB, then `b"\\n"` in a later read | one line of 64 KiB (a full piece waits for the next byte) |
"""

from __future__ import annotations

MAX_PIECE = 64 * 1024


class LineSplitter:
    """Split one stream (`stream` is `"stdout"` or `"stderr"`) into lines."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self._buf = bytearray()

    def __repr__(self) -> str:
        return f"<LineSplitter {self.stream} buffered={len(self._buf)}>"

    def feed(self, data: bytes) -> list[str]:
        self._buf += data
        lines: list[str] = []
        while True:
            cut = self._buf.find(b"\n", 0, MAX_PIECE + 1)
            if cut >= 0:
                lines.append(self._take(cut, skip=1))
            elif len(self._buf) > MAX_PIECE:  # a full piece is cut once a byte after it is no newline
                lines.append(self._take(MAX_PIECE, skip=0))
            else:
                return lines

    def finish(self) -> list[str]:
        """The partial line left at end of stream, if any."""
        if not self._buf:
            return []
        return [self._take(len(self._buf), skip=0)]

    def _take(self, n: int, skip: int) -> str:
        piece = bytes(self._buf[:n])
        del self._buf[: n + skip]
        return piece.decode("utf-8", errors="replace")
