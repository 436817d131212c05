"""Warnings given once per process: a damaged cache file read a thousand times is one warning, and a
warning a worker process relays is not repeated by the driver that gave it already."""

from __future__ import annotations

import logging
from collections.abc import Hashable

log = logging.getLogger(__name__)

#: Keys of the warnings this process has given (see `warn_once`).
_warned: set[Hashable] = set()
#: Texts of the warnings this process has given or relayed from its workers (see `new_warning`).
_warning_texts: set[str] = set()


def new_warning(text: str) -> bool:
    """True the first time a warning with this text is given in this process, which logs its
    workers' warnings too: a cache file that the driver and its workers cannot write is one warning."""
    if text in _warning_texts:
        return False
    _warning_texts.add(text)
    return True


def warn_once(key: Hashable, message: str, *arguments: object) -> None:
    """Log a warning the first time this process gives one under `key` (one per damaged file,
    not one per lookup) and with its text (see `new_warning`)."""
    if key not in _warned:
        _warned.add(key)
        if new_warning(message % arguments if arguments else message):
            log.warning(message, *arguments)
