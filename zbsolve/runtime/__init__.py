"""Running zbsolve schedules on torch.distributed: models split into stages, the executor, the launcher, the profiler.

Everything under ``zbsolve.runtime`` needs torch (``pip install zbsolve[torch]``).
"""
