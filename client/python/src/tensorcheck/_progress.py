"""The progress of one call: its phase, how far it got, how long it took.

    client.diagnose_linear(x, w, b, observed=y, progress=True)
    # tensorcheck: hashing 2 tensors (48.0 MiB) ...
    # tensorcheck: hashing done in 0.21 s
    # tensorcheck: uploading 1 tensor (32.0 MiB) ...
    # tensorcheck: uploading done in 1.40 s
    # tensorcheck: diagnosing ...
    # tensorcheck: diagnosing done in 3.05 s (4.66 s in all)

`progress=` takes:

- None or False: nothing (the default);
- True: a tqdm bar per phase when tqdm is installed, else a line on stderr
  as each phase starts and ends, with its time;
- a callable `f(phase, done, total)`: called as each phase starts
  (done 0), as it advances, and as it ends (done == total). Phases are
  "hashing" and "uploading" (done and total in bytes; only when a tensor
  goes through the store), then "verifying", "diagnosing" (Diagnose, and
  Compare's two diagnoses) with done/total 0/1 then 1/1. While the server
  works, what it says of the call (the GetProgress RPC, asked every half
  second) comes as "diagnosing: running the candidates" with the
  candidates compared and their number (the reference counts as one),
  then "diagnosing: ranking the candidates" with 0/0.

The client names candidate counts before the call only when it knows
them: the candidates the call lists; with none listed, the server picks
them, and says how many while it runs.
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn, Optional, TextIO, Union

__all__ = ["Progress", "ProgressArg", "make_progress", "check_progress"]

ProgressCallback = Callable[[str, int, int], None]
ProgressArg = Union[None, bool, ProgressCallback]

_MIB = 1 << 20


def size_text(nbytes: int, count: int) -> str:
    """ "2 tensors (48.0 MiB)"."""
    return f"{count} tensor{'s' if count != 1 else ''} ({nbytes / _MIB:.1f} MiB)"


class Progress:
    """Receives a call's phases; this one shows nothing. Thread-safe: the
    uploads of one call advance it from several threads."""

    def start(self, phase: str, total: int, detail: str = "") -> None:
        """A phase begins: `total` units (bytes, or 1 for a request);
        `detail` says what ("2 tensors (48.0 MiB)", "12 candidates")."""

    def advance(self, n: int) -> None:
        """`n` more units of the current phase are done."""

    def finish(self) -> None:
        """The current phase ended."""

    def close(self) -> None:
        """The call ended (also when it raised)."""

    # Whether the client should ask the server how far a call got.
    wants_server_progress = False

    def server(self, phase: str, done: int, total: int) -> None:
        """What the server says of the call in flight: its phase, and
        `done` of `total` steps (total 0: not counted)."""


class _Reporting(Progress):
    """Keeps the current phase, its counts and its start, under a lock;
    subclasses show them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._began = time.monotonic()
        self._phase: Optional[str] = None
        self._phase_began = self._began
        self._done = 0
        self._total = 0
        self._phases = 0
        self._said: Optional[tuple[str, int, int]] = None  # the server's, last shown

    wants_server_progress = True

    def server(self, phase: str, done: int, total: int) -> None:
        with self._lock:
            said = (phase, int(done), int(total))
            if self._phase is None or said == self._said:
                return
            self._said = said
            self._served(*said)

    def start(self, phase: str, total: int, detail: str = "") -> None:
        with self._lock:
            if self._phase is not None:
                self._ended()
            self._phase, self._total, self._done = phase, max(int(total), 0), 0
            self._said = None
            self._phase_began = time.monotonic()
            self._phases += 1
            self._started(detail)

    def advance(self, n: int) -> None:
        with self._lock:
            if self._phase is None:
                return
            # A resumed upload sends some bytes twice: never past the total.
            step = min(int(n), self._total - self._done)
            if step <= 0:
                return
            self._done += step
            self._advanced(step)

    def finish(self) -> None:
        with self._lock:
            if self._phase is None:
                return
            if self._done < self._total:
                step = self._total - self._done
                self._done = self._total
                self._advanced(step)
            self._ended()
            self._phase = None

    def close(self) -> None:
        with self._lock:
            if self._phase is not None:
                self._ended(failed=True)
                self._phase = None

    # What the subclasses show; called under the lock.
    def _started(self, detail: str) -> None:
        raise NotImplementedError

    def _served(self, phase: str, done: int, total: int) -> None:
        raise NotImplementedError

    def _advanced(self, step: int) -> None:
        raise NotImplementedError

    def _ended(self, failed: bool = False) -> None:
        raise NotImplementedError


