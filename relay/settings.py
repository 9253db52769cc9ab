"""The relay's settings: flags, then `RELAY_*` environment, then an optional config file.

Every setting is validated once, at start, so a typo stops the relay with one clear line
(exit status 2) instead of surfacing hours later as a lost document or a refused approval.
Standard library only (the relay runs on the VM's own Python): each setting is declared
once in `_SPECS` with its type and bounds, and the same checks apply whether the value came
from a flag, the environment (a string) or a config file (JSON, or TOML where the Python has
tomllib).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from relay.record import Factory, Record

_WILDCARDS = ("0.0.0.0", "::", "[::]")
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any, NoReturn

DEFAULT_STATE_DIR = Path("/var/lib/scheduled-events-relay")
EXIT_BAD_SETTINGS = 2


class SettingsError(Exception):
    """A setting that cannot work; the message is the one line the operator sees."""


class ForwardTarget(Record):
    """Where envelopes go: a Service Bus queue over REST, or a local directory."""

    kind: str  # "servicebus" or "file"
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
        import ipaddress  # only to check a --servicebus-endpoint stand-in

        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------------- value types


def _num(value: Any, kind: type) -> Any:
    """A float or int the way a person means it: 3, 3.0, "3" (not True, not "soon")."""
    if isinstance(value, bool):
        raise ValueError(f"Input should be a valid {'integer' if kind is int else 'number'}")
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text) if kind is int else float(text)
        except ValueError:
            if kind is int:
                raise ValueError(
                    "Input should be a valid integer, unable to parse string as an integer"
                ) from None
            raise ValueError(
                "Input should be a valid number, unable to parse string as a number"
            ) from None
    if kind is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if not isinstance(value, int):
            raise ValueError("Input should be a valid integer")
        return value
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("Input should be a finite number")
    return float(value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("Input should be a valid string")
    return value


def _path(value: Any) -> Path:
    if isinstance(value, Path):
        return value
    if not isinstance(value, str) or not value:
        raise ValueError("Input should be a valid path")
    return Path(value)


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("1", "true", "yes", "on", "y", "t"):
            return True
        if lowered in ("0", "false", "no", "off", "n", "f", ""):
            return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError("Input should be a valid boolean")


def _hooks(value: Any) -> dict[str, Path]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError('must be a JSON object such as {"drain": "/opt/drain.sh"}') from None
    if not isinstance(value, dict):
        raise ValueError('must be a map such as {"drain": "/opt/drain.sh"}')
    return {str(k): _path(v) for k, v in value.items()}


class _Spec(Record):
    convert: Callable[[Any], Any]
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    choices: tuple[str, ...] = ()
    length: tuple[int, int] | None = None


def _float(**bounds: float) -> _Spec:
    return _Spec(lambda v: _num(v, float), **bounds)


def _int(**bounds: float) -> _Spec:
    return _Spec(lambda v: _num(v, int), **bounds)


_SPECS: dict[str, _Spec] = {
    "imds_url": _Spec(_text),
    "vm_name": _Spec(_text, length=(1, 128)),
    "availability_set": _Spec(_text),
    "poll_interval": _float(gt=0, le=60),
    "heartbeat_interval": _float(ge=1, le=86400),
    "heartbeat_queue": _Spec(_text),
    "heartbeat_table": _Spec(_text),
    "heartbeat_table_sas_file": _Spec(_path),
    "forward_all_events": _Spec(_bool),
    "state_dir": _Spec(_path),
    "forward": _Spec(_text),
    "sas_connection_string_file": _Spec(_path),
    "identity_client_id": _Spec(_text),
    "message_ttl": _int(ge=60),
    "callback_listen": _Spec(_text),
    "ready_listen": _Spec(_text),
    "unready_while_started": _Spec(_bool),
    "drain_file": _Spec(_path),
    "drain_ttl": _float(ge=1, le=3600),
    "callback_key_file": _Spec(_path),
    "previous_key_file": _Spec(_path),
    "callback_key_max_age_days": _float(gt=0, le=3650),
    "hook_user": _Spec(_text),
    "hook_socket": _Spec(_text, length=(1, 107)),
    "callback_url": _Spec(_text),
    "callback_max_concurrent": _int(ge=1, le=256),
    "callback_read_timeout": _float(gt=0, le=120),
    "log_format": _Spec(_text, choices=("json", "text")),
    "hooks": _Spec(_hooks),
    "hook_timeout": _float(gt=0, le=3600),
    "hook_wait": _float(ge=0, le=60),
    "outbox_max_messages": _int(ge=10),
    "imds_timeout": _float(gt=0, le=120),
    "imds_first_timeout": _float(gt=0, le=600),
    "imds_max_backoff": _float(gt=0, le=300),
    "send_timeout": _float(gt=0, le=300),
    "send_max_backoff": _float(gt=0, le=3600),
    "send_slow_retry": _float(gt=0, le=3600),
    "servicebus_endpoint": _Spec(_text),
}


def _checked(name: str, value: Any) -> Any:
    spec = _SPECS[name]
    value = spec.convert(value)
    if spec.gt is not None and not value > spec.gt:
        raise ValueError(f"Input should be greater than {spec.gt:g}")
    if spec.ge is not None and not value >= spec.ge:
        raise ValueError(f"Input should be greater than or equal to {spec.ge:g}")
    if spec.le is not None and not value <= spec.le:
        raise ValueError(f"Input should be less than or equal to {spec.le:g}")
    if spec.choices and value not in spec.choices:
        raise ValueError("Input should be " + " or ".join(repr(c) for c in spec.choices))
    if spec.length is not None and not spec.length[0] <= len(value) <= spec.length[1]:
        raise ValueError(f"must be {spec.length[0]}..{spec.length[1]} characters")
    return value


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class RelaySettings(Record):
    """All settings. Field names are the config-file keys; `RELAY_<NAME>` the variables."""

    forward: str
    imds_url: str = "http://169.254.169.254"
    vm_name: str | None = None
    availability_set: str | None = None
    poll_interval: float = 1.0
    heartbeat_interval: float = 300.0
    # Contract C1: heartbeats to their own (session-less) queue; "" keeps them with documents.
    heartbeat_queue: str = "heartbeats"
    # Heartbeats into the liveness table (relay.liveness) instead of Service Bus, if set.
    heartbeat_table: str | None = None
    heartbeat_table_sas_file: Path | None = None  # a SAS query string, instead of the identity
    # Contract C2: by default only the events naming this VM are forwarded.
    forward_all_events: bool = False
    state_dir: Path = DEFAULT_STATE_DIR
    sas_connection_string_file: Path | None = None
    identity_client_id: str | None = None
    message_ttl: int = 7 * 86400
    callback_listen: str | None = None
    # Gone with the shared key (issue 22): accepted only to be ignored with a warning, so
    # an upgraded VM whose unit or config still names them keeps running.
    callback_key_file: Path | None = None
    previous_key_file: Path | None = None
    # The relay's own callback key (relay.keystore): rotated after this many days.
    callback_key_max_age_days: float = 30.0
    callback_url: str | None = None
    callback_max_concurrent: int = 16
    callback_read_timeout: float = 10.0
    # The load balancer's readiness probe (relay.ready): GET /readyz on HOST:PORT; off if None.
    ready_listen: str | None = None
    unready_while_started: bool = False  # /readyz also 503 while an own event is Started
    # The readiness responder (relay.responder, issue 44): the drain published for it
    # (valid drain_ttl s; the responder has its own settings: relay.responder.main).
    drain_file: Path | None = None
    drain_ttl: float = 60.0
    log_format: str = "json"
    hooks: dict[str, Path] = Factory(dict)
    hook_user: str | None = None  # ignored (a warning): the hook unit's drop-in says who
    # The hook unit's socket (relay.hooks): every hook script runs there, with its rights.
    hook_socket: str = "/run/scheduled-events-relay-hooks.sock"
    hook_timeout: float = 120.0
    hook_wait: float = 10.0
    outbox_max_messages: int = 10000
    # Tuning knobs, documented but rarely needed.
    imds_timeout: float = 5.0
    imds_first_timeout: float = 120.0
    imds_max_backoff: float = 10.0
    send_timeout: float = 30.0
    send_max_backoff: float = 60.0
    send_slow_retry: float = 300.0
    # For tests against a local Service Bus stand-in: overrides https://NAMESPACE.
    servicebus_endpoint: str | None = None

    def __post_init__(self) -> None:
        problems = []
        for name in self._fields:
            value = getattr(self, name)
            if value is None:
                continue
            try:
                value = _checked(name, value)
                check = getattr(self, f"_check_{name}", None)
                if check is not None:
                    value = check(value)
            except ValueError as exc:
                problems.append(f"{_flag(name)}: {exc}")
                continue
            object.__setattr__(self, name, value)
        if problems:
            raise SettingsError("; ".join(problems))
        try:
            self._consistent()
        except ValueError as exc:
            raise SettingsError(str(exc)) from None

    # Field checks beyond type and bounds; each returns the (normalised) value.

    @staticmethod
    def _check_imds_url(value: str) -> str:
        if not value.startswith(("http://", "https://")) or not urlsplit(value).hostname:
            raise ValueError("must be an http URL such as http://169.254.169.254")
        return value.rstrip("/")

    @staticmethod
    def _check_forward(value: str) -> str:
        parse_forward(value)
        return value

    @staticmethod
    def _check_heartbeat_queue(value: str) -> str:
        if "/" in value or any(c.isspace() for c in value) or len(value) > 260:
            raise ValueError("must be a queue name (no '/', no spaces), or '' for the documents")
        return value

    @staticmethod
    def _check_heartbeat_table(value: str) -> str:
        """https://ACCOUNT.table.core.windows.net/TABLE (any cloud's suffix), or a loopback
        http URL whose last path segment is the table (Azurite: /ACCOUNT/TABLE)."""
        value = value.rstrip("/")
        parts = urlsplit(value)
        if parts.scheme == "http" and not is_loopback_url(value):
            raise ValueError("plain http is allowed for loopback stand-ins only")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be https://ACCOUNT.table.core.windows.net/TABLE")
        if parts.query or parts.fragment or "@" in parts.netloc:
            raise ValueError("must be the table's URL alone (no query: a SAS goes in a file)")
        table = parts.path.rpartition("/")[2]
        if not (3 <= len(table) <= 63 and table.isascii() and table.isalnum()):
            raise ValueError(f"{table or '(none)'!r} is not a table name (3-63 letters/digits)")
        if not table[0].isalpha():
            raise ValueError(f"{table!r} is not a table name (it must start with a letter)")
        return value

    @staticmethod
    def _check_callback_listen(value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isascii() or not port.isdigit():
            raise ValueError("must be HOST:PORT, e.g. 0.0.0.0:8787")
        if not 0 <= int(port) <= 65535:
            raise ValueError("must be HOST:PORT, e.g. 0.0.0.0:8787")
        return value

    @staticmethod
    def _check_ready_listen(value: str) -> str | None:
        """HOST:PORT, or empty for no probe: add-relay.sh turns it on, and
        `RELAY_READY_LISTEN=` in relay.local.env turns it off (issue 38)."""
        return RelaySettings._check_callback_listen(value) if value else None

    @staticmethod
    def _check_callback_url(value: str) -> str:
        """Scheme, host and port only.

        Callers sign the path of the URL they call (the advertised URL + `/v1/start`), and
        the relay routes and verifies the path it receives. With a prefix, a reverse proxy
        that strips or rewrites it turns every approval into a 401 or 404, found only when
        an event needs approving. Refusing at start is the safe, simple choice: publish
        the relay (or a proxy that forwards paths unchanged) at the root of a host:port.
        """
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        parts = urlsplit(value)
        if not parts.hostname:
            raise ValueError("must name a host, e.g. http://10.0.0.4:8787")
        try:
            parts.port  # noqa: B018 - raises ValueError for a port that is not 0..65535
        except ValueError:
            raise ValueError("Port out of range 0-65535") from None
        if parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
            raise ValueError(
                f"must be http(s)://HOST[:PORT] with no path, query or user "
                f"(got {value!r}); callers sign and the relay serves /v1/... at the root, "
                "so a reverse proxy must forward the root unchanged"
            )
        return value.rstrip("/")

    @staticmethod
    def _check_hooks(value: dict[str, Path]) -> dict[str, Path]:
        for name, path in value.items():
            if not name or not all(c.isalnum() or c in "-_." for c in name):
                raise ValueError(f"hook name {name!r} may only use letters, digits, - _ .")
            if not path.is_absolute():
                raise ValueError(f"hook {name}: {path} must be an absolute path")
            if not path.is_file() or not os.access(path, os.X_OK):
                raise ValueError(f"hook {name}: {path} is not an executable file")
        return value

    @staticmethod
    def _check_servicebus_endpoint(value: str) -> str:
        if value.startswith("http://") and not is_loopback_url(value):
            raise ValueError("plain http is allowed for loopback stand-ins only")
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return value.rstrip("/")

    def _consistent(self) -> None:
        target = self.forward_target
        if target.kind == "file" and self.sas_connection_string_file is not None:
            raise ValueError("--sas-connection-string-file only applies to servicebus forwarding")
        if self.sas_connection_string_file is not None and not os.access(
            self.sas_connection_string_file, os.R_OK
        ):
            raise ValueError(
                f"cannot read SAS connection string file {self.sas_connection_string_file}"
            )
        if self.heartbeat_table_sas_file is not None:
            if not self.heartbeat_table:
                raise ValueError("--heartbeat-table-sas-file needs --heartbeat-table")
            try:
                sas = self.heartbeat_table_sas_file.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"cannot read the heartbeat table SAS file: {exc}") from None
            if "sig=" not in sas:
                raise ValueError("the heartbeat table SAS file holds no SAS token (no sig=)")
        if self.unready_while_started and not (self.ready_listen or self.drain_file):
            raise ValueError("--unready-while-started needs --ready-listen or --drain-file")
        if self.hooks and not self.callback_listen:
            raise ValueError("--hook needs --callback-listen (hooks run on a signed callback)")

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
        if host in _WILDCARDS or port == "0":
            return None
        return f"http://{host}:{port}"


SETTING_NAMES = RelaySettings._fields
"""Every setting: config-file keys; `RELAY_<NAME upper>` is each one's variable."""


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        if path.suffix == ".toml":
            try:
                import tomllib  # type: ignore[import-not-found, unused-ignore]
            except ImportError:
                raise SettingsError(
                    f"config file {path}: TOML needs Python 3.11 or newer "
                    f"(this is {sys.version.split()[0]}); use a .json file"
                ) from None
            data = tomllib.loads(raw.decode())
        else:
            data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise SettingsError(f"config file {path} is not valid JSON/TOML: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path} must hold an object of settings")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def build_parser() -> argparse.ArgumentParser:
    """The flags. argparse is imported here, and the relay process lets it go after parsing
    (relay.__main__.forget_startup_modules)."""
    import argparse

    class _OneLineParser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise SettingsError(message)

    p = _OneLineParser(
        prog="python3 scheduled-events-relay.pyz",
        description="Poll IMDS Scheduled Events, forward every changed document, "
        "approve on a signed callback.",
        epilog="Before rolling out: `check [--env-file relay.env] [--out FILE] [flags]` tries "
        "IMDS, the attested document, Service Bus and the liveness row once, with these "
        "settings, one PASS/FAIL line per step.",
        argument_default=argparse.SUPPRESS,
    )
    add = p.add_argument
    add("--config", type=Path, help="JSON (or TOML, Python 3.11+) file of settings, snake_case")
    add("--imds-url", help="IMDS base URL (default http://169.254.169.254)")
    add("--vm-name", help="this VM's name (default: from /metadata/instance/compute)")
    add("--availability-set", help="availability set name to report (IMDS does not expose it)")
    add("--poll-interval", help="seconds between IMDS polls (default 1)")
    add("--heartbeat-interval", help="seconds between heartbeats (default 300)")
    add("--heartbeat-queue", help="Service Bus queue of heartbeats ('' = with the documents)")
    add(
        "--heartbeat-table",
        help="write signed heartbeats into the bridge's liveness table "
        "(https://ACCOUNT.table.core.windows.net/PREFIXliveness) instead of Service Bus",
    )
    add("--heartbeat-table-sas-file", help="a SAS token for --heartbeat-table (default: identity)")
    add(
        "--forward-all-events",
        action="store_const",
        const=True,
        help="forward every event IMDS shows, not only those naming this VM",
    )
    add("--state-dir", help=f"outbox and state (default {DEFAULT_STATE_DIR})")
    add("--forward", help="servicebus://NAMESPACE.servicebus.windows.net/QUEUE or file:DIR")
    add("--sas-connection-string-file", help="Service Bus SAS connection string file")
    add("--identity-client-id", help="client id of a user-assigned managed identity")
    add("--message-ttl", help="Service Bus TimeToLive in seconds (default 7 days)")
    add("--callback-listen", help="HOST:PORT for the signed callback server")
    add(
        "--callback-key-file",
        "--key-file",
        dest="callback_key_file",
        help="ignored (deprecated): the relay makes its own callback key in --state-dir",
    )
    add("--previous-key-file", help="ignored (deprecated), as --callback-key-file")
    add(
        "--callback-key-max-age-days",
        help="rotate the relay's own callback key after this many days (default 30)",
    )
    add("--callback-url", help="callback URL to advertise: http(s)://HOST[:PORT], no path")
    add("--callback-max-concurrent", help="callback requests at once (default 16)")
    add("--callback-read-timeout", help="seconds to receive a request (10)")
    add("--ready-listen", help="HOST:PORT of a load balancer's probe, GET /readyz ('': none)")
    add("--unready-while-started", action="store_const", const=True, help="/readyz 503 if Started")
    add("--drain-file", help="drain state for the readiness responder (relay.responder)")
    add("--drain-ttl", help=argparse.SUPPRESS)
    add("--log-format", help="json (default) or text")
    add("--hook", action="append", metavar="NAME=PATH", help="a local hook script (repeatable)")
    add("--hook-user", help="ignored (deprecated): the hook unit's drop-in says who")
    add("--hook-socket", help="the hook unit's socket (/run/scheduled-events-relay-hooks.sock)")
    add("--hook-timeout", help="seconds a hook may run (default 120)")
    add("--hook-wait", help="seconds a hook call waits before answering 202")
    add("--outbox-max-messages", help="soft bound of the outbox (default 10000)")
    add("--imds-timeout", help="seconds per IMDS request (default 5)")
    add("--imds-first-timeout", help="seconds for the first IMDS request (120)")
    add("--imds-max-backoff", help="longest pause after IMDS errors (10)")
    add("--send-timeout", help=argparse.SUPPRESS)
    add("--send-max-backoff", help=argparse.SUPPRESS)
    add("--send-slow-retry", help=argparse.SUPPRESS)
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
    unknown = [k for k in file_values if k not in SETTING_NAMES]
    if unknown:
        raise SettingsError("; ".join(f"unknown setting {k!r}" for k in unknown))
    if "hook" in args:
        args["hooks"] = _parse_hooks(args.pop("hook"))
    merged: dict[str, Any] = dict(file_values)
    for name in SETTING_NAMES:
        variable = f"RELAY_{name.upper()}"
        if variable in os.environ:
            merged[name] = os.environ[variable]
    merged.update(args)
    if "forward" not in merged:
        raise SettingsError("--forward is required")
    return RelaySettings(**merged)


def load_or_exit(argv: list[str] | None = None) -> RelaySettings:
    try:
        return load_settings(argv)
    except SettingsError as exc:
        print(f"relay: bad settings: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_SETTINGS) from None
