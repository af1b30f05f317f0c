"""``kubectl port-forward`` to a cloud pod: the kubelet's port-forward endpoint, over SPDY/3.1.

Why it exists: users of every virtual-kubelet provider ask for port-forward, and the kubelet API
answered 501. The package is small layers, each testable alone: :mod:`.spdy` (framing and header
compression, pure), :mod:`.session` (the kubelet's port-forward protocol on one connection),
:mod:`.dial` (a declared port of a cloud pod as a connected stream, through the address the
cloud published, or the traffic gateway's route for a hostname-only cloud) and :mod:`.route`
(the upgrade request: auth, pod checks, 101).
"""

from vkprovider.api.portforward.dial import (
    Dial,
    GatewayDial,
    GatewayRoutes,
    PortDial,
    PublishedDial,
)
from vkprovider.api.portforward.route import PortForwardRoute
from vkprovider.api.portforward.session import Limits, PortForwardSession, PortRefused

__all__ = ["Dial", "GatewayDial", "GatewayRoutes", "Limits", "PortDial", "PortForwardRoute",
           "PortForwardSession", "PortRefused", "PublishedDial"]
