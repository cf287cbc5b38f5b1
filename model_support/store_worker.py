"""A helper process of a large materialize: ``python -m model_support.store_worker``.

Reads one share of the records to fold from stdin (JSON), writes the answer to stdout (see
:class:`model_support.store._FoldHelper`). Not meant to be run by hand.
"""

from __future__ import annotations

import json
import sys

from model_support.store import fold_share


def main() -> None:
    """Answer the one request on stdin."""
    request = json.loads(sys.stdin.buffer.read())
    sys.stdout.buffer.write(fold_share(request))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
