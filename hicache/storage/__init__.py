"""hicache.storage: the former name of ``hicache.backends``, kept so existing imports work.

``from hicache.storage import StorageConfig`` and ``import hicache.storage.file`` give the very
objects of ``hicache.backends``: a submodule ``hicache.storage.X`` *is* ``hicache.backends.X``
(one module, one set of classes), imported on first use, so the optional ``mooncake`` backend
is still imported only when asked for. New code imports ``hicache.backends``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from importlib.abc import Loader
from importlib.machinery import ModuleSpec
from types import ModuleType

from hicache.backends import *  # noqa: F403
from hicache.backends import __all__ as __all__


class BackendsAlias(Loader):
    """Finds ``hicache.storage.X`` and loads it as the module ``hicache.backends.X``."""

    prefix = __name__ + "."

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        return ModuleSpec(name, self) if name.startswith(self.prefix) else None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        return importlib.import_module("hicache.backends." + spec.name[len(self.prefix) :])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: ``create_module`` returned the imported backend module."""


if not any(isinstance(f, BackendsAlias) for f in sys.meta_path):
    sys.meta_path.append(BackendsAlias())
