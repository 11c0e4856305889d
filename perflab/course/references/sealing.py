"""The seal that ties a launch's records to the cases the grader drew (grader-only).

A check whose graded call launches ranks carries :func:`seal` of its drawn cases into the
sandbox; a later check that reads the same launch's records gets the cases and the tag
back, and its judge asks :func:`is_sealed` whether they are the ones drawn here (Labs 06
and 10 share one launch between checks this way). The key is this grading process's own
and never leaves the grader: the sandbox has no ``perflab.course.references``.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any

__all__ = ["seal", "is_sealed"]

#: This grading process's key for :func:`seal`.
_SEAL_KEY = secrets.token_bytes(32)


def seal(value: Any) -> str:
    """An HMAC-SHA256 of ``value`` (JSON data) under this grading process's key: a
    check's case carries it into the sandbox, a later check's judge gets it back with
    the value and :func:`is_sealed` tells whether the value is the one drawn here."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hmac.new(_SEAL_KEY, text.encode(), hashlib.sha256).hexdigest()


def is_sealed(value: Any, tag: Any) -> bool:
    """Whether ``tag`` is :func:`seal` ``(value)`` (a constant-time comparison)."""
    return isinstance(tag, str) and hmac.compare_digest(seal(value), tag)
