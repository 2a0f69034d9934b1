"""``status --watch``: refreshes with the same fleet, worst first, grouped past --top, bounded by
--count; at 1,000 instances a frame stays one screen and is quick to draw."""

from __future__ import annotations

import io
import json
import time

from rich.console import Console

from clusterctl.cli import watch as W
from clusterctl.deploy.status.instances import InstanceStatus
from clusterctl.diagnose.findings import Severity


def rows(n: int) -> list[InstanceStatus]:
    out = []
    for i in range(n):
        sev = Severity.CRIT if i % 250 == 7 else Severity.WARN if i % 100 == 3 else Severity.OK
        out.append(
            InstanceStatus(
                f"chat-{i}",
                f"gpu{i // 8:03d}",
                8000 + i % 8,
                {"OK": "serving", "WARN": "degraded", "CRIT": "down"}[sev.name],
                sev,
                message="unit failed" if sev is Severity.CRIT else "",
                template=f"chat{i % 4}",
                kv_usage=(i % 97) / 100,
                running=float(i % 5),
                waiting=float(i % 7),
                tokens_per_s=float(i % 300),
                load=(i % 89) / 100,
            )
        )
    return out


def test_order_is_health_first_then_the_sort_key():
    r = rows(300)
    by_load = W.order(r, "load")
    assert [x.severity for x in by_load[:2]] == [Severity.CRIT, Severity.CRIT]
    warn = [x for x in by_load if x.severity is Severity.WARN]
    assert [x.load for x in warn] == sorted((x.load for x in warn), reverse=True)
    assert W.order(r, "name")[2].severity is Severity.WARN


def test_groups_sum_up_templates_worst_first():
    g = W.groups(rows(1000))
    assert len(g) == 4 and sum(x["instances"] for x in g) == 1000
    assert g[0]["down"] >= g[-1]["down"] and g[0]["worst"] is Severity.CRIT
    assert all(0 <= x["kv_mean"] <= x["kv_max"] <= 1 for x in g)


def test_a_thousand_instances_fit_one_frame_quickly():
    buf = io.StringIO()
    t0 = time.monotonic()
    view = W.frame(rows(1000), sort="load", top=20, interval=5, stamp=0, took_s=1.2)
    Console(file=buf, width=160, force_terminal=False).print(view)
    took = time.monotonic() - t0
    text = buf.getvalue()
    assert "1000 instances on 125 hosts: 986 serving" in text and "4 down" in text
    assert "by template (4 groups, worst first)" in text and "the 20 worst of 1000" in text
    body = text.split("the 20 worst of 1000")[1].splitlines()
    assert sum(1 for line in body if line.strip().startswith("chat-")) == 20
    assert body[2].split()[2] == "down"  # the first instance row (after the title and the header)
    assert len(text.splitlines()) < 40 and took < 5


def test_run_watch_refreshes_count_times_and_prints_json_lines(capsys):
    calls: list[int] = []

    def collect() -> list[InstanceStatus]:
        calls.append(1)
        return rows(10)

    code = W.run_watch(
        collect, interval=0, sort="kv", top=None, count=3, json_out=True, console=Console(file=io.StringIO())
    )
    out = capsys.readouterr().out.splitlines()
    assert len(calls) == 3 and len(out) == 3 and code == 2
    doc = json.loads(out[-1])
    assert doc["exit_code"] == 2 and len(doc["instances"]) == 10
    code = W.run_watch(
        collect, interval=0, sort="kv", top=5, count=2, json_out=False, console=Console(file=io.StringIO())
    )
    text = capsys.readouterr().out
    assert text.count("instances on") == 2 and "the 5 worst of 10" in text
