"""What runs on a host: the instance agent, its store, the zygote."""
