"""capsjax: capsule networks with dynamic routing in JAX/Flax."""

__version__ = "0.2.0.dev0"
