"""TTFT in ``status`` / ``status --watch``: vLLM's ``vllm:time_to_first_token_seconds``
histogram differenced between two scrapes of a recorded vLLM 0.11.0 /metrics page
(tests/fixtures/vllm/metrics_v0.11.0.prom): p90 and mean over the requests in between,
n/a with one scrape, no request or a counter reset; a column in the frame and a key in --json."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from clusterctl.cli import watch as W
from clusterctl.deploy.status import instances as S
from clusterctl.deploy.status.metrics import WindowedMetrics, parse_sample
from clusterctl.diagnose.findings import Severity

REAL = (Path(__file__).parents[2] / "fixtures/vllm/metrics_v0.11.0.prom").read_text()
LINE = re.compile(r'^(vllm:time_to_first_token_seconds_(bucket|sum|count))(\{[^}]*\}) (\S+)$', re.M)


def earlier(text: str, change) -> str:
    """``text`` with each TTFT sample rewritten by ``change(kind, le, value)``."""

    def sub(m: re.Match) -> str:
        le = re.search(r'le="([^"]+)"', m.group(3))
        return f"{m.group(1)}{m.group(3)} {change(m.group(2), float(le.group(1)) if le else None, float(m.group(4)))}"

    return LINE.sub(sub, text)


# idle: nothing running and nothing waiting (waiting in both samples with no token is a hung engine)
IDLE = re.sub(r"(?m)^(vllm:num_requests_(?:running|waiting)\{[^}]*\}) \S+$", r"\g<1> 0.0", REAL)


def window(before: str, after: str = REAL) -> WindowedMetrics:
    return WindowedMetrics(first=parse_sample(before, at=0.0), last=parse_sample(after, at=5.0))


def test_the_recorded_page_parses_to_its_histogram():
    s = parse_sample(REAL, at=0.0)
    assert s.ttft_count == 1477 and s.ttft_sum == pytest.approx(774.0277627716447)
    assert dict(s.ttft_buckets)[1.0] == 1178 and dict(s.ttft_buckets)[float("inf")] == 1477


def test_everything_since_an_empty_histogram():
    w = window(earlier(REAL, lambda kind, le, v: 0.0))
    assert w.ttft_requests == 1477
    assert w.ttft_mean_s == pytest.approx(774.0277627716447 / 1477)
    # rank 0.9 * 1477 = 1329.3 falls in (1.0, 2.5] holding 1178..1456
    assert w.ttft_p90_s == pytest.approx(1.0 + 1.5 * (1329.3 - 1178) / (1456 - 1178))


def test_only_the_requests_between_the_two_scrapes_count():
    # 100 requests between the scrapes, all with a first token in (0.06, 0.08], 7 s in all
    def before(kind, le, v):
        if kind == "bucket":
            return v - 100 if le >= 0.08 else v
        return v - 100 if kind == "count" else v - 7.0

    w = window(earlier(REAL, before))
    assert w.ttft_requests == 100 and w.ttft_mean_s == pytest.approx(0.07)
    assert w.ttft_p90_s == pytest.approx(0.06 + 0.02 * 0.9)  # the lifetime p90 would be 1.82 s


@pytest.mark.parametrize("before", [REAL, earlier(REAL, lambda kind, le, v: v * 2)], ids=["no request", "reset"])
def test_no_request_or_a_counter_reset_is_not_applicable(before):
    w = window(before)
    assert w.ttft_p90_s is None and w.ttft_mean_s is None and w.ttft_requests is None


def test_one_scrape_or_a_page_without_the_histogram_is_not_applicable():
    one = parse_sample(REAL, at=0.0)
    assert WindowedMetrics(first=one, last=one).ttft_p90_s is None
    bare = LINE.sub("", REAL)
    assert window(bare, bare).ttft_p90_s is None and window(bare).ttft_p90_s is None


def _row(name: str, w: WindowedMetrics) -> S.InstanceStatus:
    row = S.InstanceStatus(name, "gpu01", 8000, "serving", Severity.OK, active="active", healthy=True, template="chat")
    S._apply_load(row, w, None, None)
    return row


def test_the_watch_frame_and_json_carry_ttft(capsys):
    rows = [
        _row(
            "fast",
            window(
                earlier(
                    REAL,
                    lambda kind, le, v: (
                        v - 100
                        if kind == "count" or (kind == "bucket" and le >= 0.08)
                        else v - 7.0
                        if kind == "sum"
                        else v
                    ),
                )
            ),
        ),
        # idle: nothing running (the same page twice with requests running is a hung engine)
        _row("idle", window(IDLE, IDLE)),
        _row("first", WindowedMetrics(first=(one := parse_sample(REAL, 0.0)), last=one)),
    ]
    assert rows[0].ttft_p90_s == pytest.approx(0.078) and rows[0].to_json()["ttft_mean_s"] == pytest.approx(0.07)
    assert rows[1].ttft_p90_s is None and rows[2].to_json()["ttft_p90_s"] is None
    buf = io.StringIO()
    Console(file=buf, width=160, force_terminal=False).print(
        W.frame(rows, sort="ttft", top=10, interval=5, stamp=0, took_s=0.1)
    )
    lines = buf.getvalue().splitlines()
    head = next(x for x in lines if x.split()[:1] == ["instance"])
    assert "ttft p90" in head
    assert [x.split()[0] for x in lines if x.split()[:1] in (["fast"], ["idle"], ["first"])] == [
        "fast",
        "first",
        "idle",
    ]
    by_name = {x.split()[0]: x.split() for x in lines if x.split()[:1] in (["fast"], ["idle"], ["first"])}
    assert "78ms" in by_name["fast"] and "n/a" in by_name["idle"] and "n/a" in by_name["first"]
    W.run_watch(
        lambda: rows, interval=0, sort="ttft", top=None, count=1, json_out=True, console=Console(file=io.StringIO())
    )
    doc = json.loads(capsys.readouterr().out)
    assert [i["ttft_p90_s"] for i in doc["instances"]] == [pytest.approx(0.078), None, None]
