"""Entry point of scheduled-events-relay.pyz (its `__main__.py`): `python3 FILE.pyz --help`.

A zipapp's modules are compiled from source at every start (zipimport never writes
bytecode), and the compiler's scratch memory stays in the process's heap: about 2 MB of a
relay whose target is 15 MB on every VM. So a short-lived child of the same interpreter
compiles the relay's modules and hands back the code objects (marshal); this process only
unmarshals them, as it would read .pyc files. If that fails for any reason, the modules are
imported from the archive the ordinary way: slower to start and larger, never broken.
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

if sys.version_info < (3, 9):  # noqa: UP036 - this line must run on an older Python too
    sys.stderr.write("relay: needs Python 3.9 or newer (this is %s)\n" % sys.version.split()[0])  # noqa: UP031
    sys.exit(2)

_COMPILE = """
import marshal, sys, zipfile
archive = sys.argv[1]
codes = {}
with zipfile.ZipFile(archive) as pyz:
    for name in pyz.namelist():
        if name.startswith("relay/") and name.endswith(".py"):
            module = name[:-3].replace("/", ".")
            module = module[: -len(".__init__")] if module.endswith(".__init__") else module
            source = pyz.read(name).decode("utf-8")
            codes[module] = compile(source, archive + "/" + name, "exec", dont_inherit=True)
sys.stdout.buffer.write(marshal.dumps(codes))
"""


def _precompiled(archive):
    """{module name: code} compiled by a child interpreter, or None."""
    import marshal

    read_end, write_end = os.pipe()
    try:
        pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-I", "-S", "-c", _COMPILE, archive],
            dict(os.environ),
            file_actions=[(os.POSIX_SPAWN_DUP2, write_end, 1)],
        )
    except (OSError, AttributeError):
        os.close(read_end)
        os.close(write_end)
        return None
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as pipe:
        for chunk in iter(lambda: pipe.read(65536), b""):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if status != 0 or not chunks:
        return None
    try:
        codes = marshal.loads(b"".join(chunks))  # noqa: S302 - our own child's output
    except (ValueError, EOFError, TypeError):
        return None
    return codes if isinstance(codes, dict) and "relay.__main__" in codes else None


class _Precompiled:
    """A meta-path finder and loader serving the child's code objects for relay.*."""

    def __init__(self, codes, archive):
        self.codes = codes
        self.archive = archive

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.codes:
            return None
        from importlib.machinery import ModuleSpec

        package = fullname == "relay"
        name = "relay/__init__.py" if package else fullname.replace(".", "/") + ".py"
        loader: Any = self  # a loader by protocol (create_module, exec_module), not by base
        spec = ModuleSpec(fullname, loader, origin=self.archive + "/" + name, is_package=package)
        spec.has_location = True
        if package:
            spec.submodule_search_locations = [self.archive + "/relay"]
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        exec(self.codes.pop(module.__name__), module.__dict__)  # noqa: S102 - our own code

    def get_source(self, fullname):
        """For tracebacks (linecache): the source from the archive."""
        import zipimport

        path = "relay" if fullname == "relay" else fullname.replace(".", "/")
        return zipimport.zipimporter(self.archive).get_source(path)


def _install():
    archive = os.path.dirname(os.path.abspath(__file__))
    if os.environ.get("RELAY_PYZ_COMPILE_IN_PROCESS") or not os.path.isfile(archive):
        return
    codes = _precompiled(archive)
    if codes:
        sys.meta_path.insert(0, _Precompiled(codes, archive))


_install()

from relay.__main__ import main  # noqa: E402

sys.exit(main())
