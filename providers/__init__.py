"""Cloud adapters behind one Provider protocol.

Adapters import only :mod:`providers.base`; the service picks them by configuration, so a new
cloud never needs a change in :mod:`vkprovider`.
"""
