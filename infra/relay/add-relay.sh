#!/bin/sh
# Install and start the Scheduled Events relay on this VM, wired to the bridge. Run as root.
# cloud-init runs it on first boot (infra/relay/cloud-init.yaml, which also writes the relay
# itself); for an existing VM or scale set, run the bundled form (make relay writes
# dist/add-relay-bundled.sh: this script with the relay appended) with run-command
# (README: "Add the relay to an existing VM or scale set"):
#
#   add-relay.sh NAMESPACE_FQDN QUEUE IDENTITY_CLIENT_ID CALLBACK_PORT none PACKAGE_URL [LIVENESS_TABLE_URL [HOOKS [READY [HOOK_AS]]]]
#
# The deployment output `relayBootstrapArguments` holds these seven values. The 5th is the
# word `none` (or ""): it was the relay key's Key Vault secret URI, and stays as a placeholder
# so the 6th and 7th keep their places. There is no shared relay key any more: the relay makes
# its own callback key at first start (callback-key.json in its state directory, 0600) and the
# app learns it from the relay's attested messages. A Key Vault URI there (an older caller) is
# ignored with a warning; nothing is ever read from Key Vault.
# PACKAGE_URL is usually "" (or `embedded`): the relay (scheduled-events-relay.pyz, one file
# run by the VM's own Python 3.9 or newer, standard library only) comes with this script.
# Otherwise it is https://HOST/scheduled-events-relay.pyz#sha256=HEX (a release asset and its
# checksum); the download is installed only if its SHA-256 matches.
# LIVENESS_TABLE_URL (the relays' liveness table, https://ACCOUNT.table.core.windows.net/
# PREFIXliveness): the relay writes its signed heartbeat row there (RELAY_HEARTBEAT_TABLE),
# not to the `heartbeats` queue (six arguments or "": the queue).
# HOOKS (optional, after the table URL): the relay's hook scripts, NAME=/abs/path[,NAME=/abs/path]
# (e.g. drain=/opt/drain.sh,undrain=/opt/undrain.sh; "" or none: no hooks), written to relay.env
# as RELAY_HOOKS. Each must be an executable file already on the VM: a missing one is refused
# here, before anything is installed (the relay would otherwise refuse to start).
# READY (optional, after HOOKS): the port of the readiness probe for a load balancer, GET
# /readyz on READY (all addresses): on by default, port 8493 ("" too), so the bridge can
# take the VM out of its load balancer before Azure reboots, redeploys, evicts or deletes
# it with no script of yours (issue 38); `off` (or 0): no probe. Served by the readiness
# responder (scheduled-events-relay-ready.socket and .service, issue 44), never by the
# relay: a relay that is down, restarting or removed leaves it answering 200 (fail open).
# HOOK_AS (optional, after READY): who hook scripts run as, USER[:GROUP,...][+CAP,...] (e.g.
# root, www-data:docker, nginx+CAP_KILL; default: a user made for each run, no capabilities),
# in a unit of their own outside the relay's sandbox (scheduled-events-relay-hook.socket and
# @.service, relay/hooks.py), stated in one drop-in written here:
# /etc/systemd/system/scheduled-events-relay-hook@.service.d/rights.conf.
# Operator settings belong in /etc/scheduled-events-relay/relay.local.env, which the unit reads
# after relay.env (so its values win) and this script never rewrites: relay.env is this
# script's and is rewritten on every run (an upgrade).
# The relay listens on 0.0.0.0:CALLBACK_PORT; the app calls the VM's private address as Azure
# knows it, so nothing here looks the address up or advertises it.
# Idempotent: running it again upgrades and restarts the relay (and removes what the shared-key
# versions left: callback.key and the scheduled-events-relay-key timer).
set -eu

if [ "$#" -lt 6 ] || [ "$#" -gt 10 ]; then
    echo "usage: $0 NAMESPACE_FQDN QUEUE IDENTITY_CLIENT_ID CALLBACK_PORT none PACKAGE_URL [LIVENESS_TABLE_URL [HOOKS [READY [HOOK_AS]]]]" >&2
    exit 2
