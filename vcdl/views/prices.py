"""Instance prices: the dated list price table and which instance type a worker is.

Defaults are in ``vcdl/views/prices.toml``; a run's ``cost.prices`` file (or
``vcdl cost --prices FILE``) overrides entries. :func:`run_prices` is the
table a run's cost settings give.
"""

from __future__ import annotations

import fnmatch
import math
import tomllib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

from vcdl.config import CostSection
from vcdl.errors import ConfigError

DEFAULT_INSTANCE_TYPE: Final = "g4dn.xlarge"

_PRICE_FIELDS: Final = frozenset({"on_demand", "spot", "provider", "region", "accelerator", "note"})


_META_FIELDS: Final = frozenset({"as_of", "currency", "source", "note"})

TRANSFERS: Final = ("same_region", "cross_region", "internet")
"""Where the workers are relative to the store's bucket (``cost.data_transfer``)."""

_STORAGE_NUMBERS: Final = frozenset({"get_per_1000", *(f"transfer_{t}_per_gb" for t in TRANSFERS)})
_STORAGE_FIELDS: Final = _STORAGE_NUMBERS | {"provider", "region", "as_of", "source", "note"}


@dataclass(frozen=True)
class StoragePrice:
    """What reading from an object store costs: USD per 1 000 GETs and per GB out."""

    scheme: str
    get_per_1000: float
    transfer_per_gb: Mapping[str, float]
    """By :data:`TRANSFERS`: where the workers are relative to the bucket."""
    provider: str = ""
    region: str = ""
    as_of: str = ""
    source: str = ""


@dataclass(frozen=True)
class Price:
    """Spot and on-demand USD per hour of one instance type."""

    instance_type: str
    on_demand: float
    spot: float
    provider: str = ""
    region: str = ""
    accelerator: str = ""
    note: str = ""

    @property
    def discount(self) -> float:
        """The spot discount, ``1 − spot / on_demand`` (negative if spot costs more)."""
        return 1.0 - self.spot / self.on_demand


@dataclass(frozen=True)
class PriceTable:
    """Prices by instance type, with where and when they were taken."""

    prices: Mapping[str, Price]
    as_of: str = ""
    currency: str = "USD"
    source: str = ""
    files: tuple[str, ...] = field(default=())
    storage: Mapping[str, StoragePrice] = field(default_factory=dict)
    """Object-store read prices by URL scheme (``s3``)."""

    def __getitem__(self, instance_type: str) -> Price:
        try:
            return self.prices[instance_type]
        except KeyError:
            raise ConfigError(
                f"no price for instance type {instance_type!r}; known: "
                f"{', '.join(sorted(self.prices))}; add it to a prices TOML file "
                f'([instance."{instance_type}"] on_demand = ..., spot = ...) and name it in the '
                "run's cost.prices (or `vcdl cost --prices FILE`)"
            ) from None

    def __contains__(self, instance_type: object) -> bool:
        return instance_type in self.prices


def _number(value: Any, what: str, unit: str = "USD per hour") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{what} must be a number of {unit}, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ConfigError(f"{what} must be a finite, non-negative {unit}, got {value!r}")
    return number


def parse_prices(
    doc: Mapping[str, Any], origin: str = "<prices>", base: PriceTable | None = None
) -> PriceTable:
    """The price table of a parsed TOML document, on top of ``base`` if given.

    The document has an optional ``[meta]`` table (``as_of``, ``currency``,
    ``source``, ``note``) and one ``[instance."TYPE"]`` table per instance type
    with ``on_demand`` and ``spot`` (USD/hour) and optional ``provider``,
    ``region``, ``accelerator``, ``note``. An entry for a type already in
    ``base`` may give only the fields it changes (e.g. today's ``spot``).

    Raises:
        ConfigError: unknown tables or fields, prices that are not finite
            non-negative numbers, an on-demand price of 0, a new type without
            both prices. A spot price above on-demand is allowed (spot prices
            can briefly exceed it) but warns.
    """
    unknown = set(doc) - {"meta", "instance", "storage"}
    if unknown:
        raise ConfigError(
            f"{origin}: unknown table(s) {sorted(unknown)}; a prices file has [meta] and "
            '[instance."TYPE"] tables'
        )
    meta = doc.get("meta", {})
    if not isinstance(meta, Mapping) or set(meta) - _META_FIELDS:
        raise ConfigError(f"{origin}: [meta] may only hold {sorted(_META_FIELDS)}")
    instances = doc.get("instance", {})
    if not isinstance(instances, Mapping):
        raise ConfigError(f'{origin}: "instance" must be tables [instance."TYPE"]')
    prices: dict[str, Price] = dict(base.prices) if base else {}
    for name, entry in instances.items():
        what = f'{origin}: [instance."{name}"]'
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{what} must be a table with on_demand and spot")
        bad = set(entry) - _PRICE_FIELDS
        if bad:
            raise ConfigError(
                f"{what}: unknown field(s) {sorted(bad)}; allowed {sorted(_PRICE_FIELDS)}"
            )
        old = prices.get(name)
        merged: dict[str, Any] = (
            {k: getattr(old, k) for k in _PRICE_FIELDS} if old is not None else {}
        )
        merged.update(entry)
        missing = {"on_demand", "spot"} - set(merged)
        if missing:
            raise ConfigError(f"{what}: missing {sorted(missing)} (USD per hour)")
        on_demand = _number(merged["on_demand"], f"{what} on_demand")
        spot = _number(merged["spot"], f"{what} spot")
        if on_demand == 0:
            raise ConfigError(f"{what}: on_demand must be > 0 (savings are relative to it)")
        for text in ("provider", "region", "accelerator", "note"):
            if not isinstance(merged.get(text, ""), str):
                raise ConfigError(f"{what}: {text} must be a string")
        if spot > on_demand:
            warnings.warn(
                f"{what}: spot {spot} > on_demand {on_demand}: savings will be negative",
                stacklevel=2,
            )
        prices[name] = Price(
            instance_type=name,
            on_demand=on_demand,
            spot=spot,
            provider=merged.get("provider", ""),
            region=merged.get("region", ""),
            accelerator=merged.get("accelerator", ""),
            note=merged.get("note", ""),
        )
    storage = _parse_storage(doc.get("storage", {}), origin, base)
    for key in ("as_of", "currency", "source"):
        if key in meta and not isinstance(meta[key], str):
            raise ConfigError(f"{origin}: [meta] {key} must be a string")
    return PriceTable(
        prices=prices,
        as_of=str(meta.get("as_of", base.as_of if base else "")),
        currency=str(meta.get("currency", base.currency if base else "USD")),
        source=str(meta.get("source", base.source if base else "")),
        files=(*(base.files if base else ()), origin),
        storage=storage,
    )


