"""The service's Prometheus metrics: per-call counters and histograms, and gauges read
from the engine and the datastores at scrape time, served over HTTP."""
