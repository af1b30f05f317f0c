"""Test harness: a real local control plane, simulated GPU nodes and pytest fixtures.

Why it exists: every component and e2e test runs against real etcd, kube-apiserver,
kube-controller-manager and kube-scheduler built from the upstream Go modules. Users can use the
same harness for their own tests (``pytest -p vkprovider.testing.plugin``).
"""
