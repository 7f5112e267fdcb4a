"""clockalign watch: the probes of ``record``, aggregated live into Prometheus metrics.

    aggregate.py   event batches, counters, clock sandwiches -> bounded totals
    histogram.py   fixed-bucket histograms of durations
    metrics.py     the prometheus_client collector, DCGM-named GPU gauges, the HTTP server
    rules.py       the shipped alert rules (alerts.yml)
    session.py     one watch: recorder + aggregator + server, until Ctrl-C / SIGTERM
"""
