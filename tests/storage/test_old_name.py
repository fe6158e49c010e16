"""``hicache.storage`` is the former name of ``hicache.backends``: the same modules and classes."""

from __future__ import annotations

import importlib

import pytest

import hicache.backends
import hicache.backends.file


def test_the_old_name_gives_the_same_modules_and_classes() -> None:
    old = importlib.import_module("hicache.storage")
    old_file = importlib.import_module("hicache.storage.file")
    assert old_file is hicache.backends.file
    assert old.StorageConfig is hicache.backends.StorageConfig
    assert set(old.__all__) == set(hicache.backends.__all__)
    assert importlib.import_module("hicache.storage.keys").StorageKeys is old.StorageKeys


def test_a_missing_submodule_is_still_missing() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("hicache.storage.no_such_backend")
