"""The shared HTTP transport: the lean HTTP/1.1 pool, its streams, and httpx on plain asyncio.

Why it exists: two sides ride the same transport, the cloud adapters (``providers/http.py``)
and the Kubernetes API client (``vkprovider/kube/client.py``). It used to live among the cloud
adapters, so the API client imported "a cloud adapter module" to talk to the API server. It is
a package of its own now, below both: it imports nothing of the clouds (``providers.*``
outside this package) and nothing of ``vkprovider`` (import-linter contracts in
pyproject.toml). It stays inside the ``providers`` distribution package because ``providers``
must never import ``vkprovider``: a transport inside ``vkprovider`` could not serve the
adapters, and a new top-level package would need packaging of its own for three modules.

* :mod:`providers.transport.h1`: a keep-alive HTTP/1.1 pool for whole answers;
* :mod:`providers.transport.h1stream`: streamed answers (watches, followed logs) on connections
  of their own;
* :mod:`providers.transport.asyncnet`: an httpx transport on plain asyncio streams (proxies,
  HTTP/2 and whatever the lean pool does not do).
"""
