"""What a store URL must hold before a store is opened on it."""

from __future__ import annotations

import pytest

from vcdl.errors import StoreConfigError
from vcdl.store import WeightStore


@pytest.mark.parametrize("url", ["s3://", "s3:///", "gs://", "sqlite://"])
def test_a_url_with_nothing_after_its_scheme_is_refused_not_taken_for_a_local_dir(
    url: str,
) -> None:
    """``s3://`` stripped of its slashes is ``s3:``: fsspec took it for a local directory
    named ``s3:``, and a run's weights went to the driver's own disk (found by the config
    fuzz)."""
    with pytest.raises(StoreConfigError, match="names nothing after"):
        WeightStore(url)
