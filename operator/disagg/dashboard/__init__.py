"""Read-only web dashboard of DisaggDeployment pool sizes and ratios.

`disagg.dashboard.history` is pure (the time series and the JSON document);
`disagg.dashboard.server` is the aiohttp app and its data sources. Nothing is
imported here, so importing the pure part never loads aiohttp.
"""
