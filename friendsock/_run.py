"""``python -m friendsock run``: run a program, unchanged, with friendsock on
every asyncio and uvloop event loop it makes, and report what paired.

The program runs in this interpreter as ``python`` itself would run it (as
``coverage run`` does): a fresh ``__main__`` module, ``sys.argv`` and
``sys.path[0]`` set as python sets them, and its exceptions, exit status
and signals left to the interpreter, so they end the process exactly as
without friendsock (the traceback shows the program's frames, not ours).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import marshal
import os
import runpy
import sys
import types
from typing import Any, Callable, List, NoReturn, Optional, Sequence, Tuple

from ._blocking._patch import patch_socket
from ._everywhere import install_everywhere
from ._report import Target, parse_target, report_at_exit

USAGE = """\
usage: {prog} [options] (-m module | script.py | -c code) [args]

Runs a Python program in this interpreter, as python would, with friendsock
installed on every asyncio and uvloop event loop it creates (and on trio,
anyio's trio backend included, once it imports trio), and reports at
exit how many connections paired and why the others fell back to real TCP.

options:
  --report TARGET  where the report goes: stderr (the default) or json=FILE
                   ({{pid}} in FILE becomes the process id); repeat for both
  -q, --quiet      no report on stderr (a --report json=FILE is still written)
  --sockets        also patch the socket module (friendsock.patch_socket()):
                   blocking sockets in threads, and non-blocking ones driven
                   by readiness (tornado, Twisted), pair too
  -h, --help       show this help and exit

FRIENDSOCK=0 runs the same program with pairing off, to compare.
"""


class BadInput(Exception):
    """The command line names nothing runnable: one line, exit 2."""


class _NoProgram(Exception):
    """runpy's error class for a module it cannot run."""


class Program:
    """What to run: ``kind`` is ``"module"``, ``"script"`` or ``"code"``."""

    def __init__(self, kind: str, name: str, args: List[str]) -> None:
        self.kind = kind
        self.name = name
        self.args = args


class Options:
    """What the command line asks besides the program."""

    def __init__(self) -> None:
        self.targets: List[Target] = []  # where the report goes
        self.quiet = False
        self.sockets = False  # patch_socket() as well


def parse(argv: Sequence[str]) -> Tuple[Optional[Program], Options]:
    """``(program, options)``; program None for ``--help``."""
    args = list(argv)
    options = Options()
    targets = options.targets
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            return None, options
        if arg in ("-q", "--quiet"):
            options.quiet = True
        elif arg == "--sockets":
            options.sockets = True
        elif arg == "--report" or arg.startswith("--report="):
            value = arg.partition("=")[2] if "=" in arg else (args.pop(0) if args else "")
            if not value:
                raise BadInput("--report needs a value (stderr or json=FILE)")
            try:
                targets.append(parse_target(value))
            except ValueError as exc:
                raise BadInput(str(exc)) from None
        elif arg.startswith(("-m", "-c")):
            flag, value = arg[:2], arg[2:]
            if not value:
                if not args:
                    raise BadInput(f"argument expected for the {flag} option")
                value = args.pop(0)
            if flag == "-m":
                return Program("module", value, args), options
            return Program("code", value, args), options
        elif arg == "--":
            if not args:
                break
            return Program("script", args[0], args[1:]), options
        elif arg == "-":
            raise BadInput("reading the program from stdin (-) is not supported: pass a file")
        elif arg.startswith("-"):
            raise BadInput(f"unknown option {arg} (see --help)")
        else:
            return Program("script", arg, args), options
    raise BadInput("nothing to run: give -m module, a script or -c code (see --help)")


def main(argv: Sequence[str], prog: str) -> int:
    try:
        program, options = parse(argv)
    except BadInput as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if program is None:
        print(USAGE.format(prog=prog), end="")
        return 0
    targets = options.targets or [("stderr", None)]
    if options.quiet:
        targets = [target for target in targets if target[0] != "stderr"]
    # Before anything of the program is imported (a -m module's packages).
    install_everywhere()
    if options.sockets:
        patch_socket()
    run_program(program, lambda: report_at_exit(targets))
    return 0


# The interpreter's own __main__ (this command's), kept alive once the
# program's replaces it in sys.modules.
_our_main: List[Any] = []


def run_program(program: Program, ready: Callable[[], None]) -> None:
    """Run ``program`` as python would; ``ready`` is called once it is found
    (bad input exits 2 before). Its exceptions propagate (SystemExit too)."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = sys.modules["builtins"]
    if program.kind == "code":
        _set_path0("")
        argv0 = "-c"
        main.__loader__ = importlib.machinery.BuiltinImporter
        code = _hidden_frames(lambda: compile(program.name, "<string>", "exec", dont_inherit=True))
    elif program.kind == "module":
        _set_path0(os.getcwd())
        code, argv0 = _module(main, program.name)
    else:
        code, argv0 = _script(main, program.name)
    _our_main.append(sys.modules.get("__main__"))
    sys.modules["__main__"] = main
    sys.argv[:] = [argv0, *program.args]
    ready()
    _hidden_frames(lambda: exec(code, main.__dict__))


def _set_path0(path0: str) -> None:
    """Put the program's ``sys.path[0]`` where python's for this command is
    (python adds none with -P / -I)."""
    if getattr(sys.flags, "safe_path", False):
        return
    if sys.path:
        sys.path[0] = path0
    else:
        sys.path.insert(0, path0)


def _module(main: types.ModuleType, name: str) -> Tuple[types.CodeType, str]:
    _, spec, code = _module_details(name)
    _from_spec(main, spec)
    return code, spec.origin


def _from_spec(main: types.ModuleType, spec: Any) -> None:
    main.__dict__.update(__file__=spec.origin, __cached__=spec.cached, __loader__=spec.loader,
                         __package__=spec.parent, __spec__=spec)


def _module_details(name: str) -> Any:
    # What ``python -m`` itself uses (pdb does too): the same search, the
    # same package __main__ rule, the same messages.
    try:
        return _hidden_frames(lambda: runpy._get_module_details(name, _NoProgram))  # type: ignore[attr-defined]
    except _NoProgram as exc:
        _bad_program(f"{sys.executable}: {exc}")


def _script(main: types.ModuleType, path: str) -> Tuple[types.CodeType, str]:
    if os.path.isdir(path) or _is_zip(path):
        # A directory or zip file with a __main__.py: python puts it first
        # on sys.path and runs its __main__ module.
        _set_path0(os.path.abspath(path))
        saved = sys.modules.pop("__main__", None)
        try:
            details = _hidden_frames(lambda: runpy._get_module_details("__main__", _NoProgram))  # type: ignore[attr-defined]
        except _NoProgram:
            _bad_program(f"{sys.orig_argv[0]}: can't find '__main__' module in {path!r}")
        finally:
            if saved is not None:
                sys.modules["__main__"] = saved
        _, spec, code = details
        _from_spec(main, spec)
        return code, path
    absolute = os.path.abspath(path)
    try:
        with io.open_code(absolute) as file:
            source = file.read()
    except OSError as exc:
        _bad_program(f"{sys.orig_argv[0]}: can't open file {absolute!r}: [Errno {exc.errno}] {exc.strerror}")
    _set_path0(os.path.dirname(os.path.realpath(absolute)))
    main.__dict__.update(__file__=absolute, __cached__=None, __package__=None, __spec__=None)
    if source[:4] == importlib.util.MAGIC_NUMBER:  # a .pyc file
        main.__loader__ = importlib.machinery.SourcelessFileLoader("__main__", absolute)
        return marshal.loads(source[16:]), path
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", absolute)
    return _hidden_frames(lambda: compile(source, absolute, "exec", dont_inherit=True)), path


def _is_zip(path: str) -> bool:
    import zipfile

    return os.path.isfile(path) and zipfile.is_zipfile(path)


def _bad_program(message: str) -> NoReturn:
    print(message, file=sys.stderr)
    raise SystemExit(2)


def _hidden_frames(call: Callable[[], Any]) -> Any:
    """``call()``; an exception it raises propagates as it is, but the
    traceback printed for it (if nothing catches it) starts below this
    frame, as if the interpreter itself had run the program."""
    try:
        return call()
    except (SystemExit, _NoProgram):
        raise
    except BaseException as exc:
        tb = exc.__traceback__
        # This frame's entry, then call()'s (a lambda): the program's own
        # frames come after.
        first = tb.tb_next.tb_next if tb is not None and tb.tb_next is not None else None
        previous, raised = sys.excepthook, exc

        def excepthook(kind: Any, value: Any, traceback: Any) -> None:
            if value is raised:
                # Printed from the exception's own traceback, not the argument.
                traceback = first
                value.__traceback__ = first
            previous(kind, value, traceback)

        sys.excepthook = excepthook
        raise
