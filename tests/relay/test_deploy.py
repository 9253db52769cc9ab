"""What ships to VMs: one reproducible zipapp, standard library only, its unit, cloud-init."""

from __future__ import annotations

import ast
import base64
import configparser
import hashlib
import io
import os
import subprocess
import sys
import tokenize
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.relay.conftest import RELAY_PYTHON, ROOT, build_pyz, relay_env

DEPLOY = ROOT / "relay" / "deploy"
UNIT = DEPLOY / "scheduled-events-relay.service"


def test_the_pyz_is_reproducible_and_holds_the_relay_only(relay_pyz: Path, tmp_path: Path) -> None:
    again = build_pyz(tmp_path / "again.pyz")
    assert again.read_bytes() == relay_pyz.read_bytes()  # same source, same bytes
    assert relay_pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(relay_pyz) as archive:
        infos = archive.infolist()
    names = [i.filename for i in infos]
    modules = sorted(f"relay/{p.name}" for p in (ROOT / "relay").glob("*.py"))
    assert sorted(names) == sorted(["__main__.py", *modules])
    assert all(i.date_time == (1980, 1, 1, 0, 0, 0) for i in infos)
    assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in infos)


class _AsShipped(ast.NodeTransformer):
    """What the shipped copy may leave out, left out of the source's tree: docstrings
    (a body of only a docstring becomes `...`), annotations of parameters and returns, and
    of assignments inside functions (`x: T = v` is `x = v`)."""

    def __init__(self) -> None:
        self.in_function = False

    def _body(self, node: ast.AST) -> None:
        body = node.body  # type: ignore[attr-defined]
        first = body[0] if body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            node.body = body[1:] or [ast.Expr(ast.Constant(...))]  # type: ignore[attr-defined]

    def visit_Module(self, node: ast.Module) -> ast.AST:
        self._body(node)
        node.body = [n for n in node.body if not _builder().typing_only(n)]
        return self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        self._body(node)
        outer, self.in_function = self.in_function, False
        self.generic_visit(node)
        self.in_function = outer
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self._body(node)
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None:
                arg.annotation = None
        node.returns = None
        outer, self.in_function = self.in_function, True
        self.generic_visit(node)
        self.in_function = outer
        return node

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if self.in_function and node.value is not None:
            return ast.Assign(targets=[node.target], value=node.value)
        return node


