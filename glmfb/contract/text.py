"""Text from a target as glmfb carries it.

A target's text (an exception message, a file name from ``os.listdir``, a stderr tail) may hold
bytes that are not UTF-8 (Python decodes them to lone surrogates) and terminal control
sequences (colours, window titles, hyperlinks). :func:`utf8_text` makes text valid UTF-8,
every undecodable byte written as ``\\xNN``, so every writer (JSON, HTML, JUnit, the terminal,
the history) can carry it; verdicts apply it to their text when built. :func:`visible_text`
is what a person reads (the report page, the terminal): the control sequences removed, the
text they wrap kept.
"""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")
# ESC [ ... (CSI: colours, cursor moves); ESC ] ... BEL or ESC \ (OSC: a window title, an OSC 8
# hyperlink's target; the link's text lies outside it and stays); ESC P/X/^/_ ... ESC \ (DCS and
# the other strings); any other two-byte escape; and the one-byte C1 forms of CSI and OSC.
_CONTROL_SEQUENCE = re.compile(
    "\x1b\\[[0-?]*[ -/]*[@-~]"
    "|\x1b\\][^\x07\x1b\x9c]*(?:\x07|\x1b\\\\|\x9c)?"
    "|\x1b[PX^_][^\x1b\x9c]*(?:\x1b\\\\|\x9c)?"
    "|\x1b[ -/]*[0-~]"
    "|\x9b[0-?]*[ -/]*[@-~]"
    "|\x9d[^\x07\x1b\x9c]*(?:\x07|\x1b\\\\|\x9c)?"
)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _escape_surrogate(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte os.fsdecode / surrogateescape could not decode
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def utf8_text(text: str) -> str:
    """``text`` as valid UTF-8: each byte that was not UTF-8 (a surrogate escape) as ``\\xNN``,
    any other lone surrogate as ``\\uNNNN``; everything else as it was."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub(_escape_surrogate, text)
    return text


def visible_text(text: str) -> str:
    """``text`` as a page or a terminal shows it: valid UTF-8 (:func:`utf8_text`), terminal
    control sequences removed (an ANSI colour, a window title, a hyperlink's target: the text
    they wrap stays), a carriage return as a line break, and any other control character but
    tab and newline written as ``\\xNN``."""
    text = utf8_text(text)
    if text.isprintable():
        return text
    text = _CONTROL_SEQUENCE.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)
