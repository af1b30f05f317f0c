"""The traffic gateway: HAProxy in the cluster in front of cloud replicas kube-proxy cannot reach.

Why it exists: a replica published only by hostname (SaladCloud's access domain, RunPod's HTTPS
proxy) cannot be an EndpointSlice endpoint (kube-proxy ignores FQDN endpoints). The gateway is a
stock HAProxy whose listeners stand for such replica ports; the provider plans which gateway port
fronts which replica (:mod:`.plan`), programs HAProxy through its Runtime API without a reload
(:mod:`.runtime`, :mod:`.reconcile`), and writes the gateway's ``IP:port`` into the Service's
EndpointSlice instead of the unroutable hostname (:mod:`.controller`). :mod:`.haproxycfg`
renders the static part of HAProxy's configuration (the listeners, maps and the CA).
"""
