"""Running zbsolve schedules on torch.distributed: models split into stages, the executor, the launcher, the profiler.

Everything under ``zbsolve.execute`` needs torch (``pip install zbsolve[torch]``).
"""
