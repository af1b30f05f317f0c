"""Connecting at start-up: credentials found (or refused by name) and the API server awaited.

Why it exists: ``run``, ``descheduler`` and ``decommission`` must fail in one line that names
what is wrong (a missing or malformed kubeconfig, credentials the API server rejects, an API
server that never answers) before any work starts; a kubeconfig holds tokens and keys, so no
error here ever quotes its text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from vkprovider import logs
from vkprovider.errors import APIServerUnreachable, ConfigError, one_line
from vkprovider.kube.client import KubeClient

__all__ = [
    "APIServerUnreachable",
    "checked_start",
    "credentials_name",
    "default_kubeconfig_problem",
    "kube_client",
    "wait_for_api_server",
]

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 10.0  # seconds one reachability probe may take


def default_kubeconfig_problem() -> str | None:
    """Why no credentials can be found when no kubeconfig path is given (None: they can)."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None  # in-cluster
    env = os.environ.get("KUBECONFIG")
    if env:
        paths = [p for p in env.split(os.pathsep) if p]
        if paths and not any(Path(p).expanduser().is_file() for p in paths):
            return f"KUBECONFIG={env}: no such file"
        return None
    if not Path("~/.kube/config").expanduser().is_file():
        return ("no Kubernetes credentials: not running in a cluster, no --kubeconfig, "
                "no KUBECONFIG and no ~/.kube/config")
    return None


def credentials_name(*, kubeconfig: str | None, source: str) -> str:
    """How errors name the credentials in use: ``--kubeconfig PATH``, ``FILE: kubeconfig PATH``."""
    if kubeconfig is not None:
        return f"{source} {kubeconfig}"
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "in-cluster credentials"
    return "default kubeconfig"


def kube_client(*, kubeconfig: str | None, source: str, user_agent: str) -> KubeClient:
    """A :class:`~vkprovider.kube.KubeClient`; a missing or malformed kubeconfig is a
    :class:`ConfigError` naming ``source`` (e.g. ``--kubeconfig``) and the path.

    The loader's own errors are turned into one line here; a YAML error is reported by line and
    column only, never with the text around it (a kubeconfig holds tokens and keys).
    """
    import yaml

    if kubeconfig is None:
        problem = default_kubeconfig_problem()
        if problem:
            raise ConfigError(problem)
        named = credentials_name(kubeconfig=None, source=source)
    else:
        path = Path(kubeconfig).expanduser()
        named = credentials_name(kubeconfig=kubeconfig, source=source)
        if not path.exists():
            raise ConfigError(f"{named}: no such file")
        if not path.is_file():
            raise ConfigError(f"{named}: not a file")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"{named}: not readable")
    try:
        return KubeClient.from_kubeconfig(kubeconfig=kubeconfig, user_agent=user_agent)
    except ConfigError as exc:
        raise ConfigError(f"{named}: {one_line(str(exc))}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{named}: not a valid kubeconfig: not valid YAML{where}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{named}: not a valid kubeconfig: not UTF-8 text") from exc
    except ValueError as exc:  # its text may quote a value: name the kind of problem only
        raise ConfigError(f"{named}: not a valid kubeconfig ({type(exc).__name__})") from exc
    except (TypeError, KeyError, AttributeError, IndexError) as exc:  # structure: no values
        raise ConfigError(f"{named}: not a valid kubeconfig ({type(exc).__name__}: "
                          f"{one_line(str(exc))[:200]})") from exc


async def wait_for_api_server(*, client: KubeClient, timeout: float, named: str) -> None:
    """Return once the API server answers ``GET /version``; give up after ``timeout`` seconds.

    Any HTTP answer but 401, 429 and 5xx counts as reachable (RBAC problems are reported by
    whoever makes the call). 401 means the credentials are wrong: a :class:`ConfigError`. No
    answer in time: :class:`APIServerUnreachable`. Attempts are logged at debug level only, so
    a failure is one line.
    """
    from vkprovider.kube.errors import APIError, UnauthorizedError

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pause, last = 0.2, "no answer"
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise APIServerUnreachable(
                f"the API server at {client.host} did not answer within {timeout:g}s "
                f"({one_line(last)}); giving up (set --api-server-timeout or "
                f"api_server_timeout_seconds to wait longer)")
        try:
            await asyncio.wait_for(client.request("GET", "/version", retry=False),
                                   timeout=min(remaining, PROBE_TIMEOUT))
            return
        except UnauthorizedError as exc:
            raise ConfigError(f"{named}: the API server at {client.host} rejected the "
                              f"credentials (401 Unauthorized)") from exc
        except APIError as exc:
            if exc.status and exc.status != 429 and exc.status < 500:
                return  # it answered
            last = str(exc)
        except TimeoutError:
            last = "GET /version timed out"
        log.debug("API server not reachable yet", extra=logs.kv(error=one_line(last)))
        await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
        pause = min(pause * 2, 5.0)


async def checked_start(*, client: KubeClient, timeout: float, named: str,
                         start: Callable[[], Awaitable[int]]) -> int:
    try:
        await wait_for_api_server(client=client, timeout=timeout, named=named)
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()
    return await start()
