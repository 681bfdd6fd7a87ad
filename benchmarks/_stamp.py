"""The source stamp of a results file: which code made it.

``_common.library_state()`` writes the line; ``report.py --stale`` reads it back and compares
it with today's code.  Standard library only, so that the report needs neither skcep nor numpy.
"""

import hashlib
import re
from pathlib import Path

# the line as library_state() writes it; the first match in a results file is its stamp
STAMP = re.compile(r"skcep (\S+), source sha1 ([0-9a-f]{10}) \(skcep/\*\*/\*\.py at import\)")


def source_hash(package):
    """First 10 hex digits of the sha1 of the package's ``.py`` files, read in sorted order."""
    digest = hashlib.sha1()
    for f in sorted(Path(package).rglob("*.py")):
        digest.update(f.read_bytes())
    return digest.hexdigest()[:10]


def stamp(version, sha):
    """The stamp line of skcep ``version`` whose source hashes to ``sha``."""
    return f"skcep {version}, source sha1 {sha} (skcep/**/*.py at import)"
