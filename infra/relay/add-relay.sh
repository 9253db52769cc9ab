#!/bin/sh
# Install and start the Scheduled Events relay on this VM, wired to the bridge. Run as root.
# cloud-init runs it on first boot (infra/relay/cloud-init.yaml, which also writes the relay
# itself); for an existing VM or scale set, run the bundled form (make relay writes
# dist/add-relay-bundled.sh: this script with the relay appended) with run-command
# (README: "Add the relay to an existing VM or scale set"):
#
#   add-relay.sh NAMESPACE_FQDN QUEUE IDENTITY_CLIENT_ID CALLBACK_PORT KEY_SECRET_URI PACKAGE_URL [HEARTBEAT_TABLE]
#
# The deployment output `relayBootstrapArguments` holds these seven values. PACKAGE_URL is
# usually "" (or `embedded`): the relay (scheduled-events-relay.pyz, one file run by the VM's
# own Python 3.9 or newer, standard library only) comes with this script. Otherwise it is
# https://HOST/scheduled-events-relay.pyz#sha256=HEX (a release asset and its checksum);
# the download is installed only if its SHA-256 matches. No secret is passed in: the relay
# key is read from Key Vault with the VM's managed identity (Key Vault Secrets User on that
# one secret), now and hourly after, so a rotated key reaches every VM by itself.
# HEARTBEAT_TABLE (the app's vms table, https://ACCOUNT.table.core.windows.net/TABLE): the
# relay heartbeats there, not to the `heartbeats` queue (six arguments or "": the queue).
# Idempotent: running it again upgrades and restarts the relay.
set -eu

if [ "$#" -ne 6 ] && [ "$#" -ne 7 ]; then
    echo "usage: $0 NAMESPACE_FQDN QUEUE IDENTITY_CLIENT_ID CALLBACK_PORT KEY_SECRET_URI PACKAGE_URL [HEARTBEAT_TABLE]" >&2
    exit 2
fi
NAMESPACE=$1 QUEUE=$2 CLIENT_ID=$3 PORT=$4 SECRET_URI=$5 PACKAGE_URL=$6 TABLE_URL=${7-}
case "$NAMESPACE" in *.servicebus.windows.net) ;; *)
    echo "add-relay.sh: $NAMESPACE is not NAME.servicebus.windows.net" >&2; exit 2 ;; esac
case "$QUEUE" in "" | */* | *[[:space:]]*) echo "add-relay.sh: bad queue name" >&2; exit 2 ;; esac
case "$CLIENT_ID" in *[!0-9a-fA-F-]* | "") echo "add-relay.sh: bad client id" >&2; exit 2 ;; esac
case "$PORT" in *[!0-9]* | "") echo "add-relay.sh: bad port $PORT" >&2; exit 2 ;; esac
case "$SECRET_URI" in https://*.vault.azure.net/secrets/*) ;; *)
    echo "add-relay.sh: $SECRET_URI is not a Key Vault secret URI" >&2; exit 2 ;; esac
SHA256=
case "$PACKAGE_URL" in
    "" | embedded) PACKAGE_URL= ;;
    https://*"#sha256="*)
        SHA256=${PACKAGE_URL##*#sha256=}
        PACKAGE_URL=${PACKAGE_URL%%#*}
        case "$SHA256" in *[!0-9a-f]*) SHA256=bad ;; esac
        [ "${#SHA256}" -eq 64 ] || {
            echo "add-relay.sh: the package URL's #sha256= must be 64 lowercase hex digits" >&2; exit 2; } ;;
    *) echo "add-relay.sh: the package URL must be https://...#sha256=HEX, or empty for the embedded relay" >&2
       exit 2 ;;
esac
# https://ACCOUNT.table.core.SUFFIX/TABLE (SUFFIX: windows.net or another cloud's), ASCII only.
bad_table() { echo "add-relay.sh: $TABLE_URL is not https://ACCOUNT.table.core.windows.net/TABLE" >&2; exit 2; }
if [ -n "$TABLE_URL" ]; then
    lower=abcdefghijklmnopqrstuvwxyz upper=ABCDEFGHIJKLMNOPQRSTUVWXYZ digits=0123456789
    rest=${TABLE_URL#https://} && host=${rest%%/*} && table=${rest#*/} && account=${host%%.*}
    case "$TABLE_URL" in https://*) ;; *) bad_table ;; esac
    case "$host" in "$account".table.core.*) ;; *) bad_table ;; esac
    case "${host#"$account".table.core.}" in "" | .* | *. | *..* | *[!$lower$digits.-]*) bad_table ;; esac
    case "$account" in *[!$lower$digits]*) bad_table ;; esac
    case "$table" in [!$lower$upper]* | *[!$lower$upper$digits]*) bad_table ;; esac
    [ "${#account}" -ge 3 ] && [ "${#account}" -le 24 ] && [ "${#table}" -ge 3 ] && [ "${#table}" -le 63 ] ||
        bad_table
