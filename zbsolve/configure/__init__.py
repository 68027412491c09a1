"""A whole training configuration, above the plan: ``predict`` one configuration's step time and memory, the
``space`` of configurations, their ``bounds``, the ``search`` over them and its ``result``, and ``choose`` (the
``configure`` entry point)."""
