"""Sphinx configuration of the skcep documentation.

Build (from the repository root)::

    pip install -e ".[docs]"
    python -m sphinx -W --keep-going -b html docs docs/_build/html

Pages are Markdown read by myst-parser; the API reference is generated from the numpydoc
docstrings by autodoc + numpydoc.  The build is offline: no intersphinx inventories are
fetched.
"""

import re
import sys
from pathlib import Path

from sphinx.util import logging

_DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(_DOCS.parent))  # document this checkout, whatever skcep is installed

import skcep  # noqa: E402

_logger = logging.getLogger(__name__)

# -- Project -----------------------------------------------------------------------------
project = "skcep"
author = "the skcep developers"
copyright = "the skcep developers, BSD-3-Clause"
version = release = skcep.__version__

# -- General -----------------------------------------------------------------------------
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
templates_path = []
html_static_path = []
html_theme = "alabaster"
html_title = f"skcep {release}"
pygments_style = "sphinx"

# -- MyST --------------------------------------------------------------------------------
# The introduction writes its equations in LaTeX ($...$ inline, $$...$$ displayed), which
# also renders on GitHub; the guides use Unicode math in plain text.
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3

# -- autodoc / autosummary / numpydoc ----------------------------------------------------
# The API page writes one autosummary table per module and documents each object in place
# (no stub pages are generated into the source tree).
autosummary_generate = False
autodoc_default_options = {
    "members": True,
    # methods an estimator inherits from a private skcep base class are documented; those
    # implemented by scikit-learn are skipped by _skip_scikit_learn_members below
    "inherited-members": True,
    "member-order": "bysource",
}
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True


# -- Links and pages ---------------------------------------------------------------------
# benchmarks/README.md is written with the benchmarks.  While a file listed here is absent, it
# is dropped from every toctree and links to it become plain text, so that the documentation
# of what exists builds without warnings (logged at the info level).  Any other missing target
# stays an error.
_OPTIONAL_FILES = ["../benchmarks/README.md"]

# A Markdown link to a repository file outside docs/, e.g. [results](../benchmarks/README.md),
# works as it is on the repository host; in the built pages it becomes a download link to a
# copy of the file (myst's "path:" links), so it also works wherever the HTML is published.
_OUTSIDE_LINK = re.compile(r"(?<!!)(\[[^\]]*\]\()(\.\./[^)\s#]+)((?:#[^)\s]*)?\))")


def _adapt_links(app, docname, source):
    if not str(app.env.doc2path(docname)).endswith(".md"):
        return
    text = source[0]
    for name in _OPTIONAL_FILES:
        if (_DOCS / name).is_file():
            continue
        stem = name[: -len(".md")]
        # a toctree entry "deep_tensor" or "deep_tensor.md" (optionally "Title <deep_tensor>")
        text, n_toc = re.subn(rf"(?m)^[ \t]*(?:[^\n<`]*<)?{re.escape(stem)}(?:\.md)?>?[ \t]*\n", "", text)
        # a link [text](deep_tensor.md#anchor) -> text
        text, n_link = re.subn(rf"(?<!!)\[([^\]]*)\]\({re.escape(name)}(?:#[^)]*)?\)", r"\1", text)
        if n_toc or n_link:
            _logger.info(f"[skcep] {docname}: {name} is absent; its entries are left out")
            app.env.note_dependency(str(_DOCS / name))  # re-read once the file exists

    here = Path(app.env.doc2path(docname)).parent

    def download(match):
        if not (here / match[2]).is_file():
            return match[0]  # left to myst, which reports the missing target
        return f"{match[1]}path:{match[2]}{match[3]}"

    source[0] = _OUTSIDE_LINK.sub(download, text)


def _skip_scikit_learn_members(app, what, name, obj, skip, options):
    """Leave out methods implemented by scikit-learn (get_params, set_params, a mixin's
    score, the metadata-routing set_*_request methods): scikit-learn documents them."""
    if str(getattr(obj, "__module__", None) or "").startswith("sklearn."):
        return True
    return None


def setup(app):
    app.connect("source-read", _adapt_links)
    app.connect("autodoc-skip-member", _skip_scikit_learn_members)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
