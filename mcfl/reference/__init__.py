"""The docs site's generated reference: algorithm pages from the registry, the command line
from the parser, partition pictures, links and API docstring checks (docs/gen_pages.py)."""
