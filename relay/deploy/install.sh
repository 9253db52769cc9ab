#!/bin/sh
# Install (or upgrade) the Scheduled Events relay on this VM. Idempotent; run as root.
#
#   sudo sh relay/deploy/install.sh [--no-start] [PYZ]
#   sudo sh relay/deploy/install.sh [--no-start] https://HOST/scheduled-events-relay.pyz --sha256 HEX
#
# PYZ defaults to dist/scheduled-events-relay.pyz (make relay) or the file of that name next
# to this script. A URL is downloaded and installed only if its SHA-256 is the one given.
# Needs nothing but a Python >= 3.9 with its standard library (the stock python3 of Ubuntu
# 20.04+, Debian 11+, RHEL 9, Azure Linux 2/3; on RHEL 8: dnf install python39). No pip,
# no venv, no compiler, the same file on x86_64 and arm64. It installs:
#   /opt/scheduled-events-relay/scheduled-events-relay.pyz   the relay
#   /etc/systemd/system/scheduled-events-relay.service       the hardened unit
#   /etc/systemd/system/scheduled-events-relay-hook.socket   the hook unit, which runs the
#   /etc/systemd/system/scheduled-events-relay-hook@.service  relay's hook scripts (relay/hooks.py)
#     as a user made for each run, no capabilities; more: systemctl edit scheduled-events-relay-hook@
#     (or infra/relay/add-relay.sh's HOOK_AS)
#   /etc/systemd/system/scheduled-events-relay-callback.socket  the callback port (8492) and
#   /etc/systemd/system/scheduled-events-relay-ready.socket     the probe port (8493), held by
#     systemd (issue 46; another port: edit ListenStream= and RELAY_CALLBACK_LISTEN)
#   /etc/systemd/system/scheduled-events-relay-ready.service    the readiness responder (issue 44)
#   /etc/scheduled-events-relay/relay.env                    your RELAY_* settings (kept)
#   /var/lib/scheduled-events-relay                          state (systemd-managed)
set -eu

PREFIX=/opt/scheduled-events-relay
ETC=/etc/scheduled-events-relay
UNIT=scheduled-events-relay.service
SERVICE_USER=scheduled-events-relay
START=yes
SOURCE=
SHA256=
while [ "$#" -gt 0 ]; do
    case "$1" in
        --no-start) START=no ;;
        --sha256) [ "$#" -ge 2 ] || { echo "install.sh: --sha256 needs a value" >&2; exit 2; }
                  SHA256=$2; shift ;;
        -*) echo "install.sh: unknown option $1" >&2; exit 2 ;;
        *) SOURCE=$1 ;;
    esac
    shift
done
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -z "$SOURCE" ]; then
    for candidate in "$HERE/scheduled-events-relay.pyz" "$HERE/../../dist/scheduled-events-relay.pyz"; do
        [ -f "$candidate" ] && { SOURCE=$candidate; break; }
    done
    [ -n "$SOURCE" ] || { echo "install.sh: no scheduled-events-relay.pyz (run make relay, or pass its path or URL)" >&2; exit 2; }
fi
case "$SHA256" in
    "") ;;
    *[!0-9a-f]*) echo "install.sh: --sha256 must be 64 lowercase hex digits" >&2; exit 2 ;;
    *) [ "${#SHA256}" -eq 64 ] || { echo "install.sh: --sha256 must be 64 lowercase hex digits" >&2; exit 2; } ;;
esac
case "$SOURCE" in
    https://*) [ -n "$SHA256" ] || { echo "install.sh: a URL needs --sha256 (published next to the release asset)" >&2; exit 2; } ;;
    *://*) echo "install.sh: only https:// URLs" >&2; exit 2 ;;
esac

# The newest Python >= 3.9 on this machine (PYTHON=... to choose one).
PY=
for candidate in ${PYTHON:-} python3 python3.13 python3.12 python3.11 python3.10 python3.9; do
    path=$(command -v "$candidate" 2>/dev/null) || continue
    if "$path" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
        PY=$path
        break
    fi
