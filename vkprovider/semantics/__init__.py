"""Kubernetes semantics that the provider and the companion must read the same way.

Why it exists: the virtual kubelet (what a pod asks a cloud for, what a policy's budget counts)
and the companion (would a pod fit inside, does it already tolerate the virtual node) both
interpret Kubernetes objects. When each kept its own copy of a rule, the copies drifted (a GPU
limit of ``"1000m"`` counted 1 in translation and 0 against a budget). Every such rule lives here
once, written to match what the API server and the scheduler do:

* :mod:`~vkprovider.semantics.quantity`: ``resource.Quantity`` values;
* :mod:`~vkprovider.semantics.selectors`: label selectors and node selector terms;
* :mod:`~vkprovider.semantics.taints`: whether a toleration tolerates a taint;
* :mod:`~vkprovider.semantics.gpus`: how many GPUs a container or pod asks for;
* :mod:`~vkprovider.semantics.timefmt`: RFC 3339 times as the API server writes them.

The package is pure: no I/O, no clock, no API client, and it imports nothing else of vkprovider
(an import-linter contract in ``pyproject.toml`` keeps it that way), so any layer may use it.
"""
