"""Reaching what pods serve: Kubernetes probe semantics and the network path to a replica.

Why it exists: a cloud replica is Ready when its server answers its readiness probe, and the
probe travels over the network to the address the cloud publishes. This package holds what that
needs and nothing of the pod controller: the probe state machine (pure), the prober that runs
probes with one shared HTTP client and bounded concurrency, and the dialing hook that lets a lab
network (the test harness's address map) stand between the prober and the addresses it dials.
"""
