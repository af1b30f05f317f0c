"""The check of `helm test` (templates/tests/test-connection.yaml), run by the image's Python.

Exit 0 when a provider replica answers /healthz and reports vkprovider_leader 1 for NODE, and
the companion (COMPANION_URL, when set) answers /healthz; else, after TIMEOUT_SECONDS, exit 1
saying what is missing. The Services pick a replica per request, so it asks until one leads.
"""

import os
import sys
import time
import urllib.request

node = os.environ["NODE"]
provider = os.environ["PROVIDER_URL"]
companion = os.environ.get("COMPANION_URL", "")
deadline = time.monotonic() + float(os.environ.get("TIMEOUT_SECONDS", "120"))
leading = f'vkprovider_leader{{virtual_node="{node}"}} 1.0'


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


while True:
    missing = []
    for what, url in (("provider", provider), ("companion", companion)):
        if url:
            try:
                get(f"{url}/healthz")
            except Exception as exc:
                missing.append(f"{what} /healthz: {exc}")
    try:
        if leading not in get(f"{provider}/metrics").splitlines():
            missing.append(f"no provider replica answered as the leader of {node}")
    except Exception as exc:
        missing.append(f"provider /metrics: {exc}")
    if not missing:
        sys.stdout.write(f"ok: the provider leads for {node} and both processes are healthy\n")
        sys.exit(0)
    if time.monotonic() > deadline:
        sys.stdout.write("; ".join(missing) + "\n")
        sys.exit(1)
    time.sleep(2)
