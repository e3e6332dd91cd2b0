"""Imported first by the SGLang engine checks that run in a subprocess: stands in for
``sgl_kernel``, SGLang's CUDA kernel package, which cannot load on a machine without a GPU
driver (``libcuda.so.1``), so that ``sglang.srt.speculative.ngram_worker`` imports on a CPU.

Every attribute of a stubbed module is a ``MagicMock``; nothing that needs a kernel is called
by the checks (they run SGLang's host-side code: registration, argument resolution, draft
preparation and ``_derive_tree_links``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any
from unittest.mock import MagicMock


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = MagicMock(name=f"sgl_kernel_stub.{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "sgl_kernel" or fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


sys.meta_path.insert(0, _Finder())
