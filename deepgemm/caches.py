"""Every in-memory cache deepgemm keeps, each registered here by the one module that owns it.

A cache is owned by the module that fills it; that module registers how to empty it, what it
holds, and which other caches its contents are derived from. Clearing a cache clears everything
derived from it as well, so a later call never replays a result computed from forgotten inputs:
forgetting the tuned tables (dispatch.reload_tables) also forgets the decisions made from them
and the replayable plans built on those decisions.

  device       device facts: compute capability, SM count, name, identity    (deepgemm.device)
  tables       tuned tables loaded per device                                 (deepgemm.tables)
  decisions    kernel/config chosen per problem                               (deepgemm.dispatch)
  kernels      compiled variants held in memory (the disk cache stays)       (deepgemm.jit)
  modules      kernels loaded on a device                                     (deepgemm.jit)
  plans        replayable repeat calls                                        (deepgemm.api)
  toolchain    the compilers and libraries found                              (deepgemm.toolchain)
  ...          and the interop caches of deepgemm.arrays and deepgemm.tma

deepgemm.clear_caches() empties all of them (what is on disk stays). This module imports nothing
from deepgemm, so every module can register without an import cycle.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Cache:
    name: str
    owner: str                  # the module that fills it
    doc: str                    # what it holds
    clear: Callable[[], None]
    derived_from: tuple = ()    # names of caches whose contents this one is computed from


_caches: dict[str, Cache] = {}
_lock = threading.RLock()


def register(name: str, owner: str, doc: str, clear: Callable[[], None], derived_from=()) -> Cache:
    """Register (or re-register, e.g. on a module reload) the cache `name`."""
    cache = Cache(name, owner, doc, clear, tuple(derived_from))
    with _lock:
        _caches[name] = cache
    return cache


def _with_dependents(names) -> list[str]:
    """`names` and every cache derived from them, directly or not (a cache before its dependents)."""
    order, todo = [], list(names)
    while todo:
        name = todo.pop(0)
        if name in order:
            continue
        order.append(name)
        todo += [c.name for c in _caches.values() if name in c.derived_from]
    return order


def clear(*names: str) -> list[str]:
    """Clear these caches and every cache derived from them; returns the names cleared. A name no
    module has registered yet is fine (nothing of it is cached), and its dependents still clear."""
    with _lock:
        cleared = _with_dependents(names)
        for name in cleared:
            cache = _caches.get(name)
            if cache is not None:
                cache.clear()
        return [n for n in cleared if n in _caches]


def clear_all() -> list[str]:
    """Empty every registered cache (deepgemm.clear_caches())."""
    with _lock:
        return clear(*list(_caches))


def registered() -> list[Cache]:
    with _lock:
        return list(_caches.values())
