"""Fetch Debian bullseye's Python 3.9 into .cache/py39/ (no system change) for the relay tests.

    python3 tests/relay/python39.py     (make test-py39 runs it, then the relay tests on 3.9)

The relay promises to run on a stock image's Python, and Debian 11's 3.9 is the oldest it
supports. apt-get here uses a project-local sources list (the bullseye suites of the mirror
this machine already uses, per /etc/apt/sources.list*), state and cache under .cache/py39/,
so nothing system-wide changes; `dpkg -x` unpacks the packages into .cache/py39/root/, and
.cache/py39/python3.9 is a wrapper that runs that interpreter with its own libraries
(libssl1.1, libffi7, ...) and without site-packages (-I -S): the standard library only, as
on a fresh VM.

Prints the wrapper's path on the last line of stdout. Exit status 0 with "SKIP: ..." on
stderr when apt is missing outside CI; in CI (CI=true) that is an error.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "py39"
WRAPPER = CACHE / "python3.9"
STAMP = CACHE / ".complete"
SUITE = "bullseye"
# The interpreter, its standard library, and the libraries bookworm and later no longer
# ship under these sonames (libssl1.1 for ssl/hashlib, libffi7 for ctypes, libmpdec3 for
# decimal); everything else it links (libc, libz, libexpat) any newer Debian has.
PACKAGES = (
    "python3.9-minimal",
    "libpython3.9-minimal",
    "libpython3.9-stdlib",
    "libssl1.1",
    "libffi7",
    "libmpdec3",
)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Where a Debian release goes once it leaves the mirrors (https://www.debian.org/distrib/archive:
# "archive.debian.org"). Bullseye's LTS ended on 2026-08-31, so the regular mirrors will drop
# it; the archive's Release files carry an expired Valid-Until, which apt must be told to
# accept (the packages are still checked against the archive keyring's signatures).
ARCHIVE = "http://archive.debian.org/debian"
ARCHIVE_SECURITY = "http://archive.debian.org/debian-security"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def mirror() -> str:
    """The Debian mirror this machine already uses (its main archive, not security)."""
    texts = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if path.suffix in (".list", ".sources") or path.name == "sources.list":
            try:
                texts.append(path.read_text(encoding="utf-8", errors="replace"))
            except OSError:
                continue
    for text in texts:
        for match in re.finditer(r"(?:URIs:\s*|^deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text, re.M):
            uri = match.group(1).rstrip("/")
            if uri.startswith("http") and uri.endswith("/debian"):
                return uri
    return DEFAULT_MIRROR


def skip_or_fail(reason: str) -> None:
    if os.environ.get("CI") == "true":
        sys.exit(f"python39: {reason} (CI=true: the relay must be tested on Python 3.9)")
    print(f"SKIP: relay tests on Python 3.9: {reason}", file=sys.stderr)
    sys.exit(0)


def sources(base: str, security: str, signed: str) -> str:
    """The project-local sources.list for bullseye from one archive and its security twin."""
    return (
        f"deb{signed} {base} {SUITE} main\n"
        f"deb{signed} {base} {SUITE}-updates main\n"
        f"deb{signed} {security} {SUITE}-security main\n"
    )


def candidates(base: str, signed: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """Where to look, in order: this machine's mirror, then Debian's archive (for when the
    mirror no longer carries bullseye). Each: (what, sources.list text, extra apt options)."""
    security = base.rsplit("/", 1)[0] + "/debian-security"
    return [
        (base, sources(base, security, signed), ()),
        (
            ARCHIVE,
            # -updates is left out: its packages reach main at each point release, and one
            # suite missing from the archive would fail the whole `apt-get update`.
            f"deb{signed} {ARCHIVE} {SUITE} main\n"
            f"deb{signed} {ARCHIVE_SECURITY} {SUITE}-security main\n",
            ("-oAcquire::Check-Valid-Until=false",),
        ),
    ]


def apt(*args: str) -> None:
    apt_dir = CACHE / "apt"
    options = [
        f"-oDir::Etc::SourceList={apt_dir / 'sources.list'}",
        "-oDir::Etc::SourceParts=/nonexistent",
        f"-oDir::State={apt_dir / 'state'}",
        f"-oDir::State::status={apt_dir / 'status'}",
        f"-oDir::Cache={apt_dir / 'cache'}",
        "-oDebug::NoLocking=1",
        "-oAcquire::Languages=none",
        "-qq",
    ]
    if os.geteuid() == 0:  # apt would switch to _apt, who cannot write under .cache/
        options.append("-oAPT::Sandbox::User=root")
    subprocess.run(["apt-get", *options, *args], check=True, cwd=CACHE / "debs")


def fetch() -> None:
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        skip_or_fail("apt-get/dpkg not found (Debian or Ubuntu needed to fetch bullseye's 3.9)")
    apt_dir = CACHE / "apt"
    for sub in ("state/lists/partial", "cache/archives/partial"):
        (apt_dir / sub).mkdir(parents=True, exist_ok=True)
    (CACHE / "debs").mkdir(parents=True, exist_ok=True)
    (apt_dir / "status").touch()
    signed = f" [signed-by={KEYRING}]" if Path(KEYRING).exists() else ""
    download(candidates(mirror(), signed), apt, apt_dir / "sources.list")
    root = CACHE / "root"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    for deb in sorted((CACHE / "debs").glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    libs = sorted({str(p.parent) for p in root.glob("**/lib*.so*")})
    WRAPPER.write_text(
        "#!/bin/sh\n"
        "# Debian bullseye's Python 3.9, unpacked by tests/relay/python39.py; stdlib only.\n"
        f'LD_LIBRARY_PATH="{":".join(libs)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" \\\n'
        f'  exec "{root}/usr/bin/python3.9" -I -S "$@"\n'
    )
    WRAPPER.chmod(0o755)


def download(
    where: list[tuple[str, str, tuple[str, ...]]], run: Callable[..., None], listing: Path
) -> str:
    """Download PACKAGES from the first place that has them all; returns that place.
    A failed place is said on stderr before the next is tried, so a log shows the fallback."""
    failures = []
    for base, text, extra in where:
        listing.write_text(text)
        try:
            run(*extra, "update")
            run(*extra, "download", *PACKAGES)
        except subprocess.CalledProcessError as exc:
            failures.append(f"{base}: {exc}")
            print(
                f"python39: {base} did not serve bullseye ({exc}); trying the next", file=sys.stderr
            )
            continue
        return base
    skip_or_fail("apt-get failed everywhere: " + "; ".join(failures))
    return ""


def check() -> str:
    probe = (
        "import sys, ssl, hashlib, json, zlib, http.client, urllib.request, email.utils;"
        "assert sys.version_info[:2] == (3, 9), sys.version;"
        "print(sys.version.split()[0], ssl.OPENSSL_VERSION)"
    )
    return subprocess.run(
        [str(WRAPPER), "-c", probe], check=True, capture_output=True, text=True, timeout=60
    ).stdout.strip()


def main() -> int:
    if not STAMP.exists() or not WRAPPER.exists():
        fetch()
        STAMP.write_text(check() + "\n")
    print(f"python39: {check()}", file=sys.stderr)
    print(WRAPPER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
