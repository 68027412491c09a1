"""Time and memory of a model on hardware: the model description (``model``), GPU presets (``gpus``), the closed-form
estimate from a Hugging Face config (``estimate``, docs/cost-model.md), the kernels it is timed by, the count on the
meta device, and how a step ends (``step_tail``)."""
