"""The CLI's one progress renderer (the core reports through callbacks, never prints).

Three modes, chosen once per command: ``rich`` (stderr is a terminal: live bars
that vanish when done, event lines printed above them), ``plain`` (stderr is a
file or pipe: one line per finished host / event, flushed, for logs and CI),
``off`` (``--json``: nothing on stderr but warnings and errors).

* :class:`HostProgress` counts hosts of a fan-out (``ping``, ``exec``,
  ``facts``, ``doctor``, ``collect``, ``discover``);
* :class:`ByteProgress` counts bytes per host (``stage``);
* :class:`EventProgress` shows deploy-style events with a batch bar;
* :class:`Lines` only prints event lines (``status``).

Each is a context manager; :meth:`_Progress.note` prints an event line in any
mode but ``off`` without tearing a live bar.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Optional

from clusterctl.cli._common import err_console
from clusterctl.fleet.results import HostResult, HostStatus

#: Plain mode prints an overall byte line at most this often (seconds).
PLAIN_BYTES_EVERY_S = 5.0


def progress_mode(enabled: bool) -> str:
    """``off`` when not ``enabled`` (``--json``), else ``rich`` on a terminal, ``plain`` otherwise."""
    if not enabled:
        return "off"
    return "rich" if err_console.is_terminal else "plain"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns


class _Progress:
    def __init__(self, enabled: bool):
        self.mode = progress_mode(enabled)
        self._bar: Any = None  # a rich Progress in ``rich`` mode
        self._lock = threading.Lock()

    def _rich(self, *columns: Any) -> Any:
        from rich.progress import Progress

        self._bar = Progress(*columns, console=err_console, transient=True)
        return self._bar

    def note(self, text: str) -> None:
        """An event line: above the live bar, or a plain stderr line; nothing when off."""
        if self.mode == "off":
            return
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
        else:
            with self._lock:
                print(text, file=sys.stderr, flush=True)

    def __enter__(self) -> Any:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


class Lines(_Progress):
    """Event lines only (``note``): on stderr in ``rich`` and ``plain`` mode, nothing when off
    (``status`` without ``--watch``)."""


class HostProgress(_Progress):
    """Hosts done of ``total``: a bar on a terminal, ``label [i/n] host status 0.12s`` lines otherwise.

    ``with HostProgress(n, "exec", not as_json) as bar:`` gives a callable to hand
    to ``Fleet.run(on_result=bar)``.
    """

    def __init__(self, total: int, label: str, enabled: bool):
        super().__init__(enabled)
        self.total, self.label, self.done = total, label, 0
        if self.mode == "rich":
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

            bar = self._rich(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self._task = bar.add_task(label, total=total)

    def __call__(self, r: HostResult) -> None:
        self.update(r)

    def update(self, r: HostResult) -> None:
        with self._lock:
            self.done += 1
            done = self.done
        if self._bar is not None:
            self._bar.advance(self._task)
        elif self.mode == "plain":
            what = r.status.value if r.rc is None or r.status is not HostStatus.FAILED else f"rc={r.rc}"
            self.note(f"{self.label} [{done}/{self.total}] {r.host} {what} {r.duration_s:.2f}s")


class ByteProgress(_Progress):
    """Bytes per host and overall: bars with rates on a terminal (per host up to
    ``PER_HOST_BARS`` hosts); plain mode prints an overall line at most every
    ``PLAIN_BYTES_EVERY_S`` seconds and one line per finished host.

    ``on_progress(host, done, total)`` and ``on_result(r)`` are the callbacks."""

    PER_HOST_BARS = 16

    def __init__(self, label: str, hosts: list[str], bytes_per_host: int, enabled: bool):
        super().__init__(enabled)
        self.label, self.hosts = label, hosts
        self.total = bytes_per_host * len(hosts)
        self._tasks: dict[str, Any] = {}
        self._done: dict[str, int] = {}
        self._finished = 0
        self._last_line = time.monotonic()
        if self.mode == "rich":
            from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeElapsedColumn, TransferSpeedColumn

            bar = self._rich(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeElapsedColumn(),
            )
            self._all = bar.add_task(f"all {len(hosts)} hosts", total=self.total)
            if len(hosts) <= self.PER_HOST_BARS:
                for h in hosts:
                    self._tasks[h] = bar.add_task(f"  {h}", total=bytes_per_host)

    @property
    def live(self) -> bool:
        """Whether byte counts are shown (worth asking the hosts for them)."""
        return self.mode != "off"

    def on_progress(self, host: str, done: int, total: int) -> None:
        with self._lock:
            self._done[host] = done
            overall = sum(self._done.values())
            now = time.monotonic()
            line_due = now - self._last_line >= PLAIN_BYTES_EVERY_S
            if line_due:
                self._last_line = now
        if self._bar is not None:
            if host in self._tasks:
                self._bar.update(self._tasks[host], completed=done, total=total)
            self._bar.update(self._all, completed=overall)
        elif self.mode == "plain" and line_due:
            pct = f" ({100 * overall / self.total:.0f} %)" if self.total else ""
            self.note(f"{self.label}: {_size(overall)} of {_size(self.total)}{pct}")

    def on_result(self, r: HostResult) -> None:
        with self._lock:
            self._finished += 1
            n = self._finished
        if self._bar is not None:
            if r.host in self._tasks:
                self._bar.update(self._tasks[r.host], description=f"  {r.host} {r.status.value}")
            self._bar.update(self._all, description=f"all {len(self.hosts)} hosts ({n} done)")
        elif self.mode == "plain":
            got = self._done.get(r.host)
            size = f" {_size(got)}" if got is not None else ""
            self.note(f"{self.label} [{n}/{len(self.hosts)}] {r.host} {r.status.value}{size} {r.duration_s:.2f}s")


class EventProgress(_Progress):
    """Deploy-style events (``kind``, ``message``, ``host``, ``ok``, and ``step``/``steps``
    on batch events): every event is a line; on a terminal a bar under them
    counts batches and names the current one.  ``bytes`` events (staging: ``step``
    bytes of ``steps`` on ``host``) are not lines: a byte bar on a terminal, an
    overall line at most every ``PLAIN_BYTES_EVERY_S`` seconds otherwise."""

    def __init__(self, label: str, enabled: bool):
        super().__init__(enabled)
        self.label = label
        self._bytes: dict[str, tuple[int, int]] = {}
        self._bytes_task: Any = None
        self._last_line = 0.0
        if self.mode == "rich":
            from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn

            bar = self._rich(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            self._task = bar.add_task(label, total=None)

    def __call__(self, e: Any) -> None:
        if self.mode == "off":
            return
        if e.kind == "bytes":
            self._on_bytes(e)
            return
        mark = "" if e.ok else "!! "
        where = f"{e.host}: " if e.host else ""
        self.note(f"{mark}[{e.kind}] {where}{e.message}")
        if self._bar is None:
            return
        step: Optional[int] = getattr(e, "step", None)
        steps: Optional[int] = getattr(e, "steps", None)
        if step is not None and steps:
            what = e.message.split(":", 1)[0].removesuffix(" passed")
            self._bar.update(
                self._task,
                total=steps,
                completed=step if getattr(e, "done", False) else step - 1,
                description=f"{self.label} {what}",
            )
        elif e.kind == "phase":
            self._bar.update(self._task, description=f"{self.label}: {e.message[:60]}")

    def _on_bytes(self, e: Any) -> None:
        with self._lock:
            self._bytes[f"{e.message}\0{e.host}"] = (int(e.step or 0), int(e.steps or 0))
            done = sum(d for d, _ in self._bytes.values())
            total = sum(t for _, t in self._bytes.values())
            now = time.monotonic()
            line_due = now - self._last_line >= PLAIN_BYTES_EVERY_S
            if line_due:
                self._last_line = now
        if self._bar is not None:
            if self._bytes_task is None:
                self._bytes_task = self._bar.add_task(f"{e.message}", total=total)
            self._bar.update(
                self._bytes_task,
                completed=done,
                total=total,
                description=f"{e.message} {_size(done)} of {_size(total)}",
            )
        elif line_due:
            pct = f" ({100 * done / total:.0f} %)" if total else ""
            self.note(f"[bytes] {e.message}: {_size(done)} of {_size(total)}{pct}")
