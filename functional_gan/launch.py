"""A small supervisor around each process of a multi-process run, so that every way it ends is one clear line.

When a process of a JAX multi-process run dies (SIGKILL, out of memory, a lost host), JAX's
coordination service notices the missing heartbeats and *aborts* every other process from a C++
thread: a ``Check failure stack trace`` and a page of gRPC errors, no Python ``except`` can run.
If the coordinator (process 0) itself dies, the others abort at once in the same way. torchrun
solves the same problem with an agent process around each worker; this is that agent, in small:

* ``functional-gan train --coordinator ...`` starts the real training process as its child, with
  the same command line, and waits for it;
* the child reports its progress (joined, iteration) on a pipe;
* the C++ log lines of the child's stderr go to a log file instead of the terminal (every other
  line passes through);
* when the child ends, the supervisor says in one line what happened: which process stopped
  responding, at which iteration, which checkpoint is kept, and that running the same command on
  every host resumes; its exit status is the child's (0, 2 for a user error) or 3 for a lost peer.

In the child, :func:`report` writes to the pipe; outside a supervised process it does nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

STATUS_FD_ENV = "FUNCTIONAL_GAN_STATUS_FD"  # set in the child: the pipe it reports on
EXIT_PEER_LOST = 3

# glog's line prefix (severity, date, time, thread, file:line]) and the lines of a C++ stack trace.
_GLOG = re.compile(rb"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\]]*\] ")
_NOISE = (re.compile(rb"^\s+@\s+0x"), re.compile(rb"^\*\*\* "), re.compile(rb"^\[Gloo\] "))


def supervised() -> bool:
    """True in a training process started by :func:`supervise`."""
    return STATUS_FD_ENV in os.environ


def report(**fields) -> None:
    """Tell the supervisor how far this process got (``iteration=N``, ``joined=True``)."""
    fd = os.environ.get(STATUS_FD_ENV)
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.write(int(fd), (json.dumps(fields) + "\n").encode())


def child_command(argv: list[str]) -> list[str]:
    """The command that runs ``functional-gan ARGV`` in a new interpreter (a seam for the fault-injection tests)."""
    return [sys.executable, "-m", "functional_gan.main", *argv]


def _die_with_parent() -> None:
    """In the child, before exec: a SIGKILL'd supervisor takes its training process with it (Linux)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _Status:
    def __init__(self):
        self.joined = False
        self.iteration: int | None = None

    def read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as pipe:
            for line in pipe:
                with contextlib.suppress(ValueError):
                    fields = json.loads(line)
                    self.joined = self.joined or bool(fields.get("joined"))
                    self.iteration = fields.get("iteration", self.iteration)


class _StderrFilter:
    """Pass the child's stderr through, except C++ log lines (and the rest of the write they came in), which go to a file."""

    def __init__(self, log_path: Path):
        self.log_path = log_path
        self.noise = bytearray()
        self.fatal = bytearray()  # the text of an F (fatal) log line and what follows it

    def pump(self, stream) -> None:
        out = sys.stderr.buffer
        with self.log_path.open("ab") as log:
            pending = b""
            while chunk := os.read(stream.fileno(), 65536):
                log.write(chunk)
                log.flush()
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                in_log_message = False
                for line in lines:
                    if _GLOG.match(line):
                        in_log_message = True  # a C++ message can span lines: the rest of this write belongs to it
                        if line[:1] == b"F":
                            self.fatal += line + b"\n"
                    elif self.fatal and in_log_message:
                        self.fatal += line + b"\n"
                    if in_log_message or any(p.match(line) for p in _NOISE):
                        self.noise += line + b"\n"
                    else:
                        out.write(line + b"\n")
                if b"\r" in pending:  # a progress bar redraws its line without a newline
                    head, _, pending = pending.rpartition(b"\r")
                    out.write(head + b"\r")
                out.flush()
            if pending:
                out.write(pending)
                out.flush()


