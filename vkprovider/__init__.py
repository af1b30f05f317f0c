"""vkprovider: one virtual node in front of external GPU clouds."""

__version__ = "0.1.0"