fi
[ "$(id -u)" = 0 ] || { echo "add-relay.sh: run as root" >&2; exit 1; }

ETC=/etc/scheduled-events-relay
PREFIX=/opt/scheduled-events-relay
PYZ=$PREFIX/scheduled-events-relay.pyz
IMDS=http://169.254.169.254/metadata

# The newest Python >= 3.9 on this machine (the relay needs nothing else).
PY=
for candidate in python3 python3.13 python3.12 python3.11 python3.10 python3.9; do
    path=$(command -v "$candidate" 2>/dev/null) || continue
    if "$path" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
        PY=$path
        break
    fi
done
[ -n "$PY" ] || { echo "add-relay.sh: the relay needs Python 3.9 or newer (on RHEL 8: dnf install python39)" >&2; exit 1; }

# The private address the function app calls back (IMDS knows it even before DHCP settles).
ip=$(curl -sf -H Metadata:true --max-time 30 --retry 10 --retry-connrefused \
    "$IMDS/instance/network/interface/0/ipv4/ipAddress/0/privateIpAddress?api-version=2021-02-01&format=text")

# The relay: downloaded and checked, appended to this script (bundled form), or already
# written by cloud-init.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
install -d -m 0755 "$PREFIX"
if [ -n "$PACKAGE_URL" ]; then
    curl -fsSL --retry 10 --retry-connrefused --max-time 300 "$PACKAGE_URL" -o "$work/relay.pyz"
    echo "$SHA256  $work/relay.pyz" | sha256sum -c --quiet - || {
        echo "add-relay.sh: checksum mismatch for $PACKAGE_URL; nothing installed" >&2; exit 1; }
elif grep -q '^__RELAY_PYZ_BASE64__$' "$0"; then
    sed '1,/^__RELAY_PYZ_BASE64__$/d' "$0" | base64 -d > "$work/relay.pyz"
elif [ -f "$PYZ" ]; then
    cp "$PYZ" "$work/relay.pyz"
else
    echo "add-relay.sh: no relay: pass PACKAGE_URL, or run the bundled form (make relay)" >&2
    exit 2
fi
"$PY" -I "$work/relay.pyz" --help >/dev/null || { echo "add-relay.sh: the relay does not run on $PY" >&2; exit 1; }
if ! id scheduled-events-relay >/dev/null 2>&1; then
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin scheduled-events-relay
fi
install -m 0644 "$work/relay.pyz" "$PYZ.new"
mv -f "$PYZ.new" "$PYZ"
install -d -m 0750 -g scheduled-events-relay "$ETC"

# The unit: relay/deploy/scheduled-events-relay.service, verbatim (a test keeps them equal).
cat > "$work/unit" <<'UNIT_FILE'
# Scheduled Events relay: polls IMDS, forwards every changed document, approves on a signed
# callback. One file (scheduled-events-relay.pyz) run by the VM's own Python 3.9 or newer,
# standard library only. Installed by relay/deploy/install.sh or infra/relay/add-relay.sh,
# which put the absolute path of a Python >= 3.9 in ExecStart if /usr/bin/python3 is older.
# Settings: /etc/scheduled-events-relay/relay.env (RELAY_* variables;
# RELAY_CONFIG=/etc/scheduled-events-relay/relay.json for a file).
[Unit]
Description=Azure Scheduled Events relay
Documentation=https://github.com/ (see README: "The relay on a VM")
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
User=scheduled-events-relay
Group=scheduled-events-relay
EnvironmentFile=/etc/scheduled-events-relay/relay.env
Environment=PYTHONDONTWRITEBYTECODE=1
Environment=RELAY_STATE_DIR=/var/lib/scheduled-events-relay
ExecStart=/usr/bin/python3 -I /opt/scheduled-events-relay/scheduled-events-relay.pyz
Restart=always
RestartSec=2
TimeoutStopSec=20
# Exit status 2 is a bad setting: restarting cannot fix it, and it is logged once.
RestartPreventExitStatus=2

# State (outbox, sequence, hook results) lives here and survives restarts.
StateDirectory=scheduled-events-relay
StateDirectoryMode=0750
UMask=0027

