#!/bin/sh
# Takes the Scheduled Events relay off this VM: every scheduled-events-relay unit (the
# service, the hook unit's socket and template, their drop-ins and anything else of that
# name, so units a later release adds go too), the hook socket, the relay, its settings
# (relay.env and the operator's relay.local.env), its state (outbox, callback key) and
# its user. Run by `python -m functions relay remove` (functions/rollout) through managed
# Run Command, or by hand as root. The app then forgets the VM's rows. Not in customData:
# a VM created from a model whose customData still carries the relay gets it again; take
# it out of the model first (docs/rollout.md).
set -eu
[ "$(id -u)" = 0 ] || { echo "remove-relay.sh: run as root" >&2; exit 1; }
S=/etc/systemd/system
found=
for path in "$S"/scheduled-events-relay*; do
    [ -e "$path" ] || continue
    unit=${path##*/}
    found="$found $unit"
    case "$unit" in
        *.d | *@.service) ;;  # drop-ins; a template has no state of its own
        *) systemctl disable --now "$unit" >/dev/null 2>&1 || true ;;
    esac
done
systemctl stop 'scheduled-events-relay-hook@*.service' >/dev/null 2>&1 || true
rm -rf "$S"/scheduled-events-relay* "$S"/*.wants/scheduled-events-relay*
[ -z "$found" ] || systemctl daemon-reload
rm -rf /opt/scheduled-events-relay /etc/scheduled-events-relay /var/lib/scheduled-events-relay \
    /var/lib/private/scheduled-events-relay /run/scheduled-events-relay-hooks.sock \
    /usr/local/sbin/add-scheduled-events-relay
if id scheduled-events-relay >/dev/null 2>&1; then
    userdel scheduled-events-relay
fi
echo "remove-relay.sh: removed${found:- nothing (no relay units)}; the relay's files, state and user are gone"
