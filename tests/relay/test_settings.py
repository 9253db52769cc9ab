"""Settings: flags beat environment beat config file; a bad setting is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from relay.settings import RelaySettings, load_or_exit, load_settings
from tests.relay.conftest import relay_command, relay_env


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("RELAY_"):
            monkeypatch.delenv(name)


def test_defaults_follow_the_issue() -> None:
    s = load_settings(["--forward", "file:/tmp/out"])
    assert s.imds_url == "http://169.254.169.254"
    assert s.poll_interval == 1.0
    assert s.state_dir == Path("/var/lib/scheduled-events-relay")
    assert s.log_format == "json"
    assert s.hook_timeout == 120.0
    assert s.forward_target.kind == "file"
    assert s.forward_target.directory == Path("/tmp/out")


def test_flags_beat_environment_beat_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "relay.json"
    config.write_text(
        json.dumps(
            {
                "poll-interval": 3,
                "heartbeat_interval": 60,
                "vm_name": "file-vm",
                "forward": "file:/a",
            }
        )
    )
    monkeypatch.setenv("RELAY_HEARTBEAT_INTERVAL", "120")
    monkeypatch.setenv("RELAY_VM_NAME", "env-vm")
    s = load_settings(["--config", str(config), "--vm-name", "flag-vm"])
    assert s.vm_name == "flag-vm"
    assert s.heartbeat_interval == 120
    assert s.poll_interval == 3
    assert s.forward == "file:/a"


def test_toml_config_with_a_hook_map(tmp_path: Path, key_file: Path) -> None:
    script = tmp_path / "drain.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    config = tmp_path / "relay.toml"
    config.write_text(
        f'forward = "servicebus://ns.servicebus.windows.net/documents"\n'
        f'callback_listen = "127.0.0.1:0"\ncallback_key_file = "{key_file}"\n'
        f'[hooks]\ndrain = "{script}"\n'
    )
    s = load_settings(["--config", str(config)])
    assert s.hooks == {"drain": script}
    target = s.forward_target
    assert (target.namespace, target.queue) == ("ns.servicebus.windows.net", "documents")
    assert target.resource_uri == "https://ns.servicebus.windows.net/documents"


def test_hook_flags_are_repeatable(tmp_path: Path, key_file: Path) -> None:
    scripts = []
    for name in ("drain", "flush"):
        script = tmp_path / f"{name}.sh"
        script.write_text("#!/bin/sh\n")
        script.chmod(0o755)
        scripts.append(script)
    s = load_settings(
        [
            "--forward=file:/x",
            "--callback-listen=127.0.0.1:0",
            f"--callback-key-file={key_file}",
            f"--hook=drain={scripts[0]}",
            f"--hook=flush={scripts[1]}",
        ]
    )
    assert s.hooks == {"drain": scripts[0], "flush": scripts[1]}


def test_advertised_callback_url() -> None:
    assert RelaySettings(forward="file:/x").advertised_callback_url is None
    for given, advertised in [
        ("http://10.0.0.4:8492/", "http://10.0.0.4:8492"),
        ("https://relay.example", "https://relay.example"),
        ("http://[fd00::4]:8787", "http://[fd00::4]:8787"),
    ]:
        settings = RelaySettings(forward="file:/x", callback_url=given)
        assert settings.advertised_callback_url == advertised


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.4:8492/relay",  # a reverse proxy's prefix: callers would sign it
        "http://10.0.0.4:8492/relay/",
        "http://10.0.0.4:8492/?a=b",
        "http://10.0.0.4:8492#x",
        "http://user@10.0.0.4:8492",
    ],
)
def test_a_callback_url_with_a_path_is_refused_at_start(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RELAY_CALLBACK_URL", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        load_or_exit(["--forward", "file:/x", "--callback-url", url])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("relay: bad settings: --callback-url: must be http(s)://HOST[:PORT]")
    assert url in err


def test_callback_bounds_from_flags() -> None:
    default = RelaySettings(forward="file:/x")
    assert (default.callback_max_concurrent, default.callback_read_timeout) == (16, 10.0)
    s = load_settings(
        ["--forward", "file:/x", "--callback-max-concurrent", "4", "--callback-read-timeout", "3"]
    )
    assert (s.callback_max_concurrent, s.callback_read_timeout) == (4, 3.0)


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], {}, "--forward is required"),
        (["--forward", "kafka://x"], {}, "--forward: must be servicebus://"),
        (["--forward", "servicebus://ns.servicebus.windows.net"], {}, "--forward"),
        (["--forward", "file:/x", "--poll-interval", "0"], {}, "--poll-interval"),
        (["--forward", "file:/x", "--poll-interval", "soon"], {}, "--poll-interval"),
        (["--forward", "file:/x", "--log-format", "xml"], {}, "--log-format"),
        (["--forward", "file:/x", "--bogus"], {}, "unrecognized arguments: --bogus"),
        (["--forward", "file:/x"], {"RELAY_POLL_INTERVAL": "-1"}, "--poll-interval"),
        (["--forward", "file:/x", "--imds-url", "169.254.169.254"], {}, "--imds-url"),
        (["--forward", "file:/x", "--callback-listen", "1.2.3.4"], {}, "--callback-listen"),
        (["--forward", "file:/x", "--callback-key-max-age-days", "0"], {}, "--callback-key-max"),
        (["--forward", "file:/x", "--hook", "drain"], {}, "expected NAME=/path"),
        (["--forward", "file:/x", "--callback-url", "http://h:99999"], {}, "--callback-url"),
        (["--forward", "file:/x"], {"RELAY_CALLBACK_URL": "http://h:1/p"}, "no path"),
        (["--forward", "file:/x", "--callback-max-concurrent", "0"], {}, "--callback-max"),
        (["--forward", "file:/x", "--callback-read-timeout", "0"], {}, "--callback-read"),
        (["--forward", "file:/x", "--hook-socket", ""], {}, "--hook-socket"),
        (
            ["--forward", "servicebus://ns.servicebus.windows.net/q"],
            {"RELAY_SERVICEBUS_ENDPOINT": "http://example.com"},
            "loopback",
        ),
        (
            ["--forward", "file:/x", "--sas-connection-string-file", "/etc/hostname"],
            {},
            "only applies to servicebus",
        ),
    ],
)
def test_bad_settings_exit_2_with_one_line(
    args: list[str],
    env: dict[str, str],
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_info:
        load_or_exit(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("relay: bad settings: ")
    assert expected in err


def test_hook_must_be_an_executable_file(
    tmp_path: Path, key_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "drain.sh"
    script.write_text("#!/bin/sh\n")  # not executable
    common = [
        "--forward=file:/x",
        "--callback-listen=127.0.0.1:0",
        f"--callback-key-file={key_file}",
    ]
    with pytest.raises(SystemExit):
        load_or_exit([*common, f"--hook=drain={script}"])
    assert "not an executable file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        load_or_exit([*common, "--hook=drain=relative/path.sh"])
    assert "absolute path" in capsys.readouterr().err


def test_unknown_config_key_and_broken_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "relay.json"
    config.write_text('{"forward": "file:/x", "pol_interval": 2}')
    with pytest.raises(SystemExit):
        load_or_exit(["--config", str(config)])
    assert "unknown setting 'pol_interval'" in capsys.readouterr().err
    config.write_text("{not json")
    with pytest.raises(SystemExit):
        load_or_exit(["--config", str(config)])
    assert "not valid JSON/TOML" in capsys.readouterr().err


def test_the_real_command_exits_2(tmp_path: Path, relay_pyz: Path) -> None:
    result = subprocess.run(
        relay_command(relay_pyz, "--forward", "file:/x", "--poll-interval", "-5"),
        cwd=tmp_path,
        env=relay_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "relay: bad settings: --poll-interval: Input should be greater than 0"
    ]


def test_hooks_from_the_environment_as_json(
    tmp_path: Path, key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "drain.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("RELAY_HOOKS", json.dumps({"drain": str(script)}))
    monkeypatch.setenv("RELAY_CALLBACK_LISTEN", "127.0.0.1:0")
    monkeypatch.setenv("RELAY_CALLBACK_KEY_FILE", str(key_file))
    assert load_settings(["--forward=file:/x"]).hooks == {"drain": script}


def test_an_unusable_sas_connection_string_exits_2(tmp_path: Path, relay_pyz: Path) -> None:
    conn = tmp_path / "sas.txt"
    conn.write_text("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send")
    result = subprocess.run(
        relay_command(
            relay_pyz,
            "--forward=servicebus://ns.servicebus.windows.net/documents",
            f"--sas-connection-string-file={conn}",
            f"--state-dir={tmp_path / 'state'}",
        ),
        cwd=tmp_path,
        env=relay_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == (
        "relay: bad settings: the SAS connection string needs SharedAccessKeyName "
        "and SharedAccessKey\n"
    )
