"""dgr: the node runtime of a distributed GGUF runtime."""

__version__ = "0.1.0"