fi
NAMESPACE=$1 QUEUE=$2 CLIENT_ID=$3 PORT=$4 SECRET_URI=$5 PACKAGE_URL=$6 TABLE_URL=${7-} HOOKS=${8-}
READY=${9-} HOOK_AS=${10-}
case "$NAMESPACE" in *.servicebus.windows.net) ;; *)
    echo "add-relay.sh: $NAMESPACE is not NAME.servicebus.windows.net" >&2; exit 2 ;; esac
case "$QUEUE" in "" | */* | *[[:space:]]*) echo "add-relay.sh: bad queue name" >&2; exit 2 ;; esac
case "$CLIENT_ID" in *[!0-9a-fA-F-]* | "") echo "add-relay.sh: bad client id" >&2; exit 2 ;; esac
case "$PORT" in *[!0-9]* | "") echo "add-relay.sh: bad port $PORT" >&2; exit 2 ;; esac
case "$READY" in off | 0) READY= ;; "") READY=8493 ;; *[!0-9]*) READY=x ;; esac
[ -z "$READY" ] || { [ "$READY" -le 65535 ] && [ "$READY" != "$PORT" ]; } 2>/dev/null ||
    { echo "add-relay.sh: readiness port ${9}: 1-65535 (not $PORT) or off" >&2; exit 2; }
# The 5th argument is a placeholder now: `none` or "" (an older caller's Key Vault secret URI
# is ignored with a warning: the relay makes its own key; no key is read from Key Vault).
case "$SECRET_URI" in
    "" | none) ;;
    https://*.vault.azure.net/secrets/* | https://*.vault.azure.cn/secrets/* | https://*.vault.usgovcloudapi.net/secrets/*)
        echo "add-relay.sh: warning: ignoring the 5th argument (a Key Vault secret URI): the relay makes its own key" >&2 ;;
    *) echo "add-relay.sh: the 5th argument must be none (was: the relay key's Key Vault secret URI)" >&2; exit 2 ;;
esac
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
# HOOKS -> RELAY_HOOKS, a JSON object: {"drain": "/opt/drain.sh", ...}.
HOOKS_JSON=
[ "$HOOKS" = none ] && HOOKS=
if [ -n "$HOOKS" ]; then
    rest=$HOOKS,
    while [ -n "$rest" ]; do
        item=${rest%%,*} rest=${rest#*,}
        name=${item%%=*} path=${item#*=}
        case "$item" in *=*) ;; *) name= ;; esac
        case "$name" in "" | *[!A-Za-z0-9_.-]*)
            echo "add-relay.sh: hook '$item' is not NAME=/abs/path (NAME: letters, digits, - _ .)" >&2; exit 2 ;; esac
        case "$path" in /*) ;; *) echo "add-relay.sh: hook $name: $path is not an absolute path" >&2; exit 2 ;; esac
        case "$path" in *[!A-Za-z0-9_./-]*)
            echo "add-relay.sh: hook $name: $path may only use letters, digits, / _ . -" >&2; exit 2 ;; esac
        [ -f "$path" ] && [ -x "$path" ] || {
            echo "add-relay.sh: hook $name: $path is not an executable file on this VM; install it first" >&2; exit 2; }
        HOOKS_JSON="$HOOKS_JSON${HOOKS_JSON:+,}\"$name\":\"$path\""
    done
    HOOKS_JSON="{$HOOKS_JSON}"
fi
# HOOK_AS: USER[:GROUP,...][+CAP,...] -> the hook unit's User=, SupplementaryGroups=, capabilities.
HOOK_USER=${HOOK_AS%%[:+]*} HOOK_GROUPS= HOOK_CAPS=
case "$HOOK_AS" in *+*) HOOK_CAPS=${HOOK_AS#*+} ;; esac
case "$HOOK_AS" in "$HOOK_USER":*) HOOK_GROUPS=${HOOK_AS#*:} HOOK_GROUPS=${HOOK_GROUPS%%+*} ;; esac
bad_as() { echo "add-relay.sh: HOOK_AS $HOOK_AS: $1 (USER[:GROUPS][+CAPS])" >&2; exit 2; }
[ "$HOOK_USER" != scheduled-events-relay ] || bad_as "not the relay's own user (it could read its key)"
[ -z "$HOOK_AS" ] || getent passwd "$HOOK_USER" >/dev/null || bad_as "no user $HOOK_USER"
for g in $(echo "$HOOK_GROUPS" | tr , ' '); do getent group "$g" >/dev/null || bad_as "no group $g"; done
CAPS=$(echo "$HOOK_CAPS" | tr , ' ')
for c in $CAPS; do case "$c" in *[!A-Z_]* | [!C]* | C[!A]* | CA[!P]* | CAP | CAP_) bad_as "bad capability $c" ;; esac; done
[ "$(id -u)" = 0 ] || { echo "add-relay.sh: run as root" >&2; exit 1; }

ETC=/etc/scheduled-events-relay
PREFIX=/opt/scheduled-events-relay
PYZ=$PREFIX/scheduled-events-relay.pyz

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

# The relay: downloaded and checked, appended to this script (bundled form), or already
# written by cloud-init (xz-compressed: scheduled-events-relay.pyz.xz).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
install -d -m 0755 "$PREFIX"
if [ -n "$PACKAGE_URL" ]; then
    curl -fsSL --retry 10 --retry-connrefused --max-time 300 "$PACKAGE_URL" -o "$work/relay.pyz"
    echo "$SHA256  $work/relay.pyz" | sha256sum -c --quiet - || {
        echo "add-relay.sh: checksum mismatch for $PACKAGE_URL; nothing installed" >&2; exit 1; }
elif grep -q '^__RELAY_PYZ_BASE64__$' "$0"; then
    sed '1,/^__RELAY_PYZ_BASE64__$/d' "$0" | base64 -d > "$work/relay.pyz"
elif [ -f "$PYZ.xz" ]; then
    # cloud-init's copy (infra/relay/cloud-init.yaml): xz, which cloud-init cannot unpack.
    "$PY" -c 'import lzma,sys;sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' "$PYZ.xz" > "$work/relay.pyz" ||
        xz -dc "$PYZ.xz" > "$work/relay.pyz" ||
        { echo "add-relay.sh: cannot unpack $PYZ.xz (no lzma module in $PY, no xz)" >&2; exit 1; }
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
rm -f "$PYZ.xz"
install -d -m 0750 -g scheduled-events-relay "$ETC"

# The unit: relay/deploy/scheduled-events-relay.service, verbatim (a test keeps them equal).
cat > "$work/unit" <<'UNIT_FILE'
# Scheduled Events relay: polls IMDS, forwards every changed document, approves on a signed
# callback. One file (scheduled-events-relay.pyz) run by the VM's own Python 3.9 or newer,
# standard library only. Installed by relay/deploy/install.sh or infra/relay/add-relay.sh,
# which put the absolute path of a Python >= 3.9 in ExecStart if /usr/bin/python3 is older.
# Settings: /etc/scheduled-events-relay/relay.env (RELAY_* variables; the operator's own in
# relay.local.env, read after it;
# RELAY_CONFIG=/etc/scheduled-events-relay/relay.json for a file).
[Unit]
Description=Azure Scheduled Events relay
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
User=scheduled-events-relay
Group=scheduled-events-relay
EnvironmentFile=/etc/scheduled-events-relay/relay.env
# The operator's own settings (hooks, ...): read after relay.env, so they win; never rewritten.
EnvironmentFile=-/etc/scheduled-events-relay/relay.local.env
Environment=PYTHONDONTWRITEBYTECODE=1
Environment=RELAY_STATE_DIR=/var/lib/scheduled-events-relay
ExecStart=/usr/bin/python3 -I /opt/scheduled-events-relay/scheduled-events-relay.pyz
Restart=always
RestartSec=2
TimeoutStopSec=20
# Exit status 2 is a bad setting: restarting cannot fix it, and it is logged once.
RestartPreventExitStatus=2

# Its callback port, held by systemd (scheduled-events-relay-callback.socket, issue 46).
Sockets=scheduled-events-relay-callback.socket
# The drain it publishes for the readiness responder (RELAY_DRAIN_FILE, issue 44): kept
# across restarts, gone when the relay is stopped (a stopped relay drains nothing).
RuntimeDirectory=scheduled-events-relay
RuntimeDirectoryMode=0755
RuntimeDirectoryPreserve=restart

# State (outbox, sequence, hook results) lives here and survives restarts.
StateDirectory=scheduled-events-relay
# 0700: the relay's own callback key (callback-key.json, 0600) lives here (issue 22).
StateDirectoryMode=0700
UMask=0027

# Hardening. The relay runs no hook script itself: scheduled-events-relay-hook@ does, with
# the rights its drop-in gives (relay/hooks.py).
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
ENV
[ -z "$TABLE_URL" ] || echo "RELAY_HEARTBEAT_TABLE=$TABLE_URL" >> "$ETC/relay.env.new"
[ -z "$HOOKS_JSON" ] || echo "RELAY_HOOKS='$HOOKS_JSON'" >> "$ETC/relay.env.new"
[ -z "$READY" ] || echo "RELAY_DRAIN_FILE=/run/scheduled-events-relay/drain.json" >> "$ETC/relay.env.new"
chgrp scheduled-events-relay "$ETC/relay.env.new"
mv "$ETC/relay.env.new" "$ETC/relay.env"
# The operator's own settings (hooks, ...): read after relay.env, never rewritten.
if [ ! -e "$ETC/relay.local.env" ]; then
    printf '%s\n' "# Your RELAY_* settings, one NAME=value a line, e.g. RELAY_HOOKS='{\"drain\": \"/opt/drain.sh\"}'" \
        '# Read after relay.env, so a value here wins. add-relay.sh rewrites relay.env on every' \
        '# upgrade, never this file. Then: systemctl restart scheduled-events-relay' > "$ETC/relay.local.env"
    chgrp scheduled-events-relay "$ETC/relay.local.env"
fi

# Left by the shared-key versions of this script: the Key Vault fetcher, its timer, the key.
if [ -f /etc/systemd/system/scheduled-events-relay-key.timer ]; then
    systemctl disable --now scheduled-events-relay-key.timer >/dev/null 2>&1 || true
fi
rm -f /etc/systemd/system/scheduled-events-relay-key.timer \
    /etc/systemd/system/scheduled-events-relay-key.service \
    /usr/local/sbin/scheduled-events-relay-key "$ETC/callback.key" "$ETC/callback.key.tmp"

# The hook unit: relay/deploy/scheduled-events-relay-hook.socket and @.service, verbatim (a
# test keeps them equal); its rights from HOOK_AS in one drop-in.
S=/etc/systemd/system
umask 022
cat > $S/scheduled-events-relay-hook.socket <<'HOOK_SOCKET'
# Where the relay asks for a hook run (relay/hooks.py): one scheduled-events-relay-hook@
# instance per connection. Only root and the relay's group may connect.
[Unit]
Description=Azure Scheduled Events relay: hook runs on request

[Socket]
ListenStream=/run/scheduled-events-relay-hooks.sock
SocketGroup=scheduled-events-relay
SocketMode=0660
Accept=yes
MaxConnections=16

[Install]
WantedBy=sockets.target
HOOK_SOCKET
cat > "$work/hook-unit" <<'HOOK_UNIT'
# One hook run (relay/hooks.py): the script its own RELAY_HOOKS names, never the relay's
# word. Its rights: the drop-in scheduled-events-relay-hook@.service.d/rights.conf
# (add-relay.sh's HOOK_AS); without one, a user made for the run (DynamicUser=: read-only
# file system, no capabilities).
[Unit]
Description=Azure Scheduled Events relay hook run

[Service]
DynamicUser=yes
StandardInput=socket
StandardOutput=socket
StandardError=journal
EnvironmentFile=/etc/scheduled-events-relay/relay.env
EnvironmentFile=-/etc/scheduled-events-relay/relay.local.env
ExecStart=/usr/bin/python3 -I /opt/scheduled-events-relay/scheduled-events-relay.pyz run-hook
# The script's own limit is RELAY_HOOK_TIMEOUT (at most 3600 s); this is the backstop.
RuntimeMaxSec=3660
NoNewPrivileges=yes
HOOK_UNIT
sed "s|^ExecStart=/usr/bin/python3 |ExecStart=$PY |" "$work/hook-unit" > $S/scheduled-events-relay-hook@.service
install -d $S/scheduled-events-relay-hook@.service.d
{
    echo "[Service]"
    [ -z "$HOOK_AS" ] || echo "DynamicUser=no
User=$HOOK_USER
SupplementaryGroups=$(echo "$HOOK_GROUPS" | tr , ' ')"
    [ -z "$CAPS" ] || echo "AmbientCapabilities=$CAPS"
    [ -z "$HOOK_AS" ] || [ "$CAPS$HOOK_USER" = root ] || echo "CapabilityBoundingSet=$CAPS" # root alone: all of root's
} > $S/scheduled-events-relay-hook@.service.d/rights.conf

# The ports, held by systemd from boot (issue 46: no local user can take them), and the
# readiness responder that answers the probe whatever the relay does (issue 44):
# relay/deploy/scheduled-events-relay-callback.socket, -ready.socket and -ready.service,
# verbatim but for their ports and Python (a test keeps them equal).
cat > "$work/callback-socket" <<'CALLBACK_SOCKET'
# The relay's callback port (issue 46), held by systemd from boot: root binds it, so no
# local user can take it while the relay restarts. Passed to the relay (Sockets=).
[Unit]
Description=Azure Scheduled Events relay: callback port

[Socket]
ListenStream=8492
FileDescriptorName=callback
Service=scheduled-events-relay.service

[Install]
WantedBy=sockets.target
CALLBACK_SOCKET
sed "s|^ListenStream=8492$|ListenStream=$PORT|" "$work/callback-socket" > $S/scheduled-events-relay-callback.socket
if [ -n "$READY" ]; then
    cat > "$work/ready-socket" <<'READY_SOCKET'
# The load balancer's readiness probe port (issue 44), held by systemd from boot: root binds
# it, no local user can take it, and it stays open while the responder or the relay
# restarts (a probe made meanwhile waits in its queue). Passed to the responder.
[Unit]
Description=Azure Scheduled Events relay: readiness probe port

[Socket]
ListenStream=8493
FileDescriptorName=ready
Service=scheduled-events-relay-ready.service

[Install]
WantedBy=sockets.target
READY_SOCKET
    sed "s|^ListenStream=8493$|ListenStream=$READY|" "$work/ready-socket" > $S/scheduled-events-relay-ready.socket
    cat > "$work/ready-unit" <<'READY_UNIT'
# The readiness responder (relay/responder.py): GET /readyz on the socket unit's port, from
# the drain the relay publishes (RELAY_DRAIN_FILE); 200 whenever the relay is absent (fail
# open). Modes: RELAY_READY_APP_HEALTH, RELAY_READY_SIGNAL_FILE in relay.local.env.
[Unit]
Description=Azure Scheduled Events relay: readiness responder
# Never give up restarting it: its port stays held meanwhile.
StartLimitIntervalSec=0

[Service]
DynamicUser=yes
Sockets=scheduled-events-relay-ready.socket
# status.json (probe times, read by the relay), timeline.jsonl, the drain-signal file.
RuntimeDirectory=scheduled-events-relay-ready
RuntimeDirectoryMode=0755
EnvironmentFile=-/etc/scheduled-events-relay/relay.env
EnvironmentFile=-/etc/scheduled-events-relay/relay.local.env
ExecStart=/usr/bin/python3 -I /opt/scheduled-events-relay/scheduled-events-relay.pyz ready
Restart=always
RestartSec=1
NoNewPrivileges=yes
PrivateDevices=yes
CapabilityBoundingSet=
MemoryMax=64M

[Install]
WantedBy=multi-user.target
READY_UNIT
    sed "s|^ExecStart=/usr/bin/python3 |ExecStart=$PY |" "$work/ready-unit" > $S/scheduled-events-relay-ready.service
else
    systemctl disable --now scheduled-events-relay-ready.socket scheduled-events-relay-ready.service >/dev/null 2>&1 || true
    rm -f $S/scheduled-events-relay-ready.socket $S/scheduled-events-relay-ready.service
fi

systemctl daemon-reload
systemctl enable --now scheduled-events-relay-hook.socket
# A relay before 0.2.0 binds its ports itself: stopped first, so the sockets can take them
# (its probe port is closed for that moment, once). Later upgrades restart it in place.
systemctl is-active --quiet scheduled-events-relay-callback.socket || systemctl stop scheduled-events-relay.service
systemctl enable --now scheduled-events-relay-callback.socket
if [ -n "$READY" ]; then
    systemctl enable --now scheduled-events-relay-ready.socket
    systemctl try-restart scheduled-events-relay-ready.service
fi
systemctl enable scheduled-events-relay.service
systemctl restart scheduled-events-relay.service
echo "add-relay.sh: relay running on $PY, callback on port $PORT, readiness ${READY:-off}, hooks as ${HOOK_AS:-a user of their own}; logs: journalctl -u scheduled-events-relay"
exit 0
