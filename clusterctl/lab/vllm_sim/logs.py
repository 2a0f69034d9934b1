"""vLLM's log line format: ``(<process> pid=<pid>) LEVEL MM-DD HH:MM:SS [file.py:line] message``.

The date has no year (vLLM's ``%m-%d %H:%M:%S``); uvicorn's own lines are
``(<process> pid=<pid>) INFO:     message``.  Every line goes to stdout and is
flushed, as vLLM's default handler does (journald merges both streams anyway).
All the pretend processes (APIServer, EngineCore, Worker_TPn) carry the one
real pid of the simulator, so a pid in a log line is always one to signal.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO


class Log:
    def __init__(self, stream: TextIO | None = None, pid: int | None = None) -> None:
        self.stream = stream or sys.stdout
        self.pid = pid or os.getpid()
        self._lock = threading.Lock()

    def _write(self, text: str) -> None:
        with self._lock:
            self.stream.write(text)
            self.stream.flush()

    def line(self, proc: str, level: str, where: str, msg: str) -> None:
        ts = time.strftime("%m-%d %H:%M:%S")
        prefix = f"({proc} pid={self.pid}) {level} {ts} [{where}] "
        self._write("".join(prefix + part + "\n" for part in msg.split("\n")))

    def info(self, proc: str, where: str, msg: str) -> None:
        self.line(proc, "INFO", where, msg)

    def warning(self, proc: str, where: str, msg: str) -> None:
        self.line(proc, "WARNING", where, msg)

    def error(self, proc: str, where: str, msg: str) -> None:
        self.line(proc, "ERROR", where, msg)

    def raw(self, proc: str, text: str) -> None:
        """Lines printed without the logger (tqdm bars, tracebacks, uvicorn)."""
        self._write("".join(f"({proc} pid={self.pid}) {part}\n" for part in text.split("\n")))

    def uvicorn(self, msg: str) -> None:
        self.raw("APIServer", f"INFO:     {msg}")
