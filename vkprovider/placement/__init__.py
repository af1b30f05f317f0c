"""Which cloud runs a pod: candidate order, blocked offers, failover."""
