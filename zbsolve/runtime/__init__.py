"""Running zbsolve schedules on torch.distributed: a small GPT split into stages, the executor, the launcher.

Everything under ``zbsolve.runtime`` needs torch (``pip install zbsolve[torch]``).
"""
