"""Offline IaC gate, run by `make infra-check` with the checkov venv's Python.

1. `checkov --framework bicep -d infra` must report no failed check and no parsing error.
2. Every skipped check is skipped inline (`//checkov:skip=ID: reason`) with a real reason,
   and every inline skip is actually used (a stale skip hides the next real finding).
3. The relay cloud-init, rendered with sample values, is valid YAML cloud-config.

Standard library plus PyYAML (a checkov dependency); no network: checkov's guideline
download is switched off.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
CHECKOV = Path(sys.executable).parent / "checkov"
SKIP = re.compile(r"//\s*checkov:skip=([A-Z0-9_]+)(?::\s*(.*))?$")
# The seven arguments cloud-init passes to add-relay.sh, in its order; relay_bootstrap.py uses
# the same values (this file stays importable with the standard library alone). They test the
# script as it is: main.bicep now passes `none` as the 5th (no relay key any more;
# test_cloud_init.py checks that the script takes it once the relay side lands).
SAMPLE = {
    "SERVICEBUS_NAMESPACE": "sb-x.servicebus.windows.net",
    "DOCUMENTS_QUEUE": "documents",
    "IDENTITY_CLIENT_ID": "00000000-0000-0000-0000-000000000000",
    "CALLBACK_PORT": "8492",
    "RELAY_KEY_SECRET_URI": "https://kv-x.vault.azure.net/secrets/relay-key",
    "RELAY_PACKAGE_URL": "",  # the relay embedded in customData
    "HEARTBEAT_TABLE_URL": "https://stsebridgeabc.table.core.windows.net/sebridgeliveness",
    "RELAY_HOOKS": "none",  # hook scripts are the operator's, on their own VMs
    "READY_PORT": "8493",  # the readiness probe (relayReadyPort; `off` when 0)
    "HOOK_AS": "",  # hook scripts' user: add-relay.sh's default (relayHookAs)
}


def run_checkov() -> dict:
    env = dict(os.environ, BC_SKIP_MAPPING="TRUE", CHECKOV_RUN_SCA_PACKAGE_SCAN_V2="false")
    cmd = [str(CHECKOV), "--framework", "bicep", "-d", str(INFRA), "--skip-download", "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        sys.exit(f"infra-check: checkov did not produce a report:\n{proc.stdout}\n{proc.stderr}")
    if isinstance(report, list):
        (report,) = [r for r in report if r.get("check_type") == "bicep"]
    return report


def inline_skips() -> dict[tuple[str, str], str]:
    skips = {}
    for path in sorted(INFRA.rglob("*.bicep")):
        for line in path.read_text().splitlines():
            m = SKIP.search(line.strip())
            if m:
                rel = "/" + path.relative_to(INFRA).as_posix()
                skips.setdefault((rel, m.group(1)), m.group(2) or "")
    return skips


def check_cloud_init(errors: list[str]) -> None:
    import base64
    import gzip
    import importlib.util

    import yaml

    # What customData carries: the script less its comments (relay/deploy/build_pyz.py,
    # loaded by path: this file runs in checkov's environment, outside the repository's).
    spec = importlib.util.spec_from_file_location(
        "build_pyz", INFRA.parent / "relay" / "deploy" / "build_pyz.py"
    )
    assert spec is not None and spec.loader is not None
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    script = builder.slim_script((INFRA / "relay" / "add-relay.sh").read_text()).encode()
    script_gz = (INFRA / "relay" / "add-relay.sh.gz").read_bytes()
    pyz = (INFRA / "relay" / "scheduled-events-relay.pyz.xz").read_bytes()
    values = dict(
        SAMPLE,
        ADD_RELAY_SCRIPT_B64=base64.b64encode(script_gz).decode(),
        RELAY_PYZ_B64=base64.b64encode(pyz).decode(),
    )
    text = (INFRA / "relay" / "cloud-init.yaml").read_text()
    rendered = re.sub(r"\{\{([A-Z0-9_]+)\}\}", lambda m: values[m.group(1)], text)
    try:
        doc = yaml.safe_load(rendered)
    except yaml.YAMLError as exc:
        errors.append(f"cloud-init.yaml is not valid YAML: {exc}")
        return
    if not rendered.startswith("#cloud-config\n") or not isinstance(doc, dict):
        errors.append("cloud-init.yaml must start with #cloud-config and hold a mapping")
        return
    files = {f.get("path"): f for f in doc.get("write_files", [])}
    entry = files.get("/usr/local/sbin/add-scheduled-events-relay", {})
    content = base64.b64decode(entry.get("content", ""))
    if entry.get("encoding") != "gz+b64" or gzip.decompress(content) != script:
        errors.append("cloud-init.yaml: add-relay.sh is not embedded as gz+b64 content")
    if doc.get("runcmd") != [["/usr/local/sbin/add-scheduled-events-relay", *SAMPLE.values()]]:
        errors.append(f"cloud-init.yaml: unexpected runcmd {doc.get('runcmd')}")


def main() -> int:
    started = time.monotonic()
    report = run_checkov()
    summary = report["summary"]
    results = report["results"]
    errors: list[str] = []
    if summary["parsing_errors"]:
        errors.append(f"checkov could not parse: {results.get('parsing_errors')}")
    if not summary["resource_count"] or not summary["passed"]:
        errors.append("checkov scanned nothing: is infra/ empty?")
    for failed in results.get("failed_checks", []):
        errors.append(
            f"FAILED {failed['check_id']} {failed['check_name']} "
            f"{failed['file_path']}:{failed['file_line_range'][0]} {failed['resource']}"
        )
    used = set()
    for skipped in results.get("skipped_checks", []):
        reason = skipped["check_result"].get("suppress_comment", "").strip()
        used.add((skipped["file_path"], skipped["check_id"]))
        if len(reason) < 15 or reason == "No comment provided":
            errors.append(f"skip of {skipped['check_id']} in {skipped['file_path']} has no reason")
    for (path, check_id), reason in inline_skips().items():
        if (path, check_id) not in used:
            errors.append(f"stale inline skip {check_id} in {path} (nothing to skip)")
        if len(reason.strip()) < 15:
            errors.append(f"inline skip {check_id} in {path} needs a one-line reason")
    yaml_errors: list[str] = []
    check_cloud_init(yaml_errors)
    errors += yaml_errors
    elapsed = time.monotonic() - started
    print(
        f"infra-check: checkov {summary['checkov_version']} on {summary['resource_count']} "
        f"resources: {summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['skipped']} skipped (inline, with reasons), "
        f"{summary['parsing_errors']} parsing errors; "
        f"cloud-init {'valid' if not yaml_errors else 'INVALID'}; "
        f"{elapsed:.1f}s"
    )
    for error in errors:
        print(f"infra-check: {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
