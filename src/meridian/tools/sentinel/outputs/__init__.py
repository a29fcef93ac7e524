"""What people and scrapers see: the live table, the exit summary and JSON
windows; the OpenMetrics series."""