def supervise(command: list[str], process_id: int, coordinator: str, out: str | os.PathLike,
              join_timeout: int, peer_timeout: int) -> int:
    """Run ``command`` (this process's training) as a child and explain how it ended; returns the exit status."""
    read_end, write_end = os.pipe()
    log_dir = Path(tempfile.mkdtemp(prefix="functional-gan-"))
    log_path = log_dir / f"process-{process_id}.log"
    child = subprocess.Popen(command, env={**os.environ, STATUS_FD_ENV: str(write_end)}, pass_fds=(write_end,),
                             stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
    os.close(write_end)
    status, stderr = _Status(), _StderrFilter(log_path)
    readers = [threading.Thread(target=status.read, args=(read_end,), daemon=True),
               threading.Thread(target=stderr.pump, args=(child.stderr,), daemon=True)]
    for reader in readers:
        reader.start()

    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    for reader in readers:
        reader.join(timeout=10)
    log_path = _keep_log(log_path, Path(out), process_id)
    verdict = explain(code, bytes(stderr.fatal).decode(errors="replace"), status, process_id, coordinator, Path(out),
                      join_timeout, peer_timeout)
    if verdict is None:
        return code if code >= 0 else 128 - code
    message, status_code = verdict
    details = f" (the processes' own log: {log_path})" if stderr.noise else ""
    print(f"functional-gan train: error: {message}{details}", file=sys.stderr, flush=True)
    return status_code


def _keep_log(log_path: Path, out: Path, process_id: int) -> Path:
    """Move the C++ log into the run folder when it exists (it is not created for a run that never started)."""
    if not log_path.exists() or log_path.stat().st_size == 0:
        shutil.rmtree(log_path.parent, ignore_errors=True)
        return log_path
    if not out.is_dir():
        return log_path
    target = out / "logs" / f"process-{process_id}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    with contextlib.suppress(OSError):
        target.parent.mkdir(exist_ok=True)
        shutil.move(log_path, target)
        return target
    return log_path


def _kept(out: Path) -> str:
    """The newest sealed checkpoint on disk (a manifest is written only once orbax has finished)."""
    from functional_gan.checkpoints import MANIFEST_NAME
    from functional_gan.run_folder import CHECKPOINTS

    sealed = [int(p.parent.name) for p in (out / CHECKPOINTS).glob(f"*/{MANIFEST_NAME}") if p.parent.name.isdigit()]
    if not sealed:
        return "no checkpoint had been sealed yet"
    return f"the checkpoint of iteration {max(sealed)} in {out / CHECKPOINTS} is kept"


def explain(code: int, fatal: str, status: _Status, process_id: int, coordinator: str, out: Path,
            join_timeout: int, peer_timeout: int) -> tuple[str, int] | None:
    """(one line, exit status) for a child that ended abnormally; None when its own output said it all."""
    if code in (0, 1, 2, 130) and not fatal:
        return None  # success, a traceback (a bug), a user error it printed, or Ctrl-C
    where = f"at iteration {status.iteration}" if status.iteration is not None else "before training started"
    resume = "run the same command on every host to resume"
    unhealthy = re.search(r"tasks are unhealthy \(stopped sending heartbeats\):\s*([\d\s,]+)", fatal)
    if unhealthy:
        lost = sorted({int(t) for t in re.findall(r"\d+", unhealthy.group(1))} - {process_id})
        who = ", ".join(map(str, lost)) if lost else "?"
        return (f"process {who} stopped responding (no heartbeat for {peer_timeout} s) {where}; training stopped on "
                f"process {process_id}; {_kept(out)}; {resume}", EXIT_PEER_LOST)
    if "RegisterTask" in fatal or (not status.joined and "DEADLINE_EXCEEDED" in fatal.upper()):
        return (f"process {process_id} could not join the run through the coordinator {coordinator} within "
                f"--join-timeout {join_timeout} s: the coordinator (process 0) is not running or not reachable at "
                "that address, or not every process was started, or the processes were given different "
                "--num-processes; nothing was written", EXIT_PEER_LOST)
    if "coordination service" in fatal and ("leader" in fatal or "Failed to send RPC" in fatal or "Socket closed" in fatal):
        return (f"process 0 (the coordinator, {coordinator}) stopped responding {where}; training stopped on process "
                f"{process_id}; {_kept(out)}; {resume}", EXIT_PEER_LOST)
    if fatal:
        first = fatal.strip().splitlines()[0]
        first = _GLOG.sub("", first.encode()).decode(errors="replace")
        return (f"JAX's coordination service stopped process {process_id} {where}: {first[:400]}; "
                f"{_kept(out)}; {resume}", EXIT_PEER_LOST)
    if code < 0:
        name = signal.Signals(-code).name
        cause = " (out of memory, or killed by hand)" if -code == signal.SIGKILL else ""
        return (f"process {process_id} was stopped by {name}{cause} {where}; {_kept(out)}; "
                f"{resume}", 128 - code)
    return None
