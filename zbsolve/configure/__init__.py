"""A whole training configuration, above the plan: ``predict`` one configuration's step time and memory, the
``space`` of configurations, their ``bounds``, the ``search`` over them and its ``result``, and ``choose`` (the
``configure`` entry point). The package is also ``zbsolve.configure(...)`` itself: calling it calls
``choose.configure``, imported on the first call (so that importing one of its modules imports no search)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zbsolve.configure.result import ConfigureResult


class _Configure(types.ModuleType):
    """This package, callable as ``choose.configure``."""

    def __call__(self, *args: Any, **kwargs: Any) -> ConfigureResult:
        from zbsolve.configure.choose import configure

        return configure(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        """``choose.configure``'s signature, as the call's."""
        from zbsolve.configure.choose import configure

        return inspect.signature(configure)


def __getattr__(name: str) -> Any:
    """A module of the package (``zbsolve.configure.choose``), imported on first use."""
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


sys.modules[__name__].__class__ = _Configure
