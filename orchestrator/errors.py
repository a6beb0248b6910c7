"""Errors a user can cause. The CLI prints them as one line and exits 2; nothing else catches them."""


class UserError(Exception):
    """Bad input (spec, flag, query, file): message is shown as-is, one line, exit code 2."""

    exit_code = 2


def printable(text: str, keep: str = "") -> str:
    """``text`` safe to echo on a terminal: control characters (an ESC that would start an
    escape sequence, a carriage return, a NUL, ...) and lone surrogates (bytes of a name
    that is not UTF-8) written as ``\\x1b``/``\\udcff`` escapes, except those in ``keep``
    (a table cell keeps its line breaks: ``keep="\\n\\t"``); everything else unchanged."""
    import unicodedata

    if text.isprintable():
        return text
    return "".join(
        c.encode("unicode_escape").decode("ascii")
        if c not in keep and (c in _BIDI or unicodedata.category(c) in ("Cc", "Cs"))
        else c
        for c in text
    )


# Characters that reorder what a terminal shows after them (a name could hide its real end).
_BIDI = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def utf8_problem(text: str, what: str) -> str | None:
    """Why ``text`` (``what``: "the query", "--where") is not valid UTF-8 text, or None. A
    command-line argument with bytes that are not UTF-8 reaches Python as lone surrogates
    (``\\udcff`` for the byte 0xff), which no database or encoder accepts."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        byte = f"the byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"\\u{ord(bad):04x}"
        return f"{what} is not valid UTF-8 text ({byte} at character {exc.start})"
    return None
