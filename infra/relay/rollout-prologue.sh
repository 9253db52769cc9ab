#!/bin/sh
# The head of what `python -m functions relay rollout` (functions/rollout) runs on each VM
# through managed Run Command, in front of add-relay.sh (docs/rollout.md): it gives
# add-relay.sh the arguments this VM was installed with, read back from the files
# add-relay.sh wrote (relay.env and the hook unit's rights.conf), with only the relay
# package changed. So hooks, the readiness port and HOOK_AS stay as they were, whether the
# relay came from cloud-init (customData), an earlier Run Command or a Custom Script.
# Run Command passes its named parameters as environment variables (Learn, "Run scripts in
# your Linux VM by using managed Run Commands"):
#   RELAY_PACKAGE       https://HOST/scheduled-events-relay.pyz#sha256=HEX, or `embedded`
#                       (the relay appended to this script: the bundled form)
#   RELAY_INSTALL_ARGS  optional: add-relay.sh's arguments for a VM with no relay yet
# Not in customData on purpose: each byte there is room the relay needs.
set -eu
ETC=/etc/scheduled-events-relay
PACKAGE=${RELAY_PACKAGE:-embedded}
env_value() { sed -n "s/^$1=//p" "$ETC/relay.env" | tail -n 1; }
if [ -f "$ETC/relay.env" ]; then
    forward=$(env_value RELAY_FORWARD)
    case "$forward" in servicebus://*/*) ;; *)
        echo "rollout: $ETC/relay.env has no servicebus:// RELAY_FORWARD; install with add-relay.sh" >&2
        exit 2 ;; esac
    rest=${forward#servicebus://}
    listen=$(env_value RELAY_CALLBACK_LISTEN)
    hooks=$(env_value RELAY_HOOKS | tr -d "{}'\"" | sed 's/:/=/g')
    ready=$(env_value RELAY_READY_LISTEN)  # relays before 0.2.0; since, the responder's socket:
    socket=/etc/systemd/system/scheduled-events-relay-ready.socket
    [ ! -f "$socket" ] || ready=$(sed -n 's/^ListenStream=//p' "$socket" | tail -n 1)
    hook_as=
    rights=/etc/systemd/system/scheduled-events-relay-hook@.service.d/rights.conf
    if [ -f "$rights" ] && grep -q '^User=' "$rights"; then
        groups=$(sed -n 's/^SupplementaryGroups=//p' "$rights" | tr -s ' ' ,)
        caps=$(sed -n 's/^AmbientCapabilities=//p' "$rights" | tr -s ' ' ,)
        hook_as=$(sed -n 's/^User=//p' "$rights")${groups:+:$groups}${caps:+"+$caps"}
    fi
    set -- "${rest%%/*}" "${rest#*/}" "$(env_value RELAY_IDENTITY_CLIENT_ID)" "${listen##*:}" none \
        "$PACKAGE" "$(env_value RELAY_HEARTBEAT_TABLE)" "${hooks:-none}" "${ready##*:}" "$hook_as"
    [ -n "$9" ] || set -- "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8" off "${10}"
elif [ -n "${RELAY_INSTALL_ARGS:-}" ]; then
    # shellcheck disable=SC2086 # split into add-relay.sh's arguments on purpose
    set -- $RELAY_INSTALL_ARGS
    [ "$#" -ge 6 ] || { echo "rollout: RELAY_INSTALL_ARGS has $# arguments, not 6 to 10" >&2; exit 2; }
    a1=$1 a2=$2 a3=$3 a4=$4 a5=$5
    shift 6
    set -- "$a1" "$a2" "$a3" "$a4" "$a5" "$PACKAGE" "$@"
else
    echo "rollout: no relay on this VM ($ETC/relay.env missing) and no install arguments given" >&2
    exit 3
fi
echo "rollout: add-relay.sh $*"
# add-relay.sh follows.
