"""JSON a person wrote, parsed once, with nothing silently dropped.

Python's ``json.loads`` (and pydantic's own parser) keep the last of two equal keys in an
object: ``{"training": {"global_batch_size": 16, "global_batch_size": 32}}`` planned with
32 and said nothing. :func:`loads` is ``json.loads`` refusing such a document with a
:class:`DuplicateKeyError` that names the key and where it is. Every reader of a document a
person writes goes through it: the CLI's plan requests, baselines, measurement files and
executor configs, and the service's request bodies.

The happy path is one ``json.loads`` whose object hook builds each object and compares its
size with the number of pairs read; only a document that has a duplicate is read a second
time, to say where.
"""

from __future__ import annotations

import json
from typing import Any

from planner.errors import StagewrightError

__all__ = ["DuplicateKeyError", "JsonTooDeepError", "loads"]

Location = tuple[str | int, ...]


class DuplicateKeyError(StagewrightError):
    """An object of the document names one key twice. ``where`` is the path of that object
    (keys and list indices, empty for the top level), ``key`` the repeated key and
    ``reason`` the message without the location."""

    def __init__(self, key: str, where: Location) -> None:
        self.key = key
        self.where = where
        self.reason = f"{key} is given twice; keep one"
        place = ".".join(str(part) for part in where)
        super().__init__(f"{place}: {self.reason}" if place else self.reason)


class JsonTooDeepError(StagewrightError):
    """The document nests objects or lists deeper than the parser can follow."""


def loads(text: str | bytes | bytearray) -> Any:
    """``json.loads(text)``, refusing an object with a repeated key (DuplicateKeyError) and a
    document nested too deep to parse (JsonTooDeepError); malformed JSON raises
    ``json.JSONDecodeError`` as ``json.loads`` does. A leading byte-order mark (Windows
    editors, Excel's "CSV UTF-8") is not content: ``json.loads`` skips it in bytes but
    refuses it in text, which is what every reader of a file hands it."""
    if isinstance(text, str):
        text = text.removeprefix("\ufeff")
    try:
        return json.loads(text, object_pairs_hook=_unique)
    except _Repeated:
        pass
    except RecursionError:
        raise JsonTooDeepError(
            "the JSON nests lists or objects too deep to read; flatten it"
        ) from None
    # Only a document with a repeated key reads twice: to find where the first one is.
    located = json.loads(text, object_pairs_hook=_Located.build)
    found = _repeat_in(located)
    assert found is not None
    where, key = found
    raise DuplicateKeyError(key, where)


class _Repeated(Exception):
    """Raised by the object hook of the first read: some object repeats a key."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    built = dict(pairs)
    if len(built) != len(pairs):
        raise _Repeated
    return built


class _Located(dict[str, Any]):
    """An object of the second read, carrying the first repeated key in it or below it:
    (path from this object, key)."""

    repeat: tuple[Location, str] | None = None

    @classmethod
    def build(cls, pairs: list[tuple[str, Any]]) -> _Located:
        built = cls()
        for key, value in pairs:
            if built.repeat is None:
                if key in built:
                    built.repeat = ((), key)
                else:
                    below = _repeat_in(value)
                    if below is not None:
                        built.repeat = ((key, *below[0]), below[1])
            built[key] = value
        return built


def _repeat_in(value: Any) -> tuple[Location, str] | None:
    if isinstance(value, _Located):
        return value.repeat
    if isinstance(value, list):
        for index, item in enumerate(value):
            below = _repeat_in(item)
            if below is not None:
                return (index, *below[0]), below[1]
    return None
