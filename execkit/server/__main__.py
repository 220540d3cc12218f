"""`python -m execkit.server --openapi`: print the OpenAPI document `GET /openapi.json`
serves, byte for byte, without starting a server (nor needing Starlette or uvicorn). The
TypeScript SDK's wire types are generated from it (sdk/typescript/scripts/)."""

from __future__ import annotations

import argparse
import json
import sys

from execkit._api import openapi_document, package_version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m execkit.server", description=__doc__)
    parser.add_argument(
        "--openapi", action="store_true", required=True, help="print the OpenAPI document"
    )
    parser.parse_args(argv)
    # The server's own serialisation (execkit.server._app): sorted keys, no indent.
    sys.stdout.write(json.dumps(openapi_document(package_version()), sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
