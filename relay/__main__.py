"""`python -m relay`: wire the parts together and run until SIGTERM.

Exit status: 0 after SIGTERM/SIGINT, 2 for a bad setting (one line on stderr), 1 if the
state directory cannot be used (nothing could be made durable, so nothing is polled).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time

from relay import __version__, logs
from relay.attest import Attester, AttestingSender
from relay.imds import ImdsClient, ImdsError
from relay.keystore import KeyStore
from relay.logs import ErrorStreak, event, jitter
from relay.models import VmRef
from relay.outbox import Outbox
from relay.senders import SendLoop, build_sender
from relay.settings import EXIT_BAD_SETTINGS, RelaySettings, load_or_exit
from relay.watcher import Watcher

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

log = logging.getLogger("relay")


def resolve_vm(imds: ImdsClient, settings: RelaySettings, stop: threading.Event) -> VmRef | None:
    """Who we are: IMDS compute metadata, waited for (retrying, logged). The vmId is this
    VM's identity (issue 22: envelopes, attestation, callback target), so even with
    --vm-name the relay does not start without it."""
    compute: dict[str, Any] = {}
    streak = ErrorStreak(log, "IMDS compute metadata")
    failures = 0
    while not stop.is_set():
        try:
            compute = imds.get_compute(timeout=settings.imds_first_timeout)
            if not compute.get("vmId"):
                raise ImdsError("malformed", "compute metadata has no vmId")
            streak.ok()
            break
        except ImdsError as exc:
            failures += 1
            streak.error(exc.kind, f"cannot learn this VM's identity: {exc}")
            pause = min(settings.imds_max_backoff, 0.5 * 2**failures)
            stop.wait(pause * jitter(0.75, 1.25))
    else:
        return None
    return VmRef(
        name=settings.vm_name or compute["name"],
        vm_id=str(compute["vmId"]).lower(),
        callback_url=settings.advertised_callback_url,
        scale_set=compute.get("vmScaleSetName") or None,
        availability_set=settings.availability_set,
        resource_id=compute.get("resourceId") or None,
        subscription_id=compute.get("subscriptionId") or None,
        resource_group=compute.get("resourceGroupName") or None,
    )


def forget_startup_modules() -> None:
    """Unload what only the start needed, so its memory is reused for the relay's work.

    Every module kept costs memory on every VM for the relay's whole life; argparse and its
    helpers have done their job once the flags are read. Only in the relay's own process
    (`main`), never in a host that imported relay (its other modules may hold on to them).
    """
    import gc

    # argparse's help formatter pulls in shutil, which pulls in bz2 and lzma.
    for name in ("argparse", "gettext", "textwrap", "shutil", "bz2", "lzma", "_compression"):
        sys.modules.pop(name, None)
    gc.collect()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["check"]:  # the preflight: `python3 scheduled-events-relay.pyz check`
        from relay.preflight import main as preflight

        return preflight(args[1:])
    if args[:1] == ["ready"]:  # the readiness responder, a process of its own (issue 44)
        from relay.responder import main as responder

        return responder(args[1:])
    if args == ["run-hook"]:  # one hook run in the hook unit (relay.hooks.run_hook)
        from relay.hooks import run_hook

        return run_hook()
    settings = load_or_exit(argv)
    if __name__ == "__main__" or argv is None:
        forget_startup_modules()
    logs.configure(settings.log_format)
    stop = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        event(log, logging.INFO, "stopping", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)

    try:
        outbox = Outbox(settings.state_dir, settings.outbox_max_messages)
    except OSError as exc:
        event(log, logging.CRITICAL, "cannot use the state directory", error=str(exc))
        return 1
    no_key = "there is no shared relay key any more; the relay makes its own callback key"
    for flag, value, why in (
        ("--callback-key-file", settings.callback_key_file, no_key),
        ("--previous-key-file", settings.previous_key_file, no_key),
        # Hooks run in the hook unit (relay.hooks), as its drop-in says (add-relay.sh's HOOK_AS).
        ("--hook-user", settings.hook_user, "hook scripts run as the hook unit's drop-in says"),
    ):
        if value is not None:
            event(log, logging.WARNING, f"{flag} is ignored: {why} (remove the setting)")
    try:
        build_sender(settings)  # every setting checked before anything is made or logged
    except (ValueError, OSError) as exc:
        print(f"relay: bad settings: {exc}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    try:
        keys = KeyStore(settings.state_dir, max_age=settings.callback_key_max_age_days * 86400)
    except OSError as exc:
        event(log, logging.CRITICAL, "cannot use the callback key store", error=str(exc))
        return 1
    attester = Attester(ImdsClient(settings.imds_url, settings.imds_timeout))
    try:
        sender = build_sender(settings, keys=keys, attester=attester)
    except (ValueError, OSError) as exc:
        print(f"relay: bad settings: {exc}", file=sys.stderr)
        return EXIT_BAD_SETTINGS

    imds = ImdsClient(settings.imds_url, settings.imds_timeout)
    event(
        log,
        logging.INFO,
        "relay starting",
        version=__version__,
        forward=sender.describe(),
        state_dir=str(settings.state_dir),
        pending=len(outbox),
        sequence=outbox.sequence,
        key_id=keys.current_key().id,
    )
    watching: list[Watcher] = []
    readiness = None
    if settings.ready_listen or settings.drain_file:  # what the probe says, relay.ready
        from relay.ready import Readiness

        readiness = Readiness(
            settings.state_dir,
            lambda: watching[0].started if watching else (),
            settings.unready_while_started,
            publish=settings.drain_file,
            ttl=settings.drain_ttl,
        )
        readiness.keep_publishing(stop)  # at once: a drain outlives a restart, not a death
    vm = resolve_vm(imds, settings, stop)
    if vm is None:
        return 0
    documents = getattr(sender, "documents", sender)
    if isinstance(documents, AttestingSender):
        documents.vm = vm.to_dict()
    sending = SendLoop(
        outbox, sender, max_backoff=settings.send_max_backoff, slow_retry=settings.send_slow_retry
    ).start()
    watcher = Watcher(
        imds,
        outbox,
        vm,
        poll_interval=settings.poll_interval,
        heartbeat_interval=settings.heartbeat_interval,
        timeout=settings.imds_timeout,
        first_timeout=settings.imds_first_timeout,
        max_backoff=settings.imds_max_backoff,
        stop=stop,
        forward_all_events=settings.forward_all_events,
        keys=keys,
    )
    watching.append(watcher)
    servers: list[Any] = []
    try:
        if readiness is not None and settings.ready_listen:  # the relay serving /readyz
            servers.append(readiness.serve(settings.ready_listen))
        if settings.callback_listen:
            clock = callback_clock(sender)
            servers.append(_start_callback(settings, keys, vm, watcher, sending, readiness, clock))
        heartbeats: Any = getattr(sender, "heartbeats", None)
        if hasattr(heartbeats, "facts"):  # contract 2: probe_at and drain, relay.responder
            from relay.responder import DEFAULT_STATUS, drain_facts

            serving = readiness if settings.ready_listen else None
            heartbeats.facts = drain_facts(
                bool(settings.hooks), serving, bool(settings.drain_file), DEFAULT_STATUS
            )
    except OSError as exc:
        event(log, logging.CRITICAL, "cannot listen", error=str(exc))
        for server in servers:
            server.stop()
        sending.stop()
        return 1
    try:
        watcher.run()
    finally:
        for server in servers:
            server.stop()
        sending.stop()
        event(log, logging.INFO, "relay stopped", pending=len(outbox))
    return 0


def callback_clock(sender: Any) -> Callable[[], float]:
    """The clock the callback judges signatures' timestamps by: this VM's, corrected by the
    skew measured against the `Date` of Azure's answers (relay.servicebus.AzureClock) by
    the heartbeats' sender: the liveness table's, else Service Bus's (the one that sends
    them, attested or not). Without one (a directory) it is this VM's own clock."""
    sender = getattr(sender, "heartbeats", sender)
    sender = getattr(sender, "inner", sender)
    return getattr(sender, "azure_time", time.time)


