"""The relay's settings: flags, then `RELAY_*` environment, then an optional config file.

Every setting is validated once, at start, so a typo stops the relay with one clear line
(exit status 2) instead of surfacing hours later as a lost document or a refused approval.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal, NoReturn
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

DEFAULT_STATE_DIR = Path("/var/lib/scheduled-events-relay")
EXIT_BAD_SETTINGS = 2

_config_values: ContextVar[dict[str, Any]] = ContextVar("relay_config_values")


class SettingsError(Exception):
    """A setting that cannot work; the message is the one line the operator sees."""


class ForwardTarget(BaseModel):
    """Where envelopes go: a Service Bus queue over REST, or a local directory."""

    kind: Literal["servicebus", "file"]
    namespace: str | None = None  # NAME.servicebus.windows.net
    queue: str | None = None
    directory: Path | None = None

    @property
    def resource_uri(self) -> str:
        """The entity address Azure signs and checks SAS tokens against."""
        return f"https://{self.namespace}/{self.queue}"


def parse_forward(value: str) -> ForwardTarget:
    if value.startswith("file:"):
        directory = value[len("file:") :]
        if directory.startswith("//"):
            directory = directory[2:]
        if not directory:
            raise ValueError("file: needs a directory, e.g. file:/var/spool/relay")
        return ForwardTarget(kind="file", directory=Path(directory))
    if value.startswith("servicebus://"):
        parts = urlsplit(value)
        queue = parts.path.strip("/")
        if not parts.hostname or not queue or "/" in queue:
            raise ValueError(
                "servicebus forward must look like servicebus://NAMESPACE.servicebus.windows.net/QUEUE"
            )
        return ForwardTarget(kind="servicebus", namespace=parts.hostname, queue=queue)
    raise ValueError("must be servicebus://NAMESPACE.servicebus.windows.net/QUEUE or file:DIR")


def is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RelaySettings(BaseSettings):
    """All settings. Field names are the config-file keys; `RELAY_<NAME>` the variables."""

    model_config = SettingsConfigDict(env_prefix="RELAY_", extra="forbid", frozen=True)

    imds_url: str = "http://169.254.169.254"
    vm_name: str | None = Field(default=None, min_length=1, max_length=128)
    availability_set: str | None = None
    poll_interval: float = Field(default=1.0, gt=0, le=60)
    heartbeat_interval: float = Field(default=300.0, ge=1, le=86400)
    state_dir: Path = DEFAULT_STATE_DIR
    forward: str
    sas_connection_string_file: Path | None = None
    identity_client_id: str | None = None
    message_ttl: int = Field(default=7 * 86400, ge=60)
    callback_listen: str | None = None
    callback_key_file: Path | None = None
    callback_url: str | None = None
    callback_max_concurrent: int = Field(default=16, ge=1, le=256)
    callback_read_timeout: float = Field(default=10.0, gt=0, le=120)
    log_format: Literal["json", "text"] = "json"
    hooks: dict[str, Path] = Field(default_factory=dict)
    hook_timeout: float = Field(default=120.0, gt=0, le=3600)
    hook_wait: float = Field(default=10.0, ge=0, le=60)
    outbox_max_messages: int = Field(default=10000, ge=10)
    # Tuning knobs, documented but rarely needed.
    imds_timeout: float = Field(default=5.0, gt=0, le=120)
    imds_first_timeout: float = Field(default=120.0, gt=0, le=600)
    imds_max_backoff: float = Field(default=10.0, gt=0, le=300)
    send_timeout: float = Field(default=30.0, gt=0, le=300)
    send_max_backoff: float = Field(default=60.0, gt=0, le=3600)
    send_slow_retry: float = Field(default=300.0, gt=0, le=3600)
    # For tests against a local Service Bus stand-in: overrides https://NAMESPACE.
    servicebus_endpoint: str | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _ConfigFileSource(settings_cls)

    @field_validator("imds_url")
    @classmethod
    def _imds_http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")) or not urlsplit(value).hostname:
            raise ValueError("must be an http URL such as http://169.254.169.254")
        return value.rstrip("/")

    @field_validator("forward")
    @classmethod
    def _forward_parses(cls, value: str) -> str:
        parse_forward(value)
        return value

    @field_validator("callback_listen")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None:
            return None
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError("must be HOST:PORT, e.g. 0.0.0.0:8787")
        return value

    @field_validator("callback_url")
    @classmethod
    def _callback_http(cls, value: str | None) -> str | None:
        """Scheme, host and port only.

        Callers sign the path of the URL they call (the advertised URL + `/v1/start`), and
        the relay routes and verifies the path it receives. With a prefix, a reverse proxy
        that strips or rewrites it turns every approval into a 401 or 404, found only when
        an event needs approving. Refusing at start is the safe, simple choice: publish
        the relay (or a proxy that forwards paths unchanged) at the root of a host:port.
        """
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        parts = urlsplit(value)
        if not parts.hostname:
            raise ValueError("must name a host, e.g. http://10.0.0.4:8787")
        parts.port  # noqa: B018 - raises ValueError for a port that is not 0..65535
        if parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
            raise ValueError(
                f"must be http(s)://HOST[:PORT] with no path, query or user "
                f"(got {value!r}); callers sign and the relay serves /v1/... at the root, "
                "so a reverse proxy must forward the root unchanged"
            )
        return value.rstrip("/")

    @field_validator("hooks")
    @classmethod
    def _hooks_exist(cls, value: dict[str, Path]) -> dict[str, Path]:
        for name, path in value.items():
            if not name or not all(c.isalnum() or c in "-_." for c in name):
                raise ValueError(f"hook name {name!r} may only use letters, digits, - _ .")
            if not path.is_absolute():
                raise ValueError(f"hook {name}: {path} must be an absolute path")
            if not path.is_file() or not os.access(path, os.X_OK):
                raise ValueError(f"hook {name}: {path} is not an executable file")
        return value

    @field_validator("servicebus_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if value.startswith("http://") and not is_loopback_url(value):
            raise ValueError("plain http is allowed for loopback stand-ins only")
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _consistent(self) -> RelaySettings:
        target = self.forward_target
        if target.kind == "file" and self.sas_connection_string_file is not None:
            raise ValueError("--sas-connection-string-file only applies to servicebus forwarding")
        if self.sas_connection_string_file is not None and not os.access(
            self.sas_connection_string_file, os.R_OK
        ):
            raise ValueError(
                f"cannot read SAS connection string file {self.sas_connection_string_file}"
            )
        if self.callback_listen and self.callback_key_file is None:
            raise ValueError("--callback-listen needs --callback-key-file")
        if self.callback_key_file is not None:
            from relay.signing import read_key_file

            try:
                read_key_file(str(self.callback_key_file))
            except OSError as exc:
                raise ValueError(f"cannot read callback key file: {exc.strerror}") from None
        if self.hooks and not self.callback_listen:
            raise ValueError("--hook needs --callback-listen (hooks run on a signed callback)")
        return self

    @property
    def forward_target(self) -> ForwardTarget:
        return parse_forward(self.forward)

    @property
    def advertised_callback_url(self) -> str | None:
        """What envelopes advertise: --callback-url, else the listen address if it is concrete."""
        if self.callback_url:
            return self.callback_url
        if not self.callback_listen:
            return None
        host, _, port = self.callback_listen.rpartition(":")
        if host in ("0.0.0.0", "::", "[::]") or port == "0":
            return None
        return f"http://{host}:{port}"


class _ConfigFileSource(PydanticBaseSettingsSource):
    """Values from the --config file (JSON or TOML), lowest priority after defaults."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        values = _config_values.get({})
        return values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_config_values.get({}))


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode()) if path.suffix == ".toml" else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SettingsError(f"config file {path} is not valid JSON/TOML: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path} must hold an object of settings")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise SettingsError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(
        prog="python -m relay",
        description="Poll IMDS Scheduled Events, forward every changed document, "
        "approve on a signed callback.",
        argument_default=argparse.SUPPRESS,
    )
    add = p.add_argument
    add("--config", type=Path, help="JSON or TOML file of settings (keys as below, snake_case)")
    add("--imds-url", help="IMDS base URL (default http://169.254.169.254)")
    add("--vm-name", help="this VM's name (default: from /metadata/instance/compute)")
    add("--availability-set", help="availability set name to report (IMDS does not expose it)")
    add("--poll-interval", type=float, help="seconds between IMDS polls (default 1)")
    add("--heartbeat-interval", type=float, help="seconds between heartbeats (default 300)")
    add("--state-dir", type=Path, help=f"outbox and state (default {DEFAULT_STATE_DIR})")
    add("--forward", help="servicebus://NAMESPACE.servicebus.windows.net/QUEUE or file:DIR")
    add("--sas-connection-string-file", type=Path, help="Service Bus SAS connection string file")
    add("--identity-client-id", help="client id of a user-assigned managed identity")
    add("--message-ttl", type=int, help="Service Bus TimeToLive in seconds (default 7 days)")
    add("--callback-listen", help="HOST:PORT for the signed callback server")
    add("--callback-key-file", type=Path, help="file holding the shared HMAC key")
    add("--callback-url", help="callback URL to advertise: http(s)://HOST[:PORT], no path")
    add("--callback-max-concurrent", type=int, help="callback requests at once (default 16)")
    add("--callback-read-timeout", type=float, help="seconds to receive a request (10)")
    add("--log-format", help="json (default) or text")
    add("--hook", action="append", metavar="NAME=PATH", help="a local hook script (repeatable)")
    add("--hook-timeout", type=float, help="seconds a hook may run (default 120)")
    add("--hook-wait", type=float, help="seconds a hook call waits before answering 202")
    add("--outbox-max-messages", type=int, help="soft bound of the outbox (default 10000)")
    add("--imds-timeout", type=float, help="seconds per IMDS request (default 5)")
    add("--imds-first-timeout", type=float, help="seconds for the first IMDS request (120)")
    add("--imds-max-backoff", type=float, help="longest pause after IMDS errors (10)")
    add("--send-timeout", type=float, help=argparse.SUPPRESS)
    add("--send-max-backoff", type=float, help=argparse.SUPPRESS)
    add("--send-slow-retry", type=float, help=argparse.SUPPRESS)
    add("--servicebus-endpoint", help=argparse.SUPPRESS)
    return p


