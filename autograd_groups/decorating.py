"""Context managers used as decorators, generator functions included.

``contextlib.ContextDecorator`` wraps a call in the block; a generator function's call only makes
the generator, so the block would end before its body runs. As ``torch.no_grad`` does
(``torch/utils/_contextlib.py``), a generator function's body runs in a fresh block at each resume
of the generator, and the caller's code between two resumes runs outside it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def decorate(block: Callable[[], AbstractContextManager[Any]], fn: F) -> F:
    """``fn`` running inside a new ``block()`` at each call, or, for a generator function, at each
    resume of the generator it returns.

    >>> import contextlib
    >>> inside = []
    >>> @contextlib.contextmanager
    ... def marked():
    ...     inside.append(True); yield; inside.pop()
    >>> def numbers():
    ...     yield bool(inside)
    ...     yield bool(inside)
    >>> gen = decorate(marked, numbers)()
    >>> next(gen), bool(inside), next(gen)
    (True, False, True)
    >>> gen.close()  # in the block too: before the example's names are gone
    """
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def resumed(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
            gen = fn(*args, **kwargs)
            try:
                with block():
                    response = gen.send(None)
                while True:
                    try:
                        request = yield response
                    except GeneratorExit:
                        with block():
                            gen.close()
                        raise
                    except BaseException as error:  # thrown in by the caller: into the body, in the block
                        with block():
                            response = gen.throw(error)
                    else:
                        with block():
                            response = gen.send(request)
            except StopIteration as stop:
                return stop.value

        return resumed  # type: ignore[return-value]

    @functools.wraps(fn)
    def called(*args: Any, **kwargs: Any) -> Any:
        with block():
            return fn(*args, **kwargs)

    return called  # type: ignore[return-value]
