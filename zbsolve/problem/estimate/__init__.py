"""Costs of a model from its Hugging Face config and a GPU preset: the closed form (docs/cost-model.md) and the count on the meta device."""
