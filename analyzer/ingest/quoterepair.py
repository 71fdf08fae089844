"""Unescaped double quotes inside JSON string values, as exporters before kineto #1459 wrote them.

Kineto's ``ChromeTraceLogger`` wrote each event ``name`` without escaping ``"`` (pytorch#146900,
fixed by pytorch/kineto#1459, 2026-07): a Python frame named after dynamo's generated code or a
line with a string literal gives ``"name": "{"device": "cpu", "dtype": "float32"}(12): run"``,
and the whole file is not JSON. ``repair_quotes`` finds the quotes that cannot end a string and
escapes them, in memory; the caller re-validates the result with the strict decoder.

Rule (from the JSON grammar, RFC 8259): an unescaped ``"`` inside a string either ends it or is
part of it. It ends it only when what follows can follow the string where it stands:
- a key (opened after ``{``): ``:`` then a value;
- an object member's value (opened after ``:``): ``}``, or ``,`` then a key (a string followed
  by ``:``);
- an array element (opened after ``[``; after ``,`` an element or a key): ``]``, or ``,`` then a
  value (a string one followed by ``,`` or ``]``);
and, for a value (the strings exporters break), the rest of its enclosing object does not
break where an unescaped quote would explain it: at text that is not JSON or at a misplaced
``"`` (``_quote_explains``): ``"cpu", "dtype": "float32"}(12)`` passes the first test at
``cpu"`` and fails the second at ``(``. Every other quote is inside the string.
Only ``name`` values are repaired: the one field the exporters wrote unescaped (Kineto's
``ChromeTraceLogger``, kineto#1459; Python's ``EventList.export_chrome_trace``, pytorch#189982);
a quote inside any other string, or a repair that would swallow an object boundary ``}, {``
(a missing comma or brace reads so), is no repair: the file is refused as before.

Cost: linear. The quotes of a window of the file (``WINDOW_BYTES``) are classified at once
with numpy (the characters before and after each one); a string whose quotes all pass the
first test is skipped without Python work, which is every string of a valid region. Only the
strings around a failure go through the per-quote loop and ``_quote_explains`` (bounded by
``CONTINUE_TOKENS``). Memory: about 50 bytes per quote of one window, plus the repaired copy.

Limit: the reading is a choice where the text allows two (``"a" "b"}`` is a missing comma or
one value with two quotes inside); a repair that gives invalid JSON is refused by the strict
decoder as before.
"""

from __future__ import annotations

import re

import numpy as np

WINDOW_BYTES = 16 << 20
"""Bytes of JSON classified at once (doubled while one string does not fit)."""
CONTINUE_TOKENS = 4096
"""Most tokens ``_quote_explains`` reads after a candidate closing quote; past them the quote
is taken as closing (nothing contradicted it)."""

_QUOTE, _BACKSLASH = 0x22, 0x5C
_WS = np.zeros(257, bool)
_WS[[0x20, 0x09, 0x0A, 0x0D]] = True
_EOF = 256  # class of "no character" (before the start, after the end)
_KEY, _VALUE, _ELEM, _KEY_OR_ELEM, _BAD = 0, 1, 2, 3, 4
_OPENER_KIND = np.full(257, _BAD, np.int8)
_OPENER_KIND[[ord("{"), ord(":"), ord("["), ord(",")]] = [_KEY, _VALUE, _ELEM, _KEY_OR_ELEM]
_VALUE_START = np.zeros(257, bool)
_VALUE_START[list(b'"{[-0123456789tfnNI')] = True
_AFTER_CLOSE = np.zeros(257, bool)  # what may follow a closed container
_AFTER_CLOSE[[ord(","), ord("}"), ord("]"), _EOF]] = True


def repair_quotes(data: bytes) -> tuple[bytes, int] | None:
    """``data`` (JSON text that the strict decoder refused) with every unescaped ``"`` that
    cannot end its string escaped as ``\\"`` (module docstring), and the number of strings
    repaired; None when no quote needs it (the JSON is broken otherwise) or when the quotes
    cannot be read by the rule (a string that never ends, a quote inside a string that is not
    an event name, a repair across an object boundary).
    Linear in ``len(data)``; never raises for any bytes."""
    full = np.frombuffer(data, np.uint8)
    n = len(data)
    inside: list[int] = []
    n_strings = 0
    lo, width = 0, WINDOW_BYTES
    while lo < n:
        hi = min(n, lo + width)
        got = _window(data, full, lo, hi, final=hi == n)
        if got is None:
            return None
        quotes, repaired, next_lo = got
        if next_lo is None:  # a string runs past the window: read a wider one
            width *= 2
            continue
        inside += quotes
        n_strings += repaired
        lo, width = next_lo, WINDOW_BYTES
    if not inside:
        return None
    cuts = [0, *inside, n]
    return b"\\".join(data[a:b] for a, b in zip(cuts, cuts[1:])), n_strings


