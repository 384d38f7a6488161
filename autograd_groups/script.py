"""Run a user's script as ``python SCRIPT.py ARGS`` would, reporting failure as an exit code and
how it ended."""

from __future__ import annotations

import argparse
import builtins
import os
import runpy
import sys
import traceback
import types

import torch


class Exit(int):
    """A script's exit code, with ``how`` it ended when it failed (for the command's message)."""

    how: str

    def __new__(cls, code: int, how: str = "") -> Exit:
        made = super().__new__(cls, code)
        made.how = how
        return made


def run_script(path: str, args: list[str], source: str | None = None,
               passes: tuple[type[BaseException], ...] = ()) -> Exit:
    """Run ``path`` as ``__main__`` with ``sys.argv == [path, *args]`` and its folder first on
    ``sys.path``; return 0 when it finishes, else its exit code (1 for an exception, whose
    traceback, from the script's own frames on, goes to stderr) and how it ended. ``source``, when
    given, runs in place of the file's text (a changed copy, with the file's name in tracebacks);
    exceptions of the types ``passes`` are raised on to the caller.

    >>> import os, tempfile
    >>> script = os.path.join(tempfile.mkdtemp(), "hello.py")
    >>> with open(script, "w") as f:
    ...     _ = f.write("import sys\\nprint(__name__, sys.argv[1:])\\n")
    >>> run_script(script, ["--n", "3"])
    __main__ ['--n', '3']
    0
    """
    saved_argv, saved_path = sys.argv, list(sys.path)
    # What the script may switch on for the whole process, and the command that runs it must not
    # inherit (anomaly mode raising at a NaN the command makes on purpose, grad mode off).
    modes = torch.is_grad_enabled(), torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        if source is None:
            runpy.run_path(path, run_name="__main__")
        else:
            # Not with this module's ``from __future__ import annotations``: a dataclass's field
            # types, read at run time, stay types.
            code = compile(source, path, "exec", dont_inherit=True)
            _run_as_main(code, path)
    except passes:
        raise
    except SystemExit as e:
        if e.code is None or e.code == 0:
            return Exit(0)
        if isinstance(e.code, int):
            return Exit(e.code, f"called sys.exit({e.code})")
        print(e.code, file=sys.stderr)
        return Exit(1, f"called sys.exit({e.code!r})")
    except BaseException as e:  # the script's own errors, KeyboardInterrupt included, end it
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        if tb is None and not isinstance(e, SyntaxError):
            tb = e.__traceback__
        traceback.print_exception(type(e), e, tb)
        return Exit(130 if isinstance(e, KeyboardInterrupt) else 1,
                    f"raised {type(e).__name__} (traceback above)")
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        torch.set_grad_enabled(modes[0])
        torch.set_anomaly_enabled(modes[1], modes[2])
    return Exit(0)


def _run_as_main(code: types.CodeType, path: str) -> None:
    """Run ``code`` as the module ``__main__``, as ``runpy`` runs a file: what the script pickles by
    reference (a class it defines, for ``torch.save`` or a ``DataLoader``'s spawned workers) is
    found there."""
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        if saved is None:
            del sys.modules["__main__"]
        else:
            sys.modules["__main__"] = saved


def run_flushed(path: str, args: list[str]) -> Exit:
    """:func:`run_script`, with stdout flushed before and after, so that a command's own output and
    the script's come out in the order they were printed."""
    sys.stdout.flush()
    code = run_script(path, args)
    sys.stdout.flush()
    return code


def script_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``SCRIPT.py`` and the script's own arguments (after ``--``) to a command's parser."""
    parser.add_argument("script", metavar="SCRIPT.py")
    # nargs="+" made optional, not "*": argparse would match an empty "*" right after SCRIPT.py and
    # then reject what follows "--"; "+" waits for the arguments after "--" (or none at all).
    rest = parser.add_argument("args", nargs="+", default=[], metavar="ARGS",
                               help="arguments for the script, after --")
    rest.required = False


def check_script(command: str, path: str) -> bool:
    """Whether ``path`` is a script ``command`` can run; where not, say why on stderr."""
    if not os.path.isfile(path):
        say(f"autograd-groups {command}: error: no such script: {path}")
        return False
    if path.endswith((".yaml", ".yml")):
        say(f"autograd-groups {command}: error: {path} is a spec file; `{command}` runs a Python "
            f"script (the one that trains or evaluates your model, which loads the spec). To "
            f"validate the spec itself, run `autograd-groups check {path}`")
        return False
    return True


def say(message: str) -> None:
    """Tell the user ``message`` on stderr (stdout is the script's, or a report's)."""
    print(message, file=sys.stderr)
