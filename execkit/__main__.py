"""`python -m execkit` is the `execkit` command.

Ctrl-C handling comes first, before anything that takes time is imported: until
`execkit.cli.main` takes over, an interrupt writes one line and exits 130, no traceback.
"""

from __future__ import annotations

import os
import signal
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType


def _interrupted(_signum: int, _frame: FrameType | None) -> None:
    os.write(2, b"execkit: interrupted\n")
    os._exit(130)


# A process started with SIGINT ignored (a background job of a script) keeps ignoring it.
if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
    signal.signal(signal.SIGINT, _interrupted)

from execkit.cli import main  # noqa: E402

sys.exit(main())
