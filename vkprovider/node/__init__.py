"""The virtual node: registration, lease, status, pod lifecycle and orphan GC."""
