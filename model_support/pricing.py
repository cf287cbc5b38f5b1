"""What a test costs: an instance price table, and core-seconds turned into money.

A record holds the core-seconds it used (``core_seconds`` in the matrix: the cores it held
times the time its runner held them, compile included; see ``model_support.dataset``). A price
turns that into dollars: the instance's on-demand price per hour divided by the cores the
instance exposes gives the price of one core-hour. The default table (:data:`DEFAULT_PRICES`)
gives each price with its public source and the date it was read (docs/pricing.md); a site
with other prices (another region, a discount, a reservation) overrides it with a YAML or JSON
file of the same shape (:func:`load_prices`; ``--prices FILE`` on the command line,
``MODEL_SUPPORT_PRICES`` for the viewer, the chart's ``settings.instancePrices`` for the
operator).

A Neuron record without a known instance type has no price unless the table names a
``default_instance_type`` to assume: its cost is left empty rather than guessed. A run off
Neuron (a local CPU run) is never priced as that default: its core-seconds are not Trainium
core-hours.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PRICES_ENV = "MODEL_SUPPORT_PRICES"
"""A price table file to use instead of the default (the viewer and the CLI read it)."""


class InstancePrice(BaseModel):
    """One instance type's on-demand price in one region, and the cores it exposes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_type: str = Field(
        ..., min_length=1, description="EC2 instance type, e.g. trn1.32xlarge."
    )
    region: str = Field(..., min_length=1, description="AWS region, e.g. us-east-1.")
    usd_per_hour: float = Field(..., gt=0, description="On-demand Linux price per instance-hour.")
    cores: int = Field(
        ...,
        ge=1,
        description="NeuronCores the instance exposes (at LNC=2 on trn2; see cores_lnc1).",
    )
    cores_lnc1: int | None = Field(
        None, ge=1, description="trn2: the cores exposed at LNC=1 (the same price, more cores)."
    )
    source: str = Field(..., min_length=1, description="Where the price was read (a URL).")
    as_of: str = Field(..., min_length=1, description="When it was read (YYYY-MM-DD).")
    confirmed: bool = Field(
        True, description="False: read from a third party only; check it before relying on it."
    )

    def core_hour_usd(self, lnc: int | None = None) -> float:
        """The price of one core for one hour at logical core size ``lnc``."""
        cores = self.cores_lnc1 if lnc == 1 and self.cores_lnc1 else self.cores
        return self.usd_per_hour / cores


class PriceTable(BaseModel):
    """Instance prices per (instance type, region), the region assumed, and its provenance."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str = Field("us-east-1", min_length=1, description="The region prices are read for.")
    default_instance_type: str | None = Field(
        None,
        description="The instance assumed for a record that names none (a local run); "
        "None: such records have no cost.",
    )
    prices: tuple[InstancePrice, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> PriceTable:
        seen: set[tuple[str, str]] = set()
        for price in self.prices:
            key = (price.instance_type, price.region)
            if key in seen:
                raise ValueError(f"{price.instance_type} in {price.region} is priced twice")
            seen.add(key)
        return self

    def price_of(self, instance_type: str | None, neuron: bool = True) -> InstancePrice | None:
        """The price of ``instance_type`` in the table's region; a Neuron run that names no
        instance is priced as the table's default instance. A run off Neuron (CPU, GPU) is
        priced only by its own instance type: never as Trainium core-hours."""
        wanted = instance_type or (self.default_instance_type if neuron else None)
        if wanted is None:
            return None
        return next(
            (p for p in self.prices if p.instance_type == wanted and p.region == self.region),
            None,
        )

    def core_hour_usd(
        self, instance_type: str | None, lnc: int | None = None, neuron: bool = True
    ) -> float | None:
        """One core-hour of ``instance_type`` in dollars; None when the table has no price
        (see :meth:`price_of` for ``neuron``)."""
        price = self.price_of(instance_type, neuron)
        return None if price is None else price.core_hour_usd(lnc)

    def cost_usd(
        self,
        core_seconds: float | None,
        instance_type: str | None,
        lnc: int | None = None,
        neuron: bool = True,
    ) -> float | None:
        """What ``core_seconds`` on ``instance_type`` cost; None when either is unknown."""
        rate = self.core_hour_usd(instance_type, lnc, neuron)
        if rate is None or core_seconds is None:
            return None
        return core_seconds / 3600 * rate

    def with_overrides(self, overrides: dict[str, Any]) -> PriceTable:
        """This table with ``overrides`` (the same shape) applied: a price given there for an
        (instance type, region) replaces this table's; ``region`` and
        ``default_instance_type`` replace this table's when given."""
        given = PriceTable.model_validate({"prices": [], **overrides})
        replaced = {(p.instance_type, p.region) for p in given.prices}
        kept = tuple(p for p in self.prices if (p.instance_type, p.region) not in replaced)
        fields: dict[str, Any] = {
            k: getattr(given, k) for k in ("region", "default_instance_type") if k in overrides
        }
        return self.model_copy(update={"prices": kept + given.prices, **fields})