def _start_callback(
    settings: RelaySettings,
    keys: KeyStore,
    vm: VmRef,
    watcher: Watcher,
    sending: SendLoop,
    readiness: Any,
    clock: Callable[[], float] = time.time,
) -> Any:
    from relay.callback import CallbackApp, CallbackServer
    from relay.callback_http import inherited
    from relay.startlog import StartLog

    hooks = None
    names = {**settings.hooks, **(readiness.hooks if readiness else {})}
    if names:  # subprocess and tempfile only when there are hooks to run
        from relay.hooks import HookRunner

        hooks = HookRunner(
            names,
            settings.state_dir,
            settings.hook_timeout,
            vm.name,
            settings.hook_socket,
            readiness,
        )

    def health() -> dict[str, Any]:
        return {
            "healthy": watcher.healthy and sending.healthy,
            "version": __version__,
            "vm": vm.name,
            "vm_id": vm.vm_id,
            "imds": {"healthy": watcher.healthy, "error": watcher.streak.last_error},
            "sender": {
                "healthy": sending.healthy,
                "error": sending.streak.last_error,
                "pending": len(sending.outbox),
            },
        }

    # A separate client: a slow poll must not hold up an approval, nor the reverse.
    assert vm.vm_id
    app = CallbackApp(
        keys,
        vm.vm_id,
        vm.name,
        ImdsClient(settings.imds_url, settings.imds_timeout),
        hooks=hooks,
        health=health,
        hook_wait=settings.hook_wait,
        clock=clock,
        starts=StartLog(settings.state_dir),
    )
    assert settings.callback_listen
    return CallbackServer(
        settings.callback_listen,
        app,
        max_concurrent=settings.callback_max_concurrent,
        read_timeout=settings.callback_read_timeout,
        sock=inherited("callback"),  # the port systemd holds (issue 46), if it passed one
    ).start()


if __name__ == "__main__":
    sys.exit(main())
