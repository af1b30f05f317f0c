"""The mock cloud's request bodies, validated by pydantic after a request is admitted.

Why it exists: the state (:mod:`providers.mock.state`) takes a parsed create request and the HTTP
app (:mod:`providers.mock.app`) parses every body; both need these models, and neither should
import the other to get them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

__all__ = [
    "ConfigBody",
    "CreateBody",
    "ExitBody",
    "FailBody",
    "FaultBody",
    "HealthBody",
    "InterruptionBody",
    "InventoryBody",
    "LoadBody",
    "OfferBody",
    "PortBody",
]


class PortBody(BaseModel):
    container_port: int = Field(ge=1, le=65535)
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    name: str | None = None


class CreateBody(BaseModel):
    """The create request; unknown fields are ignored so newer clients keep working."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=253)
    image: str = Field(min_length=1)
    gpu_count: int = Field(ge=1)
    gpu_type: str | None = None
    region: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    ports: list[PortBody] = Field(default_factory=list)
    cpu_millis: int = Field(default=0, ge=0)
    memory_bytes: int = Field(default=0, ge=0)
    max_price_per_hour: float | None = Field(default=None, ge=0)
    regions: list[str] | None = None  # without ``region``: choose only among these
    tags: dict[str, str] = Field(default_factory=dict)
    registry_auth: RegistryAuthBody | None = None
    interruptible: bool = False  # rent as spot (only offers with a spot price)


class RegistryAuthBody(BaseModel):
    """Pull credentials sent with a create (the mock checks them for its private registries)."""

    registry: str = Field(min_length=1)
    username: str
    password: SecretStr  # never echoed, never logged


class RegistryBody(BaseModel):
    """``PUT /admin/registries/{host}``: make ``host`` private with these credentials."""

    username: str = Field(min_length=1)
    password: SecretStr


class FailBody(BaseModel):
    message: str = "failed"
    exit_code: int | None = None


class ExitBody(BaseModel):
    exit_code: int = 0


class LoadBody(BaseModel):
    gpu_utilization: float | None = Field(default=None, ge=0.0, le=1.0)


class TemperatureBody(BaseModel):
    celsius: float | None = Field(default=None, ge=0.0, le=150.0)  # None: from the load again


class OfferBody(BaseModel):
    gpu_type: str = Field(min_length=1)
    region: str = Field(min_length=1)
    count: int = Field(ge=0)
    price_per_gpu_hour: float = Field(ge=0)
    spot_price_per_gpu_hour: float | None = Field(default=None, ge=0)  # also sold as spot


class InterruptionBody(BaseModel):
    """``POST /admin/instances/{id}/interruption``: reclaim it this many seconds from now."""

    in_seconds: float = Field(ge=0, le=86400, allow_inf_nan=False)


class InventoryBody(BaseModel):
    offers: list[OfferBody]


class FaultBody(BaseModel):
    endpoint: str
    status: int = Field(ge=400, le=599)
    count: int = Field(default=1, ge=1)
    retry_after: float | None = Field(default=None, ge=0)


class ConfigBody(BaseModel):
    boot_delay: float | None = Field(default=None, ge=0)
    delete_delay: float | None = Field(default=None, ge=0)
    quota_gpus: int | None = Field(default=None, ge=0)
    max_gpus_per_instance: int | None = Field(default=None, ge=1)
    load_seconds: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class HealthBody(BaseModel):
    live: bool | None = None
    ready: bool | None = None