_PRODUCT_TRN1 = "https://aws.amazon.com/ec2/instance-types/trn1/"
_PRODUCT_INF2 = "https://aws.amazon.com/ec2/instance-types/inf2/"
_THIRD_PARTY_TRN2 = "https://stackpulsar.com/blog/aws-trainium-inferentia/"


def _price(
    instance_type: str,
    usd: float,
    cores: int,
    source: str,
    as_of: str,
    *,
    cores_lnc1: int | None = None,
    confirmed: bool = True,
) -> InstancePrice:
    return InstancePrice(
        instance_type=instance_type,
        region="us-east-1",
        usd_per_hour=usd,
        cores=cores,
        cores_lnc1=cores_lnc1,
        source=source,
        as_of=as_of,
        confirmed=confirmed,
    )


DEFAULT_PRICES = PriceTable(
    region="us-east-1",
    prices=(
        # Each figure, its source and how far it is confirmed: docs/pricing.md.
        _price("trn1.32xlarge", 21.50, 32, _PRODUCT_TRN1, "2026-06-25"),
        _price("trn1.2xlarge", 1.34375, 2, _PRODUCT_TRN1, "2026-12-01", confirmed=False),
        _price("trn1n.32xlarge", 24.78, 32, _PRODUCT_TRN1, "2026-12-01", confirmed=False),
        _price("inf2.xlarge", 0.75818, 2, _PRODUCT_INF2, "2026-12-01", confirmed=False),
        _price("inf2.8xlarge", 1.96786, 2, _PRODUCT_INF2, "2026-12-01", confirmed=False),
        _price("inf2.24xlarge", 6.49063, 12, _PRODUCT_INF2, "2026-12-01", confirmed=False),
        _price("inf2.48xlarge", 12.98127, 24, _PRODUCT_INF2, "2026-12-01", confirmed=False),
        _price(
            "trn2.48xlarge",
            38.47,
            64,
            _THIRD_PARTY_TRN2,
            "2026-12-01",
            cores_lnc1=128,
            confirmed=False,
        ),
    ),
)
"""On-demand Linux prices in us-east-1 (docs/pricing.md gives each one's source and date)."""


class PriceTableError(ValueError):
    """A price table file that cannot be read or does not have the table's shape."""


def load_prices(path: str | os.PathLike[str] | None = None) -> PriceTable:
    """The default table with the file at ``path`` (else ``$MODEL_SUPPORT_PRICES``) applied.

    The file is YAML or JSON with any of ``region``, ``default_instance_type`` and ``prices``
    (a list of :class:`InstancePrice` fields); raises :class:`PriceTableError` naming the
    problem.
    """
    chosen = path if path is not None else os.environ.get(PRICES_ENV) or None
    if chosen is None:
        return DEFAULT_PRICES
    file = Path(chosen)
    try:
        text = file.read_text()
    except OSError as exc:
        raise PriceTableError(
            f"cannot read the price table {file}: {exc.strerror or exc}; give a YAML or JSON file"
        ) from exc
    return prices_from_text(text, str(file))


def prices_from_text(text: str, where: str = "the price table") -> PriceTable:
    """The default table with the YAML or JSON ``text`` applied (see :func:`load_prices`)."""
    import yaml

    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise PriceTableError(f"{where} is not valid YAML or JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise PriceTableError(
            f"{where} must be a mapping with region, default_instance_type and/or prices"
        )
    return prices_from_mapping(data, where)


def prices_from_mapping(data: dict[str, Any], where: str = "the price table") -> PriceTable:
    """The default table with ``data`` applied (see :func:`load_prices`)."""
    try:
        return DEFAULT_PRICES.with_overrides(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise PriceTableError(
            f"{where}: {field}: {first['msg']} ({exc.error_count()} problem(s)); see "
            "docs/pricing.md for the table's fields"
        ) from exc
