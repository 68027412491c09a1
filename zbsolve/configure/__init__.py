"""A whole training configuration, above the plan: ``predict`` one configuration's step time and memory, the
``space`` of configurations, their ``bounds``, the ``search`` over them and its ``result``, and ``choose`` (the
``configure`` entry point). The package is also ``zbsolve.configure(...)`` itself: calling it calls
``choose.configure``."""

import inspect
import sys
import types

from zbsolve.configure import choose


class _Configure(types.ModuleType):
    """This package, callable as ``choose.configure``."""

    __call__ = staticmethod(choose.configure)


sys.modules[__name__].__class__ = _Configure
__signature__ = inspect.signature(choose.configure)
