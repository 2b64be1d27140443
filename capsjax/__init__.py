"""capsjax: capsule networks with dynamic routing in JAX/Flax."""

__version__ = "0.1.0"