class _Callback(_Reporting):
    def __init__(self, fn: ProgressCallback) -> None:
        super().__init__()
        self._fn = fn

    def _started(self, detail: str) -> None:
        assert self._phase is not None
        self._fn(self._phase, 0, self._total)

    def _advanced(self, step: int) -> None:
        assert self._phase is not None
        self._fn(self._phase, self._done, self._total)

    def _served(self, phase: str, done: int, total: int) -> None:
        self._fn(f"{self._phase}: {phase}", done, total)

    def _ended(self, failed: bool = False) -> None:
        # Nothing more to say: the last advance said done == total (a call
        # that raised stops where it was).
        pass


class _Lines(_Reporting):
    """A line on `stream` as each phase starts and ends."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self._stream = stream

    def _write(self, text: str) -> None:
        self._stream.write(f"tensorcheck: {text}\n")
        self._stream.flush()

    def _started(self, detail: str) -> None:
        self._write(f"{self._phase}{' ' + detail if detail else ''} ...")

    def _advanced(self, step: int) -> None:
        pass

    def _served(self, phase: str, done: int, total: int) -> None:
        # A line per step of the server's: its phase, its count, the time.
        count = f" {done}/{total}" if total else ""
        took = time.monotonic() - self._phase_began
        self._write(f"{self._phase}: {phase}{count} ({took:.0f} s)")

    def _ended(self, failed: bool = False) -> None:
        now = time.monotonic()
        took = f"{now - self._phase_began:.2f} s"
        if failed:
            self._write(f"{self._phase} stopped after {took}")
            return
        total = f" ({now - self._began:.2f} s in all)" if self._phases > 1 else ""
        self._write(f"{self._phase} done in {took}{total}")


class _Bars(_Reporting):
    """A tqdm bar per phase: its own count, rate and elapsed time."""

    def __init__(self, tqdm: Any) -> None:
        super().__init__()
        self._tqdm = tqdm
        self._bar: Any = None
        self._served_count = False  # the bar counts the server's steps

    def _started(self, detail: str) -> None:
        in_bytes = self._phase in ("hashing", "uploading")
        self._bar = self._tqdm(
            total=self._total,
            desc=f"tensorcheck {self._phase}{' ' + detail if detail else ''}",
            unit="B" if in_bytes else "call",
            unit_scale=in_bytes,
            unit_divisor=1024,
            leave=True,
        )

    def _advanced(self, step: int) -> None:
        if self._bar is None:
            return
        if self._served_count:  # the call ended: all of the server's steps
            self._bar.n = self._bar.total
            self._bar.refresh()
        else:
            self._bar.update(step)

    def _served(self, phase: str, done: int, total: int) -> None:
        if self._bar is None:
            return
        self._bar.set_description(f"tensorcheck {self._phase}: {phase}", refresh=False)
        if total > 0:
            self._served_count = True
            self._bar.unit = "candidate" if self._phase == "diagnosing" else "configuration"
            self._bar.total = total
            self._bar.n = done
        self._bar.refresh()

    def _ended(self, failed: bool = False) -> None:
        self._served_count = False
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def make_progress(arg: ProgressArg, stream: Optional[TextIO] = None) -> Progress:
    """The Progress that `progress=arg` asks for (see the module docstring);
    TypeError for anything else."""
    if arg is None or arg is False:
        return Progress()
    if arg is True:
        try:
            tqdm = importlib.import_module("tqdm").tqdm
        except (ImportError, AttributeError):
            return _Lines(stream if stream is not None else sys.stderr)
        return _Bars(tqdm)
    if callable(arg):
        return _Callback(arg)
    _refuse(arg)


def check_progress(arg: object) -> None:
    """TypeError for what `progress=` does not take, as make_progress
    raises it (without making anything)."""
    if not (arg is None or isinstance(arg, bool) or callable(arg)):
        _refuse(arg)


def _refuse(arg: object) -> NoReturn:
    raise TypeError(
        f"progress: expected None, a bool or a callable (phase, done, total), "
        f"got {type(arg).__name__}"
    )
