"""Text that came from users (names, paths, options, database rows, driver messages), made safe to print or to
write into a script. What counts as a control character is written here once: the CLI strips such characters
before printing, and input that lands in a script or in the database (sweep names, Slurm options) is refused
when it holds one. And what is said once per process (``say_once``, ``first_time``), said one way everywhere."""

from __future__ import annotations

import os
import re
import sys
import unicodedata
from collections.abc import Hashable
from urllib.parse import unquote, urlsplit

# Cc: C0/C1 controls (ESC, BEL, newline, CSI); Cf: format characters (bidi overrides and isolates such as U+202E,
# zero-width marks); Zl/Zp: the line and paragraph separators. Each can restyle, retitle, clear or reorder a
# terminal line, or start a new line in a file.
CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})

# A URL's password (scheme://user:PASSWORD@host), up to the last '@' of the URL; and a libpq-style
# password=VALUE (connection strings, query parameters), quoted or not, up to the ": " that may end the URL.
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s'\"]*):[^\s'\"]*@")
_PASSWORD_PARAM = re.compile(r"(?P<head>\bpassword\s*=\s*)(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""
                             r"|[^\s&;,'\"]+?(?=:\s|:$|[\s&;,'\"]|$))", re.IGNORECASE)
HIDDEN = "***"


def is_control(ch: str) -> bool:
    return unicodedata.category(ch) in CONTROL_CATEGORIES


def first_control(text: str) -> str | None:
    """The first control character of ``text`` (None when it has none)."""
    if text.isprintable():   # fast path: printable text holds none (isprintable is False for Cc, Cf, Zl, Zp)
        return None
    return next((ch for ch in text if is_control(ch)), None)


def printable(text: str) -> str:
    """``text`` without control characters: a tab or line break becomes a space (words stay apart, the text stays
    on one line), any other control character is dropped. Lone surrogates (undecodable bytes of a file name) become
    U+FFFD, which every terminal encoding can take."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        category = unicodedata.category(ch)
        if category in CONTROL_CATEGORIES:
            out.append(" " if ch.isspace() else "")
        else:
            out.append("\ufffd" if category == "Cs" else ch)
    return "".join(out)


def redact(text: str, url: str | None = None) -> str:
    """``text`` with passwords replaced by ***: the password of ``url`` wherever it appears (drivers quote the
    connection string they were given), a URL's user:password@ part, and password=VALUE."""
    if url:
        try:
            password = urlsplit(url).password
        except ValueError:
            password = None
        if password:
            for form in {password, unquote(password)}:
                text = text.replace(form, HIDDEN)
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}:{HIDDEN}@", text)
    return _PASSWORD_PARAM.sub(lambda m: f"{m['head']}{HIDDEN}", text)


def shown(text: str, limit: int = 24) -> str:
    """``text`` quoted for a one-line message, cut to ``limit`` characters."""
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")


# A single name in a path longer than this cannot be made on any file system flctl runs on (ext4, xfs, btrfs, tmpfs,
# NFS: 255 bytes); said before anything is written instead of as ENAMETOOLONG from deep inside a write.
NAME_MAX = 255


def path_problem(what: str, value: str) -> str | None:
    """Why no file system takes the path ``value`` (``what``: the option or argument that gave it): a name in it
    longer than NAME_MAX bytes, or the whole longer than PATH_MAX; None where it can be a path."""
    encoded = os.fsencode(value)
    longest = max((len(part) for part in encoded.split(b"/")), default=0)
    if longest > NAME_MAX:
        return f"{what}: a name in {value[:40]!r}... is {longest} bytes long; a file system takes at most {NAME_MAX}"
    if len(encoded) >= 4096:
        return f"{what}: the path is {len(encoded):,} bytes long; a file system takes at most 4,095"
    return None


# What this process has met once (first_time), by key. Process-wide on purpose: a warning about a damaged row or
# file, or a plugin's clash, is about what the process reads, and a command (or a loop that reads again as it waits)
# that meets it twice says it once.
_MET: set[Hashable] = set()


def first_time(key: Hashable) -> bool:
    """True the first time this process asks of ``key``, False ever after (a tuple whose first item names the
    caller's kind of thing, e.g. ``("clash", group, name)``, keeps callers' keys apart)."""
    if key in _MET:
        return False
    _MET.add(key)
    return True


def say_once(line: str) -> None:
    """``line`` on stderr, once per process: the same line again says nothing."""
    if first_time(("said", line)):
        print(line, file=sys.stderr, flush=True)


def said(line: str) -> bool:
    """Whether ``say_once`` has said ``line`` in this process."""
    return ("said", line) in _MET
