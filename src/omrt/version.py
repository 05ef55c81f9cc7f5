"""omrt's version, written into every .om file's ENV partition."""

__version__ = "0.1.0"
