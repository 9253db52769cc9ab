#!/bin/sh
# Build the relay tarball that cloud-init (or you) fetches onto a VM:
#
#   relay/deploy/package.sh [OUT.tar.gz] [--wheels]
#
# The tarball holds relay/ (with deploy/install.sh and requirements.txt). With --wheels it
# also holds wheels/ for Linux x86_64 / CPython 3.12 (Ubuntu 24.04), so install.sh needs no
# access to PyPI. Upload it where VMs can read it (a release asset, or a blob with a SAS URL)
# and pass that URL to the Bicep parameter relayPackageUrl.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$(dirname "$HERE")")
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$ROOT/relay/__init__.py")
OUT=${1:-scheduled-events-relay-$VERSION.tar.gz}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -R "$ROOT/relay" "$WORK/relay"
# The IMDS simulator is for rehearsals on a workstation, not for VMs.
rm -rf "$WORK/relay/simulator"
find "$WORK" -name __pycache__ -prune -exec rm -rf {} +
if [ "${2:-}" = "--wheels" ]; then
    python3 -m pip download --quiet --dest "$WORK/wheels" --only-binary=:all: \
        --platform manylinux2014_x86_64 --python-version 3.12 -r "$ROOT/relay/requirements.txt"
fi
tar -czf "$OUT" -C "$WORK" .
echo "$OUT"
