"""Progress that reads well in a terminal and in a file.

In a terminal: a tqdm bar, redrawn in place. Written to a file (a CI log, ``nohup``, a cluster's job
log): a tqdm bar would write every frame there, joined by carriage returns into one long line, so
instead a plain line is written every ``LINE_EVERY`` of the way (and at the end), with the rate and
the bar's postfix (e.g. the losses).
"""

from __future__ import annotations

import math
import sys
import time

LINE_EVERY = 0.05  # of the total: a line every 5%, 20 lines for a whole run


class LineProgress:
    """tqdm's interface as the project uses it (``update``, ``set_postfix``, ``set_postfix_str``, ``close``, a
    context manager), written as a plain line every ``every`` of ``total``."""

    def __init__(self, total: int, desc: str, unit: str, initial: int = 0, file=None, every: float = LINE_EVERY):
        self.total, self.desc, self.unit, self.n, self.file = total, desc, unit, initial, file
        self.stride = max(1, math.ceil(total * every))
        self.next_line = (initial // self.stride + 1) * self.stride
        self.start, self.start_n, self.postfix, self.written = time.perf_counter(), initial, "", initial

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n >= self.next_line or self.n == self.total:
            self._line()
            self.next_line = (self.n // self.stride + 1) * self.stride

    def set_postfix(self, **values) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def close(self) -> None:
        if self.n != self.written:
            self._line()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _line(self) -> None:
        elapsed = time.perf_counter() - self.start
        done = self.n - self.start_n
        rate = f", {done / elapsed:.2f} {self.unit}/s" if elapsed > 0 and done else ""
        percent = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        postfix = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {self.n}/{self.total} {self.unit}{percent}{rate}, {elapsed:.0f} s{postfix}",
              file=self.file or sys.stderr, flush=True)
        self.written = self.n


class _Off(LineProgress):
    def _line(self) -> None:
        pass


def progress_bar(total: int, desc: str, unit: str, initial: int = 0, disable: bool = False, file=None):
    """A tqdm bar when ``file`` (standard error by default) is a terminal, :class:`LineProgress` otherwise; nothing
    shown when ``disable``."""
    stream = file or sys.stderr
    if disable:
        return _Off(total, desc, unit, initial, stream)
    if getattr(stream, "isatty", lambda: False)():
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=stream)
    return LineProgress(total, desc, unit, initial, stream)
