"""``pmap``: a function over items on a few threads (node-side, stdlib).

The node program used ``concurrent.futures.ThreadPoolExecutor``, whose import (it
pulls in ``logging``) cost more CPU than the rest of the program's start; on a
light lab every host's start shares the control machine's CPUs, so it showed up in
staging's time per host.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Sequence


def pmap(fn: Callable[[Any], Any], items: Sequence[Any], workers: int) -> List[Any]:
    """``[fn(x) for x in items]`` with up to ``workers`` threads taking the items in order.

    Every item is run (as with ``ThreadPoolExecutor``); then the exception of the first
    item (in ``items`` order) that raised one is re-raised, else the results in order.
    """
    n = len(items)
    results: List[Any] = [None] * n
    errors: List[Optional[BaseException]] = [None] * n
    lock = threading.Lock()
    nxt = [0]

    def work() -> None:
        while True:
            with lock:
                i = nxt[0]
                if i >= n:
                    return
                nxt[0] = i + 1
            try:
                results[i] = fn(items[i])
            except BaseException as e:  # handed to the caller below
                errors[i] = e

    count = max(1, min(int(workers), n))
    if count == 1:
        work()
    else:
        threads = [threading.Thread(target=work, name="pmap", daemon=True) for _ in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for e in errors:
        if e is not None:
            raise e
    return results
