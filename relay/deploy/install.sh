#!/bin/sh
# Install (or upgrade) the Scheduled Events relay on this VM. Idempotent; run as root.
#
#   sudo relay/deploy/install.sh [--no-start]
#
# It installs the relay package that contains this script (the relay/ directory it sits in):
#   /opt/scheduled-events-relay/venv   a virtualenv with relay/requirements.txt (pinned)
#   /opt/scheduled-events-relay/app    the relay package (python -m relay)
#   /etc/scheduled-events-relay/       relay.env (settings), callback.key (yours to write)
#   /var/lib/scheduled-events-relay    state: outbox, sequence, hook results (systemd-managed)
# If a wheels/ directory sits next to relay/, pip installs from it offline (--no-index).
set -eu

PREFIX=/opt/scheduled-events-relay
ETC=/etc/scheduled-events-relay
UNIT=scheduled-events-relay.service
SERVICE_USER=scheduled-events-relay
START=yes
[ "${1:-}" = "--no-start" ] && START=no

[ "$(id -u)" = 0 ] || { echo "install.sh: run as root" >&2; exit 1; }
HERE=$(cd "$(dirname "$0")" && pwd)
PACKAGE=$(dirname "$HERE")              # .../relay
SOURCE=$(dirname "$PACKAGE")            # directory holding relay/ (and maybe wheels/)
[ -f "$PACKAGE/__main__.py" ] || { echo "install.sh: $PACKAGE is not the relay package" >&2; exit 1; }
PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "install.sh: the relay needs Python 3.11 or newer ($PYTHON is older)" >&2; exit 1; }
"$PYTHON" -m venv --help >/dev/null 2>&1 || {
    echo "install.sh: python3-venv is missing (apt-get install python3-venv)" >&2; exit 1; }

if ! id "$SERVICE_USER" >/dev/null 2>&1; then
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$SERVICE_USER"
fi

install -d -m 0755 "$PREFIX"
[ -x "$PREFIX/venv/bin/python" ] || "$PYTHON" -m venv "$PREFIX/venv"
if [ -d "$SOURCE/wheels" ]; then
    "$PREFIX/venv/bin/pip" install --quiet --no-index --find-links "$SOURCE/wheels" \
        -r "$PACKAGE/requirements.txt"
else
    "$PREFIX/venv/bin/pip" install --quiet --disable-pip-version-check -r "$PACKAGE/requirements.txt"
fi

# Replace the package atomically: copy beside, then swap.
rm -rf "$PREFIX/app.new"
install -d -m 0755 "$PREFIX/app.new"
cp -R "$PACKAGE" "$PREFIX/app.new/relay"
find "$PREFIX/app.new" -name __pycache__ -prune -exec rm -rf {} +
rm -rf "$PREFIX/app.old"
[ -d "$PREFIX/app" ] && mv "$PREFIX/app" "$PREFIX/app.old"
mv "$PREFIX/app.new" "$PREFIX/app"
rm -rf "$PREFIX/app.old"
chmod -R go-w "$PREFIX"

install -d -m 0750 -g "$SERVICE_USER" "$ETC"
if [ ! -f "$ETC/relay.env" ]; then
    cat > "$ETC/relay.env" <<'ENV'
# Settings of the Scheduled Events relay (RELAY_<SETTING>=value); see the README.
# RELAY_FORWARD=servicebus://NAMESPACE.servicebus.windows.net/documents
# RELAY_CALLBACK_LISTEN=0.0.0.0:8787
# RELAY_CALLBACK_KEY_FILE=/etc/scheduled-events-relay/callback.key
# RELAY_CALLBACK_URL=http://10.0.0.4:8787
ENV
    chmod 0640 "$ETC/relay.env"
    chgrp "$SERVICE_USER" "$ETC/relay.env"
fi
[ -f "$ETC/callback.key" ] && chgrp "$SERVICE_USER" "$ETC/callback.key" && chmod 0640 "$ETC/callback.key"

install -m 0644 "$HERE/$UNIT" "/etc/systemd/system/$UNIT"
systemctl daemon-reload
systemctl enable "$UNIT" >/dev/null
if [ "$START" = yes ]; then
    systemctl restart "$UNIT"
    echo "install.sh: $UNIT (re)started; logs: journalctl -u $UNIT"
else
    echo "install.sh: installed; start with: systemctl start $UNIT"
fi
