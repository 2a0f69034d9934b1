"""The trust check (starved generator) and prompts built to a token count."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from clusterctl.bench import tokens, trust
from clusterctl.bench.loadgen import RunResult
from clusterctl.bench.stats import RequestResult, aggregate

from .conftest import READY


def _run(
    ttft: float, gap: float, n: int = 8, requests: int = 8, lag: float = 0.0005, cpu: float = 0.05, same_read: int = 0
) -> tuple[RunResult, dict]:
    """``requests`` results of ``n`` tokens: TTFT ``ttft`` s, then ``gap`` s apart, the first ``same_read`` gaps
    of each 0 (read together); loop lags all ``lag``."""
    res = []
    for _ in range(requests):
        itl = [0.0] * same_read + [gap] * (n - 1 - same_read)
        res.append(
            RequestResult(
                ok=True, ttft=ttft, e2e=ttft + sum(itl), itl=itl, output_tokens=n, input_tokens=4, reads=n - same_read
            )
        )
    run = RunResult(2, res, 1.0, cpu, [lag] * 200)
    rep = aggregate(res, 1.0, 2)
    rep["generator_cpu_percent"] = 100 * cpu
    return run, rep


def test_a_healthy_level_is_trusted_with_its_measured_errors() -> None:
    run, rep = _run(0.020, 0.0027)
    t = trust.judge(run, rep, server_ttft_s=0.017, server_tpot_s=0.0027)
    assert t["trusted"] and t["reasons"] == []
    assert t["ttft_error_ms"] == pytest.approx(3.0) and t["tpot_error_pct"] == pytest.approx(0.0)
    assert t["loop_lag_ms"]["mean"] == pytest.approx(0.5) and t["coalesced_share"] == 0.0


def test_the_starved_run_of_the_issue_is_flagged_on_every_signal() -> None:
    # Issue #29's run: TTFT 112 ms against the server's 17, TPOT 1.4 against 2.7, ITL median 0, CPU 4 %.
    run, rep = _run(0.112, 0.0016, same_read=4, lag=0.012, cpu=0.04)
    t = trust.judge(run, rep, server_ttft_s=0.017, server_tpot_s=0.0027)
    assert not t["trusted"] and t["ttft_error_ms"] == pytest.approx(95.0)
    assert t["tpot_error_pct"] < -25
    text = " | ".join(t["reasons"])
    assert "client TTFT 112.0 ms against the server's 17.0 ms" in text and "TPOT" in text
    assert "event loop 12.0 ms late" in text and "same read" in text
    # client-only: no /metrics, the loop lag and the chunks read together still say so
    alone = trust.judge(run, rep)
    assert not alone["trusted"] and len(alone["reasons"]) == 2 and "ttft_error_ms" not in alone


def test_each_signal_has_its_limit() -> None:
    run, rep = _run(0.020, 0.005)
    assert not trust.judge(run, rep, server_ttft_s=0.005)["trusted"]  # +15 ms > max(10, 25 % of 5)
    assert trust.judge(run, rep, server_ttft_s=0.012)["trusted"]  # +8 ms
    assert not trust.judge(run, rep, server_tpot_s=0.010)["trusted"]  # TPOT -50 %
    assert trust.judge(*_run(0.020, 0.005, lag=0.004))["trusted"]
    assert not trust.judge(*_run(0.020, 0.005, lag=0.006))["trusted"]
    assert not trust.judge(*_run(0.020, 0.005, cpu=0.95))["trusted"]
    burst = _run(0.020, 0.005, same_read=5)  # 5 of 7 gaps are 0
    assert not trust.judge(*burst)["trusted"]
    # ... unless the server's own TPOT says it sends tokens that close together (noted, not flagged)
    fast = trust.judge(*_run(0.020, 0.0004, same_read=5), server_tpot_s=0.0004)
    assert fast["trusted"] and "sends them that close together itself" in fast["notes"][0]


def test_prompts_are_built_to_a_token_count() -> None:
    # A vocabulary of about 1.6 tokens a word (3 characters a token): the word count is not the token count.
    tok = tokens.Tokenizer(lambda text: (len(text) + 2) // 3, "test")
    rng = random.Random(1)
    for target in (1, 7, 128, 500):
        p = tokens.build(target, rng, tok)
        assert p.tokens == tok.count(p.text) and target - 2 <= p.tokens <= target, (target, p)
        assert target == 1 or p.words < target
    words = tokens.build(12, rng, None)
    assert words.tokens is None and words.words == 12 and len(words.text.split()) == 12


def _starve(pid: int, stop: threading.Event) -> None:
    """Keep ``pid`` off the CPU 25 ms of every 30, as a busy-polling engine on the same cores does."""
    while not stop.is_set():
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.025)
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        time.sleep(0.005)


def test_a_starved_generator_exits_3_with_the_measured_error(host, models, start_sim) -> None:
    sim = start_sim(host, models["qwen3-8b"], scale="0.25", startup="0")
    assert sim.wait_for(READY, 60), sim.log
    code = "import sys; from clusterctl.cli.main import main; sys.exit(main(sys.argv[1:]))"
    # Starved from the start (no /tokenize probe to slow down): on an idle machine the whole level takes
    # well under the second that a head start would give it, so waiting first would starve nothing.
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            "bench",
            sim.url,
            "-c",
            "2",
            "-n",
            "6",
            "--input-len",
            "16",
            "--output-len",
            "12",
            "--no-tokenizer",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stop = threading.Event()
    starver = threading.Thread(target=_starve, args=(p.pid, stop), daemon=True)
    starver.start()
    try:
        out, err = p.communicate(timeout=90)
    finally:
        stop.set()
        starver.join()
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
    doc = json.loads(out)
    (level,) = doc["results"]
    assert p.returncode == 3 and doc["trusted"] is False and level["completed"] == 6, (p.returncode, err[-2000:])
    t = level["trust"]
    assert not t["trusted"] and t["reasons"] and t["loop_lag_ms"]["mean"] > trust.LAG_MS, t
    assert sim.stop() == 0


def _bpe(path, vocab: int) -> None:  # type: ignore[no-untyped-def]
    """A real byte-level BPE tokenizer.json (the format of Hugging Face models), trained on the synthetic words
    with a small vocabulary so that most words are two or more tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from clusterctl.vllmclient import WORDS as _WORDS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    rng = random.Random(0)
    text = [" ".join(rng.choice(_WORDS) for _ in range(50)) for _ in range(200)]
    tok.train_from_iterator(
        text,
        trainers.BpeTrainer(
            vocab_size=vocab, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok.save(str(path))


def test_a_local_tokenizer_sets_the_length_and_both_counts_are_recorded(
    host, models, start_sim, tmp_path, trust_not_judged, capsys
) -> None:
    from clusterctl.cli.main import main

    _bpe(tmp_path / "tokenizer.json", 270)  # the 256 bytes and a few merges: words of 2-5 tokens
    sim = start_sim(host, models["qwen3-8b"], scale="0.05", startup="0")
    assert sim.wait_for(READY), sim.log
    assert (
        main(
            [
                "bench",
                sim.url,
                "-c",
                "2",
                "-n",
                "4",
                "--input-len",
                "24",
                "--output-len",
                "2",
                "--tokenizer",
                str(tmp_path),
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    (r,) = doc["results"]
    assert doc["input_len_unit"] == "tokens" and doc["tokenizer"].startswith("local ")
    assert 22 <= r["prompt_tokens_mean"] <= 24 and r["prompt_words_mean"] < 12, r  # tokens, not words
    # the server counts with its own tokenizer (the simulator's: one a word): recorded next to ours
    assert r["total_input_tokens"] == pytest.approx(4 * r["prompt_words_mean"], abs=4)
    # without any tokenizer: words, with a warning in the report
    assert (
        main(
            [
                "bench",
                sim.url,
                "-c",
                "1",
                "-n",
                "1",
                "--input-len",
                "5",
                "--output-len",
                "2",
                "--no-tokenizer",
                "--json",
            ]
        )
        == 0
    )
    words = json.loads(capsys.readouterr().out)
    assert words["input_len_unit"] == "words" and "counted in words" in words["warnings"][0]
    assert main(["bench", sim.url, "--tokenizer", str(tmp_path / "nothing-here")]) == 3
    assert "no tokenizer.json" in capsys.readouterr().err
    assert sim.stop() == 0
