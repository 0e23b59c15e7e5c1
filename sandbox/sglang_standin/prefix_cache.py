"""The stand-in's prefix cache (TEST DOUBLE), modelled on SGLang's radix cache (srt/mem_cache/radix_cache.py).

A finished request's tokens (its prompt, then its output) are kept in a token trie; a new request's
longest cached prefix needs no prefill, so only its uncached tokens cost prefill time and
`meta_info.cached_tokens` counts the rest. Page size 1 and no eviction (the stand-in's KV cache
never fills): only a flush (`/flush_cache`) empties it, as on a real server with room to spare.
That is what makes a benchmark that re-sends prompts look faster than it is, which the tests
must be able to see.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any


class PrefixCache:
    """A token trie: each node a dict from the next token to the node after it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._root: dict[str, Any] = {}
        self._tokens = 0  # nodes in the trie: the cached tokens, as `token usage` counts them

    def match(self, tokens: Sequence[str]) -> int:
        """How many leading tokens of `tokens` are cached (SGLang's match_prefix)."""
        with self._lock:
            node, matched = self._root, 0
            for token in tokens:
                child = node.get(token)
                if child is None:
                    break
                node, matched = child, matched + 1
            return matched

    def insert(self, tokens: Sequence[str]) -> None:
        """Cache a finished request's tokens (SGLang's cache_finished_req)."""
        with self._lock:
            node = self._root
            for token in tokens:
                child = node.get(token)
                if child is None:
                    child = node[token] = {}
                    self._tokens += 1
                node = child

    def size(self) -> int:
        with self._lock:
            return self._tokens

    def clear(self) -> None:
        """Empty it (SGLang's tree_cache.reset, done by a flush)."""
        with self._lock:
            self._root = {}
            self._tokens = 0
