# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""JSON the way pi reads its own files: ``//`` and ``/* */`` comments, a byte order mark, trailing commas.

One reader for the overlay's ``models.json`` (``_doctor/models_json.py``) and a job's ``mcp.json``
(``_policy/mcp.py``): :func:`loads` decodes, :func:`strip_jsonc` blanks comments and trailing commas
with every position kept, so an error names the line and column of the original text. NaN and
Infinity are refused, as JSON has none. Pure.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn, Tuple, Union


class JsoncError(ValueError):
    """The text is not JSON as pi reads it: ``where`` is a line and column, or a field path."""

    def __init__(self, message: str, where: str = '') -> None:
        super(JsoncError, self).__init__(message)
        self.where = where


def strip_jsonc(text: str) -> str:
    """JSON text with comments and trailing commas blanked (positions kept)."""
    if text.startswith('\ufeff'):
        text = ' ' + text[1:]
    out = list(text)
    i, n = 0, len(text)
    last_comma = None  # index of a comma not yet followed by a value token
    prev = ''  # the last significant character outside strings and comments
    while i < n:
        c = text[i]
        if c == '"':
            last_comma = None
            prev = '"'
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == '\\' else 1
            i += 1
            continue
        if c == '/' and i + 1 < n and text[i + 1] == '/':
            while i < n and text[i] != '\n':
                out[i] = ' '
                i += 1
            continue
        if c == '/' and i + 1 < n and text[i + 1] == '*':
            end = text.find('*/', i + 2)
            if end < 0:
                line, col = _position(text, i)
                raise JsoncError('a /* comment is never closed', 'line %d column %d' % (line, col))
            for j in range(i, end + 2):
                if out[j] != '\n':
                    out[j] = ' '
            i = end + 2
            continue
        if c == ',':
            # Only a comma after a value is a trailing comma; '{,' or ',,' stays an error.
            last_comma = i if prev not in ('', '{', '[', ',') else None
        elif c in '}]':
            if last_comma is not None:
                out[last_comma] = ' '
            last_comma = None
        elif not c.isspace():
            last_comma = None
        if not c.isspace():
            prev = c
        i += 1
    return ''.join(out)


def _position(text: str, index: int) -> Tuple[int, int]:
    line = text.count('\n', 0, index) + 1
    col = index - (text.rfind('\n', 0, index) + 1) + 1
    return line, col


def loads(text: Union[str, bytes]) -> Any:
    """Decode JSON text the way pi does; raise JsoncError naming the line and column."""
    if isinstance(text, bytes):
        try:
            text = text.decode('utf-8')
        except UnicodeDecodeError as exc:
            raise JsoncError('is not UTF-8 (%s)' % exc)
    cleaned = strip_jsonc(text)
    try:
        return json.loads(cleaned, parse_constant=_no_constant)
    except ValueError as exc:
        lineno = getattr(exc, 'lineno', None)
        colno = getattr(exc, 'colno', None)
        where = 'line %s column %s' % (lineno, colno) if lineno else ''
        raise JsoncError('is not valid JSON (%s)' % getattr(exc, 'msg', exc), where)


def _no_constant(name: str) -> NoReturn:
    raise ValueError('%s is not JSON' % name)
