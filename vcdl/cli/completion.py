"""``vcdl completion``: shell completion scripts for ``vcdl``, written from its argparse parser.

:func:`command_tree` reads the parser's subcommands, options and choices;
the ``bash``, ``zsh`` and ``fish`` writers turn that tree into a script.
Nothing is listed by hand, so a new command or option is completed as soon
as the parser has it. Options that take a value complete its choices where
the parser names some, else file names.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vcdl.cli.parser import Parents, Subparsers


@dataclass
class Option:
    """One optional argument: its spellings, help, and what its value may be."""

    flags: list[str]
    help: str
    takes_value: bool
    choices: list[str] | None
    """The values to offer; None: file names; empty: nothing (a number)."""


@dataclass
class Command:
    """A parser: its options, its positionals' choices, and its subcommands."""

    name: str
    help: str
    options: list[Option] = field(default_factory=list)
    positional_choices: list[list[str] | None] = field(default_factory=list)
    subcommands: list[Command] = field(default_factory=list)


def _help(action: argparse.Action) -> str:
    text = action.help if isinstance(action.help, str) and action.help != argparse.SUPPRESS else ""
    return re.sub(r"\s+", " ", text).strip()


def command_tree(parser: argparse.ArgumentParser, name: str = "", help: str = "") -> Command:
    """The parser as a :class:`Command`, its subparsers as subcommands, recursively."""
    cmd = Command(name or parser.prog, help)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: _help(a) for a in action._choices_actions}
            for sub_name, sub in action.choices.items():
                cmd.subcommands.append(command_tree(sub, sub_name, helps.get(sub_name, "")))
        elif action.option_strings:
            choices = [str(c) for c in action.choices] if action.choices else None
            if action.type in (int, float):
                choices = []  # a number: no file names to offer
            cmd.options.append(
                Option(list(action.option_strings), _help(action), action.nargs != 0, choices)
            )
        else:
            choices = [str(c) for c in action.choices] if action.choices else None
            cmd.positional_choices.append(choices)
    return cmd


def _ident(name: str) -> str:
    """``name`` as part of a shell function's name."""
    return re.sub(r"\W", "_", name)


def _walk(cmd: Command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Command]]:
    out = [(path, cmd)]
    for sub in cmd.subcommands:
        out += _walk(sub, (*path, sub.name))
    return out


def _bash(root: Command) -> str:
    prog = root.name
    fn = "_" + _ident(prog)
    cases: list[str] = []
    for path, cmd in _walk(root):
        key = "/".join(path)
        words = [s.name for s in cmd.subcommands] + [f for o in cmd.options for f in o.flags]
        valued = [o for o in cmd.options if o.takes_value]
        value_cases = "".join(
            f"                {'|'.join(o.flags)}) "
            + (
                f'COMPREPLY=($(compgen -W "{" ".join(o.choices)}" -- "$cur"))'
                if o.choices is not None
                else 'COMPREPLY=($(compgen -f -- "$cur"))'
            )
            + "; return;;\n"
            for o in valued
        )
        positional = next((c for c in cmd.positional_choices if c), None)
        fallback = (
            f'COMPREPLY=($(compgen -W "{" ".join(positional)}" -- "$cur"))'
            if positional
            else 'COMPREPLY=($(compgen -f -- "$cur"))'
        )
        if cmd.subcommands:
            fallback = (
                f'COMPREPLY=($(compgen -W "{" ".join(s.name for s in cmd.subcommands)}" -- "$cur"))'
            )
        cases.append(
            f'        "{key}")\n'
            f'            case "$prev" in\n{value_cases}            esac\n'
            f'            if [[ "$cur" == -* ]]; then\n'
            f'                COMPREPLY=($(compgen -W "{" ".join(words)}" -- "$cur"))\n'
            f"            else\n"
            f"                {fallback}\n"
            f"            fi;;\n"
        )
    known = " ".join(sorted("/".join(p) for p, _ in _walk(root) if p))
    return (
        f"# bash completion for {prog}, written by `{prog} completion bash`\n"
        f"{fn}() {{\n"
        "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}\n"
        '    local path="" word i\n'
        "    # The subcommand path so far: each word that extends a known path.\n"
        "    for ((i = 1; i < COMP_CWORD; i++)); do\n"
        "        word=${COMP_WORDS[i]}\n"
        '        case " $' + fn + '_paths " in\n'
        '            *" ${path:+$path/}$word "*) path="${path:+$path/}$word";;\n'
        "        esac\n"
        "    done\n"
        '    case "$path" in\n' + "".join(cases) + "    esac\n"
        "}\n"
        # Every subcommand path, its words joined by "/" ("data/list"), one per word.
        f'{fn}_paths="{known}"\n'
        f"complete -o filenames -F {fn} {prog}\n"
    )