def _parse_storage(tables: Any, origin: str, base: PriceTable | None) -> dict[str, StoragePrice]:
    """``[storage.SCHEME]`` tables on top of ``base``'s (a field given replaces that field)."""
    if not isinstance(tables, Mapping):
        raise ConfigError(f"{origin}: [storage.SCHEME] must be tables")
    out = dict(base.storage) if base else {}
    for scheme, entry in tables.items():
        what = f"{origin}: [storage.{scheme}]"
        if not isinstance(entry, Mapping) or set(entry) - _STORAGE_FIELDS:
            raise ConfigError(f"{what} may only hold {sorted(_STORAGE_FIELDS)}")
        old = out.get(scheme)
        merged: dict[str, Any] = {}
        if old is not None:
            merged = {
                "get_per_1000": old.get_per_1000,
                **{f"transfer_{t}_per_gb": v for t, v in old.transfer_per_gb.items()},
                "provider": old.provider,
                "region": old.region,
                "as_of": old.as_of,
                "source": old.source,
            }
        merged.update(entry)
        missing = _STORAGE_NUMBERS - set(merged)
        if missing:
            raise ConfigError(f"{what}: missing {sorted(missing)} (USD)")
        numbers = {k: _number(merged[k], f"{what} {k}", "USD") for k in _STORAGE_NUMBERS}
        for text in ("provider", "region", "as_of", "source", "note"):
            if not isinstance(merged.get(text, ""), str):
                raise ConfigError(f"{what}: {text} must be a string")
        out[str(scheme)] = StoragePrice(
            scheme=str(scheme),
            get_per_1000=numbers["get_per_1000"],
            transfer_per_gb={t: numbers[f"transfer_{t}_per_gb"] for t in TRANSFERS},
            provider=merged.get("provider", ""),
            region=merged.get("region", ""),
            as_of=merged.get("as_of", ""),
            source=merged.get("source", ""),
        )
    return out


def default_prices() -> PriceTable:
    """The price table shipped with vcdl (``vcdl/views/prices.toml``)."""
    text = resources.files("vcdl.views").joinpath("prices.toml").read_text(encoding="utf-8")
    return parse_prices(tomllib.loads(text), "vcdl/views/prices.toml")


def load_prices(path: str | Path | None = None, *, defaults: bool = True) -> PriceTable:
    """The price table: vcdl's defaults, overridden and extended by ``path``.

    With ``defaults=False`` only the file's entries are known.

    Raises:
        ConfigError: the file is missing, not TOML, or invalid (see
            :func:`parse_prices`).
    """
    base = default_prices() if defaults else None
    if path is None:
        if base is None:
            raise ConfigError("load_prices(defaults=False) needs a prices file")
        return base
    p = Path(path).expanduser()
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"prices file {p} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read prices file {p}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"prices file {p} is not valid TOML: {exc}") from None
    return parse_prices(doc, str(p), base)


def instance_for(
    worker: str,
    instance_type: str = DEFAULT_INSTANCE_TYPE,
    worker_types: Mapping[str, str] | None = None,
    *,
    name: str | None = None,
) -> str:
    """The instance type of ``worker``: the first glob pattern of ``worker_types`` it matches.

    Patterns are :func:`fnmatch.fnmatchcase` globs on the worker address as the
    ledger records it (e.g. ``"tcp://10.0.1.*"``) or on the worker's Dask
    ``name`` (e.g. ``"gpu-*"``: a spot worker's address changes with every
    replacement, the name its launcher gives it need not), tried in mapping
    order; no match gives ``instance_type``.
    """
    for pattern, kind in (worker_types or {}).items():
        if fnmatch.fnmatchcase(worker, pattern) or (
            name is not None and fnmatch.fnmatchcase(name, pattern)
        ):
            return kind
    return instance_type


def run_prices(cost: CostSection) -> PriceTable:
    """The price table of a run's ``[cost]`` settings, every instance type it names priced.

    Raises:
        ConfigError: the prices file is unreadable or an instance type has no price.
    """
    table = load_prices(cost.prices)
    for kind in sorted({cost.instance_type, *cost.worker_types.values()}):
        table[kind]
    return table
