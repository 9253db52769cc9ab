#!/bin/sh
# Install and start the Scheduled Events relay on this VM, wired to the bridge. Run as root.
# cloud-init runs it on first boot (infra/relay/cloud-init.yaml); for an existing VM or scale
# set, run it with run-command (README: "Add the relay to an existing VM or scale set"):
#
#   add-relay.sh NAMESPACE_FQDN QUEUE IDENTITY_CLIENT_ID CALLBACK_PORT KEY_SECRET_URI PACKAGE_URL
#
# The deployment output `relayBootstrapArguments` holds these six values. The relay itself
# is installed by relay/deploy/install.sh from the package (relay/deploy/package.sh). No
# secret is passed in: the relay key is read from Key Vault with the VM's managed identity
# (Key Vault Secrets User on that one secret), now and hourly after, so a rotated key
# reaches every VM by itself. Idempotent: running it again upgrades and restarts the relay.
set -eu

if [ "$#" -ne 6 ]; then
    echo "usage: $0 NAMESPACE_FQDN QUEUE IDENTITY_CLIENT_ID CALLBACK_PORT KEY_SECRET_URI PACKAGE_URL" >&2
    exit 2
fi
NAMESPACE=$1 QUEUE=$2 CLIENT_ID=$3 PORT=$4 SECRET_URI=$5 PACKAGE_URL=$6
case "$NAMESPACE" in *.servicebus.windows.net) ;; *)
    echo "add-relay.sh: $NAMESPACE is not NAME.servicebus.windows.net" >&2; exit 2 ;; esac
case "$QUEUE" in "" | */* | *[[:space:]]*) echo "add-relay.sh: bad queue name" >&2; exit 2 ;; esac
case "$CLIENT_ID" in *[!0-9a-fA-F-]* | "") echo "add-relay.sh: bad client id" >&2; exit 2 ;; esac
case "$PORT" in *[!0-9]* | "") echo "add-relay.sh: bad port $PORT" >&2; exit 2 ;; esac
case "$SECRET_URI" in https://*.vault.azure.net/secrets/*) ;; *)
    echo "add-relay.sh: $SECRET_URI is not a Key Vault secret URI" >&2; exit 2 ;; esac
case "$PACKAGE_URL" in https://*) ;; *)
    echo "add-relay.sh: the package URL must be https:// (set relayPackageUrl)" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "add-relay.sh: run as root" >&2; exit 1; }

ETC=/etc/scheduled-events-relay
IMDS=http://169.254.169.254/metadata

# The private address the function app calls back (IMDS knows it even before DHCP settles).
ip=$(curl -sf -H Metadata:true --max-time 30 --retry 10 --retry-connrefused \
    "$IMDS/instance/network/interface/0/ipv4/ipAddress/0/privateIpAddress?api-version=2021-02-01&format=text")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
curl -fsSL --retry 10 --retry-connrefused --max-time 300 "$PACKAGE_URL" -o "$work/relay.tar.gz"
tar -xzf "$work/relay.tar.gz" -C "$work"
sh "$work/relay/deploy/install.sh" --no-start

umask 027
cat > "$ETC/relay.env.new" <<ENV
RELAY_FORWARD=servicebus://$NAMESPACE/$QUEUE
RELAY_IDENTITY_CLIENT_ID=$CLIENT_ID
RELAY_CALLBACK_LISTEN=0.0.0.0:$PORT
RELAY_CALLBACK_KEY_FILE=$ETC/callback.key
RELAY_CALLBACK_URL=http://$ip:$PORT
ENV
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
systemctl restart scheduled-events-relay.service
echo "add-relay.sh: relay running, callback http://$ip:$PORT; logs: journalctl -u scheduled-events-relay"
