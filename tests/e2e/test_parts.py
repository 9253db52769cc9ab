"""The demo's small parts on their own: relay command lines, timeline words, channel wiring."""

from __future__ import annotations

import time
from pathlib import Path

from local.channels import LOCAL_ROUTING_KEY, channel_values
from local.narration import receiver_news
from local.plan import VmSpec
from local.receivers import Received, TeamsReceiver, WebhookReceiver
from local.relays import (
    parse_hook_line,
    relay_argv,
    relay_env,
    write_drain_hook,
    write_undrain_hook,
)


def received(channel: str, status: int, body: object = None, problems=()) -> Received:
    return Received(channel, "POST", "/", {}, b"", body, time.time(), status, tuple(problems))


def argv_for(vm: VmSpec, tmp_path: Path) -> list[str]:
    return relay_argv(
        vm,
        imds_url="http://127.0.0.1:1/vm/x",
        inbox=tmp_path / "inbox",
        state_dir=tmp_path / "state",
        poll_interval=0.25,
        listen=None if vm.callback_down else "127.0.0.5:4242",
        hook=tmp_path / "hook.sh",
    )


def test_relay_command_line_names_the_availability_set_only_when_there_is_one(tmp_path: Path):
    in_set = argv_for(VmSpec(name="web-1", availability_set="web-as"), tmp_path)
    alone = argv_for(VmSpec(name="spot-1", spot=True), tmp_path)
    assert in_set[-2:] == ["--availability-set", "web-as"]
    assert "--availability-set" not in alone
    assert alone[alone.index("--forward") + 1] == f"file:{tmp_path / 'inbox'}"


def test_relays_listen_at_their_vms_address_with_their_own_key_and_the_hook_unit(
    tmp_path: Path,
):
    argv = argv_for(VmSpec(name="web-1", availability_set="web-as"), tmp_path)
    assert argv[argv.index("--callback-listen") + 1] == "127.0.0.5:4242"
    # The relay makes its own key in its state directory and the app calls it only at the
    # address Azure gives the VM: no shared key, no advertised URL.
    for gone in ("--callback-key-file", "--key-file", "--previous-key-file", "--callback-url"):
        assert gone not in argv
    # Hook scripts run in the hook unit (its stand-in, local/hook_unit.py), never as the
    # relay's children: the relay names its socket, and switches no user itself.
    assert argv[argv.index("--hook-socket") + 1] == str(tmp_path / "hooks.sock")
    assert "--hook-user" not in argv


def test_relays_get_the_undrain_hook_beside_the_drain_hook(tmp_path: Path):
    argv = relay_argv(
        VmSpec(name="app-1"),
        imds_url="http://127.0.0.1:1/vm/x",
        inbox=tmp_path / "inbox",
        state_dir=tmp_path / "state",
        poll_interval=0.25,
        listen="127.0.0.5:4242",
        hook=tmp_path / "hook.sh",
        undrain_hook=tmp_path / "undrain.sh",
    )
    hooks = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--hook"]
    assert hooks == [f"drain={tmp_path / 'hook.sh'}", f"undrain={tmp_path / 'undrain.sh'}"]


def test_a_relay_whose_callback_is_down_listens_nowhere_and_runs_no_hooks(tmp_path: Path):
    argv = argv_for(VmSpec(name="batch-1", callback_down=True), tmp_path)
    assert "--callback-listen" not in argv and "--hook" not in argv


def test_relays_get_no_relay_settings_from_the_demo_environment():
    env = relay_env({"RELAY_FORWARD": "sb://x", "PATH": "/bin"})
    assert env == {"PATH": "/bin", "PYTHONUNBUFFERED": "1"}


def test_the_drain_hook_logs_one_line_per_run(tmp_path: Path):
    hook, log = write_drain_hook(tmp_path)
    assert hook.stat().st_mode & 0o111 and str(log) in hook.read_text()
    undrain, undrain_log = write_undrain_hook(tmp_path)
    assert undrain.stat().st_mode & 0o111 and str(undrain_log) in undrain.read_text()
    assert undrain_log != log
    assert parse_hook_line("1700000000.5 workers_0 EV-1") == (1700000000.5, "workers_0", "EV-1")
    assert parse_hook_line("") == (0.0, "?", "?")  # a half-written line is not a crash


def test_receivers_speak_only_for_drain_calls_and_refusals():
    body = {"Resources": ["workers_0"], "EventType": "Terminate", "EventId": "8B9C33C7-1"}
    drain = receiver_news(received("drain", 200, body))
    text = "customer's HTTP drain hook called for workers_0 (Terminate 8B9C33C7)"
    assert drain == ("drain", "drain-hook", text, None)
    undrain = receiver_news(received("drain", 200, {**body, "action": "undrain"}))
    assert undrain is not None and undrain[1] == "undrain-hook"
    assert undrain[2].startswith("customer's HTTP undrain hook called for workers_0")
    assert receiver_news(received("teams", 202)) is None
    refused = receiver_news(received("teams", 400, problems=['"type" must be "message"']))
    assert refused == ("notify", "teams", 'answered 400: "type" must be "message"', False)
    assert receiver_news(received("pagerduty", 503)) == (
        "notify",
        "pagerduty",
        "answered 503: injected failure",
        False,
    )


def test_channels_post_to_the_environment_or_to_the_local_receivers():
    env = {"TEAMS_WEBHOOK_URL": "https://example.org/teams", "PAGERDUTY_ROUTING_KEY": "k" * 32}
    external = {"teams": env["TEAMS_WEBHOOK_URL"], "pagerduty": "https://pd.example/v2/enqueue"}
    with WebhookReceiver() as webhook:
        values = channel_values(env, external, {"webhook": webhook})
        assert values["teams_webhook_url"] == "https://example.org/teams"
        assert values["pagerduty_routing_key"] == "k" * 32
        assert values["pagerduty_events_url"] == "https://pd.example/v2/enqueue"
        assert values["webhook_url"] == webhook.url
        # The local webhook checks the signature made with the secret chosen here.
        assert webhook.verify is not None
        assert webhook.verify({}, b"{}") == (
            "missing webhook-id / webhook-timestamp / webhook-signature"
        )
    with TeamsReceiver() as teams:
        local = channel_values({}, {}, {"teams": teams})
        assert local == {"teams_webhook_url": teams.url}
    assert len(LOCAL_ROUTING_KEY) == 32  # PagerDuty's receiver refuses any other length


def test_the_docs_sample_log_is_what_the_demo_prints():
    """docs/demo.md's sample timeline: the relay count of the demo's fleet (it said 6 of
    7), hooks as the user who runs it (it said root), and a host failure's decision line
    saying it had nothing to approve, as local/narration.py prints it (issue 33)."""
    import re

    from local.plan import FLEET

    page = (Path(__file__).resolve().parents[2] / "docs" / "demo.md").read_text()
    sample = page[page.index("The timeline is printed as it happens") :]
    sample = sample[: sample.index("\n```\n", sample.index("```") + 3)]
    relays = int(re.search(r"(\d+) relays polling", sample).group(1))
    assert relays == sum(1 for vm in FLEET if vm.relay)
    assert "hooks as root" not in sample
    started = [line for line in sample.splitlines() if "already Started" in line]
    assert started and all("nothing to approve" in line for line in started)
