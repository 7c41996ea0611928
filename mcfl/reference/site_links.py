"""Links of the repository's markdown files (README, BENCHMARKS, REPRODUCTION) as the docs site
needs them: a link to a page of the site (docs/..., another included file, a notebook) made
relative to the page the file becomes; a link to any other repository file shown as its path,
since the site does not hold it (and `mkdocs build --strict` fails on a link it cannot follow).
"""

from __future__ import annotations

import re

# Repository files shown in the site, and where (their links are rewritten to match).
INCLUDED = {"README.md": "index.md", "BENCHMARKS.md": "results/benchmarks.md",
            "REPRODUCTION.md": "results/reproduction.md"}
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def site_link(target: str, page: str) -> str | None:
    """Where a repository-relative link `target` of an included file points in the site, as
    a path relative to `page` (None: the file is not part of the site)."""
    path, _, anchor = target.partition("#")
    if path.startswith("docs/") and not path.endswith(".py"):
        site_path = path.removeprefix("docs/")
    elif path in INCLUDED:
        site_path = INCLUDED[path]
    elif path.startswith("notebooks/") and path.endswith(".ipynb"):
        site_path = path
    else:
        return None
    depth = page.count("/")
    relative = "../" * depth + site_path
    return relative + (f"#{anchor}" if anchor else "")


def with_site_links(text: str, page: str) -> str:
    """`text` (an included repository file) with links into the site rewritten for `page`,
    and links to other repository files shown as their path (they are not in the site)."""
    def replace(match: re.Match) -> str:
        image, label, target = match.groups()
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            return match.group(0)
        link = site_link(target, page)
        if link is not None:
            return f"{image}[{label}]({link})"
        shown = label if label.strip("`") == target else f"{label} (`{target}`)"
        return shown
    return LINK.sub(replace, text)
