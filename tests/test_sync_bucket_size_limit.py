"""``async_training.sync_bucket_size_mb`` had no upper bound: ``1e6`` and ``1e300`` passed validation, then the NCCL
engine's up-front buffers of that size failed to allocate or overflowed. The key now stops where a bucket's byte count
stops fitting an int64 (the engines size their buffers by the buckets filled: test_nccl_engine_cpu.py)."""

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.config_ranges import MAX_BUCKET_MB


@pytest.mark.parametrize("mb", ["1e6", str(MAX_BUCKET_MB)])
def test_huge_bucket_sizes_whose_bytes_fit_an_int64_are_taken(mb):
    cfg = load_config(overrides=[f"async_training.sync_bucket_size_mb={mb}"])
    assert int(cfg.async_training.sync_bucket_size_mb * 2**20) <= 2**63 - 1


@pytest.mark.parametrize("mb", ["1e300", "8796093022208"])
def test_a_bucket_size_past_an_int64_of_bytes_is_refused_naming_why(mb):
    with pytest.raises(ConfigError, match=r"^async_training.sync_bucket_size_mb=\S+ is not valid: use in "
                                          r"\(0, 8796093022207\] \(.*int64"):
        load_config(overrides=[f"async_training.sync_bucket_size_mb={mb}"])
