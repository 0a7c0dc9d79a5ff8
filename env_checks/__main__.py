"""`python -m env_checks [--pins FILE|auto]`: fingerprint this machine and, optionally, judge it.

The fingerprint's `runtime` holds torch's build (version, HIP and CUDA versions) read by a child Python,
since this package never imports torch itself (--no-torch skips that). Without --pins it prints the
fingerprint as JSON. With --pins it prints {"fingerprint", "manifest",
"verdicts", "ok"} as JSON on stdout and one line per verdict on stderr, and exits 1 when a required pin
is violated or unknown (fail closed), 2 when the manifest itself is unusable. A CI runner runs this
before it takes jobs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from env_checks.pins import PinManifestError, evaluate, failed, load_manifest, manifest_for
from env_checks.record.fingerprint import collect, torch_build_info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m env_checks", description=__doc__.splitlines()[0])
    parser.add_argument("--pins", metavar="FILE|auto",
                        help="pin manifest to check against; 'auto' picks the bundled one for this platform")
    parser.add_argument("--no-torch", action="store_true",
                        help="skip reading torch's build (HIP/CUDA version) in a child Python")
    args = parser.parse_args(argv)
    fingerprint = collect(extra=None if args.no_torch else torch_build_info())
    if not args.pins:
        print(json.dumps(fingerprint, indent=2, sort_keys=True))
        return 0
    path = manifest_for(fingerprint) if args.pins == "auto" else Path(args.pins)
    if path is None:
        print("No bundled pin manifest fits this platform "
              f"({fingerprint['platform'].get('gpu_names')}); pass --pins FILE.", file=sys.stderr)
        return 2
    try:
        manifest = load_manifest(path)
    except PinManifestError as exc:
        print(exc, file=sys.stderr)
        return 2
    verdicts = evaluate(manifest, fingerprint)
    blocking = failed(verdicts)
    for v in verdicts:
        print(f"{v.status.upper():9} {v.severity:11} {v.name}: expected {v.expected}, found {v.found!r}"
              f" -- {v.reason}", file=sys.stderr)
    report = {"fingerprint": fingerprint, "manifest": str(path), "ok": not blocking,
              "verdicts": [dataclasses.asdict(v) for v in verdicts]}
    print(json.dumps(report, indent=2, sort_keys=True, default=str))
    return 1 if blocking else 0


if __name__ == "__main__":
    sys.exit(main())
