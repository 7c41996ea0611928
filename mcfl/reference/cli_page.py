"""The command-line reference page, written from the parser `mcfl` itself uses.

Every command and subcommand gets its usage line and a table of its flags (what each takes and
does, its choices); the run flags include every registered algorithm's hyperparameters, since
the parser is built from the registry.
"""

from __future__ import annotations

import argparse

from mcfl.apps.cli import build_parser


def _subcommands(parser: argparse.ArgumentParser):
    """(name, help, parser) of `parser`'s subcommands, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _flags_table(parser: argparse.ArgumentParser) -> str:
    rows = ["| flag | what it does |", "| --- | --- |"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            takes = "" if action.nargs == 0 else " " + (
                action.metavar or action.dest.upper())
            flag = ", ".join(f"`{s}{takes}`" for s in action.option_strings)
        else:
            flag = f"`{action.metavar or action.dest.upper()}`"
        text = (action.help or "").replace("%%", "%")
        if action.choices and not isinstance(action.choices, dict):
            text += " (choices: " + ", ".join(f"`{c}`" for c in action.choices) + ")"
        rows.append(f"| {flag} | {_cell(text)} |")
    return "\n".join(rows) if len(rows) > 2 else ""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def _section(path: list[str], summary: str, parser: argparse.ArgumentParser, level: int):
    lines = [f"{'#' * level} `{' '.join(path)}`", ""]
    if summary:
        lines += [summary[:1].upper() + summary[1:] + ".", ""]
    if parser.description and parser.description != summary:
        lines += [parser.description, ""]
    usage = " ".join(parser.format_usage().split())
    usage = usage.removeprefix("usage: ")
    lines += ["```text", usage, "```", ""]
    table = _flags_table(parser)
    if table:
        lines += [table, ""]
    for name, help_, sub in _subcommands(parser):
        lines += _section(path + [name], help_ or "", sub, min(level + 1, 4))
    return lines


def cli_page() -> str:
    """The markdown page of the whole command line."""
    parser = build_parser()
    lines = ["# The command line", "",
             "Generated from the parser `mcfl` uses (`mcfl.apps.cli.build_parser`): every "
             "command, its usage and its flags. `mcfl COMMAND --help` prints the same. A bad "
             "value is one line naming it and what is allowed, and exit status 2.", ""]
    for name, help_, sub in _subcommands(parser):
        lines += _section(["mcfl", name], help_ or "", sub, 2)
    return "\n".join(lines)
