"""One lazily made value per live object, gone when the object is.

The batching engine of a loaded HF model, the submission loop of a vLLM engine and a model's
forward lock each belong to one model object and must not keep it alive. The standard
library has no weakly keyed memo (`functools.cache` holds its keys strongly), so this small
one serves all three under one lock.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class PerObject(Generic[T]):
    """A value per weakly referenced key, made by `make(key)` on first use."""

    def __init__(self, make: Callable[[Any], T]) -> None:
        self._make = make
        self._values: weakref.WeakKeyDictionary[Any, T] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, key: Any) -> T:
        """The value of `key`, made now if it has none."""
        with self._lock:
            value = self._values.get(key)
            if value is None:
                value = self._make(key)
                self._values[key] = value
            return value

    def existing(self, key: Any) -> T | None:
        """The value of `key` if one was made (reports must not make one)."""
        with self._lock:
            try:
                return self._values.get(key)
            except TypeError:  # not weakly referenceable, so never given a value
                return None

    def set(self, key: Any, value: T) -> None:
        """Give `key` this value instead of the one `make` would make."""
        with self._lock:
            self._values[key] = value
