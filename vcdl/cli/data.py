"""``vcdl data make``, ``data import`` and ``data list``: data sets in the store."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from vcdl.cli.json_output import report
from vcdl.cli.parser import SAMPLES, Parser, checked_name
from vcdl.config_files import writable_home

if TYPE_CHECKING:
    from collections.abc import Callable

    from vcdl.cli.parser import Parents, Subparsers
    from vcdl.data import DatasetInfo
    from vcdl.store import WeightStore


def add_parsers(sub: Subparsers, parents: Parents) -> None:
    d = sub.add_parser("data", help="data sets in the store")
    dsub = d.add_subparsers(dest="data_command", required=True, parser_class=Parser)
    store_opt = Parser(add_help=False, parents=parents.reporting)
    store_opt.add_argument("--store", help="store URL (default: <home>/store)")
    mk = dsub.add_parser("make", parents=[store_opt], help="generate a built-in data set")
    mk.add_argument("kind", choices=["digits", "mnist1d", "pytext"])
    mk.add_argument("--name", help="data set name (default: the kind)")
    mk.add_argument("--samples", type=SAMPLES, default=40_000, help="mnist1d samples")
    mk.add_argument(
        "--context", type=int, default=128, help="pytext: tokens of context per row (128)"
    )
    im = dsub.add_parser(
        "import",
        parents=[store_opt],
        help="import an .npz of named arrays, a Parquet/Arrow table, or text (bytes as tokens)",
    )
    im.add_argument("file", help=".npz, .parquet/.arrow/.feather, or a text file or folder")
    im.add_argument("--name", required=True)
    im.add_argument(
        "--format",
        choices=["auto", "npz", "table", "text"],
        default="auto",
        help="what the file is (default: by its extension; text otherwise)",
    )
    im.add_argument(
        "--test-fraction",
        type=float,
        default=None,
        help="held-out share when the input names no splits (npz, table: 0.2; text: 0.1)",
    )
    im.add_argument("--classes", type=int, help="number of classes (classification x, y)")
    im.add_argument("--context", type=int, default=128, help="text: tokens of context per row")
    im.add_argument("--pattern", default="*.txt", help="text folder: files to read (*.txt)")
    dsub.add_parser("list", parents=[store_opt], help="list data sets")


def data_command(args: argparse.Namespace) -> int:
    from vcdl import api

    if args.data_command != "list":
        # Not '' (it became the kind's name), nor 10 KB echoed back.
        checked_name("--name", args.name, "data set", required=args.data_command == "import")
        if args.store is None:
            writable_home(args.home)  # a file or /proc as --home: said so, before a write fails
    store = api.data_store(args.store, args.home)
    return _SUBCOMMANDS[args.data_command](args, store)


def _make(args: argparse.Namespace, store: WeightStore) -> int:
    from vcdl import api

    info = api.make_dataset(
        store, args.kind, name=args.name, samples=args.samples, context=args.context
    )
    return _written(args, store, info)


def _import(args: argparse.Namespace, store: WeightStore) -> int:
    from vcdl import api

    info = api.import_dataset(
        store,
        args.file,
        args.name,
        format=args.format,
        test_fraction=args.test_fraction,
        classes=args.classes,
        context=args.context,
        pattern=args.pattern,
    )
    return _written(args, store, info)


def _written(args: argparse.Namespace, store: WeightStore, info: DatasetInfo) -> int:
    from vcdl.views.datasets import dataset_doc, describe

    if report(args, {"dataset": dataset_doc(store, info)}):
        return 0
    print(f"data set {info.name}: {describe(info)}, in {store.shown('datasets/' + info.name)}")
    return 0


def _list(args: argparse.Namespace, store: WeightStore) -> int:
    from vcdl import data
    from vcdl.views.datasets import dataset_doc, describe

    sets = data.list_datasets(store)
    if report(args, {"datasets": [dataset_doc(store, d) for d in sets]}):
        return 0
    for d in sets:
        print(f"{d.name:20} {describe(d)} ({d.source})")
    return 0


#: ``vcdl data``'s subcommands: name -> handler.
_SUBCOMMANDS: dict[str, Callable[[argparse.Namespace, WeightStore], int]] = {
    "make": _make,
    "import": _import,
    "list": _list,
}