def _parse_hooks(specs: list[str]) -> dict[str, str]:
    hooks: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise SettingsError(f"--hook {spec!r}: expected NAME=/path/to/script")
        if name in hooks:
            raise SettingsError(f"--hook {name} given twice")
        hooks[name] = path
    return hooks


def load_settings(argv: list[str] | None = None) -> RelaySettings:
    """Parse flags, environment and config file; raise SettingsError with one line."""
    args = vars(build_parser().parse_args(argv))
    config_path = args.pop("config", None) or os.environ.get("RELAY_CONFIG")
    file_values = read_config_file(Path(config_path)) if config_path else {}
    if "hook" in args:
        args["hooks"] = _parse_hooks(args.pop("hook"))
    token = _config_values.set(file_values)
    try:
        return RelaySettings(**args)
    except ValidationError as exc:
        raise SettingsError(_one_line(exc)) from None
    finally:
        _config_values.reset(token)


def _one_line(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        loc = [str(x) for x in error["loc"]]
        message = error["msg"].removeprefix("Value error, ")
        if not loc:
            parts.append(message)
            continue
        name = "--" + loc[0].replace("_", "-")
        if error["type"] == "missing":
            parts.append(f"{name} is required")
        elif error["type"] == "extra_forbidden":
            parts.append(f"unknown setting {loc[0]!r}")
        else:
            parts.append(f"{name}: {message}")
    return "; ".join(parts)


def load_or_exit(argv: list[str] | None = None) -> RelaySettings:
    try:
        return load_settings(argv)
    except SettingsError as exc:
        print(f"relay: bad settings: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_SETTINGS) from None
