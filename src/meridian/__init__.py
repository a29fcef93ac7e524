"""Meridian: Linux kernel observability with eBPF programs and a Python agent."""

__version__ = "0.1.0"
__all__ = ["__version__"]