done
[ -n "$PY" ] || { echo "install.sh: the relay needs Python 3.9 or newer (none found; on RHEL 8: dnf install python39)" >&2; exit 1; }

[ "$(id -u)" = 0 ] || { echo "install.sh: run as root" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
case "$SOURCE" in
    https://*) curl -fsSL --retry 10 --retry-connrefused --max-time 300 "$SOURCE" -o "$work/relay.pyz" ;;
    *) cp "$SOURCE" "$work/relay.pyz" ;;
esac
if [ -n "$SHA256" ]; then
    echo "$SHA256  $work/relay.pyz" | sha256sum -c --quiet - || {
        echo "install.sh: checksum mismatch for $SOURCE; nothing installed" >&2; exit 1; }
fi
"$PY" -I "$work/relay.pyz" --help >/dev/null || { echo "install.sh: $SOURCE does not run on $PY" >&2; exit 1; }

if ! id "$SERVICE_USER" >/dev/null 2>&1; then
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$SERVICE_USER"
fi
install -d -m 0755 "$PREFIX"
install -m 0644 "$work/relay.pyz" "$PREFIX/scheduled-events-relay.pyz.new"
mv -f "$PREFIX/scheduled-events-relay.pyz.new" "$PREFIX/scheduled-events-relay.pyz"
# Left by the earlier venv-based installer; the pyz needs neither.
rm -rf "$PREFIX/venv" "$PREFIX/app"

install -d -m 0750 -g "$SERVICE_USER" "$ETC"
if [ ! -f "$ETC/relay.env" ]; then
    cat > "$ETC/relay.env" <<'ENV'
# Settings of the Scheduled Events relay (RELAY_<SETTING>=value); see relay/README.md.
# RELAY_FORWARD=servicebus://NAMESPACE.servicebus.windows.net/documents
# RELAY_CALLBACK_LISTEN=0.0.0.0:8492
# RELAY_HEARTBEAT_TABLE=https://ACCOUNT.table.core.windows.net/PREFIXliveness
RELAY_DRAIN_FILE=/run/scheduled-events-relay/drain.json
# No key to give it: the relay makes its own callback key (callback-key.json in its state
# directory, 0600) and sends it, attested, to the bridge.
ENV
    chmod 0640 "$ETC/relay.env"
    chgrp "$SERVICE_USER" "$ETC/relay.env"
fi
# Relays before 0.2.0 served /readyz themselves; now they publish their drain for the
# readiness responder (issue 44): a kept relay.env gains the line once.
grep -q '^RELAY_DRAIN_FILE=' "$ETC/relay.env" ||
    echo "RELAY_DRAIN_FILE=/run/scheduled-events-relay/drain.json" >> "$ETC/relay.env"
# The shared key of earlier versions is not read any more (the relay ignores
# RELAY_CALLBACK_KEY_FILE with a warning): remove it.
rm -f "$ETC/callback.key"

SOCKETS="scheduled-events-relay-hook.socket scheduled-events-relay-callback.socket scheduled-events-relay-ready.socket"
for unit in "$UNIT" $SOCKETS scheduled-events-relay-hook@.service scheduled-events-relay-ready.service; do
    sed "s|^ExecStart=/usr/bin/python3 |ExecStart=$PY |" "$HERE/$unit" > "/etc/systemd/system/$unit.new"
    mv -f "/etc/systemd/system/$unit.new" "/etc/systemd/system/$unit"
done
systemctl daemon-reload
systemctl enable $SOCKETS "$UNIT" >/dev/null
if [ "$START" = yes ]; then
    # A relay before 0.2.0 binds its ports itself: stop it so the sockets can take them.
    systemctl is-active --quiet scheduled-events-relay-callback.socket || systemctl stop "$UNIT"
    systemctl start $SOCKETS
    systemctl try-restart scheduled-events-relay-ready.service
    systemctl restart "$UNIT"
    echo "install.sh: $UNIT (re)started with $PY; logs: journalctl -u $UNIT"
else
    echo "install.sh: installed (Python: $PY); start with: systemctl start $SOCKETS $UNIT"
fi
