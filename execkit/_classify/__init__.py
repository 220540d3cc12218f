"""The failure classifier (ADR 0046): did a failed attempt produce information about the work?

`classify(result)` answers for a `SpawnResult`, in order of durability:

1. A succeeded run is never classed (None).
2. Structure: a spawn errno that means the run never started is **environment** (ENOENT,
   EACCES, ENOEXEC, ENOTDIR, a missing interpreter, a missing or unusable working
   directory), each with its own reason (structure.py has the table); any other spawn
   errno is **work**. A bare exit 127 with no errno is work: a shell exits 127
   legitimately. Nothing is environment because of what the text says.
3. Text: `classify_text` over the last `TAIL_CHARS` (8 KiB) of `failure_text()`.
4. Otherwise **work**: reason `timeout` for a timed-out run, else `default`.

`classify_text(text)` is upstream or work, never environment. It reads only the tail and is
linear time: every gap is bounded (`{0,n}`) and no quantifier is nested without a bound, so
Python's backtracking engine does constant work per start position, and a pattern runs at
all only when its literal keyword occurs in the tail. The upstream list is tight on purpose
(a false upstream wrongly withholds a charge, a false work only charges as before this
classifier existed); account limits (quota, billing, usage limits) veto upstream back to
work unless the text states a reset after them. An upstream verdict carries
`retry_after_s` when the tail states when to retry.

One concern a file:

- `entry.py`: `classify`, `classify_text`, `classification_fields`, `TAIL_CHARS`;
- `structure.py`: the structural rules, the spawn errno table (`ENVIRONMENT_ERRNOS`);
- `rules.py`: the documented text list, its rows, why each row is as it is, and the same
  table in code (`RULES`); `is_upstream_status`;
- `patterns.py`: how a pattern is written (linear time), compiled (on first use, never at
  import) and run (on a lowered copy with the same offsets);
- `scan.py`: one tail scanned, and which match decides (the veto, the last status);
- `notices.py`: the retry notices more output followed (stale: an upstream signal or a
  reset on one is skipped; an account limit on one still vetoes);
- `resets.py`: the reset times a vendor states (`stated_wait_s`), each read to the end
  of its granularity (`epoch_wait`, `wait_until`);
- `verdict.py`: `FailureClass`, `Reason`, `Classification`, `EVIDENCE_CHARS`,
  `ACCOUNT_LIMIT_REASONS`, `never_started`, `stall_reason`, `stalled_for`.

Rooms outside this package import from `execkit._classify` only, never from its files.
"""

from typing import TYPE_CHECKING, Any

from execkit._classify.verdict import (
    ACCOUNT_LIMIT_REASONS,
    EVIDENCE_CHARS,
    Classification,
    FailureClass,
    Reason,
    never_started,
    stall_reason,
    stalled_for,
)

if TYPE_CHECKING:
    from execkit._classify.entry import (
        TAIL_CHARS,
        classification_fields,
        classify,
        classify_text,
    )
    from execkit._classify.resets import epoch_wait, stated_wait_s, wait_until
    from execkit._classify.rules import is_upstream_status
    from execkit._classify.structure import ENVIRONMENT_ERRNOS

# The verdict's types are imported with the package: the ledger stores a `FailureClass`.
# The classifier itself (and through it the spawner's result types) loads on first use,
# so a command that only reads the ledger (`execkit task list`) never imports it.
_LAZY = {
    "TAIL_CHARS": "entry",
    "classification_fields": "entry",
    "classify": "entry",
    "classify_text": "entry",
    "stated_wait_s": "resets",
    "epoch_wait": "resets",
    "wait_until": "resets",
    "is_upstream_status": "rules",
    "ENVIRONMENT_ERRNOS": "structure",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'execkit._classify' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"execkit._classify.{module}"), name)
    globals()[name] = value  # once: the next lookup is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "ACCOUNT_LIMIT_REASONS",
    "ENVIRONMENT_ERRNOS",
    "EVIDENCE_CHARS",
    "TAIL_CHARS",
    "Classification",
    "FailureClass",
    "Reason",
    "classification_fields",
    "classify",
    "classify_text",
    "epoch_wait",
    "is_upstream_status",
    "never_started",
    "stall_reason",
    "stalled_for",
    "stated_wait_s",
    "wait_until",
]
