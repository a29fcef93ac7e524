"""Samples to rollups: clock calibration, packet-to-sample skew (with the branch
records that follow their samples), target filters, the aggregator and its
resolver, PMU rotation, the sentinel/diagnostic modes and the anomaly monitor.
Never imports the outputs or the API."""