def _window(data: bytes, full: np.ndarray, lo: int, hi: int, *, final: bool
            ) -> tuple[list[int], int, int | None] | None:
    """(the positions of the quotes inside strings among the quotes of ``data[lo:hi]``, the
    strings repaired, where the next window starts: ``len(data)`` when done, None when this
    one must be wider). ``lo`` is 0 or an opening quote. None: not readable by the rule."""
    q = np.flatnonzero(full[lo:hi] == _QUOTE) + lo
    q = q[~_escaped(full, q)]
    nq = len(q)
    usable = nq if final else nq - 4  # the tests of quote k read the quotes up to k + 2
    if not final and usable < 2:
        return [], 0, None
    c1, after = _next_char(data, full, q + 1)
    c2, _ = _next_char(data, full, after + 1)
    kind = _OPENER_KIND[_prev_char(data, full, q - 1)]
    closes = _closes_table(c1, c2, np.append(c1[2:], [_EOF, _EOF])[:nq])
    # pair (k, k + 1) is a string the first test accepts: no Python work for it
    good = np.zeros(nq, bool)
    good[:-1] = (kind[:-1] != _BAD) & closes[np.minimum(kind[:-1], 3), np.arange(1, nq)]
    bad_at = (np.flatnonzero(~good[0::2]) * 2, np.flatnonzero(~good[1::2]) * 2 + 1)
    inside: list[int] = []
    repaired = k = run_start = 0
    while True:
        bad = bad_at[k % 2]
        j = int(np.searchsorted(bad, k))
        v = int(bad[j]) if j < len(bad) else nq
        if v >= usable:
            break
        # the string before may have passed the first test with a quote inside it
        k = v - 2 if v - 2 >= run_start else v
        got = _one_string(data, q, kind, closes, c1, k, usable)
        if got is None:
            return None
        m, quotes = got
        if m < 0:  # the string runs past the window
            return None if final else ([], 0, None)
        inside += quotes
        repaired += bool(quotes)
        k = run_start = m + 1
    if final:
        return (inside, repaired, len(data)) if v >= nq else None
    k += 2 * ((usable - k) // 2)  # an opening quote whose tests read only this window
    return (inside, repaired, int(q[k])) if q[k] > lo else ([], 0, None)


def _one_string(data: bytes, q: np.ndarray, kind: np.ndarray, closes: np.ndarray,
                c1: np.ndarray, k: int, usable: int) -> tuple[int, list[int]] | None:
    """The string opened by quote ``k``, quote by quote: (the index of its closing quote, the
    positions of the quotes inside it); -1 for the index when it runs past quote ``usable``.
    None when quote ``k`` cannot open a string, or a string that is not a ``name`` would need
    a repair, or the repaired string would hold the end of one object and the start of the
    next (``_BOUNDARY``: a missing comma or brace reads so, never a name)."""
    t = int(kind[k])
    if t == _BAD:
        return None
    row = min(t, 3)
    inside: list[int] = []
    for m in range(k + 1, usable):
        if closes[row, m] and (t != _VALUE
                               or not _quote_explains(data, int(q[m]) + 1, t, int(c1[m]))):
            if inside and _BOUNDARY.search(data, int(q[k]), int(q[m])) is not None:
                return None
            return m, inside
        if not inside and (t != _VALUE or _NAME_KEY.search(data, max(0, int(q[k]) - 64),
                                                           int(q[k])) is None):
            return None  # only event names are repaired
        inside.append(int(q[m]))
    return -1, inside


_NAME_KEY = re.compile(rb'"name"[ \t\n\r]*:[ \t\n\r]*\Z')
_BOUNDARY = re.compile(rb"\}[ \t\n\r]*,[ \t\n\r]*\{")


def _closes_table(c1: np.ndarray, c2: np.ndarray, c1_next2: np.ndarray) -> np.ndarray:
    """bool[4, nq]: row = a string's kind (key, value, element, key or element), column =
    quote k; True where quote k may close such a string by the first test (module docstring).
    ``c1`` / ``c2``: the first and second non-blank characters after each quote;
    ``c1_next2``: the first after quote k + 2 (which ends the string a ``, "`` after k
    opens)."""
    colon, comma = c1 == ord(":"), c1 == ord(",")
    key = colon & _VALUE_START[c2]
    value = (c1 == ord("}")) & _AFTER_CLOSE[c2] | comma & (c2 == _QUOTE) & (c1_next2 == ord(":"))
    next_elem = (c2 != _QUOTE) | (c1_next2 == ord(",")) | (c1_next2 == ord("]"))
    elem = (c1 == ord("]")) & _AFTER_CLOSE[c2] | comma & _VALUE_START[c2] & next_elem
    return np.stack([key, value, elem, key | elem])


_TOKEN = re.compile(rb'[ \t\n\r]*(?:(")|([{}\[\]:,])|(-?[0-9][0-9.eE+-]*|true|false|null|NaN'
                    rb'|-?Infinity))')
_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_TAIL = re.compile(rb'[ \t\n\r]*([,}\]]|\Z)?')


def _quote_explains(data: bytes, pos: int, t: int, c1: int) -> bool:
    """True when the JSON after a candidate closing quote (``pos``: just after it; ``t``: the
    kind of its string; ``c1``: the character after it) breaks where an unescaped quote
    explains it: at text no JSON token starts with, or at a ``"`` where none can stand,
    before the end of the object or array holding the string, or just after that end. A
    misplaced ``{ } [ ] : ,`` or number is no quote's doing (a missing brace or comma): False,
    as when the JSON parses (strings taken as written) or ``CONTINUE_TOKENS`` pass."""
    in_object = t in (_KEY, _VALUE) or t == _KEY_OR_ELEM and c1 == ord(":")
    stack = [b"}" if in_object else b"]"]
    expect = "colon" if t == _KEY or in_object and t != _VALUE else "sep"
    for _ in range(CONTINUE_TOKENS):
        m = _TOKEN.match(data, pos)
        if m is None:
            return True  # not JSON text
        pos = m.end()
        tok = m.group(2) or (b'"' if m.group(1) else b"0")
        if tok in (b"}", b"]") and expect in ("sep", "first"):
            if tok != stack.pop():
                return False
            if not stack:
                if _TAIL.match(data, pos).group(1) is not None:
                    return False
                after = _TOKEN.match(data, pos)
                return after is None or after.group(1) is not None
            expect = "sep"
        elif expect in ("sep", "colon"):
            if tok != (b"," if expect == "sep" else b":"):
                return tok == b'"'
            expect = "value" if expect == "colon" or stack[-1] == b"]" else "key"
        elif tok == b'"':  # a key, a value or an element
            s = _STRING_REST.match(data, pos)
            if s is None:
                return True
            pos = s.end()
            is_key = expect == "key" or expect == "first" and stack[-1] == b"}"
            expect = "colon" if is_key else "sep"
        elif expect == "key":
            return False
        elif tok in (b"{", b"["):
            stack.append(b"}" if tok == b"{" else b"]")
            expect = "first"
        elif tok == b"0":
            expect = "sep"
        else:
            return False
    return False


def _escaped(full: np.ndarray, q: np.ndarray) -> np.ndarray:
    """True where the quote at position ``q`` follows an odd run of backslashes."""
    run = np.zeros(len(q), np.int64)
    idx = np.flatnonzero(_at(full, q - 1) == _BACKSLASH)
    for _ in range(16):  # runs are short: "\\" before "\"" at most, in real traces
        if not len(idx):
            return run % 2 == 1
        run[idx] += 1
        idx = idx[_at(full, q[idx] - 1 - run[idx]) == _BACKSLASH]
    for i in idx.tolist():
        p = int(q[i]) - 1 - int(run[i])
        while p >= 0 and full[p] == _BACKSLASH:
            run[i], p = run[i] + 1, p - 1
    return run % 2 == 1


def _at(full: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The byte at each position (int16), ``_EOF`` outside the data."""
    n = len(full)
    if not len(pos):
        return np.zeros(0, np.int16)
    if n and pos.min() >= 0 and pos.max() < n:
        return full[pos].astype(np.int16)
    out = full[np.clip(pos, 0, n - 1)].astype(np.int16) if n else np.zeros(len(pos), np.int16)
    out[(pos < 0) | (pos >= n)] = _EOF
    return out


def _skip_blanks(data: bytes, full: np.ndarray, pos: np.ndarray, step: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(the first non-blank byte from each position on, going by ``step`` (+1 or -1), or
    ``_EOF`` past either end; its position). Blank runs in traces are short: a few numpy
    passes over the positions still on a blank take a byte each; longer runs are read in
    blocks that double (``_gallop``), and the few runs longer than ``_GALLOP_MAX_BYTES`` in C
    (``_nonblank``). Each run costs about its own length at numpy or C speed (a byte-by-byte
    Python loop made long blank runs ~5x slower)."""
    pos = pos.copy()
    cls = _at(full, pos)
    idx = np.flatnonzero(_WS[cls])
    for _ in range(16):
        if not len(idx):
            return cls, pos
        pos[idx] += step
        cls[idx] = _at(full, pos[idx])
        idx = idx[_WS[cls[idx]]]
    idx = _gallop(full, pos, cls, idx, step)
    for i in idx.tolist():
        pos[i] = _nonblank(full, int(pos[i]), step)
    cls[idx] = _at(full, pos[idx])
    return cls, pos


_GALLOP_MAX_BYTES = 4096
"""The widest block ``_gallop`` reads for one run; a run still blank past it is crossed in C
(such runs are at most one per 4 KiB, so their Python cost is nothing)."""
_GALLOP_CELLS = 1 << 20
"""Bytes ``_gallop`` looks at in one numpy pass (its memory: ~10 bytes each)."""


def _gallop(full: np.ndarray, pos: np.ndarray, cls: np.ndarray, idx: np.ndarray, step: int
            ) -> np.ndarray:
    """Move each position ``pos[idx]`` (on a blank) to the first non-blank byte or end of the
    data within the next blocks of 16, 32, ... ``_GALLOP_MAX_BYTES`` bytes going by ``step``,
    setting ``cls`` there; returns the indices still on a blank. A run of length L costs
    < 2 L bytes looked at."""
    width = 16
    while len(idx) and width <= _GALLOP_MAX_BYTES:
        left = []
        offsets = step * np.arange(1, width + 1)
        for b in range(0, len(idx), max(1, _GALLOP_CELLS // width)):
            part = idx[b:b + max(1, _GALLOP_CELLS // width)]
            cand = pos[part, None] + offsets
            c = _at(full, cand.ravel()).reshape(cand.shape)
            stop = ~_WS[c]  # a non-blank byte, or _EOF past either end
            hit = stop.any(1)
            first = stop.argmax(1)
            rows = np.flatnonzero(hit)
            pos[part[rows]] = cand[rows, first[rows]]
            cls[part[rows]] = c[rows, first[rows]]
            pos[part[~hit]] = cand[~hit, -1]
            left.append(part[~hit])
        idx = np.concatenate(left)
        width *= 2
    return idx


def _nonblank(full: np.ndarray, p: int, step: int) -> int:
    """The position of the first non-blank byte from ``p`` on going by ``step`` (+1 or -1);
    ``len(full)`` or -1 when none. Read in pieces that double from 4 KiB, with numpy
    comparisons (~0.1 ns a byte of spaces; ``bytes.lstrip`` ~2, a regex search ~4): a run
    costs about its own length."""
    size = 4096
    while 0 <= p < len(full):
        piece = full[p:p + size] if step > 0 else full[max(0, p + 1 - size):p + 1][::-1]
        stop = piece != 0x20  # blank runs are mostly spaces: one comparison decides
        k = int(stop.argmax())
        if stop[k] and not _WS[piece[k]]:
            return p + step * k
        if stop[k]:  # a tab or a line end: the other blanks too
            stop = stop & (piece != 0x0A) & (piece != 0x09) & (piece != 0x0D)
            k = int(stop.argmax())
            if stop[k]:
                return p + step * k
        p += step * len(piece)
        size *= 2
    return p


def _next_char(data: bytes, full: np.ndarray, pos: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """(the first non-blank byte at or after each position, or ``_EOF``; its position)."""
    return _skip_blanks(data, full, pos, 1)


def _prev_char(data: bytes, full: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The first non-blank byte at or before each position (``_EOF`` before the start)."""
    return _skip_blanks(data, full, pos, -1)[0]
