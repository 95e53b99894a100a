"""Fails when the running environment holds a distribution the lock (constraints.txt) does not pin, or
holds one at another version: `pip install -c` only constrains what it is asked for, so a new dependency
without its line in the lock would otherwise install at whatever version was published last.
Run by .ci/run right after the install; `bash .ci/lock` rewrites the lock when this fails."""

import re
import sys
from importlib import metadata
from pathlib import Path

IGNORED = {"pip", "wheel", "speczoo"}   # the installer itself, and the project (editable)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(lock_path: str) -> int:
    pins = {}
    for line in Path(lock_path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonical(name)] = version.strip()
    problems = []
    for dist in metadata.distributions():
        name = canonical(dist.metadata["Name"])
        if name in IGNORED:
            continue
        version = dist.version.split("+", 1)[0]
        if name not in pins:
            problems.append(f"{name}=={version} is installed but not pinned in {lock_path}")
        elif pins[name] != version:
            problems.append(f"{name} is {version}, the lock pins {pins[name]}")
    for p in sorted(problems):
        print(p, file=sys.stderr)
    if problems:
        print("the environment is not the lock: refresh it with `bash .ci/lock`", file=sys.stderr)
        return 1
    print(f"every installed distribution is pinned by {lock_path} ({len(pins)} pins)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "constraints.txt"))
