"""What a user gives: model descriptions cut into partitions, costs per device, problem files, and the one typed
request."""