# Hardening. Hook scripts run as children under the same sandbox: a drain hook that needs
# more (writing elsewhere, talking to a root-only socket) needs a drop-in, e.g.
#   systemctl edit scheduled-events-relay   ->   [Service] ReadWritePaths=/run/myapp
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
CapabilityBoundingSet=
AmbientCapabilities=
# Small by design (about 15 MB resident); a leak is stopped long before it hurts the VM.
MemoryHigh=64M
MemoryMax=128M
TasksMax=64

[Install]
WantedBy=multi-user.target
UNIT_FILE
sed "s|^ExecStart=/usr/bin/python3 |ExecStart=$PY |" "$work/unit" > /etc/systemd/system/scheduled-events-relay.service

umask 027
cat > "$ETC/relay.env.new" <<ENV
RELAY_FORWARD=servicebus://$NAMESPACE/$QUEUE
RELAY_IDENTITY_CLIENT_ID=$CLIENT_ID
RELAY_CALLBACK_LISTEN=0.0.0.0:$PORT
RELAY_CALLBACK_KEY_FILE=$ETC/callback.key
RELAY_CALLBACK_URL=http://$ip:$PORT
ENV
[ -z "$TABLE_URL" ] || echo "RELAY_HEARTBEAT_TABLE=$TABLE_URL" >> "$ETC/relay.env.new"
chgrp scheduled-events-relay "$ETC/relay.env.new"
mv "$ETC/relay.env.new" "$ETC/relay.env"

umask 022
cat > /usr/local/sbin/scheduled-events-relay-key <<PY
#!/usr/bin/env python3
"""Fetch the relay key from Key Vault with the VM's managed identity.

Writes $ETC/callback.key (root:scheduled-events-relay 0640) atomically and restarts the
relay only when the key changed. Exits non-zero until the role assignment has propagated.
Never prints the key.
"""
import grp, json, os, subprocess, sys, urllib.parse, urllib.request

SECRET_URI = "$SECRET_URI"
CLIENT_ID = "$CLIENT_ID"
KEY_FILE = "$ETC/callback.key"
UNIT = "scheduled-events-relay.service"

query = urllib.parse.urlencode({"api-version": "2018-02-01",
                                "resource": "https://vault.azure.net",
                                "client_id": CLIENT_ID})
req = urllib.request.Request("$IMDS/identity/oauth2/token?" + query,
                             headers={"Metadata": "true"})
with urllib.request.urlopen(req, timeout=30) as resp:
    token = json.loads(resp.read())["access_token"]
req = urllib.request.Request(SECRET_URI + "?api-version=7.4",
                             headers={"Authorization": "Bearer " + token})
with urllib.request.urlopen(req, timeout=30) as resp:
    key = json.loads(resp.read())["value"].strip()
if not key or "\\n" in key:
    sys.exit("relay key in Key Vault is empty or spans lines")
old = None
if os.path.exists(KEY_FILE):
    with open(KEY_FILE) as f:
        old = f.read().strip()
if key == old:
    sys.exit(0)
tmp = KEY_FILE + ".tmp"
fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
with os.fdopen(fd, "w") as f:
    f.write(key + "\\n")
    f.flush()
    os.fsync(f.fileno())
os.chown(tmp, 0, grp.getgrnam("scheduled-events-relay").gr_gid)
os.replace(tmp, KEY_FILE)
print("relay key updated from Key Vault", file=sys.stderr)
if old is not None:
    subprocess.run(["systemctl", "try-restart", UNIT], check=False)
PY
chmod 0755 /usr/local/sbin/scheduled-events-relay-key

cat > /etc/systemd/system/scheduled-events-relay-key.service <<UNIT
[Unit]
Description=Fetch the Scheduled Events relay key from Key Vault
After=network-online.target
Wants=network-online.target
[Service]
Type=oneshot
ExecStart=/usr/local/sbin/scheduled-events-relay-key
UNIT
cat > /etc/systemd/system/scheduled-events-relay-key.timer <<UNIT
[Unit]
Description=Refresh the Scheduled Events relay key hourly (rotation)
[Timer]
OnBootSec=5min
OnUnitActiveSec=1h
RandomizedDelaySec=5min
[Install]
WantedBy=timers.target
UNIT

# A new identity's role assignment can take minutes to reach Key Vault: retry for 15.
n=0
until /usr/local/sbin/scheduled-events-relay-key; do
    n=$((n + 1))
    [ "$n" -ge 90 ] && { echo "add-relay.sh: cannot read the relay key from Key Vault" >&2; exit 1; }
    sleep 10
done
systemctl daemon-reload
systemctl enable --now scheduled-events-relay-key.timer
systemctl enable scheduled-events-relay.service
systemctl restart scheduled-events-relay.service
echo "add-relay.sh: relay running on $PY, callback http://$ip:$PORT; logs: journalctl -u scheduled-events-relay"
exit 0