def _builder() -> Any:
    """relay/deploy/build_pyz.py as a module (it is a script, not in a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_pyz", DEPLOY / "build_pyz.py")
    assert spec is not None and spec.loader is not None
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    return builder


def test_the_pyz_is_the_same_program_as_the_source(relay_pyz: Path) -> None:
    """The shipped copy is slimmed (relay/deploy/build_pyz.py: slim) to leave customData
    room; its syntax tree is the source's, less only docstrings and annotations nothing
    reads at run time (class-level annotations stay: relay.record reads them)."""
    with zipfile.ZipFile(relay_pyz) as archive:
        shipped = {"__main__.py": DEPLOY / "pyz_main.py"}
        shipped |= {f"relay/{p.name}": p for p in (ROOT / "relay").glob("*.py")}
        for name, path in shipped.items():
            text = archive.read(name).decode()
            tokens = tokenize.generate_tokens(io.StringIO(text).readline)
            assert not [t for t in tokens if t.type == tokenize.COMMENT], name
            assert all(line.strip() for line in text.splitlines()), name  # no blank line
            source = _AsShipped().visit(ast.parse(path.read_text()))
            assert ast.dump(ast.parse(text)) == ast.dump(source), name
            assert len(text) < 0.8 * len(path.read_text()), name


def test_the_pyz_runs_on_the_standard_library_alone(relay_pyz: Path, tmp_path: Path) -> None:
    """-I -S: no site-packages, no PYTHONPATH, no current directory: stdlib and the pyz."""
    check = (
        "import importlib, sys, zipfile; sys.path.insert(0, sys.argv[1]);"
        "names = [n[:-3].replace('/', '.') for n in zipfile.ZipFile(sys.argv[1]).namelist()"
        " if n.startswith('relay/')];"
        "[importlib.import_module(n.replace('.__init__', '')) for n in names];"  # every module
        "assert len(names) >= 15, names;"
        "std = set(getattr(sys, 'stdlib_module_names', ()));"
        "bad = [m for m in sys.modules if std and m.split('.')[0] not in std | {'relay'}"
        " and not m.startswith('_') and m != '__main__'];"
        "sys.exit(f'not standard library: {bad}' if bad else 0)"
    )
    subprocess.run(
        [RELAY_PYTHON, "-I", "-S", "-c", check, str(relay_pyz)],
        cwd=tmp_path,
        env=relay_env(),
        check=True,
        timeout=60,
    )
    help_text = subprocess.run(
        [RELAY_PYTHON, "-I", "-S", str(relay_pyz), "--help"],
        cwd=tmp_path,
        env=relay_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "--forward" in help_text and "--heartbeat-queue" in help_text
    assert "--servicebus-endpoint" not in help_text


def test_the_child_compile_and_the_plain_import_start_the_same_relay(
    relay_pyz: Path, tmp_path: Path
) -> None:
    """pyz_main compiles in a child to save memory; without it (or if it fails) the relay
    imports from the archive as usual. Both must give the same relay."""
    outputs = []
    for extra in ({}, {"RELAY_PYZ_COMPILE_IN_PROCESS": "1"}):
        outputs.append(
            subprocess.run(
                [RELAY_PYTHON, str(relay_pyz), "--forward=file:/x", "--poll-interval=0"],
                cwd=tmp_path,
                env={**relay_env(), **extra},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        )
    assert [o.returncode for o in outputs] == [2, 2]
    assert (
        outputs[0].stderr
        == outputs[1].stderr
        == ("relay: bad settings: --poll-interval: Input should be greater than 0\n")
    )


def test_make_relay_builds_the_pyz(tmp_path: Path) -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "relay/deploy/build_pyz.py $(RELAY_PYZ) --embedded infra/relay/" in makefile


def test_the_unit_is_hardened_restarts_and_runs_the_pyz() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment, method-assign]
    unit.read(UNIT)
    service = unit["Service"]
    assert service["ExecStart"] == (
        "/usr/bin/python3 -I /opt/scheduled-events-relay/scheduled-events-relay.pyz"
    )
    assert service["Restart"] == "always"
    assert service["RestartPreventExitStatus"] == "2"
    assert service["StateDirectory"] == "scheduled-events-relay"
    assert service["User"] == "scheduled-events-relay"
    for setting, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "RestrictSUIDSGID": "yes",
        "StateDirectoryMode": "0700",  # callback-key.json (0600) lives there
    }.items():
        assert service[setting] == value, setting
    # No capabilities at all (issue 38): the relay runs no hook script itself, so it has no
    # user to switch to; the hook unit runs them, with the rights of its own drop-in.
    assert service["CapabilityBoundingSet"] == ""
    assert "AmbientCapabilities" not in service
    assert "CAP_" not in "".join(f"{k}={v}" for k, v in service.items())
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_cloud_init_embeds_the_relay_and_the_unit_and_needs_no_package() -> None:
    text = (DEPLOY / "cloud-init.yaml").read_text()
    assert text.startswith("#cloud-config\n")
    assert "\t" not in text
    for placeholder in (
        "__RELAY_PYZ_B64__",
        "__RELAY_FORWARD__",
        "__RELAY_CALLBACK_PORT__",
        "__RELAY_IDENTITY_CLIENT_ID__",
    ):
        assert placeholder in text
    # No shared key any more: the relay makes its own (callback-key.json in its state dir).
    assert "CALLBACK_KEY" not in text and "callback.key" not in text
    doc = yaml.safe_load(text)
    assert "packages" not in doc  # no pip, no venv, nothing from the distro's mirror
    files = {f["path"]: f for f in doc["write_files"]}
    unit = files["/etc/systemd/system/scheduled-events-relay.service"]["content"]
    assert unit == UNIT.read_text()
    pyz = files["/opt/scheduled-events-relay/scheduled-events-relay.pyz.xz"]
    assert pyz["encoding"] == "b64" and pyz["content"] == "__RELAY_PYZ_B64__"
    env = files["/etc/scheduled-events-relay/relay.env"]["content"]
    assert "RELAY_CALLBACK_URL" not in env and "KEY_FILE" not in env


def test_the_filled_in_cloud_init_fits_in_custom_data(tmp_path: Path) -> None:
    """The relay travels xz-compressed (base64 in cloud-init, unpacked by its runcmd): the
    zipapp stored, compressed as a whole, as `make relay` writes
    infra/relay/scheduled-events-relay.pyz.xz. Base64 of the
    deflated pyz alone outgrew customData once the relay gained its own key, attestation and
    liveness modules (about 66 KB), so the embedded form is the one to measure."""
    import lzma

    # The committed copy (tests/infra/test_cloud_init.py checks it is a fresh build).
    embedded = (ROOT / "infra" / "relay" / "scheduled-events-relay.pyz.xz").read_bytes()
    text = (DEPLOY / "cloud-init.yaml").read_text()
    pyz_b64 = base64.b64encode(embedded).decode()
    filled = text.replace("content: __RELAY_PYZ_B64__", f"content: {pyz_b64}")
    size = len(filled.encode())
    assert size <= 65535 - 2048, size  # Azure: customData decodes to at most 65535 bytes
    doc = yaml.safe_load(filled)
    files = {f["path"]: f for f in doc["write_files"]}
    pyz = files["/opt/scheduled-events-relay/scheduled-events-relay.pyz.xz"]
    assert pyz["encoding"] == "b64"
    written = tmp_path / "scheduled-events-relay.pyz"  # what the runcmd unpacks on the VM
    written.write_bytes(lzma.decompress(base64.b64decode(pyz["content"])))
    help_text = subprocess.run(
        [RELAY_PYTHON, "-I", "-S", str(written), "--help"],
        cwd=tmp_path,
        env=relay_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "--forward" in help_text


def test_shell_scripts_parse() -> None:
    subprocess.run(["sh", "-n", str(DEPLOY / "install.sh")], check=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["https://example.org/r.pyz"], "needs --sha256"),
        (["http://example.org/r.pyz", "--sha256", "0" * 64], "only https://"),
        (["x.pyz", "--sha256", "ABC"], "64 lowercase hex"),
        (["--bogus"], "unknown option"),
    ],
)
def test_install_refuses_bad_arguments_before_doing_anything(args: list[str], message: str) -> None:
    proc = subprocess.run(
        ["sh", str(DEPLOY / "install.sh"), *args], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr


def test_install_checks_the_checksum_before_installing(relay_pyz: Path, tmp_path: Path) -> None:
    if sys.platform != "linux":
        pytest.skip("sha256sum")
    wrong = hashlib.sha256(b"something else").hexdigest()
    proc = subprocess.run(
        ["sh", str(DEPLOY / "install.sh"), "--no-start", str(relay_pyz), "--sha256", wrong],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
    )
    if "run as root" in proc.stderr:
        pytest.skip("the checksum is checked after the root check")
    assert proc.returncode == 1, proc.stderr
    assert "checksum mismatch" in proc.stderr and "nothing installed" in proc.stderr


def _systemd_env_files(unit_text: str, root: Path) -> dict[str, str]:
    """The environment systemd gives the service from its EnvironmentFile= lines: files in
    the order given, a later file's value winning (systemd.exec), a `-` file optional,
    `#` lines comments, one pair of surrounding quotes removed."""
    env: dict[str, str] = {}
    for line in unit_text.splitlines():
        if not line.startswith("EnvironmentFile="):
            continue
        name = line.split("=", 1)[1]
        optional = name.startswith("-")
        path = root / name.lstrip("-").lstrip("/")
        if not path.exists():
            assert optional, f"{name} is required and missing"
            continue
        for entry in path.read_text().splitlines():
            if not entry.strip() or entry.lstrip().startswith("#"):
                continue
            key, _, value = entry.partition("=")
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            env[key.strip()] = value
    return env


def test_operator_settings_in_relay_local_env_win_over_the_scripts(tmp_path: Path) -> None:
    """add-relay.sh rewrites relay.env on every upgrade; the operator's hook line lives in
    relay.local.env, which the unit reads after relay.env (issue 33). The relay, started
    with what systemd would give it, runs the operator's hook, not the bootstrap's."""
    from relay.settings import load_settings

    unit_text = UNIT.read_text()
    etc = tmp_path / "etc" / "scheduled-events-relay"
    etc.mkdir(parents=True)
    theirs, mine = tmp_path / "bootstrap-drain.sh", tmp_path / "my-drain.sh"
    for hook in (theirs, mine):
        hook.write_text("#!/bin/sh\nexit 0\n")
        hook.chmod(0o755)
    (etc / "relay.env").write_text(
        f"RELAY_FORWARD=file:{tmp_path}\nRELAY_CALLBACK_LISTEN=0.0.0.0:8492\n"
        f'RELAY_HOOKS=\'{{"drain":"{theirs}"}}\'\n'
    )
    # Without the operator's file (optional: `-`), the script's settings alone.
    assert _systemd_env_files(unit_text, tmp_path)["RELAY_HOOKS"] == f'{{"drain":"{theirs}"}}'
    (etc / "relay.local.env").write_text(
        f'# mine\nRELAY_HOOKS=\'{{"drain": "{mine}"}}\'\nRELAY_HOOK_TIMEOUT=300\n'
    )
    env = _systemd_env_files(unit_text, tmp_path)
    saved = dict(os.environ)
    try:
        os.environ.update(env)
        settings = load_settings([])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert settings.hooks == {"drain": mine}
    assert settings.hook_timeout == 300
