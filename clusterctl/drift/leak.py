"""Context-leak check: does one session's prompt text show up in another session's output?

Every session (the OpenAI ``user`` field) gets its own canary, a random
lower-case word no model would produce, planted in each of its prompts; all
sessions send concurrently.  A sighting is another session's canary in a
response's text or among its top-k logprob tokens (a leaked token that greedy
decoding did not pick still ranks high).  It never compares outputs for
equality, so batching noise cannot raise or hide a finding.  Any sighting is
CRIT (the cross-session KV-reuse bug).
"""

from __future__ import annotations

import random
import string
import threading
from dataclasses import dataclass, field

from clusterctl.drift.client import EndpointError, complete, served_models
from clusterctl.vllmclient import Endpoint

_FILLER = (
    "please summarise the following note",
    "write one sentence about",
    "list three facts about",
    "translate to french",
    "what comes next after",
)


@dataclass(frozen=True)
class Sighting:
    """Session ``owner``'s canary seen in session ``seen_by``'s response ``request`` (in ``where``)."""

    canary: str
    owner: str
    seen_by: str
    request: int
    where: str  # "text" or "top-k"


@dataclass
class LeakReport:
    sessions: int
    requests: int
    failed: int
    sightings: list[Sighting] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _canary(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(10))


def pick_model(ep: Endpoint, model: str | None, timeout: float = 10.0) -> str:
    """The model to ask for: ``model`` when given (it must be listed), else the one ``/v1/models`` lists;
    raises :class:`EndpointError` when several are listed (a gateway routing many: ``--model``) or none."""
    listed = served_models(ep, timeout)
    if model:
        if listed and model not in listed:
            raise EndpointError(f"{ep.url}: model {model!r} is not served (/v1/models lists {', '.join(listed)})")
        return model
    if len(listed) == 1:
        return listed[0]
    if not listed:
        raise EndpointError(f"{ep.url}/v1/models lists no model: give --model")
    raise EndpointError(f"{ep.url} serves {len(listed)} models ({', '.join(listed)}): give --model")


def run(
    ep: Endpoint,
    *,
    sessions: int = 4,
    requests: int = 6,
    k: int = 5,
    max_tokens: int = 12,
    seed: int | None = None,
    timeout: float = 60.0,
    model: str | None = None,
) -> LeakReport:
    """``sessions`` concurrent sessions of ``requests`` each; returns every cross-session sighting.
    ``model``: the request's ``model`` (what a gateway routes by)."""
    rng = random.Random(seed)
    canaries = {f"leakcheck-{i}-{rng.randrange(1 << 32):08x}": _canary(rng) for i in range(max(2, sessions))}
    report = LeakReport(len(canaries), 0, 0)
    lock = threading.Lock()

    def session(user: str, canary: str, salt: int) -> None:
        srng = random.Random(salt)
        for n in range(requests):
            prompt = f"{canary} {canary} {srng.choice(_FILLER)} {canary} code {n}"
            try:
                out = complete(
                    ep,
                    prompt,
                    max_tokens=max_tokens,
                    k=k,
                    seed=0,
                    user=user,
                    timeout=timeout,
                    token_ids=False,
                    model=model,
                )  # canaries are looked for in token text
            except EndpointError as e:
                with lock:
                    report.failed += 1
                    report.errors.append(str(e))
                continue
            text = out.text.lower()
            top = {t.strip().lower() for pos in out.top for t in pos}
            found = []
            for owner, c in canaries.items():
                if owner == user:
                    continue
                if c in text:
                    found.append(Sighting(c, owner, user, n, "text"))
                elif any(c in t or (len(t) >= 6 and t in c) for t in top):
                    found.append(Sighting(c, owner, user, n, "top-k"))
            with lock:
                report.requests += 1
                report.sightings.extend(found)

    threads = [
        threading.Thread(target=session, args=(u, c, rng.randrange(1 << 30)), daemon=True) for u, c in canaries.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report.errors = sorted(set(report.errors))[:5]
    return report
