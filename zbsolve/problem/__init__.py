"""What a user gives: model descriptions and their partitions, costs per device, problem files, estimates from a Hugging Face config, and the one typed request."""
