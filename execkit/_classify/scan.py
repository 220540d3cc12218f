"""Scanning one tail: which match decides, and the wait an upstream verdict carries.

`Scan` lowers the tail once (patterns.lowered, offsets kept) and indexes its stale retry
notices once (notices.py); each rule's alternatives then run only where their keywords
occur. `decide_scan` applies the documented list (rules.py) in its order of authority:

1. An account limit (`quota`, `billing`, `usage-limit`) anywhere in the tail, retry
   notices included, vetoes upstream: the verdict is work with that row's reason. Not
   when a per-minute quota (`per-minute-quota`) shows a quota or billing row is a rate
   limit Google words as a quota, nor when a reset is stated after the limit (resets.py).
2. Else the last presented status (any 100..599, stale notices skipped) decides when it
   is an upstream one (429, 5xx); when it is not, every signal before it is discarded.
3. Else upstream wording after that status decides, the match nearest the end (rule order
   breaks a tie); an account limit lifted by a stated reset, with nothing upstream left,
   is upstream `usage limit`.

The deciding match is a `Hit`; `evidence` cuts the line around it to `EVIDENCE_CHARS`. An
upstream verdict carries the last stated reset as its wait (None when none is stated).
"""

from __future__ import annotations

import time

import attrs

from execkit._classify.notices import NoticeIndex
from execkit._classify.patterns import Rule, lowered
from execkit._classify.resets import last_wait
from execkit._classify.rules import (
    ACCOUNT_LIMITS,
    NUMERIC_RULES,
    PER_MINUTE,
    UPSTREAM_WORDING,
    is_http_status,
    is_upstream_status,
)
from execkit._classify.verdict import EVIDENCE_CHARS, FailureClass, Reason


def _line_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    return line_start, len(text) if line_end < 0 else line_end


def evidence(text: str, start: int, end: int) -> str:
    """The line around a match, cut to `EVIDENCE_CHARS` around the match."""
    line_start, line_end = _line_bounds(text, start, end)
    line = text[line_start:line_end].strip()
    if len(line) <= EVIDENCE_CHARS:
        return line
    # Centre a window on the match; a match longer than the window keeps its head.
    slack = max(0, EVIDENCE_CHARS - (end - start))
    lo = max(line_start, start - slack // 2)
    hi = min(line_end, lo + EVIDENCE_CHARS)
    lo = max(line_start, hi - EVIDENCE_CHARS)
    return text[lo:hi].strip()


@attrs.frozen
class Hit:
    """One counted match: its rule's name, its span in the tail, its reason and status."""

    rule: str
    start: int
    end: int
    reason: str
    code: int | None = None


class Scan:
    """One lowered tail, and the lines that are retry notices other output followed."""

    def __init__(self, tail: str) -> None:
        self.low = lowered(tail)
        self.notices = NoticeIndex(self.low)

    def last_hit(self, rule: Rule, *, skip_notices: bool, any_status: bool = False) -> Hit | None:
        """The rule's counted match nearest the end (an upstream status, not a stale notice;
        with `any_status`, any HTTP status 100..599)."""
        best: Hit | None = None
        for alternative in rule.alternatives:
            if not any(keyword in self.low for keyword in alternative.keywords):
                continue
            for match in alternative.pattern.finditer(self.low):
                if best is not None and match.end() <= best.end:
                    continue
                code = None
                if rule.reason is None:
                    code = int(match.group("code"))
                    wanted = is_http_status(code) if any_status else is_upstream_status(code)
                    if not wanted:
                        continue
                    reason = f"http {code}"
                else:
                    reason = rule.reason
                if skip_notices and self.notices.is_stale_notice(match.start()):
                    continue
                best = Hit(rule.name, match.start(), match.end(), reason, code)
        return best

    def latest(
        self, rules: tuple[Rule, ...], *, skip_notices: bool, any_status: bool = False
    ) -> Hit | None:
        """The counted match nearest the end over `rules`; rule order breaks ties."""
        best: Hit | None = None
        for rule in rules:
            hit = self.last_hit(rule, skip_notices=skip_notices, any_status=any_status)
            if hit is not None and (best is None or hit.end > best.end):
                best = hit
        return best

    def upstream(self) -> Hit | None:
        """The deciding upstream signal: the last presented status when it is an upstream
        one, else wording after it (the last status, when not upstream, bars all before)."""
        status = self.latest(NUMERIC_RULES, skip_notices=True, any_status=True)
        if status is not None and status.code is not None and is_upstream_status(status.code):
            return status
        barrier = -1 if status is None else status.end
        wording = self.latest(UPSTREAM_WORDING, skip_notices=True)
        return wording if wording is not None and wording.start >= barrier else None


def decide(tail: str, now: float | None = None) -> tuple[FailureClass, Hit] | None:
    """The deciding match in `tail`: an account-limit veto (work), else upstream, else None."""
    return decide_scan(Scan(tail), now)[0]


def decide_scan(
    scan: Scan, now: float | None
) -> tuple[tuple[FailureClass, Hit] | None, float | None]:
    """The deciding match and, for upstream, the wait until a stated reset."""
    clock = time.time() if now is None else now
    veto = scan.latest(ACCOUNT_LIMITS, skip_notices=False)
    if veto is not None and veto.reason != Reason.USAGE_LIMIT and _per_minute(scan):
        veto = None  # Google words a per-minute rate limit as an exceeded quota
    reset = None
    if veto is not None:
        reset = last_wait(scan.low, clock, scan.notices)
        if reset is None or reset[0] < veto.start:
            return (FailureClass.WORK, veto), None
    # No account limit, or one that lifts at a time stated after it: upstream may decide.
    hit = scan.upstream()
    if hit is None:
        if veto is None:
            return None, None
        hit = attrs.evolve(veto, reason=Reason.USAGE_LIMIT)
    if reset is None:
        reset = last_wait(scan.low, clock, scan.notices)
    return (FailureClass.UPSTREAM, hit), None if reset is None else reset[1]


def _per_minute(scan: Scan) -> bool:
    return scan.last_hit(PER_MINUTE, skip_notices=False) is not None
