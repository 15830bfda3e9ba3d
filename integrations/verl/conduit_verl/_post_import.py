"""Run a callback right after a given module is imported (a tiny ``sys.meta_path`` hook).

The plugin uses it to register the ``conduit`` trainer mode only in processes that import verl's
V1 trainer package, instead of importing that heavy package in every verl process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, callback: Callable[[], None]) -> None:
        self._inner, self._callback = inner, callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._callback()


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self._name, self._callback, self._busy = name, callback, False

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        sys.meta_path.remove(self)
        spec.loader = _Loader(spec.loader, self._callback)
        return spec


def when_imported(module_name: str, callback: Callable[[], None]) -> None:
    """Call ``callback`` once ``module_name`` is imported (now, if it already is)."""
    if module_name in sys.modules:
        callback()
    else:
        sys.meta_path.insert(0, _Finder(module_name, callback))
