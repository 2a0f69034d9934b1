"""A workflow request that carries the sudo password never shows it in its repr (logs, tracebacks)."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import pytest

import clusterctl.ops

SECRET = "hunter2-sudo"


def _secret(f: dataclasses.Field) -> bool:  # type: ignore[type-arg]
    """A field that holds the password (not a callable that asks for it: bringup's prompt)."""
    return f.name.endswith("password") and "Callable" not in str(f.type)


def _requests() -> list[type]:
    out = []
    for info in pkgutil.iter_modules(clusterctl.ops.__path__):  # every workflow module, new ones too
        mod = importlib.import_module(f"clusterctl.ops.{info.name}")
        for obj in vars(mod).values():
            if dataclasses.is_dataclass(obj) and isinstance(obj, type) and obj.__module__ == mod.__name__:
                if any(_secret(f) for f in dataclasses.fields(obj)):
                    out.append(obj)
    return out


def test_every_workflow_with_a_password_field_is_checked() -> None:
    names = {c.__name__ for c in _requests()}
    assert len(names) >= 6, names  # deploy (3), doctor, failover, stage, placement


@pytest.mark.parametrize("cls", _requests(), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_the_password_is_not_in_the_repr(cls: type) -> None:
    kw = {}
    for f in dataclasses.fields(cls):
        if _secret(f):
            kw[f.name] = SECRET
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kw[f.name] = None  # any value: only the repr is read
    obj = cls(**kw)
    assert SECRET not in repr(obj)
    assert any(getattr(obj, f.name) == SECRET for f in dataclasses.fields(cls) if _secret(f))