def _zsh_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "'\\''").replace("[", "\\[").replace("]", "\\]")


def _zsh(root: Command) -> str:
    prog = root.name
    functions: list[str] = []
    for path, cmd in _walk(root):
        fn = "_" + "_".join(_ident(p) for p in (prog, *path))
        if cmd.subcommands:
            described = "\n".join(
                f"        '{s.name}:{_zsh_escape(s.help).replace(':', chr(92) + ':')}'"
                for s in cmd.subcommands
            )
            dispatch = "\n".join(
                f"        {s.name}) {fn}_{_ident(s.name)} ;;" for s in cmd.subcommands
            )
            functions.append(
                f"{fn}() {{\n"
                "    local -a commands\n"
                "    if (( CURRENT == 2 )); then\n"
                f"        commands=(\n{described}\n        )\n"
                "        _describe -t commands 'command' commands\n"
                "        return\n"
                "    fi\n"
                '    local sub="${words[2]}"\n'
                "    shift words\n"
                "    (( CURRENT-- ))\n"
                f'    case "$sub" in\n{dispatch}\n    esac\n'
                "}\n"
            )
            continue
        specs: list[str] = []
        for o in cmd.options:
            value = ""
            if o.takes_value:
                value = (
                    f":value:({' '.join(o.choices)})" if o.choices is not None else ":value:_files"
                )
            described = f"'[{_zsh_escape(o.help)}]{value}'"
            if len(o.flags) == 1:
                specs.append(f"'{o.flags[0]}'{described}")
            else:
                # '(-v --verbose)'{-v,--verbose}'[...]': either spelling, once.
                specs.append(f"'({' '.join(o.flags)})'{{{','.join(o.flags)}}}{described}")
        for choices in cmd.positional_choices:
            specs.append(
                f"'*:argument:({' '.join(choices)})'" if choices else "'*:argument:_files'"
            )
            break  # one positional spec covers the rest: argparse checks them
        functions.append(
            f"{fn}() {{\n    _arguments -s \\\n        " + " \\\n        ".join(specs) + "\n}\n"
        )
    return (
        f"#compdef {prog}\n"
        f"# zsh completion for {prog}, written by `{prog} completion zsh`\n"
        + "\n".join(functions)
        # Autoloaded from $fpath the file is _vcdl's body: complete now; sourced: register.
        + f'\nif [[ "$funcstack[1]" == "_{prog}" ]]; then _{prog} "$@"; '
        + f"else compdef _{prog} {prog}; fi\n"
    )


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish(root: Command) -> str:
    prog = root.name
    lines = [
        f"# fish completion for {prog}, written by `{prog} completion fish`",
        f"complete -c {prog} -f",
    ]
    for path, cmd in _walk(root):
        # The condition: exactly this path of subcommands was typed, and no deeper one.
        seen = " && ".join(f"__fish_seen_subcommand_from {p}" for p in path)
        deeper = [s.name for s in cmd.subcommands]
        if cmd.subcommands:
            cond = (
                seen + " && " if seen else ""
            ) + f"not __fish_seen_subcommand_from {' '.join(deeper)}"
            for s in cmd.subcommands:
                head = f"complete -c {prog} -n {_fish_quote(cond)}"
                lines.append(f"{head} -a {s.name} -d {_fish_quote(s.help)}")
        if not path:
            continue
        cond = seen
        for o in cmd.options:
            parts = [f"complete -c {prog} -n {_fish_quote(cond)}"]
            for flag in o.flags:
                parts.append(f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}")
            if o.takes_value:
                parts.append(
                    f"-x -a {_fish_quote(' '.join(o.choices))}"
                    if o.choices is not None
                    else "-r -F"
                )
            parts.append(f"-d {_fish_quote(o.help)}")
            lines.append(" ".join(parts))
        for choices in cmd.positional_choices:
            if choices:
                lines.append(
                    f"complete -c {prog} -n {_fish_quote(cond)} -a {_fish_quote(' '.join(choices))}"
                )
            else:
                lines.append(f"complete -c {prog} -n {_fish_quote(cond)} -F")
            break
    return "\n".join(lines) + "\n"


WRITERS: dict[str, Callable[[Command], str]] = {"bash": _bash, "zsh": _zsh, "fish": _fish}


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell`` (bash, zsh or fish) of ``parser``'s commands."""
    return WRITERS[shell](command_tree(parser))


def add_parsers(sub: Subparsers, parents: Parents) -> None:
    comp = sub.add_parser(
        "completion",
        help="print a shell completion script, e.g. `vcdl completion bash > ~/.vcdl.bash`",
    )
    comp.add_argument("shell", choices=["bash", "zsh", "fish"])


def completion_command(args: argparse.Namespace) -> int:
    from vcdl.cli.parser import build_parser

    sys.stdout.write(completion_script(build_parser(), args.shell))
    return 0
